"""Data of the management network: how a node's management address is decided (sparkfleet/addresses.py).

The management address is what the router's backends, the Prometheus scrape targets, the exporters'
listen addresses and the firewall's monitoring allowance name: trust is decided on it. It is an IP
literal, given in the inventory (ssh_hostname) or resolved once on the controller before any
connection; an mDNS name (`*.local`) is refused unless this key accepts its one resolution.
"""
from pydantic import BaseModel, Field


class ManagementData(BaseModel):
    management_resolve_mdns_once: bool = Field(
        False, description="accept an mDNS name (`*.local`) as the node's ssh_hostname: the controller resolves it "
        "once, before any connection, and the address it gets is pinned for the run (rendered into the router's "
        "backends, the scrape targets and the firewall, and printed in the plan); nodes never resolve it. Off by "
        "default: any host on the LAN can answer an mDNS query, and the answer decides where the fleet key and "
        "live prompts go. On, the node's ssh_strict_host_key_checking must be `yes` (the SSH session resolves the "
        "name again: only a known host key tells the node from a spoofer). Prefer giving the address",
        json_schema_extra={"set_in": "inventory, per node (or group_data)"},
    )
