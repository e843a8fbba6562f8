"""The plan's types: what a deploy decides per serving group. Imports nothing of sparkfleet's or
pyinfra's, so `sparkfleet plan` (sparkfleet/plan_command.py) reads a plan without loading either."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GroupPlan:
    group: str
    profile: str
    image: str
    nodes: list[str]  # head first
    fetch: list[str] = field(default_factory=list)  # models the head fetches
    build: bool = False  # the head builds the image
    ship: list[str] = field(default_factory=list)  # "image -> node", "model -> node": sent over the fabric
    warm: str = ""  # "prewarm" | "sync <nodes>; link <nodes>; expire <nodes>" (what the cache step does) | ""
    speed: str = ""  # why the fabric proves its speed in this run (roles/fabric_speed), "" when it does not
    restart: bool = False
    reasons: list[str] = field(default_factory=list)  # why the group restarts
    healthy: bool = False
    engine: str = ""  # the engine's version before -> after the run, and which proof judges it (roles/engine_proof)
    engine_version: str = ""  # the version this run serves, as read from its image at prepare ("": not built yet)

    @property
    def standing(self) -> str:
        """How the group stands when nothing restarts it (the plan table's restart cell, `sparkfleet plan`)."""
        return "serving" if self.healthy else "/health not 200"

    @property
    def changes(self) -> bool:
        return bool(self.fetch or self.build or self.ship or self.warm or self.speed or self.restart)

    def actions(self) -> list[str]:
        """What a deploy would do to this group, and why it restarts: [] when nothing
        (`sparkfleet plan`'s summary and the doctor's plan row)."""
        return (([f"fetch {', '.join(self.fetch)}"] if self.fetch else [])
                + ([f"build {self.image}"] if self.build else [])
                + ([f"ship {', '.join(self.ship)}"] if self.ship else [])
                + ([f"prove the fabric's speed ({self.speed})"] if self.speed else [])
                + ([f"warm the kernel caches ({self.warm})"] if self.warm else [])
                + ([f"restart the group ({'; '.join(self.reasons) or 'no reason recorded'})"] if self.restart else []))


def turn_sequence(plans: dict[str, GroupPlan]) -> list[str]:
    """The order of one-group turns: groups that do not serve first (their turn repairs them, and
    they are routed again before a serving group is drained), then the serving ones, each by name."""
    return sorted(plans, key=lambda name: (plans[name].healthy, name))
