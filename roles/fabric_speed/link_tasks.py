"""Step 3d, after the jumbo-frame proof: each link's speed, before anything ships or starts.

Due when a node holds no passed record of this fabric (roles/fabric_speed/checks.py); the group's
head runs every link's test, one link and one half after the other (a test shares its link with
nothing). The figures wait for the collective (collective_tasks.py), then go into each node's
record, and into the log. Each test's servers are bounded on the node and stopped after each link
whatever its outcome (checks.py bounded_listeners): a failed proof leaves nothing listening, an
interrupted one (the controller killed) nothing past the bound."""
from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.server import Which
from pyinfra.operations import apt, python

from roles.fabric_speed.checks import (
    SPEED_PACKAGES, half_name, keep_figures, rdma_failures, rdma_figures, stop_listeners_command, tcp_failures,
    tcp_figures,
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


def _stop_listeners(name: str) -> None:
    """Every speed server on `name` stopped, in every outcome of its link's test; when this fails too
    (the connection lost), each server's bound on the node ends it (checks.py bounded_listeners)."""
    try:
        ok, out = state.inventory.get_host(name).run_shell_command(StringCommand(stop_listeners_command()))
    except Exception as exc:  # already failing: the test's own error is the one to report
        ok, out = False, None
        logger.warning(f"    fabric speed: {name}: stopping the test's servers failed ({exc}); each ends at its bound")
    if not ok and out is not None:
        logger.warning(f"    fabric speed: {name}: stopping the test's servers failed ({(out.stderr or '').strip()[-200:]}); "
                       f"each ends at its bound")


def prove_link_speeds(links, test: str, port: int, seconds: int, tcp_bar: float, rdma_bar: float,
                      rdma_qps: int) -> None:
    """Operation body on the head: every link's test; the deploy stops on the first link with a half
    below its bar, naming the half, its figure and the bar."""
    figures = []
    for link in links:
        gbits = (rdma_figures(link, port, seconds, rdma_qps, _run, _stop_listeners) if test == "ib_write_bw"
                 else tcp_figures(link, port, seconds, _run, _stop_listeners))
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
