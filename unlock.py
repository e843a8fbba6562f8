"""Break the deploy lock a dead run left: pyinfra -y inventory.py unlock.py [--limit NODE]
(`sparkfleet unlock INVENTORY [--host NODE]`, `make unlock INVENTORY=...`).

On every node (of --limit), the lock is broken only when its holder's SSH session on that node has
ended, by the same rule a deploy uses to take such a lock over (roles/lock/node_lock.py decide);
a live holder is named and left alone, and the run exits 1. Defines no operation: nothing but a
dead lock is removed.
"""
from pyinfra import state

from roles.lock.lock import break_dead_locks
from sparkfleet.once import once_per_fleet
from sparkfleet.run import refusals_stop_the_run

with refusals_stop_the_run():
    once_per_fleet(state, "deploy-unlock", lambda: break_dead_locks(state))
