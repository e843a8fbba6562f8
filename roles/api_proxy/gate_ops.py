"""The operations that keep a gate (templates/haproxy_gate.j2) in place, declared by roles/api_proxy/tasks.py for
a head's API proxy and by roles/router/tasks.py for the router's gate: its config (0600) and unit written,
the config checked with HAProxy when it changed, the unit enabled and running, restarted when its unit
changed, reloaded (HAProxy's graceful reload: in-flight requests finish) when its config or what it reads
(the key's pattern file, the node's certificate: `reload_also`) changed. An unchanged re-deploy declares
nothing that changes."""
from io import StringIO

from pyinfra.operations import server, systemd

from roles.api_proxy.checks import HAPROXY
from sparkfleet import unchanged


def gate_operations(unit: str, unit_path: str, unit_text: str, config_path: str, config_text: str,
                    reload_also, reload_why: str, before_start=None) -> None:
    """Declare the gate's operations; `reload_also()`: it must reload for what it reads (evaluated at
    execution); `before_start`: declares what must run before the unit starts (a head's engine leaving the
    API port)."""
    config = unchanged.put(name=f"Write {config_path}", src=StringIO(config_text), dest=config_path, user="root",
                           group="root", mode="0600")
    unit_op = unchanged.put(name=f"Write the {unit} unit", src=StringIO(unit_text), dest=unit_path, user="root",
                            group="root", mode="0644")
    systemd.daemon_reload(name=f"Reload systemd ({unit} unit changed)", _if=unit_op.did_change)
    server.shell(name=f"Check {config_path} with HAProxy", commands=[f"{HAPROXY} -c -q -f {config_path}"],
                 _if=config.did_change)
    if before_start is not None:
        before_start()
    started = unchanged.service(name=f"Run {unit}, at boot too", service=f"{unit}.service", running=True, enabled=True)
    server.shell(name=f"Restart {unit} (its unit changed)", commands=[f"systemctl restart {unit}.service"],
                 _if=lambda: unit_op.did_change() and not started.did_change())
    server.shell(name=f"Reload {unit} ({reload_why})", commands=[f"systemctl reload {unit}.service"],
                 _if=lambda: (config.did_change() or reload_also()) and not unit_op.did_change()
                 and not started.did_change())
