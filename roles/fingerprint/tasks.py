"""roles/fingerprint: every node of a group on the same kernel, GPU driver, CX7 firmware and Docker.

1. Read-only, at prepare: one fact per node, a table and a refusal when the nodes differ on a field
   data marks as must-match (fingerprint_must_match), before any operation runs.
2. Monitoring on: sfl_fingerprint.py (the fact's own command and parser) and the timer that runs it on
   every node, so the fingerprint is a live metric (sparkfleet_fingerprint_info), not only a deploy's
   reading; systemd reloaded when the timer's files changed.
"""
from io import StringIO
from pathlib import Path

from pyinfra import host, state
from pyinfra.operations import systemd
from pyinfra.operations.util import any_changed

from roles.fingerprint.checks import METRICS_SCRIPT, METRICS_UNIT, check_fingerprint, metrics_files
from sparkfleet import unchanged
from sparkfleet.inventory import cluster_from_state

# 1. One fingerprint per node, compared across the group once per deploy.
check_fingerprint(state)

# 2. The fingerprint as a metric, every monitoring_fingerprint_interval_s.
node = cluster_from_state(state).node(host.name)
files = metrics_files(node)
if files:
    unchanged.put(name="Install sfl_fingerprint.py (the fingerprint, as a metric)",
                  src=str(Path(__file__).with_name("sfl_fingerprint.py")), dest=METRICS_SCRIPT,
                  user="root", group="root", mode="0755", create_remote_dir=True)
    units = [unchanged.put(name=f"Write {path}", src=StringIO(text), dest=path, user="root", group="root",
                           mode="0644") for path, text in files.items()]
    systemd.daemon_reload(name=f"Reload systemd ({METRICS_UNIT} changed)", _if=any_changed(*units))
    unchanged.service(name=f"Run {METRICS_UNIT}.timer, at boot too", service=f"{METRICS_UNIT}.timer",
                      running=True, enabled=True)
