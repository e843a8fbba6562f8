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
from sparkfleet.model.tls import proxy_pem_path
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


def config_text(node) -> str:
    return render("api_proxy", "/etc/sparkfleet/api-proxy.cfg", bind=BIND, port=node_profile(node).port,
                  tls_pem=tls_pem(node),
                  engine_port=node.api_proxy_engine_port, timeout_s=node.api_proxy_timeout_s,
                  key_file=key_pattern_file(node), open_paths=OPEN_PATHS, user=PROXY_USER,
                  metrics_port=node.monitoring_engine_metrics_port if node.monitoring_enabled else None)


def unit_text(node) -> str:
    return render("api_proxy", UNIT_PATH, config=config_path(node), engine_port=node.api_proxy_engine_port,
                  open_paths=OPEN_PATHS, firewall_enabled=node.firewall_enabled)


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


def listener_problems(node, sockets, proxy_active: bool) -> list[str]:
    """The live half of the security table (docs/security.md), on a head: the API port held by the proxy
    alone, running, and the engine's own port on loopback only (anything else there is reachable
    without the proxy's key check)."""
    if not node.is_head:
        return []
    port, engine_port = node_profile(node).port, node.api_proxy_engine_port
    problems = [] if proxy_active else [f"{node.name}: {UNIT} is not running: the API answers nothing (deploy)"]
    api = {(a, p) for a, pt, p in sockets if pt == port}
    if api != {(BIND, PROXY_PROGRAM)}:
        found = ", ".join(f"{p} on {a}" for a, p in sorted(api)) or "nothing"
        problems.append(f"{node.name}: port {port} (the API) is held by {found}; want only {PROXY_PROGRAM} on {BIND}")
    exposed = sorted(f"{p} on {a}" for a, pt, p in sockets if pt == engine_port and a != "127.0.0.1")
    if exposed:
        problems.append(f"{node.name}: the engine's port {engine_port} listens beyond loopback ({', '.join(exposed)}): "
                        f"reachable without the API proxy's key check")
    return problems
