"""Facts of roles/serving: the unit's state, the head's health, a rank's RoCE GIDs."""
import shlex

from pyinfra.api import FactBase

from sparkfleet.keyvalue import key_values


class UnitState(FactBase):
    """{"active": ..., "enabled": ..., "container": running|missing|<status>} of a sparkfleet unit."""

    def command(self, unit: str) -> str:
        u = shlex.quote(unit)
        return (
            f"echo active=$(systemctl is-active {u}.service 2>/dev/null); "
            f"echo enabled=$(systemctl is-enabled {u}.service 2>/dev/null); "
            f"echo container=$(docker inspect --format '{{{{.State.Status}}}}' {u} 2>/dev/null || echo missing)"
        )

    def process(self, output):
        return key_values(output)


def is_serving(unit_state: dict) -> bool:
    """The rank serves: its unit is active and its container running."""
    return unit_state.get("active") == "active" and unit_state.get("container") == "running"


def health_command(port: int, path: str = "/health") -> str:
    return f"curl -fsS -m 5 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{int(port)}{path} 2>/dev/null || true"


class HeadHealth(FactBase):
    """True when the head answers 200 on /health."""

    def command(self, port: int) -> str:
        return health_command(port)

    def process(self, output):
        return "".join(output).strip() == "200"


def parse_gids(lines: list[str]) -> list[dict]:
    """`index type ndev gid` lines (from RoceGids) -> [{"index", "type", "ndev", "gid"}]."""
    out = []
    for line in lines:
        parts = line.split("\t")
        if len(parts) == 4 and parts[0].isdigit():
            out.append({"index": int(parts[0]), "type": parts[1], "ndev": parts[2], "gid": parts[3]})
    return out


def ipv4_mapped_gid(ipv4: str) -> str:
    """The GID RoCE v2 gives an IPv4 address: ::ffff:a.b.c.d, as sysfs prints it (8 groups of 4 hex digits)."""
    a, b, c, d = (int(x) for x in ipv4.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a * 256 + b:04x}:{c * 256 + d:04x}"


def pick_gid_index(entries: list[dict], ipv4: str, netdev: str) -> int | None:
    """The index whose GID is ::ffff:<ipv4>, type RoCE v2, on the fabric netdev (NCCL_IB_GID_INDEX)."""
    want = ipv4_mapped_gid(ipv4)
    for e in entries:
        if e["gid"].lower() == want and e["type"].strip().lower() == "roce v2" and e["ndev"] == netdev:
            return e["index"]
    return None


def nccl_auto_gid_index(entries: list[dict]) -> int | None:
    """The index NCCL chooses on one HCA with NCCL_IB_GID_INDEX=-1, NCCL_IB_ADDR_FAMILY=AF_INET and
    NCCL_IB_ROCE_VERSION_NUM=2, no NCCL_IB_ADDR_RANGE (NVIDIA/nccl v2.28.9-1 src/transport/net_ib.cc
    ncclIbGetGidIndex/ncclUpdateGidIndex): the lowest index whose GID is valid (not zero, not
    fe80::/64 link-local: validGid), IPv4-mapped (getGidAddrFamily) and of type RoCE v2; a later
    match of the same version never replaces it."""
    for e in sorted(entries, key=lambda e: e["index"]):
        gid = e["gid"].lower()
        if gid.startswith("fe80:") or set(gid.replace(":", "")) <= {"0"}:
            continue
        if gid.startswith("0000:0000:0000:0000:0000:ffff:") and e["type"].strip().lower() == "roce v2":
            return e["index"]
    return None


class RoceGids(FactBase):
    """Every populated GID of port 1 of an RDMA device, from sysfs (it can move after a link event)."""

    def command(self, hca: str) -> str:
        base = f"/sys/class/infiniband/{shlex.quote(hca)}/ports/1"
        return (
            f"for f in {base}/gids/*; do i=${{f##*/}}; g=$(cat $f 2>/dev/null) || continue; "
            f"[ \"$g\" = 0000:0000:0000:0000:0000:0000:0000:0000 ] && continue; "
            f"t=$(cat {base}/gid_attrs/types/$i 2>/dev/null); n=$(cat {base}/gid_attrs/ndevs/$i 2>/dev/null); "
            f"printf '%s\\t%s\\t%s\\t%s\\n' \"$i\" \"$t\" \"$n\" \"$g\"; done"
        )

    def process(self, output):
        return parse_gids(list(output))
