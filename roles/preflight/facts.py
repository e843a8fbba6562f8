"""One fact, one SSH round trip: everything preflight needs to know about a node."""
import shlex

from pyinfra.api import FactBase

from sparkfleet.keyvalue import key_values

KIB_PER_GIB = 1024 * 1024


def parse_node_facts(lines: list[str]) -> dict:
    """key=value lines -> typed facts (sizes in GiB). Missing keys stay absent."""
    raw = key_values(lines)
    out: dict = {k: raw[k] for k in ("os", "kernel", "arch", "disk_path", "gpu", "netplan", "renderer_state", "cmdline")
                 if k in raw}
    for key in ("mem_total", "mem_available", "disk_free", "cma_total", "cma_free"):
        if raw.get(f"{key}_kib", "").isdigit():
            out[f"{key}_gib"] = int(raw[f"{key}_kib"]) / KIB_PER_GIB
    if raw.get("netdev_mtu", "").isdigit():
        out["netdev_mtu"] = int(raw["netdev_mtu"])
        out["netdev_state"] = raw.get("netdev_state", "unknown")
    if raw.get("twin_mtu", "").isdigit():
        out["twin_mtu"] = int(raw["twin_mtu"])
        out["twin_state"] = raw.get("twin_state", "unknown")
    for key in ("bios_version", "bios_date"):
        if raw.get(key):
            out[key] = raw[key]
    hcas = {}
    for line in lines:
        if line.startswith("hca\t"):
            name, *values = line.split("\t")[1:]
            present, state, width, max_width, speed, fw = (values + [""] * 6)[:6]
            hcas[name] = {"present": present == "1", "state": state, "width": int(width) if width.isdigit() else None,
                          "max_width": int(max_width) if max_width.isdigit() else None, "speed": speed, "fw": fw}
    if hcas:
        out["hcas"] = hcas
    return out


def _hca_line(hca: str) -> str:
    """`hca NAME PRESENT STATE WIDTH MAX_WIDTH SPEED FW`, tab-separated: the RDMA device's port 1
    state ("4: ACTIVE"), its PCIe controller's link (current_link_width, max_link_width,
    current_link_speed) and firmware, from sysfs."""
    h = shlex.quote(hca)
    base = f"/sys/class/infiniband/{h}"
    return (f'if [ -e {base} ]; then printf "hca\\t%s\\t1\\t%s\\t%s\\t%s\\t%s\\t%s\\n" {h} '
            f'"$(cat {base}/ports/1/state 2>/dev/null)" "$(cat {base}/device/current_link_width 2>/dev/null)" '
            f'"$(cat {base}/device/max_link_width 2>/dev/null)" "$(cat {base}/device/current_link_speed 2>/dev/null)" '
            f'"$(cat {base}/fw_ver 2>/dev/null)"; else printf "hca\\t%s\\t0\\n" {h}; fi')


class NodeFacts(FactBase):
    """OS, kernel and its command line, arch, memory (/proc/meminfo: nvidia-smi cannot see unified
    memory; CmaTotal/CmaFree, the tell of a known-bad kernel), free disk under the data dir (its nearest
    existing parent on a fresh node), GPU, fabric netdev, netplan. The renderer's unit
    state is FabricConfigs' (read beside this fact, not twice)."""

    def command(self, data_dir: str, netdev: str, twin: str = "", hcas: str = "") -> str:
        """twin: the port's second netdev ("" none); hcas: its RDMA devices, space-separated."""
        d, n, t = shlex.quote(data_dir), shlex.quote(netdev), shlex.quote(twin)
        port = ([f'if [ -e /sys/class/net/{t} ]; then echo "twin_mtu=$(cat /sys/class/net/{t}/mtu)";'
                 f' echo "twin_state=$(cat /sys/class/net/{t}/operstate)"; fi'] if twin else [])
        if hcas:
            port += [_hca_line(h) for h in hcas.split()]
            port += ['echo "bios_version=$(cat /sys/class/dmi/id/bios_version 2>/dev/null)"',
                     'echo "bios_date=$(cat /sys/class/dmi/id/bios_date 2>/dev/null)"']
        return "\n".join(
            [
                '. /etc/os-release 2>/dev/null; echo "os=${PRETTY_NAME:-unknown}"',
                'echo "kernel=$(uname -r)"; echo "arch=$(uname -m)"; echo "cmdline=$(cat /proc/cmdline)"',
                "awk '/^MemTotal:/ {print \"mem_total_kib=\" $2} /^MemAvailable:/ {print \"mem_available_kib=\" $2}"
                " /^CmaTotal:/ {print \"cma_total_kib=\" $2} /^CmaFree:/ {print \"cma_free_kib=\" $2}' /proc/meminfo",
                f'd={d}; while [ ! -d "$d" ]; do d=$(dirname "$d"); done; echo "disk_path=$d"',
                "df -Pk \"$d\" | awk 'NR==2 {print \"disk_free_kib=\" $4}'",
                'if command -v nvidia-smi >/dev/null 2>&1; then'
                ' echo "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)";'
                " else echo gpu=; fi",
                f'if [ -e /sys/class/net/{n} ]; then echo "netdev_mtu=$(cat /sys/class/net/{n}/mtu)";'
                f' echo "netdev_state=$(cat /sys/class/net/{n}/operstate)"; fi',
                'echo "netplan=$(command -v netplan || true)"',
                *port,
            ]
        )

    def process(self, output):
        return parse_node_facts(list(output))
