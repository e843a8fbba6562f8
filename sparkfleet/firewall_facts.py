"""What a node says of its firewall and of the addresses its rules name, read as facts: the live
table's marker (LiveMarker), the management subnet the API is allowed from by default
(ManagementSubnet). No node resolves a name for its rules: the monitoring node's address is pinned
on the controller (sparkfleet/addresses.py). roles/firewall reads them to apply its table,
roles/fabric when a jumbo-frame ping fails (does the firewall change in this run?), the doctor for
its firewall row."""
import shlex
from ipaddress import ip_address, ip_interface

from pyinfra.api import FactBase

from sparkfleet.model.firewall import TABLE


class ManagementSubnet(FactBase):
    """The connected IPv4 subnet (`198.18.0.11/24`) of the address this SSH session arrived at (sudo
    keeps SSH_CONNECTION out: then the management address from the inventory), or ''."""

    def command(self, address: str) -> str:
        return (
            f"set -- ${{SSH_CONNECTION:-}}; a=${{3:-{shlex.quote(address)}}}; "
            "ip -o -4 addr show | awk -v a=\"$a\" '{split($4, p, \"/\"); if (p[1] == a) {print $4; exit}}'"
        )

    def process(self, output):
        text = "".join(output).strip()
        if not text:
            return ""
        return str(ip_interface(text).network)


def is_ipv4(text: str) -> bool:
    try:
        return ip_address(text).version == 4
    except ValueError:
        return False


class LiveMarker(FactBase):
    """`sparkfleet <sha1>` from the live table's first rule; '' when there is no table (or no nft)."""

    def command(self) -> str:
        return (f"command -v nft >/dev/null && nft list table {TABLE} 2>/dev/null "
                "| grep -o 'sparkfleet [0-9a-f]\\{40\\}' | head -n 1 || true")

    def process(self, output):
        return "".join(output).strip()
