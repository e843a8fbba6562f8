"""Step 7c: the watchdog paused before the deploy moves the pair (roles/watchdog/checks.py).

Before the prewarm (roles/kernel_cache) or the pair restart (roles/serving) stops any unit,
sparkfleet-watchdog stops on every node where it runs, the head's first: a watchdog must never
see the deploy's own stop of the head as a hang. Decided at prepare time with the same verdicts
(the run's plan, tools/plan.py): an unchanged deploy stops nothing. roles/watchdog/tasks.py (step 10)
starts it again once the pair serves.
"""
from pyinfra import host, state
from pyinfra.operations import server

from roles.watchdog.checks import node_steps, stop_command
from sparkfleet.decided import decisions
from sparkfleet.watchdog_handover import PAUSE_STEPS
from sparkfleet.inventory import cluster_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
plan = decisions(state).watchdog  # the run's plan (tools/plan.py)
on_head, pause = node.is_head, node_steps(node, plan).pause

# Defined on every host, gated by _if, so that pyinfra orders the head's before the workers'.
server.shell(
    name=PAUSE_STEPS[0],  # (sparkfleet/run.py finds the pause by this name)
    commands=[stop_command()],
    _if=lambda: on_head and pause,
)
server.shell(
    name=PAUSE_STEPS[1],
    commands=[stop_command()],
    _if=lambda: not on_head and pause,
)
