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
collective's line from files/sfl_gather.py; each is parsed here, and so is nccl-tests'
all_gather_perf table, the form the field publishes its collective's figures in: the parsers and
the verdicts are tested on real Sparks' outputs (tests/unit/fixtures/captures/).
"""
import hashlib
import json
import re
import shlex
from pathlib import Path

from pyinfra.api.exceptions import DeployError

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
# ib_write_bw's message size, pinned: the size of the runs the per-half bar is read from (NVIDIA's guide
# and the field's -R -q 4 runs print 65536, perftest's own default for its BW tests).
IB_MESSAGE_BYTES = 65536
# Why a link is slow, in the order the field met them (docs/fabric.md).
USUAL_CAUSES = ("an MTU below 9000 on either end", "one HCA of the port's two left out (NCCL_IB_HCA)",
                "a controller at PCIe x2 (a BIOS older than 2026-04)",
                "a cable plugged in after boot (both halves near 13 Gbit/s until a reboot with it in)",
                "a degraded or wrong cable")


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
        "test": [head.fabric_speed_link_test, head.fabric_speed_seconds, head.fabric_speed_min_rdma_half_gbits,
                 head.fabric_speed_rdma_qps, IB_MESSAGE_BYTES, head.fabric_speed_min_tcp_gbits],
        "collective": [sorted(head.fabric_speed_busbw_bars_gbytes.items()), head.fabric_speed_max_buffer_mib, image]
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


# The proof's servers listen as root on the fabric. Each is bounded on the node itself, not by the
# controller's good behaviour: a controller killed, an SSH session lost or a client that failed
# leaves no server behind past its bound. Each starts in a session of its own (setsid: the SSH
# session's end does not reach it) under coreutils `timeout`, which sends TERM to the server's
# process group at the bound, and KILL LISTENER_KILL_AFTER_S later to whatever ignored it (the
# bound of sparkfleet/bounded.py, here for a process left in the background). Its pid (timeout's,
# the leader of that group) is kept in LISTENER_DIR, one file per port, so the proof stops every
# server of a node after each link in every outcome (stop_listeners_command, link_tasks.py), and
# each start first stops any an earlier run left: a re-run finds none.
LISTENER_DIR = "/run/sparkfleet/fabric-speed"  # root-only (0700, in roles/lock's 0700 /run/sparkfleet); cleared at boot
# A server waits for its start to see it listen (LISTEN_WAIT_S at most), then for its client's tries
# (ten, 0.5 s apart), then runs its test's `fabric_speed_seconds`; this much more covers all of that.
LISTENER_GRACE_S = 60
LISTENER_KILL_AFTER_S = 5  # TERM first, KILL this long after
LISTEN_WAIT_S = 30  # how long a start waits for its servers to listen (listening_wait)
# What lists a server listening on {port}: a listener when it prints a line. iperf3's is a TCP socket
# (ss, iproute2).
# ib_write_bw -R listens through rdma_cm (perftest src/perftest_communication.c rdma_server_connect:
# rdma_bind_addr and rdma_listen on -p's port), in RDMA CM's own port space, which no socket table
# shows. The kernel tracks each rdma_cm id with its state and source address (drivers/infiniband/core/
# cma.c: a listen on any address is one listening id per RDMA device, cma_listen_on_dev), and
# iproute2's rdma tool lists them, filtered by state and source port (rdma/res-cmid.c, rdma/res.h:
# the cm_id filters `state` and `src-port`, since iproute2 4.17 and still at 6.18).
TCP_LISTENING = "ss -Hltn 'sport = :{port}'"
RDMA_CM_LISTENING = "rdma resource show cm_id state LISTEN src-port {port}"
# The process of pid $p is alive: it exists and is no zombie (one that ended, its parent not told yet).
_ALIVE = "[ -e /proc/$p ] && [ \"$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null)\" != Z ]"


def listener_limit(seconds: int) -> int:
    """How long a server of a `seconds` test may live, at most."""
    return int(seconds) + LISTENER_GRACE_S


def stop_listeners_command(ports=None, directory: str = LISTENER_DIR) -> str:
    """Stop the proof's servers on this node (those of `ports`, or every one), each by its process
    group: TERM, then KILL to what is left after LISTENER_KILL_AFTER_S. A pid file whose process is
    no `timeout` (it ended, and the pid may have been reused) is only removed, with its log. Exit 0."""
    d = shlex.quote(directory)
    files = " ".join(f"{d}/{int(p)}.pid" for p in ports) if ports else f"{d}/*.pid"
    return (f"for f in {files}; do [ -f \"$f\" ] || continue; p=$(cat \"$f\"); "
            f"if [ \"$(cat /proc/$p/comm 2>/dev/null)\" = timeout ]; then kill -s TERM -- -$p 2>/dev/null; "
            f"i=0; while {_ALIVE} && [ $i -lt {LISTENER_KILL_AFTER_S * 10} ]; do sleep 0.1; i=$((i+1)); done; "
            f"kill -s KILL -- -$p 2>/dev/null; fi; rm -f \"$f\" \"${{f%.pid}}.log\"; done; true")


def bounded_listeners(servers, limit_s: int, listening: str = TCP_LISTENING, directory: str = LISTENER_DIR,
                      wait_s: int = LISTEN_WAIT_S) -> str:
    """Start each (command, port) of `servers` in the background, bounded to `limit_s` seconds on the
    node whatever becomes of the shell that started it, once any server an earlier run left on those
    ports is stopped; return once every one listens (listening_wait). A server's output goes to its
    log beside its pid file, for the wait's error. Only `setsid` itself goes to the background, its
    output redirected: a background list (`mkdir ... && setsid ... &`) is a shell that keeps the SSH
    session's stdout open while it waits for the server (bash's does; dash execs the last command),
    and the start would not return before the server ends."""
    d = shlex.quote(directory)
    starts = []
    for command, port in servers:
        inner = f"echo $$ > {d}/{int(port)}.pid; exec timeout --kill-after={LISTENER_KILL_AFTER_S} {int(limit_s)} {command}"
        starts.append(f"setsid sh -c {shlex.quote(inner)} > {d}/{int(port)}.log 2>&1 < /dev/null &")
    ports = [port for _, port in servers]
    return (f"{stop_listeners_command(ports, directory)}; mkdir -p -m 0700 {d} || exit 1; " + " ".join(starts)
            + " " + listening_wait(ports, listening, directory, wait_s))


def listening_wait(ports, listening: str = TCP_LISTENING, directory: str = LISTENER_DIR,
                   seconds: int = LISTEN_WAIT_S) -> str:
    """Poll, every 0.1 s, until each of `ports` listens (`listening` prints a line for it): the
    start returns once its servers can take their clients, where a background start on a loaded node
    can take longer than the client's tries (5 s) cover. Exit 1 naming the port, the test and the
    server's own output when a server ended before it listened (its pid's process gone: at once) or
    `seconds` passed: the proof stops there, and stops its servers, rather than send a client to
    nothing."""
    d = shlex.quote(directory)
    each = " ".join(str(int(p)) for p in ports)
    ready = " && ".join(f"{listening.format(port=int(p))} 2>/dev/null | grep -q ." for p in ports)
    shown = listening.format(port="<port>")  # in double quotes below: it holds no ", $, ` or backslash
    output = f"echo \"port $port, the server's output:\" >&2; tail -n 20 {d}/$port.log >&2 2>/dev/null"
    return (f"end=$(($(date +%s) + {int(seconds)})); until {ready}; do "
            f"for port in {each}; do f={d}/$port.pid; [ -f \"$f\" ] || continue; p=$(cat \"$f\"); "
            f"if ! {{ {_ALIVE}; }}; then echo \"port $port: the server ended before it listened\" >&2; {output}; "
            f"exit 1; fi; done; "
            f"if [ \"$(date +%s)\" -gt \"$end\" ]; then echo \"ports {each}: not listening after {int(seconds)} s "
            f"({shown} printed nothing)\" >&2; for port in {each}; do {output}; done; exit 1; fi; sleep 0.1; done")


# iperf3: one TCP stream per half, both ends bound to that half's addresses (the kernel would
# otherwise pick the route, and both halves' traffic could leave by one netdev).

def iperf3_server_command(half: FabricHalf, port: int, seconds: int) -> str:
    """The server of one half, bounded on the node (bounded_listeners), its start returning once it
    listens. In the foreground (no --daemon): a daemonized iperf3 would leave `timeout` at once, and
    no bound would hold it."""
    return bounded_listeners([(f"iperf3 --server --one-off --bind {shlex.quote(half.ip)} --port {int(port)}", int(port))],
                             listener_limit(seconds))


IPERF3_TRIES = 10
IPERF3_NOT_CONNECTED = "unable to connect to server"  # iperf3's error (src/iperf_error.c IECONNECT), 3.12 to 3.19


def iperf3_client_command(server: FabricHalf, client: FabricHalf, port: int, seconds: int) -> str:
    # The server's start returned once it listened (bounded_listeners); a connection that fails is
    # still tried again, a few times (IPERF3_TRIES). Told by the report's error, not by the exit
    # status: with --json, iperf3 3.11 and 3.12 (Debian 12's) exit 0 when the connection fails
    # (esnet/iperf#1405; tests/unit/fixtures/iperf3-3.12-refused.json), and a loop on the status
    # would not try again at all.
    one = (f"iperf3 --client {shlex.quote(server.ip)} --bind {shlex.quote(client.ip)} --port {int(port)} "
           f"--time {int(seconds)} --json")
    return (f"for i in $(seq {IPERF3_TRIES}); do out=$({one}); "
            f"case \"$out\" in *'{IPERF3_NOT_CONNECTED}'*) sleep 0.5;; *) break;; esac; done; "
            f"printf '%s\\n' \"$out\"")


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
# address through rdma_cm (-R), so the GID is the one of that address, whatever its index: without
# -R perftest picks a GID itself (src/perftest_communication.c get_best_gid_index: the best-scoring
# IPv4-mapped RoCE v2 entry, the lowest index among equals), which on a netdev with a second IPv4
# address need not be the half's. The writes are the same in both modes (only the connection's
# exchange differs), so the field's plain runs and its -R runs measure one thing. `qps` queue pairs
# per half (fabric_speed_rdma_qps), IB_MESSAGE_BYTES each.

def _ib_write_bw(hca: str, port: int, seconds: int, qps: int) -> str:
    return (f"ib_write_bw -d {shlex.quote(hca)} -R -q {int(qps)} -s {IB_MESSAGE_BYTES} -F --report_gbits "
            f"-D {int(seconds)} -p {int(port)}")


def ib_server_command(link: SpeedLink, port: int, seconds: int, qps: int) -> str:
    """The server end of every half, each bounded on the node (bounded_listeners; each exits after
    its one test when it runs to the end), the start returning once rdma_cm shows every one
    listening (RDMA_CM_LISTENING: with -R they hold no TCP socket)."""
    servers = [(_ib_write_bw(s.hca, port + i, seconds, qps), port + i) for i, (s, _) in enumerate(link.halves)]
    return bounded_listeners(servers, listener_limit(seconds), RDMA_CM_LISTENING)


def ib_client_command(link: SpeedLink, port: int, seconds: int, qps: int) -> str:
    """Every half's client at once; their reports one after the other, each under `== <i>`."""
    runs = " ".join(f"{_ib_write_bw(c.hca, port + i, seconds, qps)} {shlex.quote(s.ip)} > \"$d/{i}\" 2>&1 &"
                    for i, (s, c) in enumerate(link.halves))
    show = " ".join(f"echo '== {i}'; cat \"$d/{i}\";" for i in range(len(link.halves)))
    return f"d=$(mktemp -d); {runs} wait; {show} rm -rf \"$d\""


