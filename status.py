"""Read-only status of the serving pair: pyinfra inventory.py status.py (make status)

Per pair: the probe and its latency, each rank's unit, container and uptime, each node's watchdog
and its last actions, and the recipe commit served (tools/status.py). Defines no operation:
nothing is changed, and nothing is judged (`make doctor` judges).
"""
from pyinfra import state

from sparkfleet.run import refusals_stop_the_run
from tools.status import run_status

with refusals_stop_the_run():
    run_status(state)
