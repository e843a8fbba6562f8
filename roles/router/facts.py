"""The router node's state, in one round trip per node: its architecture (which pinned wheel), whether
python3 can make a virtualenv with pip (Debian's python3-venv), the smg version installed in the
router's virtualenv, whether a router unit and its gate's unit are installed (a node that ran the
router before), whether the router hop's client certificate is there (roles/tls issues it on the router
node with TLS on; anywhere else it is removed), and the
state of the control-plane key file (sparkfleet/keyfiles.py: missing, unreadable, owner, format, ok;
never the key). And the router's routing, read before any change (roles/rolling/routes.py decides
from it)."""
import json
import shlex

from pyinfra.api import FactBase

from roles.router.gate import GATE_UNIT_PATH
from roles.router.node_config import CONTROL_KEY_FILE, ROUTER_CONFIG, ROUTER_UNIT, SFL_ROUTER
from sparkfleet.model.api_key import KEY_PATTERN
from sparkfleet.keyfiles import state_command, state_end


class RouterHost(FactBase):
    def command(self, venv: str, unit_path: str, gate_unit_path: str = GATE_UNIT_PATH, hop_pem: str = "") -> str:
        """`hop_pem`: where the router hop's certificate would be on the node (hop_pem_path; '' in the
        records of captures made before it was read: not read)."""
        python = shlex.quote(f"{venv}/bin/python")
        hop = shlex.quote(hop_pem)
        hop_line = (f"if [ -e {hop} ] || [ -e {hop}.key.new ]; then echo hop_pem=yes; else echo hop_pem=no; fi; "
                    if hop_pem else "")
        return (
            "echo arch=$(uname -m); "
            "if python3 -c 'import ensurepip, venv' 2>/dev/null; then echo venv=yes; else echo venv=no; fi; "
            f"echo installed=$({python} -c 'import importlib.metadata as m; print(m.version(\"smg\"))' 2>/dev/null); "
            f"if [ -f {shlex.quote(unit_path)} ]; then echo unit=yes; else echo unit=no; fi; "
            f"if [ -f {shlex.quote(gate_unit_path)} ]; then echo gate_unit=yes; else echo gate_unit=no; fi; "
            f"{hop_line}echo control=$({state_command(CONTROL_KEY_FILE, KEY_PATTERN)}{state_end()})"
        )

    def process(self, output):
        values = dict(line.split("=", 1) for line in output if "=" in line)
        return {"arch": values.get("arch", "").strip(), "venv": values.get("venv") == "yes",
                "installed": values.get("installed", "").strip() or None, "unit": values.get("unit") == "yes",
                "gate_unit": values.get("gate_unit") == "yes", "hop_pem": values.get("hop_pem") == "yes",
                "control_key": values.get("control", "").strip()}


class RouterRouting(FactBase):
    """The router's routing now (read-only, at prepare): None when its unit is not active; else
    {url: state} (routed, unhealthy, draining, drained: sfl_router.py routing); {'error': text} when
    the unit is active but the router's admin API does not answer."""

    def command(self) -> str:
        return (f"if systemctl is-active --quiet {ROUTER_UNIT}.service; then "
                f"python3 {SFL_ROUTER} routing {ROUTER_CONFIG} 2>&1 | tail -n 1; else echo not-running; fi")

    def process(self, output):
        last = output[-1].strip() if output else ""
        if last == "not-running":
            return None
        try:
            table = json.loads(last)
            return {b["url"]: b["state"] for b in table}
        except (ValueError, TypeError, KeyError):
            return {"error": last[-300:] or "no answer"}
