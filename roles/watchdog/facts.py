"""Facts of roles/watchdog: the unit's state on a node."""
import shlex

from pyinfra.api import FactBase

from roles.watchdog.schema import WATCH_UNIT
from sparkfleet.keyvalue import key_values


class WatchdogUnit(FactBase):
    """{"active": ..., "enabled": ...} of sparkfleet-watchdog.service ("inactive" and "" when absent)."""

    def command(self) -> str:
        u = shlex.quote(f"{WATCH_UNIT}.service")
        return (f"echo active=$(systemctl is-active {u} 2>/dev/null); "
                f"echo enabled=$(systemctl is-enabled {u} 2>/dev/null)")

    def process(self, output):
        return key_values(output)
