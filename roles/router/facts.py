"""The router node's state, in one round trip per node: its architecture (which pinned wheel), whether
python3 can make a virtualenv with pip (Debian's python3-venv), the smg version installed in the
router's virtualenv, whether a router unit is installed (a node that ran the router before), and the
state of the control-plane key file (sparkfleet/keyfiles.py: missing, unreadable, owner, format, ok;
never the key)."""
import shlex

from pyinfra.api import FactBase

from roles.router.node_config import CONTROL_KEY_FILE
from roles.serving.api_key import KEY_PATTERN
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
