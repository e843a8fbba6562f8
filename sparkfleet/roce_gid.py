"""A rank's RoCE v2 GID index (NCCL_IB_GID_INDEX), read from sysfs on every deploy (RoceGids) and
picked as NCCL itself would pick it: roles/serving renders it into each rank's environment, and the
prewarm (roles/kernel_cache) and the collective speed proof (roles/fabric_speed) start the pair with
the same environment."""
import shlex

from pyinfra.api import FactBase
from pyinfra.api.exceptions import DeployError


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


def resolve_gid_index(node_host, node) -> int | None:
    """This rank's RoCE v2 GID index, read from sysfs on every deploy; None without RDMA, and None
    with both halves of the port (NCCL then chooses per HCA: sparkfleet/model/engine.py), once each
    half's address is the GID NCCL will choose on its HCA."""
    if not node.rdma_hca:
        return None
    indices = [half_gid_index(node_host, node, half) for half in node.fabric_halves if half.hca]
    return indices[0] if len(indices) == 1 else None


def half_gid_index(node_host, node, half) -> int:
    """The index of ::ffff:<the half's address>, RoCE v2, on the half's netdev; with both halves,
    also the one NCCL's own choice (NCCL_IB_GID_INDEX=-1) lands on, or the deploy stops."""
    entries = node_host.get_fact(RoceGids, hca=half.hca)
    index = pick_gid_index(entries, half.ip, half.netdev)
    seen = "; ".join(f"{e['index']}: {e['gid']} {e['type']} {e['ndev']}" for e in entries) or "no GIDs"
    if index is None:
        raise DeployError(
            f"{node.name}: no RoCE v2 GID for {half.ip} on {half.hca}/{half.netdev} "
            f"(sysfs shows {seen}); is the fabric address up?"
        )
    if len(node.rdma_hcas) > 1:
        chosen = nccl_auto_gid_index(entries)
        if chosen != index:
            raise DeployError(
                f"{node.name}: NCCL would choose GID index {chosen} on {half.hca}, not {index} ({half.ip} on "
                f"{half.netdev}): with two HCAs NCCL_IB_GID_INDEX is -1 and NCCL takes the first IPv4 RoCE v2 GID "
                f"(sysfs shows {seen}); remove the other IPv4 address from {half.netdev}"
            )
    return index
