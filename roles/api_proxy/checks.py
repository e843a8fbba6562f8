"""roles/api_proxy: what the head's API proxy is, rendered from data (pure), and the one fact it needs.

The proxy is HAProxy from the distribution (Debian and Ubuntu: `haproxy`), run by its own unit with
its own config; the package's haproxy.service is left as the package set it (its default config
listens on no port). On every other node, a proxy left from an earlier head is removed.
"""
import shlex

from pyinfra.api import FactBase

from sparkfleet.listeners import parse_ss
from sparkfleet.model.api_proxy import OPEN_PATHS, PROXY_USER
from sparkfleet.model.engine import KEY_PROXY_FILE
from sparkfleet.model.serving import node_profile
from sparkfleet.model.tls import HOP_CN, ca_bundle_path, proxy_pem_path
from sparkfleet.render import render

UNIT = "sparkfleet-api-proxy"
UNIT_PATH = f"/etc/systemd/system/{UNIT}.service"
HAPROXY = "/usr/sbin/haproxy"
PACKAGE = "haproxy"
# Where the proxy listens: every address, as the engine did; the firewall admits the API's
# networks only (roles/firewall).
BIND = "0.0.0.0"
PROXY_PROGRAM = "haproxy"  # the process name `ss -p` shows


def config_path(node) -> str:
    return f"{node.serving_dir}/api-proxy.cfg"


def key_pattern_file(node) -> str:
    """`Bearer <key>`, one line, root-only (roles/serving/api_key.py writes it with the others)."""
    return f"{node.serving_dir}/{KEY_PROXY_FILE}"


def tls_pem(node) -> str | None:
    """The certificate and key HAProxy serves the API with (roles/tls writes it), None when TLS is off."""
    return proxy_pem_path(node) if node.tls_enabled else None


def gate_context(node, *, frontend: str, port: int, backend: str, hop=None, strip_key: bool = False) -> dict:
    """The context of templates/haproxy_gate.j2 on `node`: HAProxy on every address at `port`, over TLS with
    the node's certificate (roles/tls) unless data turns it off, the key (the node's pattern file) on every
    request but OPEN_PATHS, in front of `backend` on loopback. The head's API proxy and the router's gate
    (roles/router/gate.py) both render it. `hop`: the router node (a routed head admits the router hop's
    client certificate from its address, router_hop); `strip_key`: the key goes no further than the gate."""
    return {"frontend": frontend, "bind": BIND, "port": port, "tls_pem": tls_pem(node), "key_file": key_pattern_file(node),
            "open_paths": OPEN_PATHS, "user": PROXY_USER, "timeout_s": node.api_proxy_timeout_s, "backend": backend,
            "hop": hop, "strip_key": strip_key, "firewall_enabled": node.firewall_enabled}


def router_hop(node, router) -> dict | None:
    """What a head admits of the router hop (docs/security.md#the-router-hop), or None: the router hop's
    client certificate (its subject's CN HOP_CN, which no node's certificate bears; clientAuth, without
    which OpenSSL refuses a client's certificate in the handshake), verified against the head's trust
    bundle, from the router node's management address, instead of the key. Only on a head the router
    routes to (`router`: the router node, None otherwise), with TLS on: without TLS there is no client
    certificate, and smg presents the fleet's key like any client."""
    if router is None or not node.tls_enabled:
        return None
    return {"node": router.name, "cn": HOP_CN, "address": router.management_address, "ca_file": ca_bundle_path(node)}


def config_text(node, router=None) -> str:
    """The head's API proxy config; `router`: the router node when the router routes to this head."""
    return render("api_proxy", "/etc/sparkfleet/api-proxy.cfg", engine_port=node.api_proxy_engine_port,
                  metrics_port=node.monitoring_engine_metrics_port if node.monitoring_enabled else None,
                  **gate_context(node, frontend="api", port=node_profile(node).port, backend="engine",
                                 hop=router_hop(node, router)))


def unit_text(node) -> str:
    return render("api_proxy", UNIT_PATH, config=config_path(node), pidfile=f"/run/{UNIT}.pid",
                  engine_port=node.api_proxy_engine_port, open_paths=OPEN_PATHS, firewall_enabled=node.firewall_enabled)


class ApiProxyHost(FactBase):
    """Whether HAProxy is installed, whether a proxy unit is (a node that was a head before), and
    whether it runs."""

    def command(self, unit_path: str) -> str:
        return (f"if [ -x {HAPROXY} ]; then echo haproxy=yes; else echo haproxy=no; fi; "
                f"if [ -f {shlex.quote(unit_path)} ]; then echo unit=yes; else echo unit=no; fi; "
                f"echo active=$(systemctl is-active {UNIT}.service 2>/dev/null)")

    def process(self, output):
        values = dict(line.strip().split("=", 1) for line in output if "=" in line)
        return {"haproxy": values.get("haproxy") == "yes", "unit": values.get("unit") == "yes",
                "active": values.get("active") == "active"}


class Listeners(FactBase):
    """Every listening TCP socket: [(address, port, program)] from `ss` (the doctor's listeners row)."""

    def command(self) -> str:
        return "ss -Hltnp 2>/dev/null || true"

    def process(self, output):
        # sparkfleet/listeners.py: the one parser of ss's listeners (the listener table's test reads it too)
        return [(s.address, s.port, s.process) for s in parse_ss(output)]


def gate_listener_problems(name: str, sockets, active: bool, unit: str, port: int, what: str, behind_port: int,
                           behind: str, gate: str) -> list[str]:
    """The live half of the security table (docs/security.md) for one gate: its unit running, `port` (`what`)
    held by HAProxy alone on every address, and the port of what is `behind` it on loopback only (anything
    else there is reachable without `gate`'s key check). `sockets`: the Listeners fact."""
    problems = [] if active else [f"{name}: {unit} is not running: {what} answers nothing (deploy)"]
    held = {(a, p) for a, pt, p in sockets if pt == port}
    if held != {(BIND, PROXY_PROGRAM)}:
        found = ", ".join(f"{p} on {a}" for a, p in sorted(held)) or "nothing"
        problems.append(f"{name}: port {port} ({what}) is held by {found}; want only {PROXY_PROGRAM} on {BIND}")
    exposed = sorted(f"{p} on {a}" for a, pt, p in sockets if pt == behind_port and a != "127.0.0.1")
    if exposed:
        problems.append(f"{name}: {behind} {behind_port} listens beyond loopback ({', '.join(exposed)}): "
                        f"reachable without {gate}'s key check")
    return problems


def listener_problems(node, sockets, proxy_active: bool) -> list[str]:
    """A head's listeners: the API port held by the proxy alone, running, and the engine's own port on loopback
    only (gate_listener_problems)."""
    if not node.is_head:
        return []
    return gate_listener_problems(node.name, sockets, proxy_active, UNIT, node_profile(node).port, "the API",
                                  node.api_proxy_engine_port, "the engine's port", "the API proxy")
