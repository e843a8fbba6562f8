"""Write roles/serving/known_env/<engine>-<version>.txt from the real engine: what a VLLM_*/SGLANG_* pin
is held to before any connection, for profiles whose image runs that release.

    make snapshot ENGINE=vllm VERSION=0.35.0      (or: .venv/bin/python -m tests.parity.snapshot vllm 0.35.0)

Needs the lock tests/parity/<engine>-<version>.txt (docs/lab.md, "Moving an engine"). Builds (or reuses)
that lock's parity virtualenv (venv.sh), runs the engine's own checker (check_<engine>.py) with no
case, and writes its env_known: the same list the parity tier compares the committed file with. Then
add the version to SNAPSHOT_VERSIONS (sparkfleet/model/env_readers.py) so profiles and the parity tier
use it.
"""
import json
import subprocess
import sys
from pathlib import Path

from sparkfleet.model.env_readers import ENGINE_NAMES, SNAPSHOT_VERSIONS, known_env_path, release

HERE = Path(__file__).resolve().parent
CHECKERS = HERE.parents[1] / "roles" / "engine_proof" / "files"  # the checkers the in-image proof shares

# What each engine's list is, as the header of its file says it (check_<engine>.py's env_known).
SOURCE = {
    "vllm": "the keys of environment_variables in vllm/envs.py.",
    "sglang": "every EnvField of sglang/srt/environ.py (with deprecated\n# names), its _DEPRECATED_ENVS and "
              "third_party_cache_defaults(), and every literal name read through\n# os.environ / os.getenv / "
              "get_*_env_var under sglang/ (roles/engine_proof/files/check_sglang.py env_known).",
}


def env_known(engine: str, version: str) -> list[str]:
    """The real engine's env_known at `version`, from its parity virtualenv (built once per lock)."""
    if not (HERE / f"{engine}-{version}.txt").is_file():
        raise SystemExit(f"no lock tests/parity/{engine}-{version}.txt: write it first (docs/lab.md, \"Moving an "
                         f"engine\", step 1: the release's Requires-Dist resolved with pip, as the header of "
                         f"{engine}-{SNAPSHOT_VERSIONS[engine][-1]}.txt says)")
    venv = subprocess.run(["bash", str(HERE / "venv.sh"), engine, version], capture_output=True, text=True)
    if venv.returncode != 0:
        raise SystemExit(venv.stderr.strip() or f"venv.sh {engine} {version} failed")
    python = venv.stdout.strip().splitlines()[-1]
    run = subprocess.run([python, str(CHECKERS / f"check_{engine}.py")], input=json.dumps({"cases": []}), cwd=CHECKERS,
                         capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise SystemExit(f"check_{engine}.py failed:\n{run.stderr[-3000:]}")
    output = json.loads(run.stdout)
    if release(output["version"]) != release(version):
        raise SystemExit(f"the virtualenv of tests/parity/{engine}-{version}.txt runs {engine} {output['version']}")
    return sorted(output["env_known"])


def text(engine: str, version: str, names: list[str]) -> str:
    head = (f"# {ENGINE_NAMES[engine]} {version} reads these environment variables: {SOURCE[engine]}\n"
            "# Regenerated from the real package by the parity tier (tests/parity/test_engine_parity.py), which fails\n"
            "# when this file differs; a VLLM_* or SGLANG_* pin not listed here is refused (sparkfleet/model/env_readers.py).\n")
    return head + "".join(f"{name}\n" for name in names)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ENGINE_NAMES:
        print(f"usage: snapshot.py {'|'.join(ENGINE_NAMES)} VERSION", file=sys.stderr)
        return 2
    engine, version = argv[0], release(argv[1])
    path = known_env_path(engine, version)
    path.write_text(text(engine, version, env_known(engine, version)))
    print(f"wrote {path.relative_to(HERE.parents[1])}")
    if version not in SNAPSHOT_VERSIONS[engine]:
        print(f"now add {version!r} to SNAPSHOT_VERSIONS[{engine!r}] in sparkfleet/model/env_readers.py (oldest "
              f"first), so profiles whose engine_version is {version} and the parity tier use it")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
