"""The fingerprint of a node: one shell command, one round trip, no container started. The command
and its parser are roles/fingerprint/sfl_fingerprint.py's, which each node also runs for its metrics."""
from pyinfra.api import FactBase

from roles.fingerprint.sfl_fingerprint import fingerprint_command, parse_fingerprint, visible_files  # noqa: F401
from roles.kernel_cache.engine_key import layers_command, parse_layers


class Fingerprint(FactBase):
    """kernel, GPU driver, CX7 firmware, Docker, and the image `ref`'s ID, engine and NCCL versions.

    Every source is read without starting anything that could hang or change state:
    - gpu_driver: /proc/driver/nvidia/version is the loaded kernel module, which is what CUDA runs
      against; nvidia-smi (bounded) only where /proc does not show it.
    - cx7_firmware: the fabric netdev's own RDMA device in sysfs (fw_ver, as `ethtool -i` prints it
      without the board's PSID); ethtool only where sysfs has none. A veth (the lab) has neither.
    - docker: the running daemon's version (what runs the containers), not the installed binary's.
    - engine, nccl: read from the image's layers on disk (overlay2 only: other storage drivers show
      no layer directories), top layer first, so a deletion or an upgrade in a later layer wins.
      The wheels' dist-info name the exact versions pip installed; an image's ENV is only a
      fallback, printed as such: a CUDA base image's NCCL_VERSION stays set after a recipe builds
      its own NCCL over it. Both a pip NCCL and a system libnccl are shown ("pip 2.27.3, lib
      2.28.9") when an image has both: which one the engine loads depends on how its torch was
      built (pip's torch loads the wheel's, NGC's the system one), and either changing matters.
      `docker run` would be exact but starts a container per node per deploy. Reading the layers
      needs root (sparkfleet connects as root); without it they read as absent on every node.
    """

    def command(self, netdev: str, ref: str, engine: str) -> str:
        return fingerprint_command(netdev, ref, engine)

    def process(self, output):
        return parse_fingerprint(list(output))


class EngineVersions(FactBase):
    """The engine (name and version, from the dist-info in the image's layers, as Fingerprint reads
    it) of the image the head's unit runs now and of the image this run serves (`ref`): what the
    plan prints as the engine's move ("vllm 0.31.0 -> 0.32.0"); and what in that image the engine
    folds into its compile-cache keys, read from the same layers in the same round trip (the
    kernel-cache generation's key: roles/kernel_cache/engine_key.py). {"running": str | None, "image":
    str | None, "layers": dict | None}; None where there is no such container or image yet (the run
    builds it), and "layers" None too from a record taken before it was read (a capture bundle)."""

    def command(self, netdev: str, unit: str, ref: str, engine: str) -> str:
        running = fingerprint_command(netdev, "$r", engine).replace("'$r'", '"$r"')
        return "\n".join([
            f"r=$(docker inspect --format '{{{{.Image}}}}' {unit} 2>/dev/null || true)",
            'echo "== running"',
            'if [ -n "$r" ]; then', running, "fi",
            'echo "== image"',
            fingerprint_command(netdev, ref, engine),
            'echo "== layers"',
            layers_command(ref, engine),
        ])

    def process(self, output):
        parts, current = {"running": [], "image": [], "layers": []}, None
        for line in output:
            if line.startswith("== "):
                current = line[3:].strip()
            elif current in parts:
                parts[current].append(line)
        out = {k: parse_fingerprint(parts[k])["engine"] for k in ("running", "image")}
        out["layers"] = parse_layers(parts["layers"])
        return out
