"""The run's one plan: per serving group, what is fetched, built, shipped, warmed and restarted, and why;
for the fleet, the turn order, the routing and the fleet key's fate.

decide() is deploy.py's step 1b: it takes every role's verdict once, from facts read at prepare
(before any operation), composes what only their sum says (whether the pair restarts, what pauses
the watchdog; the turns, what is drained and routed again), prints the table and the fleet's lines
once and installs the result (sparkfleet/decided.py) for every step after it to read. Nothing decides again: each role executes its slice. A group whose row says nothing
is left alone (groups are independent: a change to one group's profile restarts that group only).
The composer stands above the roles; no role imports it.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import asdict, replace

from pyinfra import logger
from pyinfra.api.exceptions import DeployError

from roles.fabric import checks as fabric_checks
from roles.engine_proof.checks import engine_move
from roles.fabric_speed import checks as fabric_speed_checks
from roles.fingerprint.facts import EngineVersions
from roles.firewall import checks as firewall_checks
from roles.image import checks as image_checks
from roles.kernel_cache import checks as kernel_cache_checks
from roles.preflight.checks import preflight_rows
from roles.rolling import routes
from roles.router import fleet_key
from roles.router.facts import RouterRouting
from roles.router.node_config import router_node
from roles.serving import checks as serving_checks
from roles.serving.api_key import decide_key, head_key_found
from roles.tls import checks as tls_checks
from roles.watchdog import checks as watchdog_checks
from roles.weights import checks as weights_checks
from sparkfleet import addresses, decided
from sparkfleet.model.engine import unit_name
from sparkfleet.model.env_readers import snapshot_version
from sparkfleet.model.serving import node_profile
from sparkfleet.inventory import fleet_from_state
from sparkfleet.once import at_once, fleet_slot, group_slot, once_per_fleet, per_group
from sparkfleet.plan_command import FLEET_FILE, GROUPS_FILE, plan_dir
from sparkfleet.plan_types import WARM_AFTER_BUILD, FleetPlan, GroupPlan, turn_order
from sparkfleet.verdicts import FleetKey, NodeMemory, RoutingPlan


def restart_reasons(cluster, profile, image, fabric, weights, caches, serving) -> list[str]:
    """Why the pair restarts: a TP pair is one thing, so a change any role sees moves both ranks
    (head stopped first, workers started first). Pure: every input is a role's verdict. A new or
    changed API key is none of them: the engine holds no key (the API proxy checks it and reloads,
    roles/api_proxy), so a rotation leaves the pair serving."""
    reasons = []
    if image.head_id is None or not image.same_everywhere:
        reasons.append(f"image {profile.image_ref} is new or differs between nodes")
    reasons += serving.reasons  # a rank's file changed, or its unit does not serve
    for name in sorted(fabric.drift):  # step 3 re-applies it: the ranks' connections ride on that link
        if fabric.drift[name] or not fabric.file_current[name]:
            reasons.append(f"{name}: the fabric link is reconfigured "
                           f"({'; '.join(fabric.drift[name]) or 'its netplan file changed'})")
    if weights.fetch:  # the engine loaded the old files; the pair serves what the manifests say
        reasons.append(f"new weights on the head: {', '.join(weights.fetch)}")
    if caches.prewarm:
        reasons.append("the kernel caches are warmed first (the prewarm stops the pair)")
    return reasons  # caches.after_build comes only with an image built in this run: its reason is the first


def what_moves_the_pair(caches, serving) -> str | None:
    """What stops the pair's units in this run, for the watchdog to be paused around (roles/watchdog)."""
    if caches.prewarm:
        return "the prewarm"
    if caches.after_build:  # the image is new: the pair restarts, after a prewarm or not (decided after the build)
        return "the pair restart (and the prewarm before it, if the new image's engine is not warmed)"
    return "the pair restart" if serving.restart else None


