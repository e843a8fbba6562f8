"""Data keys of roles/fabric: the ConnectX-7 point-to-point link between the nodes."""
from ipaddress import IPv4Interface
from typing import Literal

from pydantic import BaseModel, Field

JUMBO_MTU = 9000
# back-to-back: one cable per serving group of two; switch: every node on one switched segment.
FABRIC_TOPOLOGIES = ("back-to-back", "switch")


class FabricData(BaseModel):
    fabric_netdev: str = Field(
        "enp1s0f0np0",
        pattern=r"^[A-Za-z0-9_.-]{1,15}$",
        description="The CX7 netdev cabled to the peer (`ibdev2netdev` shows it).",
    )
    fabric_address: IPv4Interface = Field(
        description="This node's static fabric address with prefix, e.g. 10.77.77.1/30. Required per node.",
        strict=False,  # written as text ("10.77.77.1/30"); every other key is strictly typed (no coercion)
    )
    fabric_topology: Literal["back-to-back", "switch"] = Field(
        "back-to-back",
        description="How the CX7 ports are cabled: back-to-back (one cable per serving group of two nodes, a "
        "subnet per cable) or switch (every node on one switched segment; the group's nodes in one subnet). The "
        "jumbo-frame proof runs between every two nodes of a group either way. One value for the whole fleet.",
    )
    fabric_mtu: int = Field(
        JUMBO_MTU,
        ge=1280,
        le=9216,
        description="Link MTU. 9000 (jumbo frames): NCCL bus bandwidth drops from ~20 GB/s to ~3 GB/s without.",
    )
    fabric_mtu_reason: str | None = Field(
        None,
        description=f"Required when fabric_mtu is not {JUMBO_MTU}: why the smaller MTU is on purpose.",
    )
    netplan_renderer: Literal["NetworkManager", "networkd"] = Field(
        "NetworkManager",
        description="netplan renderer: NetworkManager on DGX OS, networkd on plain Debian/Ubuntu servers.",
    )
    fabric_take_over: bool = Field(
        False,
        description="When another netplan file, NetworkManager connection or systemd-networkd file also "
        "configures fabric_netdev: false stops the deploy naming it; true has the deploy disable it "
        "(kept on disk: *.sparkfleet-disabled, autoconnect no) and say so.",
    )
    rdma_hca: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_]+$",
        description="RDMA device of the fabric port (e.g. rocep1s0f0), or none for TCP sockets only.",
    )

# The systemd unit behind each netplan renderer; it must be running for `netplan apply` to work.
RENDERER_UNITS = {"NetworkManager": "NetworkManager", "networkd": "systemd-networkd"}
# `netplan apply` restarts NetworkManager without waiting for it (netplan/cli/commands/apply.py:
# systemctl_network_manager('start', sync=False) queues the start with --no-block), and nmcli answers
# only once it runs. What reads a renderer after an apply waits for its queued jobs first (30 s at most).
RENDERERS_SETTLED = ("for i in $(seq 150); do [ -z \"$(systemctl show -P Job "
                     + " ".join(RENDERER_UNITS.values()) + " 2>/dev/null)\" ] && break; sleep 0.2; done")

NETPLAN_FILE = "/etc/netplan/40-sparkfleet-fabric.yaml"
