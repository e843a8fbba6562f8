"""Does the fabric carry what it should? Tests per link, the collective across the group, bars in data.

Decided at prepare from facts, like the jumbo-frame proof (roles/fabric): due in every run that
(re)configures the fabric (roles/fabric's verdict), and otherwise by each node's record
of its last passed proof (record_path), keyed by everything the figures depend on (the links' ends,
the MTU, the tests, the bars, the serving image the collective runs in). The proof is due when a
node's record is missing or its key differs: a fresh deploy, a fabric reconfigured, a recipe bump
(the image's NCCL build matters: dgx-spark-playbooks PR #103 measured 3.04 GB/s with one build,
23.74 GB/s with another, nothing else changed). A failed proof writes no record, so the next
deploy runs it again. A converged deploy runs no test and changes nothing.

The figures are what the tools print: iperf3's JSON, ib_write_bw's report (perftest), and the
collective's line from files/sfl_gather.py; each is parsed here, so the parsers are tested on
recorded output (tests/unit/fixtures/fabric-speed-*.txt).
"""
import hashlib
import json
import re
import shlex
from pathlib import Path

from sparkfleet.model.fabric import FabricHalf
from sparkfleet.model.fabric_speed import SPEED_RECORD_NAME, speed_record_path
from sparkfleet.model.monitoring import TEXTFILE_DIR, metric_label
from roles.fabric_speed.facts import SpeedRecord
from sparkfleet.inventory import cluster_from_state
from sparkfleet.once import per_host
from sparkfleet.verdicts import SpeedLink, SpeedPlan  # noqa: F401 (this role's verdict, on the ground floor)

RECORD_NAME = SPEED_RECORD_NAME
RUNNER_SOURCE = str(Path(__file__).with_name("files") / "sfl_gather.py")
RUNNER_PATH = "/usr/local/lib/sparkfleet/sfl_gather.py"  # on the node; mounted read-only into the image
RUNNER_IN_CONTAINER = "/sfl_gather.py"
SPEED_CONTAINER = "sparkfleet-fabric-speed"
SPEED_PACKAGES = {"ib_write_bw": "perftest", "iperf3": "iperf3"}  # Debian/Ubuntu (DGX OS) package names
MIB = 2**20
MIN_BUFFER_MIB = 64  # below this, all_gather measures latency, not bandwidth
# Why a link is slow, in the order the field met them (docs/fabric.md).
USUAL_CAUSES = ("an MTU below 9000 on either end", "one HCA of the port's two left out (NCCL_IB_HCA)",
                "a controller at PCIe x2 (a BIOS older than 2026-04)", "a degraded or wrong cable")


record_path = speed_record_path


def speed_links(cluster) -> list[SpeedLink]:
    """Every two nodes of the group, once: a pair is one link; a switched group of n, n(n-1)/2."""
    nodes = sorted(cluster.nodes, key=lambda n: n.rank)
    return [SpeedLink(a, b, tuple(zip(a.fabric_halves, b.fabric_halves)))
            for i, a in enumerate(nodes) for b in nodes[i + 1:]]


