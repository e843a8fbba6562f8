"""What a fact's own command would read on the machine a capture came from, derived from that capture.

A capture (tests/unit/fixtures/captures/) is what a person ran on a real DGX Spark; a fact often
reads the same state another way (sysfs instead of show_gids, `uname -r` instead of `uname -a`).
Each function here turns one capture into the input of one of sparkfleet's commands, by the rule
the tool that printed the capture follows (cited on each), so the command and its parser run on
values a real machine gave. Nothing is added that the capture does not hold, except where a
function says so (a masked digit, a netdev the capture leaves out) and why it cannot matter.
"""
import ipaddress
import os
import re
import stat
from pathlib import Path

# The kernel's names of a GID's type in sysfs gid_attrs/types (drivers/infiniband/core/cache.c,
# gid_type_str); show_gids prints the part from the "v" on (`grep -o "[Vv].*"`).
GID_TYPES = {"v1": "IB/RoCE v1", "v2": "RoCE v2"}
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _unmasked(gid: str) -> str:
    """A GID whose owner masked hex digits with x/X (the MAC-derived interface ID of a link-local GID)
    with "a" in their place: the GID pick never reads a link-local GID past its fe80::/64 prefix, and
    any digit but an all-zero interface ID (which show_gids would not print) keeps the table as shown."""
    return re.sub("[xX]", "a", gid)


