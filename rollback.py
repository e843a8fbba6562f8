"""Roll the pair back to the recipe commit it served before: pyinfra inventory.py rollback.py

Reads the served-commit history on the head, then runs the normal deploy with that commit for
this run only. Every node kept the previous image, so nothing is rebuilt or pulled; the units are
re-rendered and the pair restarts worker-first.
"""
from pyinfra import local, state

from sparkfleet.rollback import override_with_previous
from sparkfleet.run import refusals_stop_the_run

with refusals_stop_the_run():
    override_with_previous(state)
local.include("deploy.py")
