"""Step 2c: the run's plan (sparkfleet/plan.py), printed once before any operation runs."""
from pyinfra import state

from sparkfleet.plan import fleet_plan

fleet_plan(state)
