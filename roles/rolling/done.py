"""After every serving group's turn (deploy.py): one operation on every host, so what follows (the
router, which may restart and route every group again) waits for the last group's turn to end."""
from pyinfra import host, state
from pyinfra.operations import python

from roles.rolling.checks import turn_groups, turn_order, turns_done
from sparkfleet.inventory import fleet_from_state
from sparkfleet.decided import fleet_summary

order = turn_order(state)
moved = any(p.restart for p in fleet_summary(state).values())
first = fleet_from_state(state).groups[turn_groups(order[0])[0]].head.name

python.call(
    name="Every serving group took its turn",
    function=turns_done,
    order=order,
    _if=lambda: host.name == first and len(fleet_from_state(state).groups) > 1 and moved,
)
