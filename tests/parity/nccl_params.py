"""The environment variables NCCL reads at a tag, from its source: every NCCL_PARAM(Name, "KEY", ...)
(read as NCCL_KEY, src/include/param.h) and every ncclGetEnv("NCCL_...") literal.

    python -m tests.parity.nccl_params NCCL_GIT_DIR TAG > roles/serving/known_env/nccl-TAG.txt

NCCL is a C library inside the serving image, not in the parity virtualenvs, so its names are
taken from its git history (github:NVIDIA/nccl) and committed; tests/unit/test_nccl_names.py
holds every NCCL_* a rank's environment carries against that snapshot.
"""
import re
import subprocess
import sys

PARAM = re.compile(r'NCCL_PARAM\(\s*\w+\s*,\s*"([A-Z0-9_]+)"')
GET_ENV = re.compile(r'ncclGetEnv\(\s*"(NCCL_[A-Z0-9_]+)"')


def names(source: str) -> set[str]:
    return {f"NCCL_{m}" for m in PARAM.findall(source)} | set(GET_ENV.findall(source))


def read_tag(git_dir: str, tag: str) -> set[str]:
    files = subprocess.run(["git", "-C", git_dir, "ls-tree", "-r", "--name-only", tag, "src"], check=True,
                           capture_output=True, text=True).stdout.split()
    found: set[str] = set()
    for path in files:
        if path.endswith((".cc", ".cu", ".h", ".c", ".cpp")):
            text = subprocess.run(["git", "-C", git_dir, "show", f"{tag}:{path}"], check=True, capture_output=True,
                                  text=True, errors="replace").stdout
            found |= names(text)
    return found


if __name__ == "__main__":
    git_dir, tag = sys.argv[1:3]
    print(f"# NCCL {tag}: every NCCL_PARAM and ncclGetEnv(\"NCCL_...\") name in src/ (tests/parity/nccl_params.py)")
    print("\n".join(sorted(read_tag(git_dir, tag))))
