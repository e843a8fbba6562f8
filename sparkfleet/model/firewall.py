"""Data of roles/firewall: who may reach the API, and that the fabric's services are reached from
the fabric only."""
from ipaddress import IPv4Network
from typing import Annotated

from pydantic import BaseModel, Field

# The one nftables table sparkfleet owns on a node (roles/firewall); nothing else is touched.
TABLE = "inet sparkfleet"

# Written as text ("198.18.0.0/24"), like fabric_address; host bits set ("10.0.0.1/24") are refused.
Network = Annotated[IPv4Network, Field(strict=False)]


class FirewallData(BaseModel):
    firewall_enabled: bool = Field(
        True, description="manage the nftables table `inet sparkfleet` on every node (false: the table and its unit "
        "are removed; nothing else is touched)"
    )
    firewall_api_allowed_networks: list[Network] | None = Field(
        None, description="networks that may reach the head's API port (`[\"192.168.1.0/24\"]`); none: the connected "
        "subnet of the address each node's SSH session arrives at"
    )
