"""The router node's state, in one round trip per node: its architecture (which pinned wheel), whether
python3 can make a virtualenv with pip (Debian's python3-venv), the smg version installed in the
router's virtualenv, whether a router unit is installed (a node that ran the router before), and the
state of the control-plane key file (sparkfleet/keyfiles.py: missing, unreadable, owner, format, ok;
never the key). And the router's routing, read before any change (roles/rolling/routes.py decides
from it)."""
import json
import shlex

from pyinfra.api import FactBase

from roles.router.node_config import CONTROL_KEY_FILE, ROUTER_CONFIG, ROUTER_UNIT, SFL_ROUTER
from sparkfleet.model.api_key import KEY_PATTERN
from sparkfleet.keyfiles import state_command, state_end


class RouterHost(FactBase):
    def command(self, venv: str, unit_path: str) -> str:
        python = shlex.quote(f"{venv}/bin/python")
        return (
            "echo arch=$(uname -m); "
            "if python3 -c 'import ensurepip, venv' 2>/dev/null; then echo venv=yes; else echo venv=no; fi; "
            f"echo installed=$({python} -c 'import importlib.metadata as m; print(m.version(\"smg\"))' 2>/dev/null); "
            f"if [ -f {shlex.quote(unit_path)} ]; then echo unit=yes; else echo unit=no; fi; "
            f"echo control=$({state_command(CONTROL_KEY_FILE, KEY_PATTERN)}{state_end()})"
        )

    def process(self, output):
        values = dict(line.split("=", 1) for line in output if "=" in line)
        return {"arch": values.get("arch", "").strip(), "venv": values.get("venv") == "yes",
                "installed": values.get("installed", "").strip() or None, "unit": values.get("unit") == "yes",
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
