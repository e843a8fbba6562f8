"""Facts of the fabric link: its live state, and whether a peer answers jumbo pings."""
import json
import shlex

from pyinfra.api import FactBase


def parse_link(text: str) -> dict | None:
    """`ip -j addr show dev X` -> {mtu, up, operstate, ipv4: ["a/p", ...], ipv6: [...]}; None if absent."""
    try:
        links = json.loads(text or "[]")
    except json.JSONDecodeError:
        return None
    if not links:
        return None
    link = links[0]
    addrs = link.get("addr_info", [])
    return {
        "mtu": link.get("mtu"),
        "up": "UP" in link.get("flags", []),
        "operstate": link.get("operstate", "UNKNOWN"),
        "ipv4": [f"{a['local']}/{a['prefixlen']}" for a in addrs if a.get("family") == "inet"],
        "ipv6": [f"{a['local']}/{a['prefixlen']}" for a in addrs if a.get("family") == "inet6"],
    }


class FabricLink(FactBase):
    def command(self, netdev: str) -> str:
        return f"ip -j addr show dev {shlex.quote(netdev)} 2>/dev/null || echo '[]'"

    def process(self, output):
        return parse_link("\n".join(output))


def ping_command(peer_ip: str, payload: int, settle_seconds: int = 0) -> str:
    """Unfragmented (DF) pings of `payload` bytes; with settle_seconds, first wait for the link to answer.
    Three pings 50 ms apart (0.1 s, where ping's default second made it 2 s and 0.2 s apart 0.4 s): every
    deploy's prepare and the doctor ping each half of the fabric from each end, one after the other.
    iputils allows any user an interval down to 2 ms since 20210202 (Ubuntu 24.04 ships 20240117)."""
    ping = f"ping -M do -s {int(payload)} -c 3 -i 0.05 -W 2 -q {shlex.quote(peer_ip)}"
    if not settle_seconds:
        return ping
    probe = f"ping -M do -s {int(payload)} -c 1 -W 1 -q {shlex.quote(peer_ip)}"
    return (
        f"for _ in $(seq {2 * settle_seconds}); do {probe} >/dev/null 2>&1 && break; sleep 0.5; done; {ping}"
    )


class FabricPing(FactBase):
    """True when `peer_ip` answers unfragmented pings of `payload` bytes."""

    def command(self, peer_ip: str, payload: int) -> str:
        return f"{ping_command(peer_ip, payload)} >/dev/null 2>&1 && echo ok || echo fail"

    def process(self, output):
        return list(output)[-1:] == ["ok"]
