"""roles/api_proxy: what the head's API proxy is, rendered from data (pure), and the one fact it needs.

The proxy is HAProxy from the distribution (Debian and Ubuntu: `haproxy`), run by its own unit with
its own config; the package's haproxy.service is left as the package set it (its default config
listens on no port). On every other node, a proxy left from an earlier head is removed.
"""
import shlex

from pyinfra.api import FactBase

from roles.api_proxy.schema import OPEN_PATHS
from roles.serving.engine import KEY_PROXY_FILE
from roles.serving.schema import node_profile
from sparkfleet.render import render

UNIT = "sparkfleet-api-proxy"
UNIT_PATH = f"/etc/systemd/system/{UNIT}.service"
HAPROXY = "/usr/sbin/haproxy"
PACKAGE = "haproxy"
# The user HAProxy's workers run as (the package creates it; the firewall names it, so the package is
# installed before the firewall: roles/api_proxy/install_tasks.py).
PROXY_USER = "haproxy"
# Where the proxy listens: every address, as the engine did; the firewall admits the API's
# networks only (roles/firewall).
BIND = "0.0.0.0"


def config_path(node) -> str:
    return f"{node.serving_dir}/api-proxy.cfg"


def key_pattern_file(node) -> str:
    """`Bearer <key>`, one line, root-only (roles/serving/api_key.py writes it with the others)."""
    return f"{node.serving_dir}/{KEY_PROXY_FILE}"


def config_text(node) -> str:
    return render("api_proxy", "/etc/sparkfleet/api-proxy.cfg", bind=BIND, port=node_profile(node).port,
                  engine_port=node.api_proxy_engine_port, timeout_s=node.api_proxy_timeout_s,
                  key_file=key_pattern_file(node), open_paths=OPEN_PATHS, user=PROXY_USER)


def unit_text(node) -> str:
    return render("api_proxy", UNIT_PATH, config=config_path(node), engine_port=node.api_proxy_engine_port,
                  open_paths=OPEN_PATHS)


class ApiProxyHost(FactBase):
    """Whether HAProxy is installed and whether a proxy unit is (a node that was a head before)."""

    def command(self, unit_path: str) -> str:
        return (f"if [ -x {HAPROXY} ]; then echo haproxy=yes; else echo haproxy=no; fi; "
                f"if [ -f {shlex.quote(unit_path)} ]; then echo unit=yes; else echo unit=no; fi")

    def process(self, output):
        values = dict(line.strip().split("=", 1) for line in output if "=" in line)
        return {"haproxy": values.get("haproxy") == "yes", "unit": values.get("unit") == "yes"}
