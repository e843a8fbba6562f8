"""What roles/watchdog does in a deploy, decided once at prepare time, and the commands it runs.

The deploy pauses the watchdog around its own restarts of the pair: the watchdog must never act on
a pair the deploy is changing (it would see a stopped head as a hang and restart the pair against
the deploy). The decision is the deploy's own prepare-time one: the pair moves when the kernel
caches are prewarmed (roles/kernel_cache: the prewarm stops the production units) or the pair
restarts (roles/serving). Then, before the prewarm or the pair restart stops any unit (deploy.py
step 7c, roles/watchdog/pause_tasks.py), sparkfleet-watchdog stops on every node where it runs,
the head's first (its restart in flight, if any, is then cut at a point it resumes from, and no
worker is left waiting on it). At the end (step 10, roles/watchdog/tasks.py), once the pair serves,
every node whose watchdog this run stopped, or found stopped, gets `sfl_watch.py deployed` (the
hand-over: the head does not resume a restart the stop interrupted, clears a give-up, counts its
restarts afresh) and its watchdog is started, the workers' first, the head's last. An unchanged
deploy stops nothing and starts nothing.

A deploy that fails in between leaves the watchdogs stopped and still enabled (a reboot starts
them); `make doctor` fails on that ("sparkfleet-watchdog is inactive"); the next deploy finds them
stopped and hands over and starts them at its end, whatever else it does. A failed prewarm whose
previous production serves again (roles/kernel_cache) hands over to, and starts, the watchdogs it
paused itself, before the deploy stops (resume_watchdogs: sparkfleet/watchdog_handover.py).
"""
from dataclasses import dataclass

from roles.watchdog.facts import WatchdogUnit
from sparkfleet.model.watchdog import SFL_WATCH, WATCH_CONFIG, WATCH_UNIT
from sparkfleet.once import per_host
from sparkfleet.verdicts import WatchdogPlan  # noqa: F401 (this role's verdict, on the ground floor)

# systemctl is-active values of a unit whose process runs or is about to (auto-restart included).
RUNNING = ("active", "activating", "reloading")


def runs(unit: dict | None) -> bool:
    return bool(unit) and unit.get("active") in RUNNING


def stop_command() -> str:
    return f"systemctl stop {WATCH_UNIT}.service"


def check_config_command() -> str:
    """The node's program accepts the config it was given (status exits 2 on a config error only)."""
    return f"python3 {SFL_WATCH} status {WATCH_CONFIG} >/dev/null; test $? -lt 2"


@dataclass(frozen=True)
class NodeSteps:
    """What roles/watchdog does on one node; `start` is what it does whatever changed: a running
    watchdog whose program, config or unit changed is restarted too (decided when the files are written)."""

    pause: bool  # stopped before the prewarm or the pair restart (pause_tasks.py)
    stop: bool  # stopped at the end: watchdog_enabled is false and it runs
    hand_over: bool  # `sfl_watch.py deployed` before the start
    start: bool  # started at the end: this run stopped it, or found it stopped
    enable: bool  # enabled at boot


def plan_for(cluster, moves: str | None, units: dict[str, dict]) -> WatchdogPlan:
    running = {name: runs(unit) for name, unit in units.items()}
    order = (cluster.head, *cluster.workers)
    pause = tuple(n.name for n in order if moves and running.get(n.name))
    return WatchdogPlan(moves=moves, running=running, pause=pause)


def node_steps(node, plan: WatchdogPlan) -> NodeSteps:
    on, paused, running = node.watchdog_enabled, node.name in plan.pause, plan.running.get(node.name, False)
    again = on and (paused or not running)
    return NodeSteps(pause=paused, stop=not on and running, hand_over=again, start=again,
                     enable=on and node.serving_start_at_boot)


def watchdog_units(state) -> dict[str, dict]:
    """node name -> its sparkfleet-watchdog unit (WatchdogUnit), every node of the run at once."""
    return per_host(state, lambda h: h.get_fact(WatchdogUnit))


def summary(plan: WatchdogPlan, cluster) -> str:
    """The verdict in one line, as the deploy prints it."""
    stopped = [n for n, r in plan.running.items() if not r]
    if plan.pause:
        text = f"paused on {', '.join(plan.pause)} before {plan.moves}, started again at the end"
    elif plan.moves:
        text = f"not running, nothing to pause before {plan.moves}"
    else:
        text = "left running (the pair does not move)"
    if stopped and cluster.head.watchdog_enabled:
        text += f"; started at the end on {', '.join(stopped)} (found stopped)"
    return text
