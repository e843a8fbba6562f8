"""Run a cluster-wide step once per deploy (per serving group), however many hosts load the deploy file.

pyinfra loads deploy.py once per host, in parallel greenlets, at prepare time. Checks that need
every node's facts (the preflight table, the fabric proof) run in the first greenlet that asks;
the others wait on the lock and get the same result, so the table prints once and every host
sees the same verdict.
"""
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from gevent.lock import Semaphore

from sparkfleet.inventory import current_group, fleet_from_state, group_hosts


def once_per_run(state, key: str, compute: Callable[[], Any]) -> Any:
    """compute() once per serving group (its hosts' greenlets share the result): every decision a
    role takes is its group's, so a change to one group's profile restarts that group only."""

    return once_per_fleet(state, f"{current_group(state)}:{key}", compute)


def once_per_fleet(state, key: str, compute: Callable[[], Any]) -> Any:
    """compute() once per run, whatever the group (the plan table, the router)."""
    with _slot(state, key) as slot:
        return slot.value if slot.done else slot.fill(compute())


class Slot:
    """One group's shared result, filled by the first greenlet that finds it empty (group_slot)."""

    __slots__ = ("done", "value", "error")

    def __init__(self):
        self.done, self.value, self.error = False, None, None

    def fill(self, value: Any) -> Any:
        self.done, self.value = True, value
        return value


@contextmanager
def _slot(state, key: str) -> Iterator[Slot]:
    """The run's slot for `key`, held under its lock: the first greenlet fills it, every other waits
    and gets its value, or the same failure (every host re-raises it)."""
    registry = state.__dict__.setdefault("_sparkfleet_once", {})
    lock = registry.setdefault(("lock", key), Semaphore())
    with lock:
        slot = registry.setdefault(key, Slot())
        if slot.error is not None:
            raise slot.error
        try:
            yield slot
        except Exception as exc:
            slot.error = exc
            raise


def group_slot(state, key: str):
    """once_per_run without a callback: the reader computes in its own body, under the group's lock,
    when the slot is empty; every other greenlet of the group gets the value, or the same failure.

        with group_slot(state, "fabric-others") as slot:
            return slot.value if slot.done else slot.fill(read(...))

    A role's reader that hands a callback to once_per_run is entered twice from its caller's chain
    (down into this file, back up into the role); a slot keeps the whole read in the role's body."""
    return _slot(state, f"slot:{current_group(state)}:{key}")


def fleet_slot(state, key: str):
    """group_slot for what is read once for the whole fleet, whatever the group (the router's routing,
    the fleet key's files: tools/plan.py fleet_facts)."""
    return _slot(state, f"slot:fleet:{key}")


def active_hosts(state):
    """The active hosts of the current host's serving group (every active host outside a host)."""

    return group_hosts(state, state.inventory.get_active_hosts())


def fleet_hosts(state):
    """Every active host of the fleet, whatever its group."""
    return list(state.inventory.get_active_hosts())


def at_once(*computes: Callable[[], Any], limit: int | None = None) -> list[Any]:
    """compute() of each, all at once (a greenlet each, as pyinfra gathers facts); the results in
    order. A cluster-wide step runs in one host's greenlet: calling get_fact host after host from
    there pays every node's round trips one after the other. The first failure is raised here, as a
    loop would raise it (raised in its greenlet, gevent would print it with a traceback).

    limit: at most that many at once. Each compute that reads facts holds an SSH channel on every
    node it reads, and sshd refuses channels past MaxSessions on one connection (OpenSSH's default
    is 10, sshd_config(5); paramiko reports it as ChannelException(2, 'Connect failed'))."""
    import gevent
    from gevent.pool import Pool
    from pyinfra.context import ctx_host, ctx_state

    state, host = ctx_state.get(), ctx_host.get()

    def one(compute):
        try:
            with ctx_state.use(state), ctx_host.use(host):
                return "ok", compute()
        except Exception as exc:
            return "error", exc

    spawn = Pool(limit).spawn if limit else gevent.spawn
    greenlets = [spawn(one, compute) for compute in computes]
    gevent.joinall(greenlets)
    out = []
    for greenlet in greenlets:
        kind, value = greenlet.value
        if kind == "error":
            raise value
        out.append(value)
    return out


def per_host(state, compute: Callable[[Any], Any], hosts=None) -> dict[str, Any]:
    """host name -> compute(host), every host at once (see at_once)."""
    hosts = list(active_hosts(state) if hosts is None else hosts)
    return dict(zip((h.name for h in hosts), at_once(*(lambda h=h: compute(h) for h in hosts))))


def per_group(state, compute: Callable[[Any], Any]) -> dict[str, Any]:
    """group name -> compute(group), every serving group at once, each in a greenlet whose host is
    one of that group's (its head when active): once_per_run keys, cluster_from_state and
    active_hosts there are that group's, so the results are the ones its roles read."""
    import gevent
    from pyinfra.context import ctx_host, ctx_state


    fleet = fleet_from_state(state)
    active = {h.name: h for h in fleet_hosts(state)}
    current = ctx_state.get()  # the State itself (`state` may be pyinfra's context proxy of it)
    chosen = {}
    for name, group in fleet.groups.items():
        host = next((active[n.name] for n in group.nodes if n.name in active), None)  # nodes are in rank order
        if host is not None:
            chosen[name] = (group, host)

    def one(group, host):
        try:
            with ctx_state.use(current), ctx_host.use(host):
                return "ok", compute(group)
        except Exception as exc:
            return "error", exc

    greenlets = {name: gevent.spawn(one, group, host) for name, (group, host) in chosen.items()}
    gevent.joinall(list(greenlets.values()))
    out = {}
    for name, greenlet in greenlets.items():
        kind, value = greenlet.value
        if kind == "error":
            raise value
        out[name] = value
    return out