def ib_write_bw_rows(report: str) -> list[float]:
    """BW average (Gb/sec) of every result row under an ib_write_bw header (--report_gbits): one row
    for a timed run, one per interval with --run_infinitely; lines that are not rows (a warning
    perftest prints to stderr, the dashes) are skipped."""
    rows: list[float] = []
    under_header = False
    for line in report.splitlines():
        if "BW average[Gb/sec]" in line:
            under_header = True
            continue
        words = line.split()
        if under_header and len(words) >= 5 and words[0].isdigit() and words[1].isdigit():
            rows.append(float(words[3]))
    return rows


def ib_write_bw_gbits(report: str) -> float:
    """One half's figure: the mean of its report's rows, to perftest's two decimals; ValueError when
    the report has none."""
    rows = ib_write_bw_rows(report)
    if not rows:
        raise ValueError(f"ib_write_bw reported no bandwidth: {report.strip()[-300:] or 'nothing'}")
    return round(sum(rows) / len(rows), 2)


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
    return (f"{link.client.name} {c.netdev}{'/' + c.hca if c.hca else ''} -> "
            f"{link.server.name} {s.netdev}{'/' + s.hca if s.hca else ''} ({s.ip})")


def tcp_failures(link: SpeedLink, gbits: dict[int, float], bar: float) -> list[str]:
    return [f"fabric speed: {half_name(link, i)}: iperf3 {g:.2f} Gbit/s, below the bar of {bar:g} Gbit/s "
            f"(fabric_speed_min_tcp_gbits); usual causes: {'; '.join(USUAL_CAUSES)}"
            for i, g in sorted(gbits.items()) if g < bar]