def proof_key(cluster, image: str | None) -> str:
    """What the figures depend on, as one digest: a record with another key proves nothing now."""
    head = cluster.head
    what = {
        "links": [[link.server.name, link.client.name] + [[s.netdev, s.ip, s.hca, c.netdev, c.ip, c.hca]
                                                          for s, c in link.halves] for link in speed_links(cluster)],
        "mtu": sorted({n.fabric_mtu for n in cluster.nodes}),
        "test": [head.fabric_speed_link_test, head.fabric_speed_seconds, head.fabric_speed_min_rdma_gbits,
                 head.fabric_speed_min_tcp_gbits],
        "collective": [head.fabric_speed_min_busbw_gbytes, head.fabric_speed_max_buffer_mib, image]
        if head.fabric_speed_collective else None,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def recorded_key(text: str | None) -> str | None:
    """The key of a node's record (None: none, or not one sparkfleet wrote)."""
    try:
        record = json.loads(text or "")
    except json.JSONDecodeError:
        return None
    return record.get("key") if isinstance(record, dict) and record.get("passed") is True else None


def why_due(cluster, key: str, records: dict[str, str | None], reconfigured: bool = False) -> str | None:
    """Why the proof runs in this deploy (None: the fabric stays as it is and every node holds a
    passed record of this key)."""
    head = cluster.head
    if head.fabric_speed_link_test == "off" and not head.fabric_speed_collective:
        return None
    if reconfigured:
        return "this run (re)configures the fabric"
    missing = [n.name for n in cluster.nodes if recorded_key(records.get(n.name)) is None]
    if missing:
        return f"no passed proof on {', '.join(missing)}"
    stale = [n.name for n in cluster.nodes if recorded_key(records.get(n.name)) != key]
    if stale:
        return f"the fabric, the tests or the image changed since {', '.join(stale)} passed"
    return None


def keep_figures(state, group: str, figures: list[dict]) -> None:
    """A step's figures, kept for the record written once the whole proof passed (this run only)."""
    kept = state.__dict__.setdefault("sparkfleet_speed_figures", {})
    kept.setdefault(group, []).extend(figures)


def kept_figures(state, group: str) -> list[dict]:
    return state.__dict__.get("sparkfleet_speed_figures", {}).get(group, [])


def record_text(key: str, figures: list[dict]) -> str:
    return json.dumps({"key": key, "passed": True, "figures": figures}, indent=1, sort_keys=True) + "\n"


# The passed proof's figures for the node exporter's textfile collector, written on the group's head
# beside its record (monitoring on): the dashboard's and the team's view of what the fabric measured.
SPEED_TEXTFILE = f"{TEXTFILE_DIR}/sparkfleet-fabric-speed.prom"


def speed_metrics_text(figures: list[dict], proven_at: float) -> str:
    """Each link's Gbit/s (iperf3 or ib_write_bw, per half) and the collective's bus bandwidth, as the
    last passed proof measured them, and when."""
    links = [f for f in figures if "gbits" in f]
    collectives = [f for f in figures if "busbw_gbytes" in f]
    lines = ["# HELP sparkfleet_fabric_speed_gbits A fabric link's throughput in the last passed speed proof, Gbit/s.",
             "# TYPE sparkfleet_fabric_speed_gbits gauge"]
    lines += [f'sparkfleet_fabric_speed_gbits{{test="{metric_label(f["test"])}",link="{metric_label(f["link"])}"}} {f["gbits"]}'
              for f in links]
    lines += ["# HELP sparkfleet_fabric_speed_busbw_gbytes The collective's bus bandwidth in the last passed speed "
              "proof, GB/s.", "# TYPE sparkfleet_fabric_speed_busbw_gbytes gauge"]
    lines += [f'sparkfleet_fabric_speed_busbw_gbytes{{test="{metric_label(f["test"])}",backend="{metric_label(f.get("backend", ""))}"}} '
              f'{f["busbw_gbytes"]}' for f in collectives]
    lines += ["# HELP sparkfleet_fabric_speed_proven_timestamp_seconds When the last speed proof passed.",
              "# TYPE sparkfleet_fabric_speed_proven_timestamp_seconds gauge",
              f"sparkfleet_fabric_speed_proven_timestamp_seconds {int(proven_at)}"]
    return "\n".join(lines) + "\n"


# iperf3: one TCP stream per half, both ends bound to that half's addresses (the kernel would
# otherwise pick the route, and both halves' traffic could leave by one netdev).

def iperf3_server_command(half: FabricHalf, port: int) -> str:
    return f"iperf3 --server --one-off --daemon --bind {shlex.quote(half.ip)} --port {int(port)}"


def iperf3_client_command(server: FabricHalf, client: FabricHalf, port: int, seconds: int) -> str:
    # The server daemonizes before it listens: a refused first connection is tried again.
    one = (f"iperf3 --client {shlex.quote(server.ip)} --bind {shlex.quote(client.ip)} --port {int(port)} "
           f"--time {int(seconds)} --json")
    return f"for i in 1 2 3 4 5 6 7 8 9 10; do out=$({one}) && break; sleep 0.5; done; printf '%s\\n' \"$out\""


def iperf3_gbits(text: str) -> float:
    """Gbit/s the server received (end.sum_received), from `iperf3 --json`; ValueError naming
    iperf3's own error when it failed."""
    try:
        report = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"iperf3 printed no report: {text.strip()[-300:] or 'nothing'}") from err
    if report.get("error"):
        raise ValueError(f"iperf3: {report['error']}")
    return report["end"]["sum_received"]["bits_per_second"] / 1e9


# ib_write_bw (perftest): both HCAs at once, as NCCL drives them, each connected by its half's
# address through rdma_cm (-R), so the GID is the one of that address, whatever its index.

