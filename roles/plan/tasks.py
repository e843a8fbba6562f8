"""Step 2c: the run's plan (sparkfleet/plan.py), printed once before any operation runs; run as a
plan (`sparkfleet plan`), also written for that command to read."""
from pyinfra import state

from sparkfleet.once import once_per_fleet
from sparkfleet.plan import fleet_plan, write_plan
from sparkfleet.plan_command import GROUPS_FILE, plan_dir

plans = fleet_plan(state)
if (directory := plan_dir()) is not None:
    once_per_fleet(state, "plan-file", lambda: write_plan(plans, directory / GROUPS_FILE))