def rdma_failures(link: SpeedLink, gbits: dict[int, float], bar: float) -> list[str]:
    """Each half below the bar, named (both ends' netdev and HCA), with every half's figure beside it:
    one half low points at that half, both low at the cable or the boot it was plugged in after."""
    each = ", ".join(f"{link.halves[i][1].hca} {g:.2f}" for i, g in sorted(gbits.items()))
    return [f"fabric speed: {half_name(link, i)}: ib_write_bw {g:.2f} Gbit/s, below the bar of {bar:g} Gbit/s "
            f"per half (fabric_speed_min_rdma_half_gbits; the link's halves, all at once: {each}); usual causes: "
            f"{'; '.join(USUAL_CAUSES)}"
            for i, g in sorted(gbits.items()) if g < bar]


# The collective: all_gather across the group in the serving image (files/sfl_gather.py).

def buffer_mib(cluster, mem_available_gib: dict[str, float]) -> tuple[int | None, str]:
    """The gathered tensor's size in MiB: the largest size the collective has a bar for
    (fabric_speed_busbw_bars_gbytes), at most fabric_speed_max_buffer_mib, whose buffers (the output,
    the input, NCCL's staging: about twice the output) fit in the least MemAvailable of the group
    minus guard_min_headroom_gib and fabric_speed_headroom_gib. (None, why) when even the smallest
    does not fit: the deploy stops rather than freeze a Spark (PR #103's 16 GB test) or gather at a
    size no bar holds for."""
    head = cluster.head
    bars = head.fabric_speed_busbw_bars_gbytes
    name, available = min(((n.name, mem_available_gib.get(n.name, 0.0)) for n in cluster.nodes), key=lambda x: x[1])
    keep = head.guard_min_headroom_gib + head.fabric_speed_headroom_gib
    budget_mib = (available - keep) * 1024 / 2
    sizes = [s for s in sorted(bars) if s <= head.fabric_speed_max_buffer_mib and s <= budget_mib]
    if not sizes:
        smallest = min(bars)
        return None, (f"fabric speed: {name}: MemAvailable {available:.1f} GiB leaves no room for the collective's "
                      f"smallest buffer with a bar, {smallest} MiB (fabric_speed_busbw_bars_gbytes), beside {keep:g} "
                      f"GiB kept free (guard_min_headroom_gib + fabric_speed_headroom_gib): free memory on {name}, "
                      f"or set fabric_speed_collective = false")
    size = sizes[-1]
    return size, (f"{size} MiB, held to {bars[size]:g} GB/s busbw (budget: {available:.1f} GiB available on {name} "
                  f"- {keep:g} GiB kept, halved; at most fabric_speed_max_buffer_mib, {head.fabric_speed_max_buffer_mib})")


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


