"""Step 13, run as a plan only (`sparkfleet plan`: prepare, then nothing runs): what each operation
this host declared above would do (sparkfleet/plan_ops.py), written for that command to read. In a
deploy it does nothing."""
import json

from pyinfra import host, state

from sparkfleet.plan_command import OPS_PREFIX, plan_dir
from sparkfleet.plan_ops import host_operations

if (directory := plan_dir()) is not None:
    (directory / f"{OPS_PREFIX}{host.name}.json").write_text(json.dumps(host_operations(state, state.inventory.get_host(host.name)), indent=1))
