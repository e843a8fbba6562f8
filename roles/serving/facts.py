"""Facts of roles/serving: the unit's state, the head's health (a rank's RoCE GIDs: sparkfleet/roce_gid.py)."""
import shlex

from pyinfra.api import FactBase

from sparkfleet.keyvalue import key_values


class UnitState(FactBase):
    """{"active": ..., "enabled": ..., "container": running|missing|<status>} of a sparkfleet unit."""

    def command(self, unit: str) -> str:
        u = shlex.quote(unit)
        return (
            f"echo active=$(systemctl is-active {u}.service 2>/dev/null); "
            f"echo enabled=$(systemctl is-enabled {u}.service 2>/dev/null); "
            f"echo container=$(docker inspect --format '{{{{.State.Status}}}}' {u} 2>/dev/null || echo missing)"
        )

    def process(self, output):
        return key_values(output)


def is_serving(unit_state: dict) -> bool:
    """The rank serves: its unit is active and its container running."""
    return unit_state.get("active") == "active" and unit_state.get("container") == "running"


def health_command(port: int, path: str = "/health") -> str:
    return f"curl -fsS -m 5 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{int(port)}{path} 2>/dev/null || true"


class HeadHealth(FactBase):
    """True when the head answers 200 on /health."""

    def command(self, port: int) -> str:
        return health_command(port)

    def process(self, output):
        return "".join(output).strip() == "200"