def summary(group, profile, image, weights, caches, speed, serving) -> GroupPlan:
    """The plan table's row of one group. Pure."""
    ship = [f"image -> {n}" for n in image.ship] + [f"{model} -> {n}" for (model, n) in sorted(weights.pull)]
    # What roles/kernel_cache's one step does: a prewarm (which also syncs, links and expires), or
    # only bringing the ranks in line: a rank's files (sync), `current` linked to the image's
    # generation (link: a rollback), generations past kernel_cache_keep_generations removed (expire).
    if caches.prewarm:
        warm = "prewarm"
    elif caches.after_build:
        warm = WARM_AFTER_BUILD
    else:
        warm = "; ".join(f"{what} {', '.join(sorted(nodes))}" for what, nodes in
                         (("sync", caches.sync), ("link", caches.link), ("expire", caches.expire)) if nodes)
    return GroupPlan(group=group.group or "pair", profile=profile.name, image=profile.image_ref,
                     nodes=[n.name for n in group.nodes], fetch=sorted(weights.fetch), build=image.build, ship=ship,
                     warm=warm, speed=speed.why or "", restart=serving.restart, reasons=list(serving.reasons),
                     healthy=serving.healthy)


# How many roles' readers run at once: each holds a channel on every node it reads, beside the run's
# own (the deploy lock's session among them), and sshd refuses a connection's channels past
# MaxSessions (10 by default). Six is what the composer ran at once before the pass was one.
FACT_READERS_AT_ONCE = 6


def read_facts(state) -> None:
    """Step 1: every group's facts pass and the fleet's (the router's routing, the fleet key's files),
    at once, before preflight's check reads its rows (one of the pass's readers): they overlap
    instead of one waiting for another. Nothing is decided here, and no failure is raised here: a
    reader's failure stays in its slot and is raised where it was before, by preflight's check (its
    rows) or by decide() (the rest), so that a node which fails preflight is still refused by
    preflight's table."""
    def quietly(read):
        try:
            read()
        except Exception:  # kept in the slot (sparkfleet.once.group_slot, fleet_slot): raised again by its next reader
            pass

    def compute():
        # The fleet's readers one after the other, beside the groups' pass: one more channel on the
        # router group's nodes and the heads, under sshd's MaxSessions (FACT_READERS_AT_ONCE).
        at_once(lambda: quietly(lambda: per_group(state, lambda group: group_facts(state, group))),
                lambda: (quietly(lambda: fleet_key_facts(state)), quietly(lambda: router_routing(state)),
                         quietly(lambda: tls_checks.tls_facts(state))))
    once_per_fleet(state, "plan-facts", compute)


def fleet_key_facts(state) -> fleet_key.KeyFacts | None:
    """The fleet key's holders as the facts pass read them (roles/router fleet_key.key_facts), once per
    run; None without a router."""
    with fleet_slot(state, "fleet-key") as slot:
        return slot.value if slot.done else slot.fill(fleet_key.key_facts(state, fleet_from_state(state)))


def router_routing(state) -> dict | None:
    """The router's routing as the facts pass read it (roles/router/facts.py RouterRouting: None when
    its unit is not active, {'error': ...} when it does not answer), once per run; None without a
    router."""
    with fleet_slot(state, "router-routing") as slot:
        if slot.done:
            return slot.value
        router = router_node(fleet_from_state(state))
        return slot.fill(None if router is None else state.inventory.get_host(router.name).get_fact(RouterRouting))


def fleet_key_decision(state) -> FleetKey | None:
    """The fleet key's fate from the facts pass (roles/router fleet_key.decide): decide() takes it once
    for the run; the doctor and a replay take it for the groups' key verdicts."""
    return fleet_key.decide(fleet_from_state(state), fleet_key_facts(state), secrets.token_hex(32).encode())


def group_facts(state, group) -> dict:
    """Every fact one group's verdicts read, in one pass: each role's reader at once (run in a
    greenlet of that group: sparkfleet.once.per_group), each reading its nodes at once; once per
    run (read_facts reads it first, decide and the doctor read it again from the group's slot)."""
    with group_slot(state, "plan-facts") as slot:
        return slot.value if slot.done else slot.fill(_read_group_facts(state, group))