def gids_from_show_gids(text: str) -> dict[str, list[dict]]:
    """`show_gids` -> {hca: [{"index", "type", "ndev", "gid"}]}, the entries sysfs holds for port 1.

    show_gids (Mellanox/mlnx-tools sbin/show_gids) prints, for every non-zero GID of every port, the
    files sparkfleet's RoceGids reads: gids/<i> (GID), gid_attrs/types/<i> (VER, "v1"/"v2" cut from
    "IB/RoCE v1"/"RoCE v2") and gid_attrs/ndevs/<i> (the last DEV column); IPv4 is derived from the
    GID and not needed."""
    out: dict[str, list[dict]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 6 or not parts[2].isdigit() or parts[1] != "1":
            continue  # the prompt, the header, n_gids_found=; port 1 only (a Spark's CX7 has one per device)
        hca, _, index, gid, *rest = parts
        ver, ndev = rest[-2], rest[-1]
        out.setdefault(hca, []).append(
            {"index": int(index), "type": GID_TYPES[ver], "ndev": ndev, "gid": _unmasked(gid)})
    return out


def gids_from_sysfs_listing(text: str, node: int, ndev: str) -> list[dict]:
    """The `index N  TYPE  GID  (Node1: XXXX)` listing of one device's gids/ on two Sparks
    (gid_index4_hole_sysfs_listing.txt) -> node 0's or node 1's entries, each GID in sysfs's form (8
    groups of 4 hex digits). An entry the listing shows empty ("空") reads as zeros in sysfs, as the
    kernel shows an unused slot, so it is left out here as RoceGids leaves it out. The listing names no
    netdev: `ndev` is the device's own (rocep1s0f0 is enp1s0f0np0 on every Spark: ibdev2netdev)."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*index (\d+)\s+(IB/RoCE v1|RoCE v2)\s+(\S+)(?:\s+\(Node1: ([0-9a-fA-F]{4})\))?", line)
        if not m:
            continue
        index, kind, gid, node1_tail = int(m[1]), m[2], _unmasked(m[3]), m[4]
        if node == 1 and node1_tail:  # the listing gives node 1's address as its last group only
            gid = gid.rsplit(":", 1)[0] + ":" + node1_tail
        out.append({"index": index, "type": kind, "ndev": ndev, "gid": ipaddress.IPv6Address(gid).exploded})
    return out


def write_gid_sysfs(root: Path, tables: dict[str, list[dict]], slots: int = 16) -> Path:
    """A sysfs tree under root (class/infiniband/<hca>/ports/1/...) holding `tables`: every slot's gids
    file (unused slots all zeros, as the kernel shows them; 10-15 sort between 1 and 2 as text, as on
    a Spark), and types/ndevs only for the entries that exist (reading an unused slot's fails)."""
    for hca, entries in tables.items():
        port = root / "class" / "infiniband" / hca / "ports" / "1"
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (port / sub).mkdir(parents=True, exist_ok=True)
        for i in range(max([slots] + [e["index"] + 1 for e in entries])):
            (port / "gids" / str(i)).write_text(ZERO_GID + "\n")
        for e in entries:
            (port / "gids" / str(e["index"])).write_text(e["gid"] + "\n")
            (port / "gid_attrs" / "types" / str(e["index"])).write_text(e["type"] + "\n")
            (port / "gid_attrs" / "ndevs" / str(e["index"])).write_text(e["ndev"] + "\n")
    return root


def command_output(text: str, command: str) -> list[str]:
    """The lines a shell session capture shows after `$ COMMAND` (or `user@host:~$ COMMAND`), up to the
    next prompt: what that command printed."""
    lines, out, inside = text.splitlines(), [], False
    for line in lines:
        prompt = re.match(r"^(?:\S+@\S+:\S*\$|\$|#) ?(.*)$", line)
        if prompt:
            if inside:
                break
            inside = prompt[1].strip() == command
            continue
        if inside:
            out.append(line)
    return out


def uname_release(uname_a: str) -> str:
    """`uname -r` from a `uname -a` line: its third field (uname(1) prints kernel name, node name,
    kernel release, ... in that order)."""
    return uname_a.split()[2]


def smi_query_value(csv_lines: list[str], field: str) -> str:
    """`nvidia-smi --query-gpu=FIELD --format=csv,noheader` from the output of a query of several fields
    with the header (`--format=csv`): the data row's value in FIELD's column (csv, ", " between values)."""
    header, row = csv_lines[0].split(", "), csv_lines[1].split(", ")
    return row[header.index(field)]


def ibstat_fw_ver(ibstat: str, ca: str) -> str:
    """The `fw_ver` sysfs file of RDMA device `ca`: ibstat's "Firmware version" of that CA, which it
    reads from /sys/class/infiniband/<ca>/fw_ver (rdma-core libibumad umad.c, SYS_CA_FW_VERS)."""
    blocks = re.split(r"^CA '", ibstat, flags=re.M)
    [block] = [b for b in blocks if b.startswith(f"{ca}'")]
    return re.search(r"Firmware version: (\S+)", block)[1]


def docker_server_version(dpkg_version: str) -> str:
    """`docker version --format '{{.Server.Version}}'` of an engine installed as docker-ce DPKG_VERSION:
    Docker's packages are versioned EPOCH:UPSTREAM-REVISION~DISTRO (5:29.2.1-1~ubuntu.24.04~noble), the
    daemon reports UPSTREAM."""
    return dpkg_version.split(":", 1)[-1].split("-", 1)[0]


def ip_oneline_ipv4(ip_addr: str) -> list[str]:
    """`ip -o -4 addr show` from `ip addr` text: each IPv4 address record on one line, "N: NAME" and the
    record's lines joined with '\\' for their line feeds (ip(8), -oneline), the "inet" line first."""
    out, name = [], None
    lines = ip_addr.splitlines()
    for i, line in enumerate(lines):
        head = re.match(r"^(\d+): ([^:@ ]+)[:@]", line)
        if head:
            name = f"{head[1]}: {head[2]}"
            continue
        if name and line.startswith("    inet "):
            tail = lines[i + 1] if i + 1 < len(lines) and lines[i + 1].startswith("       valid_lft") else ""
            out.append(f"{name}    {line.strip()}" + (f"\\{tail}" if tail else ""))
    return out


def ip_json_link(ip_addr: str, netdev: str) -> list[dict]:
    """`ip -j addr show dev NETDEV` from `ip addr` text: the fields sparkfleet's parse_link reads, as
    iproute2's JSON names them (ifname, flags, mtu, operstate, addr_info: family, local, prefixlen);
    [] when the text has no such netdev (ip prints [] for none)."""
    lines = ip_addr.splitlines()
    for i, line in enumerate(lines):
        head = re.match(r"^\d+: ([^:@ ]+)(?:@\S+)?: <([^>]*)> mtu (\d+) .*?state (\S+)", line)
        if not head or head[1] != netdev:
            continue
        addrs = []
        for rest in lines[i + 1:]:
            if re.match(r"^\d+: ", rest):
                break
            a = re.match(r"^\s+(inet6?) ([0-9a-f.:]+)/(\d+)", rest)
            if a:
                addrs.append({"family": a[1], "local": a[2], "prefixlen": int(a[3])})
        return [{"ifname": head[1], "flags": head[2].split(","), "mtu": int(head[3]), "operstate": head[4],
                 "addr_info": addrs}]
    return []


def stand_in(bin_dir: Path, name: str, output: str | None, first_arg: str | None = None) -> None:
    """A program `name` in bin_dir that prints `output` when its first argument is `first_arg` (any, when
    None) and fails otherwise, or always when output is None: what a fact's command finds on PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    data = bin_dir / f"{name}.out"
    if output is None:
        body = "exit 1\n"
    else:
        data.write_text(output if output.endswith("\n") else output + "\n")
        guard = f'[ "$1" = {first_arg} ] || exit 1\n' if first_arg else ""
        body = f"{guard}cat {data}\n"
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def path_with(bin_dir: Path) -> dict:
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
