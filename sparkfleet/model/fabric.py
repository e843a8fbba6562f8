"""Data keys of roles/fabric: the ConnectX-7 point-to-point link between the nodes.

On a DGX Spark one QSFP port is two PCIe Gen5 x4 endpoints: one cable shows as two netdevs and two
RDMA devices, `enp1s0f0np0`/`rocep1s0f0` and its twin `enP2p1s0f0np0`/`roceP2p1s0f0`. Each is a
half of the port with its own address, in its own subnet (two addresses of one subnet on two
netdevs of a host answer each other's ARP and share one route: the kernel would send the twin's
traffic out of the first half). NCCL carries the collectives over both HCAs (roles/serving).
"""
from dataclasses import dataclass
from ipaddress import IPv4Interface
from typing import Literal

from pydantic import BaseModel, Field

JUMBO_MTU = 9000
# back-to-back: one cable per serving group of two; switch: every node on one switched segment.
FABRIC_TOPOLOGIES = ("back-to-back", "switch")
# A netdev's name (sparkfleet.values.SAFE_IFNAME): at most 15 characters (IFNAMSIZ), not starting with . or -,
# so never `.` or `..` (the kernel refuses those too: linux net/core/dev.c, dev_valid_name).
NETDEV_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$"


class FabricData(BaseModel):
    fabric_netdev: str = Field(
        "enp1s0f0np0",
        pattern=NETDEV_NAME,
        description="the CX7 netdev cabled to the peer (`ibdev2netdev` shows it)",
    )
    fabric_address: IPv4Interface = Field(
        description="the node's address on the CX7 link with prefix (`10.77.77.1/30`); unique in the fleet; one "
        "subnet per link (back-to-back: a group's two nodes, each cable its own) or per group (switch)",
        strict=False,  # written as text ("10.77.77.1/30"); every other key is strictly typed (no coercion)
    )
    fabric_topology: Literal["back-to-back", "switch"] = Field(
        "back-to-back",
        description="how the CX7 ports are cabled: `back-to-back` (a cable per serving group of two) or `switch` "
        "(every node on one switched segment, any group size); one value for the fleet; the jumbo-frame proof runs "
        "between every two nodes of a group either way",
    )
    fabric_mtu: int = Field(
        JUMBO_MTU,
        ge=1280,
        le=9216,
        description="link MTU; jumbo frames (NCCL bus bandwidth drops from ~20 GB/s to ~3 GB/s without); the same on "
        "every node",
    )
    fabric_mtu_reason: str | None = Field(
        None,
        description="required when `fabric_mtu` is not 9000: why the smaller MTU is on purpose",
    )
    netplan_renderer: Literal["NetworkManager", "networkd"] = Field(
        "NetworkManager",
        description="`NetworkManager` (DGX OS) or `networkd` (plain Debian/Ubuntu servers); its service must be "
        "active (preflight)",
    )
    fabric_take_over: bool = Field(
        False,
        description="another netplan file, NetworkManager connection or systemd-networkd file that also configures "
        "`fabric_netdev`: `false` stops the deploy naming it; `true` has the deploy disable it (kept on disk: "
        "`*.sparkfleet-disabled`, NetworkManager's autoconnect off) and say so. See "
        "docs/operations.md#a-cx7-configured-by-someone-else",
    )
    rdma_hca: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_]+$",
        description="RDMA device of the fabric port (`rocep1s0f0` on a DGX Spark), or none for TCP sockets only",
    )
    fabric_twin_netdev: str | None = Field(
        None,
        pattern=NETDEV_NAME,
        description="the port's second half (`enP2p1s0f0np0` on a DGX Spark: one cable is two PCIe x4 endpoints, "
        "and NCCL over one of them reaches about half of what the cable carries); none for a port of one half",
    )
    fabric_twin_address: IPv4Interface | None = Field(
        None,
        description="the twin's address with prefix (`10.77.78.1/30`), required with `fabric_twin_netdev`: in a "
        "subnet of its own, never the first half's (two netdevs of a host in one subnet share one route and answer "
        "each other's ARP); the same rules as `fabric_address`",
        strict=False,  # written as text, like fabric_address
        json_schema_extra={"set_in": "inventory, per node"},
    )
    rdma_twin_hca: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_]+$",
        description="RDMA device of the twin (`roceP2p1s0f0` on a DGX Spark); required with `rdma_hca` and "
        "`fabric_twin_netdev` (NCCL then carries the collectives over both HCAs)",
    )


@dataclass(frozen=True)
class FabricHalf:
    """One half of the CX7 port: a netdev, its address, its RDMA device (None: TCP sockets only)."""

    netdev: str
    address: IPv4Interface
    hca: str | None

    @property
    def ip(self) -> str:
        return str(self.address.ip)


# The systemd unit behind each netplan renderer; it must be running for `netplan apply` to work.
RENDERER_UNITS = {"NetworkManager": "NetworkManager", "networkd": "systemd-networkd"}
# `netplan apply` restarts NetworkManager without waiting for it (netplan/cli/commands/apply.py:
# systemctl_network_manager('start', sync=False) queues the start with --no-block), and nmcli answers
# only once it runs. What reads a renderer after an apply waits for its queued jobs first (30 s at most).
RENDERERS_SETTLED = ("for i in $(seq 150); do [ -z \"$(systemctl show -P Job "
                     + " ".join(RENDERER_UNITS.values()) + " 2>/dev/null)\" ] && break; sleep 0.2; done")

NETPLAN_FILE = "/etc/netplan/40-sparkfleet-fabric.yaml"