def engine_versions(state, head, profile) -> dict:
    """The head's EngineVersions fact: the engine of the image its unit runs, and of this run's image,
    and that image's layers (what the kernel caches are keyed by), read once per run for the group's
    readers (the plan's engine line, roles/kernel_cache's generation)."""
    with group_slot(state, "engine-versions") as slot:
        if slot.done:
            return slot.value
        head_host = state.inventory.get_host(head.name)
        return slot.fill(head_host.get_fact(EngineVersions, netdev=head.fabric_netdev, unit=unit_name(head),
                                            ref=profile.image_ref, engine=profile.engine) or {})


def _read_group_facts(state, group) -> dict:
    profile = node_profile(group.head)
    readers = {
        "fabric": lambda: fabric_checks.fabric_facts(state),  # links, files, and the read-only proof
        "firewall": lambda: firewall_checks.firewall_facts(state),  # live markers, what the rules name
        "key_found": lambda: head_key_found(state, group.head),
        "image": lambda: image_checks.image_facts(state, profile),
        "engine": lambda: engine_versions(state, group.head, profile),
        "weights": lambda: weights_checks.weights_facts(state),
        # keyed by the engine in the head's image: its layers come with the head's EngineVersions
        "caches": lambda: kernel_cache_checks.cache_facts(
            state, lambda: engine_versions(state, group.head, profile).get("layers")),
        "serving": lambda: serving_checks.serving_facts(state),
        "speed_records": lambda: fabric_speed_checks.speed_records(state),
        "watchdog_units": lambda: watchdog_checks.watchdog_units(state),
        # preflight's rows, not its verdict: the doctor reads this plan too, and shows a failed
        # preflight as a row of its own instead of stopping here.
        "preflight": lambda: preflight_rows(state),
    }
    return dict(zip(readers, at_once(*readers.values(), limit=FACT_READERS_AT_ONCE)))


def decide_group(facts: dict, group, fleet_key_v: FleetKey | None = None, fleet=None) -> decided.Decisions:
    """One group's decisions, a pure function of its facts, its validated config (`fleet`: every
    group's, for what the firewall admits; the group itself by default, a pair) and the fleet key's
    fate (roles/router: the fleet's one key replaces this head's): each role's verdict, then what only
    their sum says (whether the pair restarts, what pauses the watchdog)."""
    profile = node_profile(group.head)
    firewall_v = firewall_checks.decide(facts["firewall"], group, fleet)
    # A ping that fails may be stopped by a table this run changes: the fabric's verdict weighs it.
    fabric = fabric_checks.decide(facts["fabric"], group, firewall_v)
    key = decide_key(group.head, facts["key_found"], fleet_key_v is not None and group.head.name in fleet_key_v.writes)
    image_v = image_checks.decide(facts["image"], group, profile)
    weights_v = weights_checks.decide(facts["weights"], group)
    caches = kernel_cache_checks.decide(facts["caches"], group)
    own = serving_checks.decide(facts["serving"], group)
    reasons = restart_reasons(group, profile, image_v, fabric, weights_v, caches, own)
    serving_v = replace(own, restart=bool(reasons), reasons=tuple(reasons))
    memory = {node.name: NodeMemory(total_gib=row.get("mem_total_gib", 0.0), available_gib=row.get("mem_available_gib", 0.0))
              for node, row, _ in facts["preflight"]}
    available = {name: m.available_gib for name, m in memory.items()}
    speed = fabric_speed_checks.decide(group, profile.image_ref, facts["speed_records"], available,
                                       reconfigured=not fabric.converged)
    watchdog_v = watchdog_checks.plan_for(group, what_moves_the_pair(caches, serving_v), facts["watchdog_units"])
    moves = engine_move(facts["engine"], profile, serving_v.restart or caches.prewarm, snapshot_version)
    row = replace(summary(group, profile, image_v, weights_v, caches, speed, serving_v), engine=moves.line(profile.engine),
                  engine_version=moves.after or "", firewall=firewall_checks.summary(firewall_v))
    return decided.Decisions(summary=row,
                             fabric=fabric, key=key, image=image_v, weights=weights_v, caches=caches,
                             speed=speed, serving=serving_v, watchdog=watchdog_v, memory=memory, firewall=firewall_v)


