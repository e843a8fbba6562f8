"""0. One run at a time: the deploy lock on every node of the run, before any fact is read and so
before the first change (roles/lock/lock.py). No operation: taking it writes only the lock, and
an unchanged deploy still changes nothing."""
from pyinfra import state

from roles.lock.lock import take_deploy_locks
from sparkfleet.once import once_per_fleet

once_per_fleet(state, "deploy-lock", lambda: take_deploy_locks(state))
