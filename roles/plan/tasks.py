"""Step 2c: the run's plan (sparkfleet/plan.py), printed once before any operation runs; run as a
plan (`sparkfleet plan`), also written for that command to read."""
import os
from pathlib import Path

from pyinfra import state

from sparkfleet.once import once_per_fleet
from sparkfleet.plan import fleet_plan, write_plan
from sparkfleet.plan_command import GROUPS_FILE, PLAN_DIR_VAR

plans = fleet_plan(state)
if os.environ.get(PLAN_DIR_VAR):
    once_per_fleet(state, "plan-file", lambda: write_plan(plans, Path(os.environ[PLAN_DIR_VAR]) / GROUPS_FILE))
