"""The router's gate, as pure functions of the fleet (a test renders what a deploy writes): HAProxy on the
router node at router_port, over TLS with the router node's certificate (roles/tls), the fleet's key on
every request but the open paths (the head's API proxy's gate: templates/haproxy_gate.j2, roles/api_proxy
gate_context), in front of smg on 127.0.0.1:router_smg_port.

Why a gate: smg 1.13.0 serves routes without its own key check (its public routes: /engine_metrics and
/loads fetch every head's metrics and loads with smg's credential, /get_model_info and /get_server_info
forward to a head; model_gateway/src/server.rs build_app `public_routes`), so smg listens where only root
and the gate's workers reach it (roles/firewall), and the gate is the check, as the API proxy is the
engine's. With TLS on, the gate removes the key once checked: smg holds none, and presents the router
hop's client certificate to the heads instead (its own credential, docs/security.md#the-router-hop);
with TLS off there is no client certificate, and smg is given the fleet's key as before.
"""
from sparkfleet.model.api_proxy import OPEN_PATHS
from sparkfleet.render import render


GATE_UNIT = "sparkfleet-router-proxy"
GATE_UNIT_PATH = f"/etc/systemd/system/{GATE_UNIT}.service"


def gate_config_path(router) -> str:
    return f"{router.serving_dir}/router-proxy.cfg"


def smg_holds_key(router) -> bool:
    """smg is given the fleet's key only with TLS off (no client certificate to present to the heads)."""
    return not router.tls_enabled


def gate_config_text(router) -> str:
    from roles.api_proxy.checks import gate_context

    return render("router", "/etc/sparkfleet/router-proxy.cfg", smg_port=router.router_smg_port,
                  **gate_context(router, frontend="router", port=router.router_port, backend="smg",
                                 strip_key=not smg_holds_key(router)))


def gate_unit_text(router) -> str:
    return render("router", GATE_UNIT_PATH, config=gate_config_path(router), pidfile=f"/run/{GATE_UNIT}.pid",
                  smg_port=router.router_smg_port, open_paths=OPEN_PATHS, firewall_enabled=router.firewall_enabled)


def gate_listener_problems(router, sockets, gate_active: bool) -> list[str]:
    """The doctor's listeners row of the router node (the live half of docs/security.md's table): the gate
    running, router_port held by it alone on every address, and smg's own port on loopback only (anything
    else there answers its public routes, /engine_metrics and /loads among them, without a key).
    `sockets`: roles/api_proxy's Listeners fact, [(address, port, program)]."""
    from roles.api_proxy.checks import gate_listener_problems as listeners

    return listeners(router.name, sockets, gate_active, GATE_UNIT, router.router_port, "the router",
                     router.router_smg_port, "smg's port", "the gate")
