"""The plan's types: what a deploy decides per serving group. Imports nothing of sparkfleet's or
pyinfra's, so `sparkfleet plan` (sparkfleet/plan_command.py) reads a plan without loading either."""
from __future__ import annotations

from dataclasses import dataclass, field


# The plan table's warm cell, and the kernel-cache step's name, when the plan leaves the prewarm to be
# decided after the build (roles/kernel_cache/checks.py decide: CachePlan.after_build).
WARM_AFTER_BUILD = "after the build: reuse or prewarm"
AFTER_BUILD_STEP = "Reuse or prewarm the kernel caches (decided after the build)"


@dataclass(frozen=True)
class GroupPlan:
    group: str
    profile: str
    image: str
    nodes: list[str]  # head first
    fetch: list[str] = field(default_factory=list)  # models the head fetches
    build: bool = False  # the head builds the image
    ship: list[str] = field(default_factory=list)  # "image -> node", "model -> node": sent over the fabric
    warm: str = ""  # "prewarm" | WARM_AFTER_BUILD | "sync <nodes>; link <nodes>; expire <nodes>" (what the cache step does) | ""
    speed: str = ""  # why the fabric proves its speed in this run (roles/fabric_speed), "" when it does not
    restart: bool = False
    reasons: list[str] = field(default_factory=list)  # why the group restarts
    healthy: bool = False
    engine: str = ""  # the engine's version before -> after the run, and which proof judges it (roles/engine_proof)
    engine_version: str = ""  # the version this run serves, as read from its image at prepare ("": not built yet)
    firewall: str = ""  # where the nftables table is applied or removed, and why (roles/firewall); "": nowhere

    @property
    def standing(self) -> str:
        """How the group stands when nothing restarts it (the plan table's restart cell, `sparkfleet plan`)."""
        return "serving" if self.healthy else "/health not 200"

    @property
    def changes(self) -> bool:
        return bool(self.fetch or self.build or self.ship or self.warm or self.speed or self.restart or self.firewall)

    def actions(self) -> list[str]:
        """What a deploy would do to this group, and why it restarts: [] when nothing
        (`sparkfleet plan`'s summary and the doctor's plan row)."""
        return (([f"fetch {', '.join(self.fetch)}"] if self.fetch else [])
                + ([f"build {self.image}"] if self.build else [])
                + ([f"ship {', '.join(self.ship)}"] if self.ship else [])
                + ([f"change the firewall: {self.firewall}"] if self.firewall else [])
                + ([f"prove the fabric's speed ({self.speed})"] if self.speed else [])
                + ([f"warm the kernel caches ({self.warm})"] if self.warm else [])
                + ([f"restart the group ({'; '.join(self.reasons) or 'no reason recorded'})"] if self.restart else []))


def turn_sequence(plans: dict[str, GroupPlan]) -> list[str]:
    """The order of one-group turns: groups that do not serve first (their turn repairs them, and
    they are routed again before a serving group is drained), then the serving ones, each by name."""
    return sorted(plans, key=lambda name: (plans[name].healthy, name))


def turn_order(plans: dict[str, GroupPlan], groups: list[str]) -> list[str]:
    """The turns, in order, each the groups that take it ('g1', or 'g1+g2'): one group per turn while
    any group serves (the others keep answering during a group's turn), in turn_sequence's order; all
    groups in one turn when none serves yet (a first bring-up keeps nobody waiting for nothing).
    `groups`: every group of the fleet, planned or not (a group with no host in this run still takes
    its turn, with nothing in it)."""
    if any(p.healthy for p in plans.values()):
        planned = turn_sequence(plans)
        return planned + [g for g in groups if g not in planned]
    return ["+".join(groups)]


def turn_groups(turn: str) -> list[str]:
    return turn.split("+")


@dataclass(frozen=True)
class FleetPlan:
    """The fleet's verdicts, decided once at step 1b with the groups' (tools/plan.py decide) from the
    same facts pass: the turn order, what the router routes and what this run drains or routes again,
    and where the fleet's one API key is written. Printed with the groups' and written beside them
    (`sparkfleet plan`); the rolling, router and key steps execute it. A pair (one group, no router)
    has one turn and nothing else."""
    turns: list[str] = field(default_factory=list)  # in order: 'g1', or 'g1+g2' when none serves yet
    router: str = ""  # the router node ("": no router)
    routing: dict[str, str] = field(default_factory=dict)  # group -> its state at the router as read at
    #            prepare (routed, unhealthy, draining, drained, or 'not configured yet'), in the router's order
    router_note: str = ""  # why the routing was not read ("not running; ..."), "" when it was
    route_again: list[str] = field(default_factory=list)  # put back before any turn (left drained, they serve)
    drain: list[str] = field(default_factory=list)  # out of the router for their restart, back at their turn's end
    outage_accepted: dict[str, str] = field(default_factory=dict)  # group -> why its drain leaves its model
    #            unrouted, accepted in data (router_outage_accepted)
    key_source: str = ""  # the node whose key file is the fleet's API key (the router group's head)
    key_writes: list[str] = field(default_factory=list)  # nodes whose key file gets the fleet's key
    key_generated: bool = False  # no key file anywhere yet: the controller generates it
    tls: list[str] = field(default_factory=list)  # the TLS lines the deploy printed (roles/tls plan_lines)

    def restarting(self, plans: dict[str, GroupPlan]) -> list[str]:
        """The groups that restart, in the order they take their turns."""
        return [g for t in self.turns for g in turn_groups(t) if g in plans and plans[g].restart]

    def router_lines(self) -> list[str]:
        """The router's part of the deploy's plan output (tools/plan.py), read back by
        tests/e2e/plan_conformance.py: '--> sparkfleet router on <node>: ...', then what this run
        routes again, drains and accepts."""
        if not self.router:
            return []
        if self.router_note:
            out = [f"--> sparkfleet router on {self.router}: {self.router_note}"]
        else:
            cells = ", ".join(f"{group} {state}" for group, state in self.routing.items())
            out = [f"--> sparkfleet router on {self.router}: {cells}"]
        if self.route_again:
            out.append(f"    routed again before any turn (an earlier run left them drained; they serve): "
                       f"{', '.join(self.route_again)}")
        if self.drain:
            out.append(f"    out of routing for their restart, routed again at their turn's end: {', '.join(self.drain)}")
        for group, why in self.outage_accepted.items():
            out.append(f"    {group}: {why}; router_outage_accepted is true: its turn drains it anyway")
        if self.key_writes:
            out.append(f"    the fleet's API key ({self.key_source}'s{', generated now' if self.key_generated else ''}) "
                       f"written into the key file of: {', '.join(self.key_writes)}")
        return out

    def lines(self) -> list[str]:
        """`sparkfleet plan`'s fleet section (nothing for a pair: one turn and no router)."""
        out = [f"  turn order: {', then '.join(self.turns)}"] if len(self.turns) > 1 else []
        if self.turns and "+" in self.turns[0]:
            out.append(f"  turn order: {self.turns[0]} (one turn: no group serves yet)")
        return out + ["  " + line.removeprefix("--> sparkfleet ").strip() for line in self.router_lines() + self.tls]
