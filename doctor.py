"""Read-only health check of a deployed pair: pyinfra inventory.py doctor.py

Every guard, the fabric (netplan file, live link, jumbo pings to every peer), docker, image IDs,
units and the head's /health, as one table. Defines no operation: nothing is changed.
"""
from pyinfra import state

from sparkfleet.doctor import run_doctor
from sparkfleet.run import refusals_stop_the_run

with refusals_stop_the_run():
    run_doctor(state)
