"""One fact, one SSH round trip: everything preflight needs to know about a node."""
import re
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase

from sparkfleet.keyvalue import key_values

KIB_PER_GIB = 1024 * 1024


@dataclass(frozen=True)
class PortHalf:
    """One half of a CX7 port as the node shows it: a Spark's QSFP port is two PCIe endpoints, one per
    controller (`enp1s0f1np1`/`rocep1s0f1` and `enP2p1s0f1np1`/`roceP2p1s0f1` for port 1). `port`: the
    physical port; `controller`: the PCIe controller (comparable within one reading only); `up`: a
    live cable (carrier, as `ibdev2netdev` says Up, or the RDMA port ACTIVE); `state`: as read."""
    port: str
    controller: str
    netdev: str
    hca: str | None
    up: bool
    state: str


# The names systemd and the kernel give a CX7 half: enp1s0f1np1 (controller enp1s0, function 1, physical
# port 1) and rocep1s0f1 (its RDMA device).
_NETDEV_NAME = re.compile(r"^(?P<controller>.+)f(?P<function>[0-9]+)np(?P<port>[0-9]+)$")


def _named(netdev: str) -> tuple[str, str] | None:
    """(port, controller) from a netdev's name, or None for a name of another shape (the lab's veth)."""
    m = _NETDEV_NAME.match(netdev)
    return (m["port"], m["controller"]) if m else None


def parse_ibdev2netdev(lines: list[str]) -> list[PortHalf]:
    """`ibdev2netdev` output (`rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)`): Up is the netdev's carrier
    (Mellanox/mlnx-tools ofed_scripts/ibdev2netdev: get_link_state). A prompt or any other line is skipped."""
    out = []
    for line in lines:
        m = re.match(r"^\s*(\S+) port \d+ ==> (\S+) \((\w+)\)\s*$", line)
        named = m and _named(m[2])
        if named:
            out.append(PortHalf(named[0], named[1], m[2], m[1], m[3] == "Up", m[3]))
    return out


def parse_rdma_link(lines: list[str]) -> list[PortHalf]:
    """`rdma link` output (`link rocep1s0f0/1 state ACTIVE physical_state LINK_UP netdev enp1s0f0np0`)."""
    out = []
    for line in lines:
        m = re.match(r"^\s*link (\S+)/\d+ state (\S+) physical_state (\S+) netdev (\S+)", line)
        named = m and _named(m[4])
        if named:
            out.append(PortHalf(named[0], named[1], m[4], m[1], m[2] == "ACTIVE", f"{m[2]} {m[3]}"))
    return out


def parse_port_lines(lines: list[str]) -> list[PortHalf]:
    """NodeFacts' `port` lines (PORT_LINES reads them from sysfs, as ibdev2netdev does): `port HCA NETDEV
    PCI PHYS_PORT_NAME CARRIER OPERSTATE RDMA_STATE`, tab-separated. The physical port is the netdev's
    phys_port_name (`p1`), else its name's; the controller its PCI address without the function."""
    out = []
    for line in lines:
        if not line.startswith("port\t"):
            continue
        hca, netdev, pci, phys, carrier, operstate, rdma = (line.split("\t")[1:] + [""] * 7)[:7]
        named = _named(netdev)
        m = re.fullmatch(r"p([0-9]+)", phys)
        port = m[1] if m else named[0] if named else None
        controller = pci.rsplit(".", 1)[0] if pci else named[1] if named else None
        if port is None or controller is None:
            continue
        up = carrier == "1" or "ACTIVE" in rdma.upper()
        state = f"carrier {carrier or '-'}, {operstate or '-'}, {rdma or '-'}"
        out.append(PortHalf(port, controller, netdev, hca or None, up, state))
    return out


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
    ports = parse_port_lines(lines)
    if ports:
        out["ports"] = ports
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


# Every RDMA device's netdev, both ports: which one the cable is in (parse_port_lines). The netdev is the
# device's PCI function's (device/net), its state as ibdev2netdev and `rdma link` read it.
PORT_LINES = (
    'for h in /sys/class/infiniband/*; do for n in "$h"/device/net/*; do [ -e "$n" ] || continue; n=${n##*/};'
    ' p=$(readlink -f "$h/device");'
    " printf 'port\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' \"${h##*/}\" \"$n\" \"${p##*/}\""
    ' "$(cat /sys/class/net/$n/phys_port_name 2>/dev/null)" "$(cat /sys/class/net/$n/carrier 2>/dev/null)"'
    ' "$(cat /sys/class/net/$n/operstate 2>/dev/null)" "$(cat "$h/ports/1/state" 2>/dev/null)"; done; done'
)


class NodeFacts(FactBase):
    """OS, kernel and its command line, arch, memory (/proc/meminfo: nvidia-smi cannot see unified
    memory; CmaTotal/CmaFree, the tell of a known-bad kernel), free disk under the data dir (its nearest
    existing parent on a fresh node), GPU, fabric netdev, both CX7 ports, netplan. The renderer's unit
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
                PORT_LINES,
                *port,
            ]
        )

    def process(self, output):
        return parse_node_facts(list(output))
