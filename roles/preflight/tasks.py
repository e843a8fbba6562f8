"""roles/preflight: gather every node's facts, print them as one table, stop on a hard failure.

Runs at prepare time, before any operation: a node that cannot host the pair stops the deploy
before anything is changed on any node.
"""
from pyinfra import state

from roles.preflight.checks import gather_and_check

# 1. Facts of every node, one table, hard requirements enforced (once per deploy).
gather_and_check(state)
