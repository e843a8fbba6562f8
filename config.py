"""pyinfra settings for every sparkfleet run (pyinfra executes config.py from the working directory).

A tensor-parallel pair is one machine in two boxes: when any node fails a step, the whole run
stops there instead of carrying on with the other nodes (pyinfra's default), so a worker is never
restarted onto a new image while the head failed to build it.

config.py runs before pyinfra loads the inventory: sparkfleet.run.install() validates the data
pyinfra merges for every host (inventory, group data, --group-data, --data) before the first
connection, and prints every refusal as one block (see sparkfleet/run.py).
"""
from pyinfra import config

from sparkfleet import channels, op_order
from sparkfleet.capture import install_recorder
from sparkfleet.run import install

config.FAIL_PERCENT = 0

install()
# No more commands at once on one host's SSH connection than its sshd takes (sparkfleet/channels.py).
channels.install()
# Each operation's order from the call stack's file names and line numbers alone, as pyinfra's own
# function computes it, without reading every frame's source (sparkfleet/op_order.py).
op_order.install()
# Only in the read-only runs of `sparkfleet capture` (its directory in the environment): every fact's
# command and raw output kept for the bundle (sparkfleet/capture.py). A deploy records nothing.
install_recorder()
