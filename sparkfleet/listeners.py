"""The listening sockets of a node, as `ss -l...p` prints them: (protocol, address, port, processes).

One parser for every reader: the doctor's Listeners fact (roles/api_proxy/checks.py, `ss -Hltnp`) and
the listener table's comparison (tests/listeners.py, `ss -ltnup`). It takes ss's output with or
without its header line (-H), with or without the Netid column (ss prints it only when more than one
socket type is asked for: `-ltnup` has it, `-ltnp` has not), and lines starting with `#` (a capture's
own header) are skipped.

An address is given as ss prints it less its decorations: IPv6 brackets and an interface scope
(`127.0.0.53%lo` -> `127.0.0.53`, `[::]` -> `::`); `*` stays `*` (ss's word for every address of both
families). A process is its name as ss shows it: the kernel's comm, 15 characters at most
(`prometheus-node-exporter` is `prometheus-node`); a socket ss shows no process for has none.
"""
import re
from typing import NamedTuple

PROTOCOLS = ("tcp", "udp")
# users:(("haproxy",pid=8,fd=7),("haproxy",pid=9,fd=7)): each holder's name (ss's own quoting)
_PROCESS = re.compile(r'\("([^"]*)",pid=')


class Socket(NamedTuple):
    proto: str  # tcp or udp
    address: str  # 0.0.0.0, ::, *, 127.0.0.1, 198.19.77.1, ...
    port: int
    processes: tuple[str, ...]  # every holder's name, in ss's order; () when ss shows none

    @property
    def process(self) -> str:
        """The first holder's name, or `?` when ss shows none (not root, or a kernel socket)."""
        return self.processes[0] if self.processes else "?"


def split_address(local: str) -> tuple[str, int] | None:
    """`198.19.77.1:873` -> ('198.19.77.1', 873); `[::]:22` -> ('::', 22); `127.0.0.53%lo:53` ->
    ('127.0.0.53', 53); `*:22` -> ('*', 22). None when there is no numeric port (`*:*`)."""
    address, sep, port = local.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return address.strip("[]").split("%", 1)[0], int(port)


def parse_ss(lines, default_proto: str = "tcp") -> list[Socket]:
    """Every listening socket of `ss -l[t][u]n[p]`'s output (text or lines). `default_proto`: the
    protocol of lines without a Netid column (ss prints none when one type was asked for)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    sockets = []
    for line in lines:
        fields = line.split()
        if not fields or fields[0].startswith("#") or fields[0] in ("Netid", "State"):
            continue
        proto = default_proto
        if fields[0] in PROTOCOLS:
            proto, fields = fields[0], fields[1:]
        # State Recv-Q Send-Q Local Peer [Process]
        if len(fields) < 5:
            continue
        local = split_address(fields[3])
        if local is None:
            continue
        sockets.append(Socket(proto, local[0], local[1], tuple(_PROCESS.findall(line))))
    return sockets
