"""roles/api_proxy: on each serving group's head, HAProxy on the profile's port in front of the engine
on 127.0.0.1:api_proxy_engine_port; every request needs the key but those of OPEN_PATHS
(sparkfleet/model/api_proxy.py says why each engine's own check is not enough).

Runs after the API key's files are written (roles/serving/api_key_tasks.py writes the proxy's
pattern file with the others) and before any engine starts, so no engine ever answers on the
profile's port itself. HAProxy was installed before the firewall (install_tasks.py); config and unit written, the
unit enabled and running; reloaded (HAProxy's own graceful reload: in-flight requests finish) when
its config, the key or its certificate (roles/tls, step 7b1) changed, restarted when its unit did. An unchanged re-deploy changes nothing.
On any other node, a proxy left from an earlier head is stopped and removed.
"""
from pyinfra import host, state
from pyinfra.operations import server

from roles.api_proxy.checks import UNIT, UNIT_PATH, ApiProxyHost, config_path, config_text, unit_text
from roles.api_proxy.gate_ops import gate_operations
from sparkfleet.decided import decisions, fleet_decision
from sparkfleet.model.engine import unit_name
from sparkfleet.model.watchdog import WATCH_UNIT
from roles.router.node_config import router_of
from sparkfleet.inventory import cluster_from_state, fleet_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
router = router_of(fleet_from_state(state), node)  # a routed head admits the router hop (roles/api_proxy)
found = host.get_fact(ApiProxyHost, unit_path=UNIT_PATH)

if node.is_head:
    key_changed = decisions(state).key != "ok"  # the run's plan: the pattern file was rewritten at step 7b
    tls = fleet_decision(state).tls
    new_cert = tls is not None and tls.reloads(node.name)  # roles/tls wrote a new certificate at step 7b1
    # A head deployed before the proxy existed has its engine on the profile's port: when the pair
    # restarts in this run anyway (its unit moves the engine to api_proxy_engine_port), that engine
    # and the watchdog that would start it again stop first (the watchdog is handed the pair back at
    # step 10). Otherwise a port already taken stops the proxy's start, naming it.
    moves = not found["active"] and decisions(state).serving.restart

    def stop_the_engine():
        server.shell(name="Stop the head's engine before the proxy takes the API port (the pair restarts in this run)",
                     commands=[f"systemctl stop {WATCH_UNIT}.service 2>/dev/null || true",
                               f"systemctl stop {unit_name(node)}.service 2>/dev/null || true"],
                     _if=lambda: moves)

    gate_operations(UNIT, UNIT_PATH, unit_text(node), config_path(node), config_text(node, router),
                    reload_also=lambda: key_changed or new_cert,
                    reload_why="its config, the API key or its certificate changed", before_start=stop_the_engine)
elif found["unit"]:
    server.shell(
        name=f"Remove {UNIT} ({node.name} is no head)",
        commands=[f"systemctl disable --now {UNIT}.service", f"rm -f {UNIT_PATH} {config_path(node)}",
                  "systemctl daemon-reload"],
    )
