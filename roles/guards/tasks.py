"""roles/guards: every failure mode of the field report checked at prepare, before any change.

Read-only: facts in, a table out, DeployError with the numbers when a guard refuses.
"""
from pyinfra import state

from roles.guards.run import run_guards

# 1. Memory admission and headroom, refused settings, the drafter license (once per deploy).
run_guards(state)
