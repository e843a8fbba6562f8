"""Data keys of roles/fabric_speed: the fabric proves its speed, not only its MTU.

A link that passes the jumbo-frame proof can still carry half of what it should: one HCA of the
port's two left out of NCCL_IB_HCA, a controller wired at PCIe x2 by an old BIOS, a degraded cable.
The field's figures (docs/fabric.md): NVIDIA's pass bar for NCCL's all_gather between two Sparks
is 21.875 GB/s busbw at 16 GiB (dgx-spark-playbooks); 23.74 GB/s with both HCAs and NCCL v2.28.9-1,
~3 GB/s with a development build (dgx-spark-playbooks PR #103); one half of the port is a PCIe Gen5 x4
endpoint, about 100 Gbit/s (same PR). Bus bandwidth climbs with the buffer's size, so each bar holds
at the size it is measured at (BUSBW_BARS_GBYTES).
"""
from typing import Literal

from pydantic import BaseModel, Field, PositiveFloat, PositiveInt

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


# NVIDIA's pass bar for a pair's all_gather: `all_gather_perf -b 16G -e 16G -f 2`, its "Avg bus
# bandwidth" (for one size, the mean of the out-of-place and in-place busbw) at least 21.875 GB/s,
# "175 Gbps" (NVIDIA/dgx-spark-playbooks, nvidia/multi-sparks-through-switch/assets/spark_cluster_setup/
# spark_cluster_setup.py: MIN_NCCL_TEST_BW, checked against that run's output).
NVIDIA_BUSBW_BAR_GBYTES = 21.875
NVIDIA_BUSBW_BAR_MIB = 16384

# A healthy pair's all_gather_perf curve, size (MiB) -> (out-of-place, in-place) busbw GB/s: two Sparks
# on one QSFP cable, both HCAs, MTU 9000, NCCL 2.28.9 (sc13912/route179.dev, content/posts/
# dgx-spark-nccl-roce-benchmarking/index.md at 5068330; tests/unit/fixtures/captures/
# nccl_allgather_route179_512m_16g.txt). The only published Spark curve found that reaches 16 GiB.
HEALTHY_ALL_GATHER_CURVE = {
    512: (18.39, 19.48), 1024: (19.93, 21.00), 2048: (21.80, 22.95),
    4096: (22.93, 23.62), 8192: (23.43, 23.97), 16384: (23.74, 24.20),
}


def curve_bars(curve: dict[int, tuple[float, float]], bar: float, bar_mib: int) -> dict[int, float]:
    """The bar at each size of a healthy curve: `bar` (defined at `bar_mib`) scaled by how much less
    the healthy pair carried at that size, busbw(size) / busbw(bar_mib), each the mean of the
    out-of-place and in-place figures as nccl-tests averages them. The healthy pair clears every
    size's bar by the margin it clears NVIDIA's at 16 GiB (23.97 / 21.875, 9.6%)."""
    at_bar = sum(curve[bar_mib]) / 2
    return {mib: round(bar * (sum(pair) / 2) / at_bar, 3) for mib, pair in sorted(curve.items())}


BUSBW_BARS_GBYTES = curve_bars(HEALTHY_ALL_GATHER_CURVE, NVIDIA_BUSBW_BAR_GBYTES, NVIDIA_BUSBW_BAR_MIB)

# ib_write_bw's bar per half: NCCL spreads its channels over both of the port's HCAs (docs/fabric.md),
# so the slower half sets the pace, and NVIDIA's 175 Gbit/s for the port asks 87.5 of each. Healthy
# halves, both at once: 92.57 and 97.28 Gbit/s with one QP each (NVIDIA's guide, the captures'
# ibwb_nvidia_guide_client*.txt), 98.04 each with four (sc13912/route179.dev, the post above); a cable
# plugged in after boot: 13.33 and 13.23 (ibwb_13gbps_two_rails_hotplug.txt).
RDMA_HALF_BAR_GBITS = NVIDIA_BUSBW_BAR_GBYTES * 8 / 2

# One value per serving group: both ends of a link run the same test against the same bar.
SHARED_SPEED_KEYS = (
    "fabric_speed_link_test", "fabric_speed_collective", "fabric_speed_seconds", "fabric_speed_port",
    "fabric_speed_min_rdma_half_gbits", "fabric_speed_rdma_qps", "fabric_speed_min_tcp_gbits",
    "fabric_speed_busbw_bars_gbytes", "fabric_speed_max_buffer_mib", "fabric_speed_headroom_gib",
)


