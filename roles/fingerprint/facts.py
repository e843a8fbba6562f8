"""The fingerprint of a node: one shell command, one round trip, no container started."""
import shlex

from pyinfra.api import FactBase

from sparkfleet.keyvalue import key_values

# Where pip puts an engine and NCCL's wheel in the images DGX Spark recipes build: the system
# Python (NGC and CUDA bases), and a venv under /opt (uv- and conda-based recipes).
_SITE_DIRS = ("usr/local/lib/python3*/*-packages", "usr/lib/python3*/*-packages", "opt/*/lib/python3*/site-packages")
# A system NCCL (a .deb from NVIDIA's repository or built from source) is a versioned file.
_NCCL_LIBS = ("usr/lib/*-linux-gnu/libnccl.so.2.*", "usr/local/lib/libnccl.so.2.*")
_ENV_KEYS = ("NCCL_VERSION", "VLLM_VERSION", "SGLANG_VERSION")


def _layer_globs(engine: str) -> list[str]:
    return [f"{site}/{name}-*.dist-info" for site in _SITE_DIRS for name in (engine, "nvidia_nccl_cu*")] + list(_NCCL_LIBS)


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
        if not engine.isidentifier():  # it is part of a glob, unquoted
            raise ValueError(f"engine {engine!r}: a package name (vllm, sglang)")
        n, r = shlex.quote(netdev), shlex.quote(ref)
        inspect = ("id={{.Id}}{{println}}layers={{with .GraphDriver.Data}}{{index . \"UpperDir\"}}:"
                   "{{index . \"LowerDir\"}}{{end}}{{println}}{{range .Config.Env}}env_{{println .}}{{end}}")
        env = "|".join(_ENV_KEYS)
        globs = " ".join(f'"$d"/{g}' for g in _layer_globs(engine))
        return "\n".join([
            'echo "kernel=$(uname -r)"',
            "v=$(awk '/NVRM version/ {for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+[.][0-9]+([.][0-9]+)?$/) {print $i; exit}}'"
            " /proc/driver/nvidia/version 2>/dev/null)",
            'if [ -z "$v" ] && command -v nvidia-smi >/dev/null 2>&1; then'
            " v=$(timeout 10 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1); fi",
            'echo "gpu_driver=$v"',
            f"v=$(cat /sys/class/net/{n}/device/infiniband/*/fw_ver 2>/dev/null | head -n1)",
            'if [ -z "$v" ] && command -v ethtool >/dev/null 2>&1; then'
            f" v=$(ethtool -i {n} 2>/dev/null | sed -n 's/^firmware-version: *//p'); fi",
            'echo "cx7_firmware=$v"',
            "echo \"docker=$(timeout 10 docker version --format '{{.Server.Version}}' 2>/dev/null)\"",
            f"i=$(timeout 10 docker image inspect --format '{inspect}' {r} 2>/dev/null)",
            'if [ -n "$i" ]; then',
            f"  printf '%s\\n' \"$i\" | grep -E '^(id=|env_({env})=)'",
            "  l=$(printf '%s\\n' \"$i\" | sed -n 's/^layers=//p'); k=0",
            '  o=$IFS; IFS=:; set -- $l; IFS=$o',
            # A whiteout (a character device) is how overlay2 records a deletion in a later layer.
            # An empty layer path (an image of one layer has no LowerDir) must not become the node's own /.
            f'  for d do k=$((k + 1)); [ -n "$d" ] || continue; for f in {globs}; do',
            '    if [ -c "$f" ]; then echo "layer $k whiteout ${f##*/}"; elif [ -e "$f" ]; then echo "layer $k has ${f##*/}"; fi',
            "  done; done",
            "fi",
            "true",
        ])

    def process(self, output):
        return parse_fingerprint(list(output))


def _dist_info(name: str) -> tuple[str, str] | None:
    """'vllm-0.11.0.dist-info' -> ('vllm', '0.11.0'); wheel names have no '-' in either part."""
    if not name.endswith(".dist-info") or "-" not in name:
        return None
    package, version = name[: -len(".dist-info")].split("-", 1)
    return package.lower(), version


def visible_files(layers: list[tuple[int, str, str]]) -> list[str]:
    """The names of the image's merged filesystem: (layer, 'has'|'whiteout', name), layer 1 on top."""
    hidden, seen = set(), []
    for _, kind, name in sorted(layers, key=lambda entry: entry[0]):
        if name in hidden or name in seen:
            continue
        if kind == "whiteout":
            hidden.add(name)
        else:
            seen.append(name)
    return seen


def parse_fingerprint(lines: list[str]) -> dict:
    """The fact's lines -> {field: value or None}; the image's fields are None when it is absent."""
    layers, plain = [], []
    for line in lines:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "layer" and parts[1].isdigit():
            layers.append((int(parts[1]), parts[2], parts[3]))
        else:
            plain.append(line)
    raw = key_values(plain)
    out = {k: raw.get(k) or None for k in ("kernel", "gpu_driver", "cx7_firmware", "docker")}
    if out["cx7_firmware"]:
        out["cx7_firmware"] = out["cx7_firmware"].split()[0]  # ethtool adds the board's PSID: not firmware
    out["image_id"] = raw.get("id") or None
    engines, pip_nccl, lib_nccl = [], [], []
    for name in visible_files(layers):
        info = _dist_info(name)
        if info and info[0].startswith("nvidia_nccl_cu"):
            pip_nccl.append(info[1])
        elif info:
            engines.append(f"{info[0]} {info[1]}")
        elif name.startswith("libnccl.so.2."):
            lib_nccl.append(name[len("libnccl.so."):])
    env_engine = [f"{k.split('_')[0].lower()} {raw[f'env_{k}']} (env)" for k in ("VLLM_VERSION", "SGLANG_VERSION")
                  if raw.get(f"env_{k}")]
    nccl = [f"pip {v}" for v in sorted(set(pip_nccl))] + [f"lib {v}" for v in sorted(set(lib_nccl))]
    if not nccl and raw.get("env_NCCL_VERSION"):
        nccl = [f"env {raw['env_NCCL_VERSION']}"]
    has_image = out["image_id"] is not None
    out["engine"] = (", ".join(sorted(set(engines)) or env_engine) or None) if has_image else None
    out["nccl"] = (", ".join(nccl) or None) if has_image else None
    return out
