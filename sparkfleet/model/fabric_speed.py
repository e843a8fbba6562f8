"""Data keys of roles/fabric_speed: the fabric proves its speed, not only its MTU.

A link that passes the jumbo-frame proof can still carry half of what it should: one HCA of the
port's two left out of NCCL_IB_HCA, a controller wired at PCIe x2 by an old BIOS, a degraded cable.
The field's figures (docs/fabric.md): NVIDIA's pass bar for NCCL's all_gather between two Sparks
is 21.875 GB/s busbw (dgx-spark-playbooks); 23.74 GB/s with both HCAs and NCCL v2.28.9-1, ~3 GB/s
with a development build (dgx-spark-playbooks PR #103); one half of the port is a PCIe Gen5 x4
endpoint, about 100 Gbit/s (same PR).
"""
from typing import Literal

from pydantic import BaseModel, Field

from sparkfleet.refusal import Problem, shared_key_problems

# Each node's record of its group's last passed speed proof (roles/fabric_speed writes it; the
# benchmark receipt on the head carries its figures).
SPEED_RECORD_NAME = "fabric-speed.json"


def speed_record_path(node) -> str:
    return f"{node.preflight_data_dir}/{SPEED_RECORD_NAME}"


def passed_figures(text: str | None) -> list[dict] | None:
    """The figures of a passed proof's record (None: no record, or not a passed one sparkfleet wrote)."""
    import json

    try:
        record = json.loads(text or "")
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict) or record.get("passed") is not True or not isinstance(record.get("figures"), list):
        return None
    return record["figures"]


# One value per serving group: both ends of a link run the same test against the same bar.
SHARED_SPEED_KEYS = (
    "fabric_speed_link_test", "fabric_speed_collective", "fabric_speed_seconds", "fabric_speed_port",
    "fabric_speed_min_rdma_gbits", "fabric_speed_min_tcp_gbits", "fabric_speed_min_busbw_gbytes",
    "fabric_speed_max_buffer_mib", "fabric_speed_headroom_gib",
)


class FabricSpeedData(BaseModel):
    fabric_speed_link_test: Literal["ib_write_bw", "iperf3", "off"] = Field(
        "iperf3",
        description="the per-link test after a deploy that (re)configured the fabric, before any engine starts: "
        "`ib_write_bw` (perftest, over both HCAs of the port at once, connected by address with rdma_cm), "
        "`iperf3` (TCP over each half, for nodes without RDMA: the lab; the default, as `rdma_hca`'s is none), or "
        "`off`",
    )
    fabric_speed_collective: bool = Field(
        True,
        description="after the link test, the collective the engine runs: all_gather across the serving group "
        "inside the serving image, through torch.distributed (NCCL on GPU nodes, gloo without a GPU), its bus "
        "bandwidth held to `fabric_speed_min_busbw_gbytes`",
    )
    fabric_speed_seconds: int = Field(5, ge=1, le=60, description="duration of each link test")
    fabric_speed_port: int = Field(
        29510, ge=1024, le=65535,
        description="TCP port of the tests' servers (iperf3, ib_write_bw's rdma_cm, the collective's rendezvous); "
        "the firewall opens it to the fabric only",
    )
    fabric_speed_min_rdma_gbits: float = Field(
        160.0, gt=0,
        description="ib_write_bw bar per link, both halves together, in Gbit/s: above what one half carries "
        "(a PCIe Gen5 x4 endpoint, ~100), below a healthy 200 Gbit/s link's ~190",
    )
    fabric_speed_min_tcp_gbits: float = Field(
        10.0, gt=0, description="iperf3 bar per half, in Gbit/s (one TCP stream)",
    )
    fabric_speed_min_busbw_gbytes: float = Field(
        21.875, gt=0,
        description="the collective's bar: all_gather bus bandwidth in GB/s, as nccl-tests computes it "
        "(NVIDIA's pass bar for two DGX Sparks, dgx-spark-playbooks)",
    )
    fabric_speed_max_buffer_mib: int = Field(
        2048, ge=64,
        description="the collective's largest buffer (the gathered tensor), in MiB; smaller when the memory "
        "budget is (`fabric_speed_headroom_gib`): never the playbook's 16 GB, which froze a Spark",
    )
    fabric_speed_headroom_gib: float = Field(
        8.0, ge=0,
        description="memory left free while the collective runs: its buffers (about twice the gathered tensor "
        "on unified memory) fit in MemAvailable minus this and `guard_min_headroom_gib`, or the deploy stops",
    )


def fabric_speed_problems(nodes) -> list[Problem]:
    """What the schema alone cannot refuse: one setting per group, and a test each node can run."""
    problems = shared_key_problems(nodes, SHARED_SPEED_KEYS, "both ends of a link run one test against one bar")
    for n in nodes:
        if n.fabric_speed_link_test == "ib_write_bw" and not n.rdma_hca:
            problems.append(Problem(
                "key 'fabric_speed_link_test' = 'ib_write_bw' needs RDMA, but rdma_hca is not set "
                "(allowed: 'ib_write_bw', 'iperf3', 'off')", [n.name], key="fabric_speed_link_test",
                fix="set rdma_hca (the DGX Spark's is 'rocep1s0f0'), or fabric_speed_link_test = 'iperf3'"))
    return problems
