"""pyinfra settings for every sparkfleet run (pyinfra executes config.py from the working directory).

A tensor-parallel pair is one machine in two boxes: when any node fails a step, the whole run
stops there instead of carrying on with the other nodes (pyinfra's default), so a worker is never
restarted onto a new image while the head failed to build it.

config.py runs before pyinfra loads the inventory: sparkfleet.run.install() validates the data
pyinfra merges for every host (inventory, group data, --group-data, --data) before the first
connection, and prints every refusal as one block (see sparkfleet/run.py).
"""
from pyinfra import config

from sparkfleet.run import install

config.FAIL_PERCENT = 0

install()
