"""Read-only health check of a deployed pair: pyinfra inventory.py doctor.py

Every guard, the fabric (netplan file, live link, jumbo pings to every peer), the firewall (each
node's live table inet sparkfleet is the one data renders), docker, image IDs, units, the pair's health (the watchdog's probe: a real completion, every rank's processes; never
/health alone) and each node's watchdog (running, and not given up), as one table. Defines no
operation: nothing is changed.
"""
from pyinfra import state

from tools.doctor import run_doctor
from sparkfleet.run import refusals_stop_the_run

with refusals_stop_the_run():
    run_doctor(state)
