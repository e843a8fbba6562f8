"""roles/serving: systemd units for the head and the --headless workers; the pair restarts as one.

Order when the pair restarts: head stopped, workers restarted, each worker's container running,
then the head started and its /health awaited (bounded, with progress); the endpoint is printed.
The head's history (roles/serving/history.py) records the commit attempted, served or failed.
"""
from io import StringIO
from pathlib import Path

from pyinfra import host, state
from pyinfra.facts.files import File
from pyinfra.operations import files, python, server, systemd
from pyinfra.operations.util import any_changed

from sparkfleet.model.image import history_path
from roles.receipt.receipt import note_start
from roles.serving.api_key import curl_config, key_file
from roles.serving.ready import wait_for_container
from roles.serving.history import RecipeHistory, history_file, last_served, record_command, same_commit, wait_then_record
from sparkfleet.decided import decisions, prewarmed
from sparkfleet.model.engine import HEAD_UNIT, WORKER_UNIT, unit_name
from sparkfleet.model.serving import SFL_GID, node_profile
from sparkfleet.model.tls import api_base, ca_bundle_path, curl_tls
from sparkfleet import unchanged
from sparkfleet.inventory import cluster_from_state
from sparkfleet.once import at_once

cluster = cluster_from_state(state)
node = cluster.node(host.name)
profile = node_profile(node)
unit = unit_name(node)
planned = decisions(state)  # the run's plan (tools/plan.py), decided at prepare
pair = planned.serving  # the whole pair's verdict

# 1. The rank's environment (root-only: it may carry secrets) and its unit. On RDMA nodes the unit
#    reads the RoCE v2 GID index again at every start (sfl_gid.sh; the tools directory exists:
#    roles/fanout made it).
unchanged.directory(name="Create the serving config directory", path=node.serving_dir, user="root", group="root", mode="0700")
if node.rdma_hca:
    unchanged.put(
        name="Install sfl_gid.sh (the RoCE v2 GID index, read again at every start)",
        src=str(Path(__file__).with_name("sfl_gid.sh")),
        dest=SFL_GID,
        mode="0755",
    )
written = [
    unchanged.put(
        name=f"Write {path}",
        src=StringIO(text),
        dest=path,
        user="root",
        group="root",
        mode=mode,
    )
    for path, (text, mode) in pair.files[node.name].items()
]
systemd.daemon_reload(name="Reload systemd (unit changed)", _if=any_changed(*written))

# 2. Start at boot, or not, as the data says.
# running=None: pyinfra's default (running=True) would start the unit here, out of the pair's order.
unchanged.service(
    name=f"Set {unit} start at boot to {node.serving_start_at_boot}",
    service=f"{unit}.service",
    running=None,
    enabled=node.serving_start_at_boot,
)

# 2b. A node that changed rank keeps no unit of its old role (it would start a second engine at boot).
other_unit = WORKER_UNIT if node.is_head else HEAD_UNIT
events_file, commit = history_file(node, profile), profile.recipe.commit
history = history_path(node, profile)
# What this step reads of the node, at once (one read after the other: a round trip each).
other_file, events = at_once(
    lambda: host.get_fact(File, path=f"/etc/systemd/system/{other_unit}.service"),
    lambda: host.get_fact(RecipeHistory, path=events_file, deployed=history) if node.is_head else [],
)
other_present = other_file is not None
server.shell(
    name="Remove the unit of the other role",
    commands=[
        f"systemctl disable --now {other_unit}.service",
        f"rm -f /etc/systemd/system/{other_unit}.service {node.serving_dir}/{other_unit}.env",
        "systemctl daemon-reload",
    ],
    _if=lambda: other_present,
)

# 3. The pair restarts as one: head stopped first, workers started first, head last. Each step is
# defined on every host (gated by _if) so that pyinfra orders it against the other hosts' steps.
on_head, restart = node.is_head, pair.restart
server.shell(
    name="Record the attempted recipe commit",  # a prewarm recorded it already (roles/kernel_cache)
    commands=[record_command(events_file, "attempted", commit)],
    _if=lambda: on_head and restart and not prewarmed(state, cluster.head.name, planned.caches),
)
python.call(
    name="Note when the pair's units start (the receipt's cold start)",
    function=note_start,
    pair=cluster.head.name,
    _if=lambda: on_head and restart,
)
server.shell(
    name="Stop the head (the pair restarts)",
    commands=[f"systemctl stop {unit}.service"],
    _if=lambda: on_head and restart,
)
server.shell(
    name="Restart the workers (workers first)",
    commands=[f"systemctl restart {unit}.service"],
    _if=lambda: not on_head and restart,
)
python.call(
    name="Wait for the worker containers",
    function=wait_for_container,
    unit=unit,
    _if=lambda: not on_head and restart,
)
server.shell(
    name="Start the head (every worker is up)",
    commands=[f"systemctl restart {unit}.service"],
    _if=lambda: on_head and restart,
)
python.call(
    name="Wait for the head's /health",
    function=wait_then_record,  # roles/serving/ready.py wait_for_health; a failure is recorded
    history=events_file,
    commit=commit,
    unit=unit,
    api=api_base(node, profile.port),
    tls=curl_tls(node),
    ca_file=ca_bundle_path(node) if node.tls_enabled else None,
    timeout_s=node.serving_health_timeout_s,
    endpoint=f"{api_base(node, profile.port)}/v1",
    max_model_len=profile.max_model_len,
    curl_config=curl_config(node),
    key_file=key_file(node),
    workers=tuple(w.name for w in cluster.workers) if restart else (),
    _if=lambda: on_head and (restart or not pair.healthy),
)

# 4. Once the pair serves: the recipe commit it serves, last in .deployed (the drift check reads it)
#    and a served event in the history (rollback reads it: roles/serving/history.py).
server.shell(
    name="Record the served recipe commit",
    commands=[
        f"mkdir -p $(dirname {history}) && touch {history}",
        f"sed -i '/^{commit}$/d' {history} && echo {commit} >> {history}",
        record_command(events_file, "served", commit),
    ],
    _if=lambda: on_head and (restart or not same_commit(last_served(events), commit)),
)
