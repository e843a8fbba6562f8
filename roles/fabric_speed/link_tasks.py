"""Step 3d, after the jumbo-frame proof: each link's speed, before anything is built or started.

Due when a node holds no passed record of this fabric (roles/fabric_speed/checks.py); the group's
head runs every link's test, one link and one half after the other (a test shares its link with
nothing). The figures wait for the collective (collective_tasks.py), then go into each node's
record, and into the log."""
from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.server import Which
from pyinfra.operations import apt, python

from roles.fabric_speed.checks import (
    SPEED_PACKAGES, SpeedLink, ib_client_command, ib_reports, ib_server_command, ib_write_bw_gbits, iperf3_client_command,
    iperf3_gbits, iperf3_server_command, half_name, keep_figures, rdma_failures, tcp_failures,
)
from sparkfleet.decided import decisions
from sparkfleet.inventory import cluster_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
plan = decisions(state).speed  # the run's plan (tools/plan.py)
if plan.why and node.is_head:
    logger.info(f"--> sparkfleet fabric speed ({cluster.head.name}'s group): proof due: {plan.why}")
if plan.why and plan.buffer_mib is None and node.fabric_speed_collective:
    raise DeployError(plan.buffer_why)  # at prepare: nothing has changed


def _run(name: str, command: str, what: str) -> str:
    ok, out = state.inventory.get_host(name).run_shell_command(StringCommand(command))
    if not ok:
        raise DeployError(f"fabric speed: {name}: {what} failed:\n{out.stderr or out.stdout}")
    return out.stdout


def _tcp(link: SpeedLink, port: int, seconds: int) -> dict[int, float]:
    figures = {}
    for i, (s, c) in enumerate(link.halves):
        _run(link.server.name, iperf3_server_command(s, port), f"iperf3's server on {s.netdev}")
        try:
            figures[i] = iperf3_gbits(_run(link.client.name, iperf3_client_command(s, c, port, seconds),
                                           f"iperf3 over {c.netdev}"))
        except ValueError as err:
            raise DeployError(f"fabric speed: {half_name(link, i)}: {err}") from err
    return figures


def _rdma(link: SpeedLink, port: int, seconds: int, qps: int) -> dict[int, float]:
    _run(link.server.name, ib_server_command(link, port, seconds, qps), "ib_write_bw's servers")
    reports = ib_reports(_run(link.client.name, ib_client_command(link, port, seconds, qps), "ib_write_bw"))
    figures = {}
    for i in range(len(link.halves)):
        try:
            figures[i] = ib_write_bw_gbits(reports.get(i, ""))
        except ValueError as err:
            raise DeployError(f"fabric speed: {half_name(link, i)}: {err}") from err
    return figures


def prove_link_speeds(links, test: str, port: int, seconds: int, tcp_bar: float, rdma_bar: float,
                      rdma_qps: int) -> None:
    """Operation body on the head: every link's test; the deploy stops on the first link with a half
    below its bar, naming the half, its figure and the bar."""
    figures = []
    for link in links:
        gbits = _rdma(link, port, seconds, rdma_qps) if test == "ib_write_bw" else _tcp(link, port, seconds)
        failures = rdma_failures(link, gbits, rdma_bar) if test == "ib_write_bw" else tcp_failures(link, gbits, tcp_bar)
        for i, g in sorted(gbits.items()):
            figures.append({"test": test, "link": half_name(link, i), "gbits": round(g, 3)})
            logger.info(f"    fabric speed: {half_name(link, i)}: {test} {g:.2f} Gbit/s")
        if failures:
            raise DeployError("\n".join(failures))
    keep_figures(state, links[0].server.serving_group, figures)


# The test's tool on every node (perftest ships ib_write_bw), from the OS's packages, when the node
# lacks it (each test is named after its program): an installed tool costs one read, not apt's.
if node.fabric_speed_link_test != "off" and not host.get_fact(Which, command=node.fabric_speed_link_test):
    apt.packages(
        name=f"Install {SPEED_PACKAGES[node.fabric_speed_link_test]} (the fabric's speed test)",
        packages=[SPEED_PACKAGES[node.fabric_speed_link_test]],
        update=True,
        cache_time=3600,
    )

if plan.why and node.is_head and node.fabric_speed_link_test != "off":
    python.call(
        name=f"Prove the fabric's speed: {node.fabric_speed_link_test} over every link",
        function=prove_link_speeds,
        links=plan.links,
        test=node.fabric_speed_link_test,
        port=node.fabric_speed_port,
        seconds=node.fabric_speed_seconds,
        tcp_bar=node.fabric_speed_min_tcp_gbits,
        rdma_bar=node.fabric_speed_min_rdma_half_gbits,
        rdma_qps=node.fabric_speed_rdma_qps,
    )
