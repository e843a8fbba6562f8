"""Handing the pair to its watchdogs: `sfl_watch.py deployed` (the head does not resume a restart the
stop interrupted, clears a give-up, counts its restarts afresh), then the watchdog (re)started. A
deploy's end does it on every node whose watchdog it stopped or found stopped (roles/watchdog/tasks.py);
a failed prewarm whose previous production serves again does it for the watchdogs it paused itself
(roles/kernel_cache: resume_watchdogs). roles/watchdog/checks.py says when the deploy pauses them."""
from typing import Iterable, Mapping

from pyinfra.api.exceptions import DeployError
from pyinfra.context import ctx_state

from sparkfleet.model.watchdog import SFL_WATCH, WATCH_CONFIG, WATCH_UNIT
from sparkfleet.run_failure import on_node

# The deploy's operations that pause the watchdogs (roles/watchdog/pause_tasks.py, step 7c) and start
# them again (roles/watchdog/tasks.py, step 10): sparkfleet/run.py watches for them by these names to
# say, when a run stops between the two, where the watchdogs stay paused (paused_note).
PAUSE_STEPS = (f"Pause the head's {WATCH_UNIT} (the deploy moves the pair)",
               f"Pause the workers' {WATCH_UNIT} (the deploy moves the pair)")
START_STEPS = (f"Start the workers' {WATCH_UNIT}", f"Start the head's {WATCH_UNIT} (every worker's runs)")


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
    _resumed([n.name for n in order])
    return f"{WATCH_UNIT} watches it again on {', '.join(n.name for n in order)}"


# Where a run keeps the nodes whose watchdogs it started again outside step 10 (a failed prewarm's own
# hand-over): on pyinfra's state, which sparkfleet/run.py reads at the run's end (resumed_on). Kept
# there, not on run.py's RunContext, so this module needs nothing from run.py (which imports it).
RESUMED_ATTR = "_sparkfleet_watchdogs_resumed"


def _resumed(names: list[str]) -> None:
    """Tell this run's end (sparkfleet/run.py) that these watchdogs watch again: not paused any more."""
    if ctx_state.isset():
        ctx_state.get().__dict__.setdefault(RESUMED_ATTR, set()).update(names)


def resumed_on(state) -> set[str]:
    """The nodes whose watchdogs this run started again outside step 10 (_resumed)."""
    return set(getattr(state, RESUMED_ATTR, ()) or ())


def paused_note(paused: Iterable[str], addresses: Mapping[str, str]) -> str | None:
    """The last lines of a run that stopped after pausing the watchdogs of `paused` (node names, in the
    order paused), None when it left none paused. `addresses`: node -> where ssh reaches it."""
    names = list(dict.fromkeys(paused))
    if not names:
        return None
    checks = "\n".join(f"    {on_node(addresses.get(n, n), f'systemctl status {WATCH_UNIT}')}" for n in names)
    return (f"{WATCH_UNIT} stays paused on {', '.join(names)}: this deploy stopped it before moving the pair and "
            f"stopped before starting it again. Nothing restarts a hung pair there until the next successful "
            f"deploy, which hands the pair over and starts it (a reboot starts it too: it stays enabled; "
            f"`make doctor` fails until then). Check it (inactive means paused):\n{checks}")
