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


def health_command(api: str, tls: str = "", path: str = "/health", plain_port: int | None = None) -> str:
    """The HTTP code of GET <api><path> through the head's API proxy, asked on the head: `api` is the API as
    clients name it (sparkfleet/model/tls.py api_base: https://<management address>:<port>), `tls` curl's
    options that verify its certificate against the node's trust bundle (curl_tls). `plain_port`: when the
    verified request gets no answer, plain HTTP on 127.0.0.1 at that port is asked too (the plan's reading
    of a proxy deployed before TLS, which this run moves to TLS); never a request that skips verification."""
    code = f"curl -fsS -m 5 -o /dev/null -w '%{{http_code}}' {tls + ' ' if tls else ''}{api}{path} 2>/dev/null"
    if plain_port is None:
        return f"{code} || true"
    plain = f"curl -fsS -m 5 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{int(plain_port)}{path} 2>/dev/null"
    return f"c=$({code}); [ \"$c\" = 200 ] || c=$({plain}); echo \"$c\""


class HeadHealth(FactBase):
    """True when the head answers 200 on /health (health_command's arguments)."""

    def command(self, api: str, tls: str = "", plain_port: int | None = None) -> str:
        return health_command(api, tls, plain_port=plain_port)

    def process(self, output):
        return "".join(output).strip() == "200"