def _ib_write_bw(hca: str, port: int, seconds: int) -> str:
    return f"ib_write_bw -d {shlex.quote(hca)} -R -F --report_gbits -D {int(seconds)} -p {int(port)}"


def ib_server_command(link: SpeedLink, port: int, seconds: int) -> str:
    """The server end of every half, in the background (each exits after its one test)."""
    return "; ".join(f"setsid nohup {_ib_write_bw(s.hca, port + i, seconds)} >/dev/null 2>&1 < /dev/null &"
                     for i, (s, _) in enumerate(link.halves)) + " sleep 1"


def ib_client_command(link: SpeedLink, port: int, seconds: int) -> str:
    """Every half's client at once; their reports one after the other, each under `== <i>`."""
    runs = " ".join(f"{_ib_write_bw(c.hca, port + i, seconds)} {shlex.quote(s.ip)} > \"$d/{i}\" 2>&1 &"
                    for i, (s, c) in enumerate(link.halves))
    show = " ".join(f"echo '== {i}'; cat \"$d/{i}\";" for i in range(len(link.halves)))
    return f"d=$(mktemp -d); {runs} wait; {show} rm -rf \"$d\""


def ib_write_bw_gbits(report: str) -> float:
    """BW average (Gb/sec) of one ib_write_bw report (--report_gbits); ValueError when it has none."""
    lines = report.splitlines()
    for i, line in enumerate(lines):
        if "BW average[Gb/sec]" in line:
            for row in lines[i + 1:]:
                words = row.split()
                if len(words) >= 4 and words[0].isdigit():
                    return float(words[3])
    raise ValueError(f"ib_write_bw reported no bandwidth: {report.strip()[-300:] or 'nothing'}")


def ib_reports(output: str) -> dict[int, str]:
    """The client command's output -> {half index: its report}."""
    reports: dict[int, list[str]] = {}
    current = None
    for line in output.splitlines():
        m = re.fullmatch(r"== (\d+)", line.strip())
        if m:
            current = int(m.group(1))
            reports[current] = []
        elif current is not None:
            reports[current].append(line)
    return {i: "\n".join(lines) for i, lines in reports.items()}


def half_name(link: SpeedLink, i: int) -> str:
    s, c = link.halves[i]
    return f"{link.client.name} {c.netdev}{'/' + c.hca if c.hca else ''} -> {link.server.name} {s.netdev} ({s.ip})"


def tcp_failures(link: SpeedLink, gbits: dict[int, float], bar: float) -> list[str]:
    return [f"fabric speed: {half_name(link, i)}: iperf3 {g:.2f} Gbit/s, below the bar of {bar:g} Gbit/s "
            f"(fabric_speed_min_tcp_gbits); usual causes: {'; '.join(USUAL_CAUSES)}"
            for i, g in sorted(gbits.items()) if g < bar]


def rdma_failures(link: SpeedLink, gbits: dict[int, float], bar: float) -> list[str]:
    total = sum(gbits.values())
    if total >= bar:
        return []
    each = ", ".join(f"{link.halves[i][1].hca} {g:.1f}" for i, g in sorted(gbits.items()))
    return [f"fabric speed: {link.name}: ib_write_bw {total:.1f} Gbit/s over {len(gbits)} HCA(s) ({each}), below the "
            f"bar of {bar:g} Gbit/s (fabric_speed_min_rdma_gbits); usual causes: {'; '.join(USUAL_CAUSES)}"]


# The collective: all_gather across the group in the serving image (files/sfl_gather.py).

def buffer_mib(cluster, mem_available_gib: dict[str, float]) -> tuple[int | None, str]:
    """The gathered tensor's size in MiB, a power of two, from the memory guard's budget: its buffers
    (the output, the input, NCCL's staging: about twice the output) fit in the least MemAvailable
    of the group minus guard_min_headroom_gib and fabric_speed_headroom_gib. (None, why) when even
    MIN_BUFFER_MIB does not fit: the deploy stops rather than freeze a Spark (PR #103's 16 GB test)."""
    head = cluster.head
    name, available = min(((n.name, mem_available_gib.get(n.name, 0.0)) for n in cluster.nodes), key=lambda x: x[1])
    keep = head.guard_min_headroom_gib + head.fabric_speed_headroom_gib
    budget_mib = (available - keep) * 1024 / 2
    size = 1 << (int(budget_mib).bit_length() - 1) if budget_mib >= 1 else 0  # a power of two
    size = min(size, head.fabric_speed_max_buffer_mib)
    if size < MIN_BUFFER_MIB:
        return None, (f"fabric speed: {name}: MemAvailable {available:.1f} GiB leaves no room for the collective's "
                      f"{MIN_BUFFER_MIB} MiB buffer beside {keep:g} GiB kept free (guard_min_headroom_gib + "
                      f"fabric_speed_headroom_gib): free memory on {name}, or set fabric_speed_collective = false")
    return size, f"{size} MiB (budget: {available:.1f} GiB available on {name} - {keep:g} GiB kept, halved)"


