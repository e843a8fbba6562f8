#!/usr/bin/env python3
"""sfl_fingerprint.py: a node's fingerprint (kernel, GPU driver, CX7 firmware, Docker, and the served
image's ID, engine and NCCL versions), read by one shell command and parsed here.

One program for both readers, standard library only:
- the deploy's Fingerprint fact (roles/fingerprint/facts.py) runs fingerprint_command over SSH and
  parses its lines with parse_fingerprint: the table and the refusal at prepare;
- on each node (roles/fingerprint, monitoring on), sparkfleet-fingerprint-metrics.timer runs this
  file: it reads the image the node's engine container runs now, the same command and parse, and
  writes sparkfleet_fingerprint_info for the node exporter's textfile collector, so the fleet's
  fingerprint is seen live, not only when a deploy runs.
  sfl_fingerprint.py --netdev NETDEV --engine ENGINE --container NAME --textfile PATH
"""
import argparse
import os
import shlex
import subprocess
import sys

# Where pip puts an engine and NCCL's wheel in the images DGX Spark recipes build: the system
# Python (NGC and CUDA bases), and a venv under /opt (uv- and conda-based recipes).
SITE_DIRS = ("usr/local/lib/python3*/*-packages", "usr/lib/python3*/*-packages", "opt/*/lib/python3*/site-packages")
# A system NCCL (a .deb from NVIDIA's repository or built from source) is a versioned file.
_NCCL_LIBS = ("usr/lib/*-linux-gnu/libnccl.so.2.*", "usr/local/lib/libnccl.so.2.*")
_ENV_KEYS = ("NCCL_VERSION", "VLLM_VERSION", "SGLANG_VERSION")


def _layer_globs(engine: str) -> list[str]:
    return [f"{site}/{name}-*.dist-info" for site in SITE_DIRS for name in (engine, "nvidia_nccl_cu*")] + list(_NCCL_LIBS)


def fingerprint_command(netdev: str, ref: str, engine: str) -> str:
    """The one shell command that prints a node's fingerprint (parse_fingerprint reads its lines)."""
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


def dist_info(name: str) -> tuple[str, str] | None:
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
    # key=value lines (as sparkfleet.keyvalue reads them: a file the nodes run cannot import it)
    raw = {key.strip(): value.strip() for key, sep, value in (line.partition("=") for line in plain) if sep}
    out = {k: raw.get(k) or None for k in ("kernel", "gpu_driver", "cx7_firmware", "docker")}
    if out["cx7_firmware"]:
        out["cx7_firmware"] = out["cx7_firmware"].split()[0]  # ethtool adds the board's PSID: not firmware
    out["image_id"] = raw.get("id") or None
    engines, pip_nccl, lib_nccl = [], [], []
    for name in visible_files(layers):
        info = dist_info(name)
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


def metrics_text(fingerprint: dict) -> str:
    """One info series: every field a label ('' when absent)."""
    def label(value) -> str:  # the exposition format's escaping (sparkfleet.model.monitoring.metric_label)
        return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    labels = ",".join(f'{k}="{label(fingerprint.get(k) or "")}"' for k in FIELDS)
    return ("# HELP sparkfleet_fingerprint_info This node's fingerprint now: kernel, GPU driver, CX7 firmware, Docker, "
            "and the image its engine container runs, with its engine and NCCL versions.\n"
            "# TYPE sparkfleet_fingerprint_info gauge\n"
            f"sparkfleet_fingerprint_info{{{labels}}} 1\n")


FIELDS = ("kernel", "gpu_driver", "cx7_firmware", "docker", "image_id", "engine", "nccl")



NOT_ROOT_ONLY = "not a root-only directory: refused"


def root_only_dir(path):
    """A descriptor of directory `path`, made when absent one component at a time (mkdir relative to its
    parent's descriptor, never through a symlink: O_NOFOLLOW), every directory of it from / down owned
    by root and writable by root alone (a sticky one on the way allowed, as /tmp); otherwise OSError
    naming the directory (issue 43 item 5; the rules of sparkfleet/root_paths.py)."""
    import errno
    import stat

    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags)
    where = ""
    parts = [p for p in path.split("/") if p]
    try:
        for i, name in enumerate(parts):
            where += "/" + name
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                sub = os.open(name, flags, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(e.errno, f"{where} is a symlink or not a directory, {NOT_ROOT_ONLY}") from None
                raise
            os.close(fd)
            fd = sub
            st = os.fstat(fd)
            last = i == len(parts) - 1
            if st.st_uid != 0 or (st.st_mode & 0o022 and (not st.st_mode & stat.S_ISVTX or last)):
                raise OSError(errno.EPERM, f"{where} is owned by uid {st.st_uid} with mode "
                                           f"{stat.S_IMODE(st.st_mode):o}, {NOT_ROOT_ONLY}")
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_textfile(path, text):
    """`path` holds `text` whole: a new file (O_CREAT|O_EXCL|O_NOFOLLOW, a random name no reader takes
    for a metrics file) in the root-only directory, renamed over it through that directory's descriptor."""
    import secrets

    directory, name = os.path.split(path)
    dfd = root_only_dir(directory)
    try:
        tmp = f".{name}.{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        try:
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), 0o644)
                f.write(text)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    finally:
        os.close(dfd)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--netdev", required=True)
    p.add_argument("--engine", required=True)
    p.add_argument("--container", required=True, help="the engine's container on this node")
    p.add_argument("--textfile", required=True)
    a = p.parse_args(argv)
    # the image the container runs (none: the image fields are empty)
    image = subprocess.run(["timeout", "10", "docker", "inspect", "--format", "{{.Image}}", a.container],
                           capture_output=True, text=True).stdout.strip()
    run = subprocess.run(["sh", "-c", fingerprint_command(a.netdev, image or "sparkfleet-no-image:none", a.engine)],
                         capture_output=True, text=True, timeout=120)
    text = metrics_text(parse_fingerprint(run.stdout.splitlines()))
    try:
        write_textfile(a.textfile, text)
    except OSError as err:
        print(f"sfl_fingerprint: could not write {a.textfile}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