def group_decisions(state, group, fleet_key_v: FleetKey | None) -> decided.Decisions:
    """One group's decisions from this run's facts, each role's verdict line printed."""
    facts = group_facts(state, group)
    d = decide_group(facts, group, fleet_key_v, fleet_from_state(state))
    profile = node_profile(group.head)
    logger.info("--> sparkfleet weights: " + weights_checks.summary(d.weights))
    logger.info(f"--> sparkfleet kernel caches ({profile.image_ref}): "
                f"{kernel_cache_checks.summary(d.caches, facts['caches'], group.head.name)}")
    shown = "; ".join(d.serving.reasons) if d.serving.reasons else (
        "unchanged, healthy" if d.serving.healthy else "unchanged, /health not 200")
    logger.info(f"--> sparkfleet serving {profile.name} ({profile.image_ref}): {shown}")
    logger.info(f"--> sparkfleet watchdog: {watchdog_checks.summary(d.watchdog, group)}")
    return d


# The plan table's columns (tests/e2e/plan_conformance.py reads the table back by them).
TABLE_HEADER = ("group", "profile", "nodes (head first)", "fetch", "build", "ship over the fabric", "warm", "restart")


def _cell(items: list[str], empty: str = "-") -> str:
    return ", ".join(items) if items else empty


def _ship_cell(p: GroupPlan) -> str:
    """What crosses the fabric, per receiving node: 'spark-b: image, 2 models'."""
    per_node: dict[str, list[str]] = {}
    for item in p.ship:
        what, node = item.rsplit(" -> ", 1)
        per_node.setdefault(node, []).append(what)
    cells = []
    for node, things in per_node.items():
        models = [t for t in things if t != "image"]
        parts = (["image"] if "image" in things else []) + ([f"{len(models)} model{'s' * (len(models) > 1)}"]
                                                            if models else [])
        cells.append(f"{node}: {', '.join(parts)}")
    return "; ".join(cells) or "-"


def plan_table(plans: dict[str, GroupPlan], reasons_shown: int = 4) -> list[str]:
    """The table's lines: one row per group, then why each restarting group restarts."""
    header = TABLE_HEADER
    rows = [header]
    for name, p in sorted(plans.items()):
        restart = "yes" if p.restart else f"no, {p.standing}"
        fetch = f"{len(p.fetch)} model{'s' * (len(p.fetch) > 1)}" if p.fetch else "-"
        rows.append((name, p.profile, _cell(p.nodes), fetch, "yes" if p.build else "-", _ship_cell(p),
                     p.warm or "-", restart))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    for name, p in sorted(plans.items()):
        if p.fetch:
            lines.append(f"  {name} fetches: {', '.join(p.fetch)}")
        if p.speed:
            lines.append(f"  {name} proves the fabric's speed: {p.speed}")
        if p.engine:
            lines.append(f"  {name} engine: {p.engine}")
        if p.firewall:
            lines.append(f"  {name} firewall: {p.firewall}")
        shown = p.reasons[:reasons_shown]
        more = len(p.reasons) - len(shown)
        if shown:
            lines.append(f"  {name} restarts: {'; '.join(shown)}" + (f" (and {more} more)" if more else ""))
    return lines


def management_lines(fleet) -> list[str]:
    """Every node's management address as validation pinned it on the controller, and how (given, or the
    name resolved there once): what the router's backends, the scrape targets and the firewall name
    (sparkfleet/addresses.py). Printed before the table, so the operator sees where the key and the
    prompts go."""
    return ["--> sparkfleet management addresses (rendered into the router's backends, the scrape targets and "
            "the firewall; no node resolves a name):"] + [f"    {line}" for line in addresses.plan_lines(fleet.nodes)]


def fleet_plan(turns: list[str], routing: RoutingPlan, key: FleetKey | None, tls: list[str] = ()) -> FleetPlan:
    """The fleet's row of the plan: the turn order, the router's verdict, the fleet key's and TLS's lines. Pure."""
    return FleetPlan(turns=list(turns), router=routing.router, tls=list(tls),
                     routing={g: state or "not configured yet" for g, state in routing.states.items()},
                     router_note=routing.note, route_again=list(routing.route_again), drain=list(routing.drain),
                     outage_accepted=dict(routing.accepted), key_source=key.source if key else "",
                     key_writes=list(key.writes) if key else [], key_generated=bool(key and key.generated))


