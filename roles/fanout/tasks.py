"""roles/fanout: the one path bulk data takes between nodes, over the fabric.

Every node runs a read-only rsync daemon bound to its fabric address (weights, kernel-cache and,
while the watchdog runs, watchdog modules: roles/watchdog) and a read-only HTTP server of its weights
(sfl_files.py serve, the weights pull's transport: sendfile on the head, the hash taken as the bytes
arrive), and carries sfl_files.py, which fetches, pulls, resumes and writes manifests. Workers pull
from the head; nothing is ever pushed, so no node needs a key to another.
"""
from io import StringIO
from pathlib import Path

from pyinfra import host, state
from pyinfra.facts.server import Which
from pyinfra.operations import apt, systemd

from sparkfleet.model.fanout import SFL_FILES
from sparkfleet import unchanged
from sparkfleet.inventory import cluster_from_state
from sparkfleet.render import render
UNIT = "/etc/systemd/system/sparkfleet-rsyncd.service"
HTTP_UNIT = "/etc/systemd/system/sparkfleet-fanout-http.service"

cluster = cluster_from_state(state)
node = cluster.node(host.name)

# 1. rsync (DGX OS ships it; a minimal image may not) and the file mover.
if not host.get_fact(Which, command="rsync"):
    apt.packages(name="Install rsync", packages=["rsync"], update=True, cache_time=3600)
unchanged.directory(name="Create the sparkfleet tools directory", path=str(Path(SFL_FILES).parent), mode="0755")
program = unchanged.put(
    name="Install sfl_files.py (fetch, fan-out, manifests)",
    src=str(Path(__file__).with_name("sfl_files.py")),
    dest=SFL_FILES,
    mode="0755",
)

# 2. What the daemon serves must exist before it starts: the watchdog's state directory too (module
#    watchdog, while the watchdog runs; roles/watchdog installs the program that writes into it).
served = (node.weights_dir, node.kernel_cache_dir, *((node.watchdog_state_dir,) if node.watchdog_enabled else ()))
for path in served:
    unchanged.directory(name=f"Create {path}", path=path, user="root", group="root", mode="0755")

# 3. The daemon, read-only, on the fabric address only; restarted only when its files changed.
config = unchanged.put(
    name="Write the fabric rsync daemon config",
    src=StringIO(render("fanout", "/etc/sparkfleet/rsyncd.conf", node=node, fabric_network=node.fabric_address.network)),
    dest="/etc/sparkfleet/rsyncd.conf",
    mode="0644",
)
unit = unchanged.put(
    name="Write the sparkfleet-rsyncd unit",
    src=StringIO(render("fanout", UNIT, node=node, firewall_enabled=node.firewall_enabled)),
    dest=UNIT,
    mode="0644",
)
systemd.daemon_reload(name="Reload systemd (rsyncd unit changed)", _if=unit.did_change)
unchanged.service(name="Enable and start sparkfleet-rsyncd", service="sparkfleet-rsyncd.service", running=True, enabled=True)
systemd.service(
    name="Restart sparkfleet-rsyncd (config changed)",
    service="sparkfleet-rsyncd.service",
    restarted=True,
    _if=lambda: config.did_change() or unit.did_change(),
)

# 4. The weights' HTTP server (sfl_files.py serve), read-only, on the fabric address only; restarted when
#    its unit or the program it runs changed.
http_unit = unchanged.put(
    name="Write the sparkfleet-fanout-http unit",
    src=StringIO(render("fanout", HTTP_UNIT, node=node, sfl_files=SFL_FILES, firewall_enabled=node.firewall_enabled,
                        fabric_network=node.fabric_address.network)),
    dest=HTTP_UNIT,
    mode="0644",
)
systemd.daemon_reload(name="Reload systemd (fanout-http unit changed)", _if=http_unit.did_change)
unchanged.service(name="Enable and start sparkfleet-fanout-http", service="sparkfleet-fanout-http.service",
                  running=True, enabled=True)
systemd.service(
    name="Restart sparkfleet-fanout-http (unit or sfl_files.py changed)",
    service="sparkfleet-fanout-http.service",
    restarted=True,
    _if=lambda: http_unit.did_change() or program.did_change(),
)