class FabricSpeedData(BaseModel):
    fabric_speed_link_test: Literal["ib_write_bw", "iperf3", "off"] = Field(
        "iperf3",
        description="the per-link test after a deploy that (re)configured the fabric, before any engine starts: "
        "`ib_write_bw` (perftest, over both HCAs of the port at once, each half connected by its address with "
        "rdma_cm, held to `fabric_speed_min_rdma_half_gbits`), "
        "`iperf3` (TCP over each half, for nodes without RDMA: the lab; the default, as `rdma_hca`'s is none), or "
        "`off`",
    )
    fabric_speed_collective: bool = Field(
        True,
        description="after the link test, the collective the engine runs: all_gather across the serving group "
        "inside the serving image, through torch.distributed (NCCL on GPU nodes, gloo without a GPU), its bus "
        "bandwidth held to the bar for the buffer size it gathers (`fabric_speed_busbw_bars_gbytes`)",
    )
    fabric_speed_seconds: int = Field(5, ge=1, le=60, description="duration of each link test")
    fabric_speed_port: int = Field(
        29510, ge=1024, le=65535,
        description="TCP port of the tests' servers (iperf3, ib_write_bw's rdma_cm, the collective's rendezvous); "
        "the firewall opens it to the fabric only",
    )
    fabric_speed_min_rdma_half_gbits: float = Field(
        RDMA_HALF_BAR_GBITS, gt=0,
        description="ib_write_bw bar for each half of a link, both halves running at once, in Gbit/s: NVIDIA's "
        "175 Gbit/s for the port (dgx-spark-playbooks spark_cluster_setup.py) over its two halves, over which "
        "NCCL spreads its channels, so the slower sets the pace; healthy halves measure 92.57 and 97.28 "
        "(NVIDIA's guide), 98.04 (four QPs), a cable plugged in after boot ~13",
    )
    fabric_speed_rdma_qps: int = Field(
        4, ge=1, le=64,
        description="ib_write_bw's queue pairs on each half (`-q`): four, as the field's runs (eugr/spark-vllm-"
        "docker docs/NETWORKING.md, TrevorSquillario/gb10-training and sc13912/route179.dev run -q 4): one QP "
        "per half measured 92.57 and 97.28 Gbit/s (NVIDIA's guide) where four measured 98.04 each (route179), "
        "and NCCL itself drives several per HCA",
    )
    fabric_speed_min_tcp_gbits: float = Field(
        10.0, gt=0, description="iperf3 bar per half, in Gbit/s (one TCP stream)",
    )
    fabric_speed_busbw_bars_gbytes: dict[PositiveInt, PositiveFloat] = Field(
        default_factory=lambda: dict(BUSBW_BARS_GBYTES), min_length=1,
        description="the collective's bar at each buffer size it may gather, {MiB: GB/s}: all_gather bus "
        "bandwidth as nccl-tests computes it, the mean of the out-of-place and in-place runs (its 'Avg bus "
        "bandwidth' of one size). The collective gathers the largest of these sizes the memory budget and "
        "`fabric_speed_max_buffer_mib` allow. Default: NVIDIA's pass bar, 21.875 at 16384 MiB "
        "(dgx-spark-playbooks spark_cluster_setup.py), scaled to each size by a healthy pair's published "
        "all_gather_perf curve (sc13912/route179.dev; docs/fabric.md shows the derivation)",
    )
    fabric_speed_max_buffer_mib: int = Field(
        2048, ge=1,
        description="the collective's largest buffer (the gathered tensor), in MiB; smaller when the memory "
        "budget is (`fabric_speed_headroom_gib`): not the playbook's 16 GiB by default, which froze a Spark "
        "(its footprint about twice the buffer); 16384 measures at NVIDIA's own size where memory allows",
    )
    fabric_speed_headroom_gib: float = Field(
        8.0, ge=0,
        description="memory left free while the collective runs: its buffers (about twice the gathered tensor "
        "on unified memory) fit in MemAvailable minus this and `guard_min_headroom_gib`, or the deploy stops",
    )


def fabric_speed_problems(nodes) -> list[Problem]:
    """What the schema alone cannot refuse: one setting per group, a test each node can run, and a
    buffer cap that leaves the collective a size with a bar."""
    problems = shared_key_problems(nodes, SHARED_SPEED_KEYS, "both ends of a link run one test against one bar")
    for n in nodes:
        smallest = min(n.fabric_speed_busbw_bars_gbytes)
        if n.fabric_speed_collective and n.fabric_speed_max_buffer_mib < smallest:
            problems.append(Problem(
                f"key 'fabric_speed_max_buffer_mib' = {n.fabric_speed_max_buffer_mib} is below every size the "
                f"collective has a bar for (fabric_speed_busbw_bars_gbytes: {sorted(n.fabric_speed_busbw_bars_gbytes)} "
                f"MiB): it would gather at a size no bar holds for", [n.name], key="fabric_speed_max_buffer_mib",
                fix=f"set fabric_speed_max_buffer_mib to {smallest} or more, or add a bar for a smaller size "
                f"(with its source) to fabric_speed_busbw_bars_gbytes"))
        if n.fabric_speed_link_test == "ib_write_bw" and not n.rdma_hca:
            problems.append(Problem(
                "key 'fabric_speed_link_test' = 'ib_write_bw' needs RDMA, but rdma_hca is not set "
                "(allowed: 'ib_write_bw', 'iperf3', 'off')", [n.name], key="fabric_speed_link_test",
                fix="set rdma_hca (the DGX Spark's is 'rocep1s0f0'), or fabric_speed_link_test = 'iperf3'"))
    return problems