def fleet_lines(plans: dict[str, GroupPlan], fleet: FleetPlan) -> list[str]:
    """The fleet's lines under the table: how the restarting groups take their turns, the turn order
    (a fleet), the router's routing, what this run drains and routes again, and where the key goes."""
    lines = []
    restarting = fleet.restarting(plans)
    if len(restarting) > 1 and any(p.healthy for p in plans.values()):
        lines.append(f"    rolling: {', then '.join(restarting)} (one group at a time: each out of the router, "
                     f"upgraded, proven to serve and routed again before the next stops)")
    elif len(restarting) > 1:
        lines.append(f"    together: {', '.join(sorted(restarting))} (no group serves yet: none waits for another)")
    if len(fleet.turns) > 1 or "+" in "".join(fleet.turns):
        lines.append(f"    turn order: {', then '.join(fleet.turns)}")
    return lines + fleet.router_lines()


def write_plan(plans: dict[str, GroupPlan], fleet: FleetPlan, directory) -> None:
    """The plan as JSON for `sparkfleet plan` (sparkfleet/plan_command.py): group -> its verdicts, and
    the fleet's (no key in it: FleetPlan names the nodes a key is written to)."""
    with open(directory / GROUPS_FILE, "w") as out:
        json.dump({name: asdict(p) for name, p in sorted(plans.items())}, out, indent=1, sort_keys=True)
    with open(directory / FLEET_FILE, "w") as out:
        json.dump(asdict(fleet), out, indent=1)  # unsorted: the router's groups in its own order


def refusal(decisions: dict[str, decided.Decisions], fleet, routing: RoutingPlan,
            tls=None) -> DeployError | None:
    """What refuses the run at step 1b, after the plan printed and before any host is changed: a node
    whose firewall cannot be rendered (roles/firewall: its subnet or the monitoring node's address
    unread), then a turn that drains a model's last routed group (roles/rolling/routes.py), then TLS
    (roles/tls: a fleet CA or a site's certificate the deploy must not use). Pure."""
    walls = {name: plan for d in decisions.values() for name, plan in d.firewall.items()}
    return firewall_checks.refusal(walls) or routes.refusal(fleet, routing) or tls_checks.refusal(tls)


def decide(state) -> dict[str, GroupPlan]:
    """Step 1b: every group's decisions and the fleet's, once per run, printed before any operation runs
    and installed for every later step (sparkfleet/decided.py); run as a plan, also written for
    `sparkfleet plan` to read. A turn that would drain a model's last routed group is refused here,
    before any host is changed. Returns the table's rows."""
    def compute():
        fleet = fleet_from_state(state)
        key = fleet_key_decision(state)  # before the groups': a head whose key is replaced restarts
        decisions = per_group(state, lambda group: group_decisions(state, group, key))
        plans = {name: d.summary for name, d in decisions.items()}
        turns = turn_order(plans, list(fleet.groups))
        routing = routes.decide(fleet, router_routing(state), plans, turns)
        tls = tls_checks.decide(fleet, tls_checks.tls_facts(state))
        tls_lines = tls_checks.plan_lines(fleet, tls)
        fleet_v = decided.FleetDecision(summary=fleet_plan(turns, routing, key, tls_lines), key=key, tls=tls)
        changed = sum(p.changes for p in plans.values())
        for line in management_lines(fleet):
            logger.info(line)
        logger.info(f"--> sparkfleet plan: {len(plans)} serving group(s), {changed} with changes "
                    f"(decided before any change; the roles execute this plan)")
        for line in plan_table(plans):
            logger.info("    " + line)
        for line in fleet_lines(plans, fleet_v.summary) + tls_lines:
            logger.info(line)
        if (refused := refusal(decisions, fleet, routing, tls)) is not None:
            raise refused
        decided.install(state, decisions, fleet_v)
        if (directory := plan_dir()) is not None:
            write_plan(plans, fleet_v.summary, directory)
        return plans

    return once_per_fleet(state, "plan", compute)
