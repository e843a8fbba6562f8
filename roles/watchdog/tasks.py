"""roles/watchdog: sparkfleet-watchdog on every node keeps the pair serving between deploys.

The head's watchdog probes the pair with a real completion and restarts it as one when it stops
serving; each worker's follows the head's state through the fabric rsync daemons (module watchdog,
roles/fanout, which also creates the state directory before its daemon serves it). No node holds a
key to another. The program is sfl_watch.py (its docstring is the design); this file installs it:

1. the program beside sfl_files.py, its config (/etc/sparkfleet/watchdog.json, 0600: it names the
   API key file) and its unit; the config checked by the program itself when either changed;
2. the unit enabled at boot iff watchdog_enabled and serving_start_at_boot, and running iff
   watchdog_enabled;
3. the end of the deploy's pause (roles/watchdog/pause_tasks.py, checks.py): once the pair serves,
   where this run stopped the watchdog or found it stopped, the hand-over (`sfl_watch.py deployed`),
   then the start, workers first, head last. A running watchdog is restarted only when its program,
   config or unit changed; an unchanged deploy changes nothing here.
"""
from io import StringIO
from pathlib import Path

from pyinfra import host, state
from pyinfra.operations import server, systemd
from pyinfra.operations.util import any_changed

from sparkfleet.decided import decisions
from sparkfleet.model.serving import node_profile
from roles.watchdog.checks import check_config_command, node_steps, stop_command
from roles.watchdog.node_config import UNIT_PATH, unit_text, watch_config_text
from sparkfleet.model.watchdog import SFL_WATCH, WATCH_CONFIG, WATCH_UNIT
from sparkfleet.watchdog_handover import START_STEPS, hand_over_command, start_command
from sparkfleet import unchanged
from sparkfleet.inventory import cluster_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
steps = node_steps(node, decisions(state).watchdog)
on_head, enabled = node.is_head, node.watchdog_enabled

# 1. The program, its config and its unit. (The tools directory exists: roles/fanout made it.)
program = unchanged.put(
    name="Install sfl_watch.py (the pair's watchdog: probe, restart as one, status)",
    src=str(Path(__file__).with_name("sfl_watch.py")),
    dest=SFL_WATCH,
    mode="0755",
)
config = unchanged.put(
    name=f"Write {WATCH_CONFIG}",
    src=StringIO(watch_config_text(cluster, node, node_profile(node), node)),
    dest=WATCH_CONFIG,
    user="root",
    group="root",
    mode="0600",
)
unit = unchanged.put(
    name=f"Write the {WATCH_UNIT} unit",
    src=StringIO(unit_text(node)),
    dest=UNIT_PATH,
    user="root",
    group="root",
    mode="0644",
)
changed = any_changed(program, config, unit)
systemd.daemon_reload(name=f"Reload systemd ({WATCH_UNIT} unit changed)", _if=unit.did_change)
server.shell(
    name=f"Check {WATCH_CONFIG} with the program",
    commands=[check_config_command()],
    _if=any_changed(program, config),
)

# 2. At boot only with the pair (serving_start_at_boot); running=None: started below, in order.
unchanged.service(
    name=f"Set {WATCH_UNIT} start at boot to {steps.enable}",
    service=f"{WATCH_UNIT}.service",
    running=None,
    enabled=steps.enable,
)
server.shell(
    name=f"Stop {WATCH_UNIT} (watchdog_enabled is false)",
    commands=[stop_command()],
    _if=lambda: steps.stop,
)

# 3. The pair serves (roles/serving awaited it): the hand-over, then the watchdogs, workers first.
server.shell(
    name="Hand the pair over to the watchdog (sfl_watch.py deployed)",
    commands=[hand_over_command()],
    _if=lambda: steps.hand_over,
)
server.shell(
    name=START_STEPS[0],  # (sparkfleet/run.py finds the start by this name)
    commands=[start_command()],
    _if=lambda: not on_head and enabled and (steps.start or changed()),
)
server.shell(
    name=START_STEPS[1],
    commands=[start_command()],
    _if=lambda: on_head and enabled and (steps.start or changed()),
)
