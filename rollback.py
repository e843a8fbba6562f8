"""Roll the pair back to the recipe commit that served last: pyinfra inventory.py rollback.py

Reads the head's history of what the pair attempted and served (roles/serving/history.py) and runs
the normal deploy, for this run only, with the commit that served last other than the one data
names (after a failed upgrade: the one serving before it). Every node kept that image, so nothing
is rebuilt or pulled; the units are re-rendered and the pair restarts worker-first when they changed.
"""
from pyinfra import local, state

from tools.rollback import override_with_previous
from sparkfleet.run import refusals_stop_the_run

with refusals_stop_the_run():
    local.include("roles/lock/tasks.py")  # before the history is read: one run at a time (roles/lock)
    override_with_previous(state)
local.include("deploy.py")