def all_gather_perf_figures(output: str) -> list[dict]:
    """nccl-tests' all_gather_perf table -> one figure per size, in the runner's form: bytes, each
    run's busbw and #wrong, and busbw_gbytes, their mean (nccl-tests' 'Avg bus bandwidth' of that
    size). Rows are the lines of 13 columns whose first is the size in bytes; comments are skipped."""
    figures = []
    for line in output.splitlines():
        words = line.split()
        if len(words) != 13 or not (words[0].isdigit() and words[1].isdigit()):
            continue
        out_of_place, in_place = float(words[7]), float(words[11])
        wrong = sum(int(w) for w in (words[8], words[12]) if w.isdigit())
        figures.append({"backend": "nccl", "bytes": int(words[0]), "busbw_out_of_place_gbytes": out_of_place,
                        "busbw_in_place_gbytes": in_place, "busbw_gbytes": round((out_of_place + in_place) / 2, 4),
                        "wrong": wrong})
    return figures


def gather_failures(cluster, figure: dict) -> list[str]:
    """The figure held to the bar for the size it gathered (fabric_speed_busbw_bars_gbytes): the
    mean of its out-of-place and in-place busbw, as the bar's own figures are."""
    head = cluster.head
    bars = head.fabric_speed_busbw_bars_gbytes
    mib = figure["bytes"] // MIB
    ranks = ", ".join(n.name for n in sorted(cluster.nodes, key=lambda n: n.rank))
    what = f"all_gather ({figure['backend']}, {mib} MiB) across {ranks}"
    if figure.get("wrong"):
        return [f"fabric speed: {what} returned {figure['wrong']} wrong element(s): the collective is broken, "
                f"whatever its speed"]
    if mib not in bars:
        return [f"fabric speed: {what}: no bar for {mib} MiB (fabric_speed_busbw_bars_gbytes has "
                f"{sorted(bars)} MiB): a figure is held to the bar of the size it gathered, or to none"]
    bar = bars[mib]
    if figure["busbw_gbytes"] >= bar:
        return []
    runs = (f" (out-of-place {figure['busbw_out_of_place_gbytes']:.2f}, in-place {figure['busbw_in_place_gbytes']:.2f})"
            if "busbw_in_place_gbytes" in figure else "")
    return [f"fabric speed: {what}: busbw {figure['busbw_gbytes']:.3f} GB/s{runs}, below the bar of {bar:g} GB/s "
            f"for {mib} MiB (fabric_speed_busbw_bars_gbytes); usual causes: {'; '.join(USUAL_CAUSES)}; or the "
            f"image's NCCL build"]


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


