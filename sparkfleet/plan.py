"""The run's plan: per serving group, what is fetched, built, shipped, warmed and restarted.

Every decision below is a role's own prepare-time verdict (facts read before any operation), taken
once per group and cached (sparkfleet.once): the roles then execute exactly these verdicts. The
table prints once, before any operation runs, like a dry run's plan; a group whose row says
nothing is left alone (groups are independent: a change to one group's profile restarts that
group only).
"""
from __future__ import annotations

import json
from dataclasses import asdict

from pyinfra import logger

from sparkfleet.once import once_per_fleet, per_group
from sparkfleet.plan_types import GroupPlan


def group_plan(state, group) -> GroupPlan:
    """One group's verdicts (run in a greenlet of that group: sparkfleet.once.per_group)."""
    from roles.fabric_speed.checks import speed_plan
    from roles.image.checks import image_plan
    from roles.kernel_cache.checks import cache_plan
    from roles.serving.checks import pair_state
    from roles.serving.schema import node_profile
    from roles.weights.checks import weights_plan

    profile = node_profile(group.head)
    image = image_plan(state, profile)
    weights = weights_plan(state)
    caches = cache_plan(state)
    serving = pair_state(state)
    plan = GroupPlan(group=group.group or "pair", profile=profile.name, image=profile.image_ref,
                     nodes=[n.name for n in group.nodes])
    plan.fetch = sorted(weights.fetch)
    plan.build = image.build
    plan.ship = [f"image -> {n}" for n in image.ship]
    plan.ship += [f"{model} -> {n}" for (model, n) in sorted(weights.pull)]
    # What roles/kernel_cache's one step does: a prewarm (which also syncs, links and expires), or
    # only bringing the ranks in line: a rank's files (sync), `current` linked to the image's
    # generation (link: a rollback), generations past kernel_cache_keep_generations removed (expire).
    if caches.prewarm:
        plan.warm = "prewarm"
    else:
        plan.warm = "; ".join(f"{what} {', '.join(sorted(nodes))}" for what, nodes in
                              (("sync", caches.sync), ("link", caches.link), ("expire", caches.expire)) if nodes)
    plan.speed = speed_plan(state).why or ""
    plan.restart, plan.reasons, plan.healthy = serving.restart, list(serving.reasons), serving.healthy
    return plan


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
        shown = p.reasons[:reasons_shown]
        more = len(p.reasons) - len(shown)
        if shown:
            lines.append(f"  {name} restarts: {'; '.join(shown)}" + (f" (and {more} more)" if more else ""))
    return lines


def turn_sequence(plans: dict[str, GroupPlan]) -> list[str]:
    """The order of one-group turns: groups that do not serve first (their turn repairs them, and
    they are routed again before a serving group is drained), then the serving ones, each by name."""
    return sorted(plans, key=lambda name: (plans[name].healthy, name))


def write_plan(plans: dict[str, GroupPlan], path: str) -> None:
    """The plan as JSON for `sparkfleet plan` (sparkfleet/plan_command.py), group -> its verdicts."""
    with open(path, "w") as out:
        json.dump({name: asdict(p) for name, p in sorted(plans.items())}, out, indent=1, sort_keys=True)


def fleet_plan(state) -> dict[str, GroupPlan]:
    """Every group's plan, printed once as a table before any operation runs."""
    def compute():
        plans = per_group(state, lambda group: group_plan(state, group))
        changed = sum(p.changes for p in plans.values())
        logger.info(f"--> sparkfleet plan: {len(plans)} serving group(s), {changed} with changes "
                    f"(decided before any change; the roles execute this plan)")
        for line in plan_table(plans):
            logger.info("    " + line)
        restarting = [name for name in turn_sequence(plans) if plans[name].restart]
        if len(restarting) > 1 and any(p.healthy for p in plans.values()):
            logger.info(f"    rolling: {', then '.join(restarting)} (one group at a time: each out of the router, "
                        f"upgraded, proven to serve and routed again before the next stops)")
        elif len(restarting) > 1:
            logger.info(f"    together: {', '.join(restarting)} (no group serves yet: none waits for another)")
        return plans

    return once_per_fleet(state, "plan", compute)
