"""The router's pinned wheels: fetched once by the controller (the nodes reach no PyPI), kept in a
cache outside the checkout, checked by sha256 here and again on the node before pip installs them.

smg's wheels are abi3 (one per architecture for every CPython >= 3.8) with its Rust router built in;
`sfl_router.py run` imports only smg.router and smg.router_args, which need nothing but the standard
library, so the node's virtualenv holds smg alone (`pip install --no-deps`: its declared requirements
setproctitle, grpcio, grpcio-health-checking and pyyaml serve `smg serve` and the gRPC servicer).

  python -m roles.router.wheels [ARCH ...]   fetch into the cache (default: x86_64 and aarch64)

The cache: $SFL_ROUTER_CACHE, else /var/cache/sparkfleet/router when it can be written (root, as the
lab and CI run), else ~/.cache/sparkfleet/router.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# version -> arch (uname -m) -> (wheel file name, sha256), as PyPI serves them.
WHEELS = {
    "1.13.0": {
        "x86_64": ("smg-1.13.0-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                   "cfae8171dac68a74b4822263b1864fa79952992ee472a25ba7266ccd200399b4"),
        "aarch64": ("smg-1.13.0-cp38-abi3-manylinux_2_28_aarch64.whl",
                    "5276328560354dca26ea9f454694c3d56994fb5a41c323c8edf97508181d2d7e"),
    },
}
# pip download's --platform for each architecture: the tag of the wheel above.
PLATFORMS = {"x86_64": "manylinux2014_x86_64", "aarch64": "manylinux_2_28_aarch64"}


def cache_dir() -> Path:
    if os.environ.get("SFL_ROUTER_CACHE"):
        return Path(os.environ["SFL_ROUTER_CACHE"])
    system = Path("/var/cache/sparkfleet/router")
    try:
        system.mkdir(parents=True, exist_ok=True)
        if os.access(system, os.W_OK):
            return system
    except OSError:
        pass
    return Path.home() / ".cache" / "sparkfleet" / "router"


def wheel(version: str, arch: str) -> tuple[str, str]:
    """(file name, sha256) of the pinned wheel, or ValueError naming what is pinned."""
    pins = WHEELS.get(version)
    if pins is None:
        raise ValueError(f"smg {version} is not pinned (roles/router/wheels.py pins {', '.join(WHEELS)})")
    if arch not in pins:
        raise ValueError(f"smg {version} has no pinned wheel for {arch} (pinned: {', '.join(pins)})")
    return pins[arch]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cached(version: str, arch: str) -> Path | None:
    """The cached wheel when its sha256 is the pinned one (a wrong file is removed)."""
    name, digest = wheel(version, arch)
    path = cache_dir() / name
    if not path.is_file():
        return None
    if sha256_file(path) != digest:
        path.unlink()
        return None
    return path


def fetch(version: str, arch: str) -> Path:
    """The pinned wheel in the cache, downloaded (pip, hash-checked) when absent."""
    found = cached(version, arch)
    if found is not None:
        return found
    name, digest = wheel(version, arch)
    target = cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"smg=={version} --hash=sha256:{digest}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
               "--only-binary=:all:", "--platform", PLATFORMS[arch], "--implementation", "cp", "--abi", "abi3",
               "--python-version", "3.11", "-d", tmp, "-r", str(req)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        got = Path(tmp) / name
        if done.returncode != 0 or not got.is_file():
            raise RuntimeError(f"could not download {name} (pip exit {done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()[-800:]}")
        if sha256_file(got) != digest:
            raise RuntimeError(f"{name}: sha256 {sha256_file(got)} is not the pinned {digest}")
        got.replace(target / name)
    return target / name


def main(argv: list[str]) -> int:
    version = os.environ.get("SFL_ROUTER_VERSION", next(iter(WHEELS)))
    for arch in argv or list(WHEELS[version]):
        print(f"{fetch(version, arch)} (smg {version}, {arch}, sha256 verified)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