# One link's test, run from the head's operation body (link_tasks.py): `run(node, command, what)` runs
# a command on a node and returns its stdout (raising DeployError when it fails), `stop(node)` stops
# that node's servers (stop_listeners_command) and never raises. The server node's servers are
# stopped when the test ends, whatever the outcome: figures read, a client that failed, a report
# that is no report, the connection lost. What `stop` cannot reach, each server's bound ends.

def tcp_figures(link: SpeedLink, port: int, seconds: int, run, stop) -> dict[int, float]:
    """iperf3 over each half, one after the other: half index -> Gbit/s."""
    figures = {}
    try:
        for i, (s, c) in enumerate(link.halves):
            run(link.server.name, iperf3_server_command(s, port, seconds), f"iperf3's server on {s.netdev}")
            try:
                figures[i] = iperf3_gbits(run(link.client.name, iperf3_client_command(s, c, port, seconds),
                                              f"iperf3 over {c.netdev}"))
            except ValueError as err:
                raise DeployError(f"fabric speed: {half_name(link, i)}: {err}") from err
    finally:
        stop(link.server.name)
    return figures


def rdma_figures(link: SpeedLink, port: int, seconds: int, qps: int, run, stop) -> dict[int, float]:
    """ib_write_bw over both halves at once: half index -> Gbit/s."""
    try:
        run(link.server.name, ib_server_command(link, port, seconds, qps), "ib_write_bw's servers")
        reports = ib_reports(run(link.client.name, ib_client_command(link, port, seconds, qps), "ib_write_bw"))
    finally:
        stop(link.server.name)
    figures = {}
    for i in range(len(link.halves)):
        try:
            figures[i] = ib_write_bw_gbits(reports.get(i, ""))
        except ValueError as err:
            raise DeployError(f"fabric speed: {half_name(link, i)}: {err}") from err
    return figures