def gather_docker_args(profile, node, env_file: str) -> list[str]:
    """The runner's container: the serving container's network, IPC, memlock, GPUs and devices (what
    NCCL's path depends on) and the rank's environment file, but no weights, no kernel caches and no
    API key: the proof runs before the caches' `current` exists (a bind mount of a missing path
    would make docker create a directory there) and needs none of them."""
    c = profile.container
    args = ["docker", "run", "--rm", "--init", "--name", SPEED_CONTAINER]
    args += (["--network=host"] if c.network_host else []) + (["--ipc=host"] if c.ipc_host else [])
    args += [f"--shm-size={c.shm_size}", f"--ulimit=memlock={node.serving_ulimit_memlock}"]
    args += ["--gpus=all"] if node.gpu_expected else []
    args += [f"--device={d}" for d in list(c.devices) + (["/dev/infiniband"] if node.rdma_hca else [])]
    return args + [f"--env-file={env_file}", f"--volume={RUNNER_PATH}:{RUNNER_IN_CONTAINER}:ro",
                   "--entrypoint=python3"]


def env_path(node) -> str:
    return f"{node.serving_dir}/fabric-speed.env"


def gather_args(cluster, node, mib: int) -> list[str]:
    """The runner's arguments for one rank; the rendezvous on the head's fabric address."""
    head = cluster.head
    backend = "nccl" if node.gpu_expected else "gloo"
    return ["--rank", str(node.rank), "--world", str(len(cluster.nodes)), "--addr", head.fabric_ip,
            "--port", str(head.fabric_speed_port), "--mib", str(mib), "--backend", backend]


def gather_figure(output: str) -> dict:
    """The runner's result line (`sfl_gather {json}`); ValueError with its last words when it has none."""
    for line in reversed(output.splitlines()):
        if line.startswith("sfl_gather "):
            return json.loads(line[len("sfl_gather "):])
    raise ValueError(f"the collective printed no result: {output.strip()[-600:] or 'nothing'}")


def gather_failures(cluster, figure: dict) -> list[str]:
    head = cluster.head
    bar = head.fabric_speed_min_busbw_gbytes
    ranks = ", ".join(n.name for n in sorted(cluster.nodes, key=lambda n: n.rank))
    if figure.get("wrong"):
        return [f"fabric speed: all_gather across {ranks} returned {figure['wrong']} wrong element(s): the collective "
                f"is broken, whatever its speed"]
    if figure["busbw_gbytes"] >= bar:
        return []
    return [f"fabric speed: all_gather ({figure['backend']}, {figure['bytes'] // MIB} MiB) across {ranks}: busbw "
            f"{figure['busbw_gbytes']:.3f} GB/s, below the bar of {bar:g} GB/s (fabric_speed_min_busbw_gbytes); "
            f"usual causes: {'; '.join(USUAL_CAUSES)}; or the image's NCCL build"]


def decide(cluster, image: str | None, records: dict[str, str | None], mem_available_gib: dict[str, float],
           reconfigured: bool = False) -> SpeedPlan:
    """The verdict as a pure function of the records, MemAvailable and the fabric's own verdict
    (reconfigured: roles/fabric applies a netplan file or proves the link again in this run)."""
    head = cluster.head
    key = proof_key(cluster, image)
    why = why_due(cluster, key, records, reconfigured)
    mib, buffer_why = (None, "")
    if why and head.fabric_speed_collective:
        mib, buffer_why = buffer_mib(cluster, mem_available_gib)
    return SpeedPlan(why, key, tuple(speed_links(cluster)), mib, buffer_why)


def speed_records(state) -> dict[str, str | None]:
    """node name -> the speed record it keeps (SpeedRecord), every node of the run at once."""
    cluster = cluster_from_state(state)
    return per_host(state, lambda h: h.get_fact(SpeedRecord, path=record_path(cluster.node(h.name))))
