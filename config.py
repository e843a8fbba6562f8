"""pyinfra settings for every sparkfleet run (pyinfra executes config.py from the working directory).

A tensor-parallel pair is one machine in two boxes: when any node fails a step, the whole run
stops there instead of carrying on with the other nodes (pyinfra's default), so a worker is never
restarted onto a new image while the head failed to build it.
"""
from pyinfra import config

config.FAIL_PERCENT = 0
