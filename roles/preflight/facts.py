"""One fact, one SSH round trip: everything preflight needs to know about a node."""
import shlex

from pyinfra.api import FactBase

from sparkfleet.keyvalue import key_values

KIB_PER_GIB = 1024 * 1024


def parse_node_facts(lines: list[str]) -> dict:
    """key=value lines -> typed facts (sizes in GiB). Missing keys stay absent."""
    raw = key_values(lines)
    out: dict = {k: raw[k] for k in ("os", "kernel", "arch", "disk_path", "gpu", "netplan", "renderer_state") if k in raw}
    for key in ("mem_total", "mem_available", "disk_free"):
        if raw.get(f"{key}_kib", "").isdigit():
            out[f"{key}_gib"] = int(raw[f"{key}_kib"]) / KIB_PER_GIB
    if raw.get("netdev_mtu", "").isdigit():
        out["netdev_mtu"] = int(raw["netdev_mtu"])
        out["netdev_state"] = raw.get("netdev_state", "unknown")
    return out


class NodeFacts(FactBase):
    """OS, kernel, arch, memory (/proc/meminfo: nvidia-smi cannot see unified memory), free disk
    under the data dir (its nearest existing parent on a fresh node), GPU, fabric netdev, netplan.
    The renderer's unit state is FabricConfigs' (read beside this fact, not twice)."""

    def command(self, data_dir: str, netdev: str) -> str:
        d, n = shlex.quote(data_dir), shlex.quote(netdev)
        return "\n".join(
            [
                '. /etc/os-release 2>/dev/null; echo "os=${PRETTY_NAME:-unknown}"',
                'echo "kernel=$(uname -r)"; echo "arch=$(uname -m)"',
                "awk '/^MemTotal:/ {print \"mem_total_kib=\" $2} /^MemAvailable:/ {print \"mem_available_kib=\" $2}' /proc/meminfo",
                f'd={d}; while [ ! -d "$d" ]; do d=$(dirname "$d"); done; echo "disk_path=$d"',
                "df -Pk \"$d\" | awk 'NR==2 {print \"disk_free_kib=\" $4}'",
                'if command -v nvidia-smi >/dev/null 2>&1; then'
                ' echo "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)";'
                " else echo gpu=; fi",
                f'if [ -e /sys/class/net/{n} ]; then echo "netdev_mtu=$(cat /sys/class/net/{n}/mtu)";'
                f' echo "netdev_state=$(cat /sys/class/net/{n}/operstate)"; fi',
                'echo "netplan=$(command -v netplan || true)"',
            ]
        )

    def process(self, output):
        return parse_node_facts(list(output))
