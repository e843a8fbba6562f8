"""Handing the pair to its watchdogs: `sfl_watch.py deployed` (the head does not resume a restart the
stop interrupted, clears a give-up, counts its restarts afresh), then the watchdog (re)started. A
deploy's end does it on every node whose watchdog it stopped or found stopped (roles/watchdog/tasks.py);
a failed prewarm whose previous production serves again does it for the watchdogs it paused itself
(roles/kernel_cache: resume_watchdogs). roles/watchdog/checks.py says when the deploy pauses them."""
from pyinfra.api.exceptions import DeployError

from sparkfleet.model.watchdog import SFL_WATCH, WATCH_CONFIG, WATCH_UNIT


def start_command() -> str:
    """(Re)start: reads the unit, program and config afresh, and starts a stopped one too."""
    return f"systemctl restart {WATCH_UNIT}.service"


def hand_over_command() -> str:
    return f"python3 {SFL_WATCH} deployed {WATCH_CONFIG}"


def resume_watchdogs(run, cluster, paused) -> str | None:
    """After a failed prewarm brought the previous production back: hand the pair over to the
    watchdogs this run paused and start them, workers first. `run(node name, command, what)` runs a
    command on a node and raises DeployError when it fails (roles/kernel_cache's _Nodes.run).
    Returns what it did (None: nothing was paused), or why the watchdogs stay stopped."""
    order = [n for n in (*cluster.workers, cluster.head) if n.name in paused]
    if not order:
        return None
    try:
        for n in order:  # the head's hand-over before any worker's watchdog reads its state
            run(n.name, hand_over_command(), "handing the pair over to its watchdog")
        for n in order:
            run(n.name, start_command(), f"starting {WATCH_UNIT}")
    except DeployError as exc:
        return (f"{WATCH_UNIT} stays stopped ({str(exc).splitlines()[0]}); the next deploy starts it "
                f"(or: systemctl start {WATCH_UNIT})")
    return f"{WATCH_UNIT} watches it again on {', '.join(n.name for n in order)}"
