"""Write tests/parity/vllm-<version>.txt, the lock of a vLLM release's parity virtualenv, from the
release itself: step 1 of "Moving an engine" (docs/lab.md) for vLLM, before `make snapshot`.

    make lock VERSION=0.35.0 WHY="the newest vLLM release"   (or: python -m tests.parity.vllm_lock 0.35.0 "...")

What it does, as the locks' header says: the release's own Requires-Dist (its wheel's METADATA, no
extras), less torch and the CUDA kernel packages below, plus torch==2.13.0 (the CPU build on this
machine's disk), resolved by pip in a fresh virtualenv of $PYTHON (python3: the interpreter venv.sh
builds with) with `pip install --dry-run --report`; written as `pip freeze` writes (pip and setuptools
dropped), then vllm==<version>. SGLang's lock is made by hand (tests/parity/sglang-0.5.23.txt's header:
its import-driven reduction cannot be read from its metadata).
"""
import datetime
import email.parser
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Nothing before the GPU is touched imports these; their wheels are CUDA builds of several GB.
LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec", "pynvvideocodec", "flashinfer-python", "tilelang",
            "tokenspeed-mla", "quack-kernels", "humming-kernels", "nvidia-cudnn-frontend", "nvidia-cutlass-dsl", "nvtx",
            "instanttensor", "fastsafetensors", "numba", "six", "setuptools"}
TORCH = "2.13.0"

HEADER = """# The vLLM {v} the engine-parity tier proves against (roles/engine_proof/files/check_vllm.py), installed with
# `pip install --no-deps -r` into its own virtualenv by tests/parity/venv.sh (`make parity-venvs`).
# Every package is pinned: vllm=={v} and what importing its CLI parser and config classes needs
# (vLLM {v}'s own Requires-Dist, resolved on {date} in a fresh Python {py} venv with pip's resolver:
# `pip install --dry-run --report` of that list, less the packages below, with torch=={torch}; pip and
# setuptools dropped as `pip freeze` drops them; tests/parity/vllm_lock.py). Left out on purpose: the
# CUDA kernel packages (flashinfer, tilelang, tokenspeed-mla, quack/humming kernels, nvidia-*,
# instanttensor, fastsafetensors, numba, the video codecs, torchvision/torchaudio), which nothing
# before the GPU is touched imports. torch: vLLM {v} pins {pinned} (a CUDA build); the CPU build of
# {torch} (this machine's disk) serves for parsing and config validation.
# Why this version: {why}
# A new version: docs/lab.md, "Moving an engine" (its lock, then `make snapshot ENGINE=vllm VERSION=...`).
"""


def name_of(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0).lower().replace("_", "-")


def requires_dist(version: str, tmp: Path) -> list[str]:
    """The release's Requires-Dist without extras, from its wheel's METADATA."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(tmp), f"vllm=={version}"],
                   check=True)
    [wheel] = tmp.glob(f"vllm-{version}-*.whl")
    with zipfile.ZipFile(wheel) as z:
        metadata = email.parser.Parser().parsestr(z.read(f"vllm-{version}.dist-info/METADATA").decode())
    return [r for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]


def resolve(requirements: list[str], tmp: Path) -> dict[str, str]:
    """pip's resolution of `requirements` in a fresh virtualenv: {name as pip writes it: version}."""
    python = os.environ.get("PYTHON", "python3")
    subprocess.run([python, "-m", "venv", str(tmp / "venv")], check=True)
    (tmp / "in.txt").write_text("\n".join(requirements) + "\n")
    subprocess.run([str(tmp / "venv" / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "--dry-run",
                    "--ignore-installed", "--report", str(tmp / "report.json"), "-r", str(tmp / "in.txt")], check=True)
    report = json.loads((tmp / "report.json").read_text())
    return {i["metadata"]["name"]: i["metadata"]["version"] for i in report["install"]}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].strip():
        print("usage: vllm_lock.py VERSION WHY  (WHY: the profile whose image runs it, or the newest release)",
              file=sys.stderr)
        return 2
    version, why = argv
    with tempfile.TemporaryDirectory(prefix="sfl-vllm-lock-") as tmp:
        requirements = requires_dist(version, Path(tmp))
        pinned = next((r.split("==", 1)[1].split(";")[0].strip() for r in requirements
                       if name_of(r) == "torch" and "==" in r), "no torch")
        wanted = [r for r in requirements if name_of(r) not in LEFT_OUT] + [f"torch=={TORCH}"]
        resolved = resolve(wanted, Path(tmp))
        py = subprocess.run([Path(tmp) / "venv" / "bin" / "python", "-c",
                             "import sys; print('%d.%d' % sys.version_info[:2])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    lines = [f"{n}=={TORCH if name_of(n) == 'torch' else v}"  # torch==2.13.0 installs this machine's +cpu build
             for n, v in sorted(resolved.items(), key=lambda i: name_of(i[0])) if name_of(n) not in ("pip", "setuptools")]
    path = HERE / f"vllm-{version}.txt"
    path.write_text(HEADER.format(v=version, date=datetime.date.today().isoformat(), py=py, torch=TORCH, pinned=pinned,
                                  why=why) + "\n".join(lines) + f"\nvllm=={version}\n")
    print(f"wrote tests/parity/{path.name} ({len(lines) + 1} packages); next: make snapshot ENGINE=vllm VERSION={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
