"""The router from the controller, over SSH to the router node: which groups it routes to now, and a
group drained (taken out of routing) or undrained (put back) for a rolling upgrade. Each call runs
`sfl_router.py` on the router node as root, which reads the control-plane key from its root-only file
(/etc/sparkfleet/router-control-key, generated there; the API key clients have is refused on smg's
control plane) and calls smg's admin API on loopback: the key never crosses SSH, never leaves the
router node and is on no command line.

`host` is the router node's pyinfra Host (state.inventory.get_host(router_node)); `backend` is a
group's head as the router names it (backend_of(group), from the inventory). A rolling upgrade step:

    drain(router_host, backend_of(group))    # smg lets in-flight requests finish, then forgets it
    ... upgrade the group, prove it serves ...
    undrain(router_host, backend_of(group))  # back once smg's health checks pass

A drained group stays out until undrained, or until the router restarts (it then routes to every
group of its config again): do not change the router's config while a group is drained.
"""
from __future__ import annotations

import json
import shlex
import time

from pyinfra import host, logger
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError

from roles.router.node_config import ROUTER_CONFIG, SFL_ROUTER, backend_url, routed_groups


class RouterError(RuntimeError):
    pass


def backend_of(group) -> str:
    """The URL the router knows a serving group by (its head's API on the management address)."""
    return backend_url(group.head)


def _run(host, *args: str) -> list[dict]:

    command = " ".join(["python3", SFL_ROUTER, *(shlex.quote(a) for a in args)])
    ok, out = host.run_shell_command(StringCommand(command))
    text = "\n".join(out.stdout_lines if hasattr(out, "stdout_lines") else out.stdout.splitlines())
    if not ok:
        err = "\n".join(out.stderr_lines) if hasattr(out, "stderr_lines") else str(out)
        raise RouterError(f"{host.name}: {' '.join(args[:1])} failed: {(err or text).strip()[-400:]}")
    return json.loads(text.strip().splitlines()[-1])


def groups_by_url(fleet, router) -> dict[str, str]:
    """backend URL -> the serving group's name, for every group the router routes to."""

    return {backend_url(g.head): name for name, g in routed_groups(fleet, router).items()}


def routing(host) -> list[dict]:
    """[{url, state, configured, status}] for every backend: state routed (smg sends it requests),
    unhealthy (registered, failing its health checks), draining or drained (not registered)."""
    return _run(host, "routing", ROUTER_CONFIG)


def drain(host, backend: str, timeout_s: float = 120) -> list[dict]:
    """Take `backend` out of routing; returns (the routing after) once smg no longer has it."""
    return _run(host, "drain", ROUTER_CONFIG, backend, str(timeout_s))


def undrain(host, backend: str, timeout_s: float = 120) -> list[dict]:
    """Put `backend` back; returns (the routing after) once smg routes to it (registered and healthy)."""
    return _run(host, "undrain", ROUTER_CONFIG, backend, str(timeout_s))


def report_routing(port: int, timeout_s: float = 60) -> None:
    """Operation body (the router node, after a (re)start): wait for the router's admin API, then print
    one line per group; fails when it never answers or routes to no group at all."""

    deadline = time.monotonic() + timeout_s
    table, last_error = None, ""
    while time.monotonic() < deadline:
        try:
            table = routing(host)
            if table and all(b["state"] == "routed" for b in table if b["configured"]):
                break
        except (RouterError, ValueError, IndexError) as e:
            last_error = str(e)
        time.sleep(1)
    if not table:
        raise DeployError(f"{host.name}: the router on port {port} did not answer within {timeout_s:g} s "
                          f"(journalctl -u sparkfleet-router): {last_error}")
    for b in table:
        logger.info(f"    [{host.name}] router :{port} -> {b['url']}: {b['state']}")
    if not any(b["state"] == "routed" for b in table):
        raise DeployError(f"{host.name}: the router on port {port} routes to no group: "
                          f"{', '.join(b['url'] + ' ' + b['state'] for b in table)}")


ROUTING_PROBLEMS = {
    "routed": None,
    "drained": "drained: out of routing although the router's config names it; a deploy routes it again once it serves",
    "draining": "draining: being taken out of routing (a run's turn, or a run that stopped in one)",
    "unhealthy": "unhealthy: the router's health checks of its head fail (GET /health)",
    None: "not in the router's routing: a deploy writes the router's config and restarts it",
}


def doctor_rows(fleet, router, table) -> list[tuple]:
    """(check, group, problems, note) per group the router should route to, from RouterRouting's
    table (None: the router's unit is not active; {'error': ...}: it does not answer)."""
    groups = groups_by_url(fleet, router)
    if table is None or "error" in table:
        why = "its unit is not active" if table is None else f"its admin API does not answer: {table['error']}"
        return [("router", router.name, [f"the router on {router.name} routes nothing: {why}"])]
    rows = []
    for url, group in groups.items():
        problem = ROUTING_PROBLEMS.get(table.get(url), f"{table.get(url)}: a state sparkfleet does not know")
        rows.append(("router", group, [f"{url} {problem}"] if problem else [], f"{url} routed"))
    return rows
