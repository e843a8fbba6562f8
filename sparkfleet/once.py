"""Run a cluster-wide step once per deploy, however many hosts load the deploy file.

pyinfra loads deploy.py once per host, in parallel greenlets, at prepare time. Checks that need
every node's facts (the preflight table, the fabric proof) run in the first greenlet that asks;
the others wait on the lock and get the same result, so the table prints once and every host
sees the same verdict.
"""
from typing import Any, Callable

from gevent.lock import Semaphore


def once_per_run(state, key: str, compute: Callable[[], Any]) -> Any:
    registry = state.__dict__.setdefault("_sparkfleet_once", {})
    lock = registry.setdefault(("lock", key), Semaphore())
    with lock:
        if key not in registry:
            try:
                registry[key] = ("ok", compute())
            except Exception as exc:  # every host re-raises the same failure
                registry[key] = ("error", exc)
    kind, value = registry[key]
    if kind == "error":
        raise value
    return value


def active_hosts(state):
    return list(state.inventory.get_active_hosts())


def at_once(*computes: Callable[[], Any]) -> list[Any]:
    """compute() of each, all at once (a greenlet each, as pyinfra gathers facts); the results in
    order. A cluster-wide step runs in one host's greenlet: calling get_fact host after host from
    there pays every node's round trips one after the other. The first failure is raised here, as a
    loop would raise it (raised in its greenlet, gevent would print it with a traceback)."""
    import gevent
    from pyinfra.context import ctx_host, ctx_state

    state, host = ctx_state.get(), ctx_host.get()

    def one(compute):
        try:
            with ctx_state.use(state), ctx_host.use(host):
                return "ok", compute()
        except Exception as exc:
            return "error", exc

    greenlets = [gevent.spawn(one, compute) for compute in computes]
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
