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
