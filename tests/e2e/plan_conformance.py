"""The plan a deploy printed against the operations it ran: every planned fetch (started in the
background, then waited for), build (started in the background, then waited for), shipment,
cache warm-up, pair restart, firewall table applied or removed, fleet CA made, certificate issued and
trust bundle written happened, on the node the plan names,
and none happened that the plan did not announce; and so for the fleet's actions: every group routed again, taken out of routing
for its restart and put back, and every fleet key written, as the fleet's lines printed them, the
groups' turns in the printed order. Read from the deploy's own output, nothing else: the plan table
and the fleet's lines (tools/plan.py, printed once before any operation) and pyinfra's per-operation
results.

Used by tests/e2e/lab.py's deploy() on every lab deploy that succeeded, so each end-to-end test that
deploys also proves that what ran is what was printed."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from roles.image.background import BUILD_START_PREFIX as IMAGE_BUILD_START, START_PREFIX as IMAGE_PULL_START
from roles.weights.background import FOLLOW_STEP, START_STEP as FETCH_START_STEP
from sparkfleet.plan_types import AFTER_BUILD_STEP, WARM_AFTER_BUILD
from tools.plan import TABLE_HEADER

# The operations that start a long step as a transient unit (sparkfleet/background.py): none of them
# starts, stops or restarts the pair, whatever its name begins with.
BACKGROUND_STARTS = (IMAGE_BUILD_START, IMAGE_PULL_START, FETCH_START_STEP, FOLLOW_STEP)


def starts_in_background(op: str) -> bool:
    return op.startswith(BACKGROUND_STARTS)


_PLAN = re.compile(r"^--> sparkfleet plan: (?P<groups>\d+) serving group\(s\), (?P<changes>\d+) with changes")
# The fleet's lines under the table (sparkfleet/plan_types.py FleetPlan.router_lines, tools/plan.py fleet_lines).
_ROUTER = re.compile(r"^--> sparkfleet router on (?P<router>\S+): ")
_ROUTE_AGAIN = re.compile(r"^routed again before any turn \(an earlier run left them drained; they serve\): (?P<groups>.+)$")
_DRAIN = re.compile(r"^out of routing for their restart, routed again at their turn's end: (?P<groups>.+)$")
_KEY = re.compile(r"^the fleet's API key \((?P<source>\S+)'s(?:, generated now)?\) written into the key file of: "
                  r"(?P<nodes>.+)$")
_TURNS = re.compile(r"^turn order: (?P<turns>.+)$")
# A group's firewall line under the table (tools/plan.py plan_table, roles/firewall/checks.py summary):
# '<group> firewall: applied on a, b (why); removed on c (why)'.
_FIREWALL = re.compile(r"^(?P<group>\S+) firewall: (?P<what>.+)$")
_FIREWALL_PART = re.compile(r"^(?P<verb>applied|removed) on (?P<nodes>.+?) \([^()]+\)$")
APPLY = "Apply the nftables table inet sparkfleet (one transaction)"
REMOVE = "Remove the nftables table inet sparkfleet (firewall_enabled is false)"


@dataclass
class PlannedGroup:
    group: str
    nodes: list[str]  # head first
    fetch: int = 0  # models the head fetches
    build: bool = False
    ship_image: set[str] = field(default_factory=set)  # workers that pull the image
    ship_models: dict[str, int] = field(default_factory=dict)  # worker -> models it is sent
    warm: str = "-"  # "prewarm" | WARM_AFTER_BUILD | "sync <nodes>; link <nodes>; expire <nodes>" | "-"
    restart: bool = False
    firewall_applied: list[str] = field(default_factory=list)  # nodes whose nftables table is applied
    firewall_removed: list[str] = field(default_factory=list)  # nodes whose table is removed (firewall off)

    @property
    def head(self) -> str:
        return self.nodes[0]


def parse_plan(output: str) -> tuple[int, dict[str, PlannedGroup]] | None:
    """(groups with changes, {group: its plan}) from the printed table; None when no plan printed
    (a run refused before step 1b)."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        m = _PLAN.match(line.strip())
        if m:
            break
    else:
        return None
    header = re.split(r"\s{2,}", lines[i + 1].strip())
    assert tuple(header) == TABLE_HEADER, f"the plan table's header changed: {header}"
    indent = len(lines[i + 1]) - len(lines[i + 1].lstrip())
    plans = {}
    for row in lines[i + 2:]:
        if len(row) - len(row.lstrip()) != indent or not row.strip():  # a row: the header's indent, then the group
            break
        cells = re.split(r"\s{2,}", row.strip())
        assert len(cells) == len(TABLE_HEADER), f"a plan row that does not parse: {row!r}"
        name, _, nodes, fetch, build, ship, warm, restart = cells
        p = PlannedGroup(group=name, nodes=[n.strip() for n in nodes.split(",")],
                         fetch=0 if fetch == "-" else int(fetch.split()[0]), build=build == "yes",
                         warm=warm, restart=restart == "yes")
        for part in ([] if ship == "-" else ship.split("; ")):
            node, what = part.split(": ", 1)
            for item in what.split(", "):
                if item == "image":
                    p.ship_image.add(node)
                else:
                    p.ship_models[node] = int(item.split()[0])
        plans[name] = p
    assert len(plans) == int(m["groups"]), f"{m['groups']} groups announced, {len(plans)} rows read"
    for row in lines[i + 2 + len(plans):]:  # the groups' lines under the table, up to the first blank
        if not row.strip():
            break
        if (f := _FIREWALL.match(row.strip())) and f["group"] in plans:
            for part in f["what"].split("; "):
                part_m = _FIREWALL_PART.match(part)
                assert part_m, f"a firewall line that does not parse: {row!r}"
                nodes = part_m["nodes"].split(", ")
                (plans[f["group"]].firewall_applied if part_m["verb"] == "applied"
                 else plans[f["group"]].firewall_removed).extend(nodes)
    return int(m["changes"]), plans


@dataclass
class PlannedFleet:
    router: str | None = None  # the router node, when the plan printed its line
    route_again: list[str] = field(default_factory=list)
    drain: list[str] = field(default_factory=list)
    key_writes: list[str] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)  # as printed ('g1', 'g1+g2'); [] for a pair


def parse_fleet(output: str) -> PlannedFleet:
    """The fleet's lines the plan printed (none for a pair)."""
    fleet = PlannedFleet()
    for line in output.splitlines():
        text = line.strip()
        if m := _ROUTER.match(text):
            fleet.router = m["router"]
        elif m := _ROUTE_AGAIN.match(text):
            fleet.route_again = m["groups"].split(", ")
        elif m := _DRAIN.match(text):
            fleet.drain = m["groups"].split(", ")
        elif m := _KEY.match(text):
            fleet.key_writes = m["nodes"].split(", ")
        elif m := _TURNS.match(text):
            fleet.turns = m["turns"].split(", then ")
    return fleet


def _names(changed: list[tuple[str, str]]) -> list[tuple[set[str], str]]:
    return [(printed_names(op), host) for op, host in changed]


def fleet_mismatches(output: str, changed: list[tuple[str, str]], plans: dict[str, PlannedGroup]) -> list[str]:
    """The fleet's actions a run took against the fleet's lines its plan printed."""
    fleet, ran, out = parse_fleet(output), _names(changed), []

    def done(host, test) -> bool:
        return any(h == host and any(test(n) for n in names) for names, h in ran)

    def expect(what, planned, did):
        if planned != did:
            out.append(f"fleet: {what}: the plan said {planned}, the run did {did}")

    again = [(names, h) for names, h in ran if any(n.startswith("Route again the serving groups ") for n in names)]
    expect("groups routed again before any turn", fleet.route_again,
           [g for names, _ in again for n in names for g in re.findall(r"\((.+)\)$", n)[0].split(", ")])
    if again and {h for _, h in again} != {fleet.router}:
        out.append(f"fleet: groups routed again on {sorted({h for _, h in again})}, the router is {fleet.router}")
    expect("groups taken out of routing for their restart", sorted(fleet.drain),
           sorted(g for g, p in plans.items()
                  if done(p.head, lambda n, g=g: n == f"Take serving group {g} out of the router (it restarts)")))
    written = sorted({h for names, h in ran if any(n.startswith("Write the fleet's API key into ") for n in names)})
    expect("nodes the fleet's API key was written to", sorted(fleet.key_writes), written)
    if fleet.turns:  # the groups proven at their turn's end, turn after turn in the printed order
        turn_of = {g: i for i, t in enumerate(fleet.turns) for g in t.split("+")}
        proven = [g for names, h in ran for n in names
                  if (m := re.fullmatch(r"Prove serving group (\S+) serves, and put it back in the router", n))
                  for g in [m[1]] if g in plans and h == plans[g].head]
        # the groups of one turn taken together ('g1+g2') are proven in whatever order pyinfra runs them
        ran_turns = [turn_of.get(g, -1) for g in proven]
        if -1 in ran_turns or ran_turns != sorted(ran_turns):
            out.append(f"fleet: the groups' turns, in order: the plan said {', then '.join(fleet.turns)}, "
                       f"the run proved {', '.join(proven)}")
    return out


def _count(changed: list[tuple[str, str]], host: str, test) -> int:
    return sum(1 for op, h in changed if h == host and test(op))


def mismatches(output: str, changed: list[tuple[str, str]]) -> list[str]:
    """What ran against what the plan printed: one line per difference (none: the plan was followed).
    `changed` is (operation, host) of every operation that changed something."""
    parsed = parse_plan(output)
    if parsed is None:
        return []
    _, plans = parsed
    out = []

    def expect(group, what, planned, done):
        if planned != done:
            out.append(f"{group}: {what}: the plan said {planned}, the run did {done}")

    for name, p in plans.items():
        workers = p.nodes[1:]
        expect(name, f"build on {p.head}", p.build,
               _count(changed, p.head, lambda op: op.startswith("Build ") and op.endswith(" on the head")) > 0)
        expect(name, f"the build started in the background on {p.head}", p.build,
               _count(changed, p.head, lambda op: op.startswith(IMAGE_BUILD_START)) > 0)
        expect(name, f"models fetched on {p.head}", p.fetch,
               _count(changed, p.head, lambda op: op.startswith("Fetch ") and " on the head (" in op))
        expect(name, f"the fetch started in the background on {p.head}", p.fetch > 0,
               _count(changed, p.head, lambda op: op.startswith(FETCH_START_STEP)) > 0)
        for w in workers:
            expect(name, f"image pulled by {w}", w in p.ship_image,
                   _count(changed, w, lambda op: op.startswith("Pull ") and op.endswith(" from the head")) > 0)
            expect(name, f"image pull started in the background on {w}", w in p.ship_image,
                   _count(changed, w, lambda op: op.startswith(IMAGE_PULL_START)
                          and op.endswith(" from the head, in the background")) > 0)
            # The head fetches a model: every worker pulls it (the plan's FOLLOWS_FETCH), following the fetch.
            expect(name, f"the pull following the fetch started in the background on {w}", p.fetch > 0,
                   _count(changed, w, lambda op: op.startswith(FOLLOW_STEP)) > 0)
            expect(name, f"models sent to {w}", p.ship_models.get(w, 0),
                   _count(changed, w, lambda op: op.startswith("Send ") and op.endswith(" to the workers over the fabric")))
        prewarmed = _count(changed, p.head, lambda op: op == "Prewarm and merge the kernel caches") > 0
        synced = _count(changed, p.head, lambda op: op == "Bring the kernel caches in line with the head's") > 0
        after_build = _count(changed, p.head, lambda op: op == AFTER_BUILD_STEP) > 0
        expect(name, "kernel-cache prewarm", p.warm == "prewarm", prewarmed)
        expect(name, "kernel caches brought in line (sync, link, expire)",
               p.warm not in ("-", "prewarm", WARM_AFTER_BUILD), synced)
        expect(name, "kernel caches reused or prewarmed as decided after the build", p.warm == WARM_AFTER_BUILD,
               after_build)
        restarted = [p.head] if _count(changed, p.head, lambda op: op == "Start the head (every worker is up)") else []
        restarted += [w for w in workers if _count(changed, w, lambda op: op == "Restart the workers (workers first)")]
        expect(name, "pair restart (nodes restarted)", p.nodes if p.restart else [], restarted)
        for what, planned, op in (("firewall table applied on", p.firewall_applied, APPLY),
                                  ("firewall table removed on", p.firewall_removed, REMOVE)):
            expect(name, what, sorted(planned),
                   [n for n in sorted(p.nodes) if _count(changed, n, lambda o, op=op: op in printed_names(o))])
    return out + fleet_mismatches(output, changed, plans) + tls_mismatches(output, changed)


# The plan's TLS lines (roles/tls/checks.py plan_lines), each an action on a node.
_TLS_CA = re.compile(r"^fleet CA created on: (?P<node>\S+)$")
_TLS_ISSUE = re.compile(r"^certificate issued for (?P<node>\S+?): ")
_TLS_HOP = re.compile(r"^router hop's client certificate issued on (?P<node>\S+?): ")
_TLS_SITE = re.compile(r"^site certificate installed on (?P<node>\S+?): ")
_TLS_EXPORTER = re.compile(r"^exporters' copy of the certificate written on (?P<node>\S+?): ")
_TLS_BUNDLE = re.compile(r"^trust bundle written on: (?P<nodes>.+)$")


def tls_mismatches(output: str, changed: list[tuple[str, str]]) -> list[str]:
    """TLS's actions a run took against the plan's TLS lines: the fleet CA created, each certificate
    issued or installed (the router hop's too), each exporters' copy and each trust bundle written on the
    nodes the plan named, and nowhere else."""
    planned = {"ca": set(), "issue": set(), "hop": set(), "site": set(), "exporter": set(), "bundle": set()}
    seen_plan = False
    for line in output.splitlines():
        text = line.strip()
        if text.startswith("--> sparkfleet TLS: "):
            seen_plan = True
        for what, rule in (("ca", _TLS_CA), ("issue", _TLS_ISSUE), ("hop", _TLS_HOP), ("site", _TLS_SITE),
                           ("exporter", _TLS_EXPORTER)):
            if m := rule.match(text):
                planned[what].add(m["node"])
        if m := _TLS_BUNDLE.match(text):
            planned["bundle"].update(m["nodes"].split(", "))
    ran = _names(changed)
    did = {what: {h for names, h in ran if any(n.startswith(prefix) for n in names)} for what, prefix in (
        ("ca", "Create the fleet CA on "), ("issue", "Issue the certificate of "),
        ("hop", "Issue the router hop's client certificate on "),
        ("site", "Install the site certificate of "), ("exporter", "Copy the certificate of "),
        ("bundle", "Write the trust bundle "))}
    if not seen_plan and not any(did.values()):
        return []
    return [f"TLS: {what}: the plan said {sorted(planned[what])}, the run did {sorted(did[what])}"
            for what in planned if planned[what] != did[what]]


_HOST_RUNS = re.compile(r"^  (?P<host>\S+): (?P<n>\d+) operation\(s\) would run:$")
_HOST_NONE = re.compile(r"^  (?P<host>\S+): none would run$")
_HOST_MAYBE = re.compile(r"^  (?P<host>\S+): (?P<n>\d+) more only if an earlier step changes")


def parse_planned_operations(output: str) -> dict[str, tuple[list[set[str]], int]]:
    """From `sparkfleet plan`'s output: host -> (the operations it would run, each the set of names
    it may carry, and how many more run only if an earlier step changes)."""
    out: dict[str, tuple[list[set[str]], int]] = {}
    current = None
    for line in output.splitlines():
        if m := _HOST_RUNS.match(line) or _HOST_NONE.match(line):
            current = m["host"]
            out.setdefault(current, ([], 0))
        elif m := _HOST_MAYBE.match(line):
            ops, _ = out.get(m["host"], ([], 0))
            out[m["host"]] = (ops, int(m["n"]))
            current = None
        elif current and line.startswith("    "):
            label = line.strip().split(" | ", 1)[-1]
            out[current][0].append(set(label.split(" / ")))
        else:
            current = None
    return out


_NAME_START = re.compile(r", (?=(?:\S+\.py \| )+)")  # where the next of an operation's names begins


def printed_names(op: str) -> set[str]:
    """The names of an operation as a deploy printed it (tests/e2e/lab.py Run keeps the first's include
    prefixes off): pyinfra prints one with a name per host as all of them, each with its include
    prefixes, joined by ", ". The plan names each host's operation by the names known when that host
    was planned, one or all (sparkfleet/plan_command.py operation_label)."""
    return {part.rsplit(" | ", 1)[-1] for part in _NAME_START.split(op)}


def operations_mismatches(plan_output: str, changed: list[tuple[str, str]]) -> list[str]:
    """A deploy's changed operations against the plan made before it: every operation the plan said
    would run changed, on its host; any other that changed is one of those the plan said run only if
    an earlier step changes (no more of them than it counted)."""
    planned = parse_planned_operations(plan_output)
    out = []
    for host, (ops, maybe) in sorted(planned.items()):
        done = [op for op, h in changed if h == host]
        left = list(done)
        for names in ops:
            hit = next((op for op in left if names & printed_names(op)), None)
            if hit is None:
                out.append(f"{host}: planned to run {' / '.join(sorted(names))}, did not change")
            else:
                left.remove(hit)
        if len(left) > maybe:
            out.append(f"{host}: {len(left)} operation(s) changed outside the plan's list, which counted {maybe} "
                       f"that run only if an earlier step changes: {left}")
    unplanned = sorted({h for _, h in changed} - set(planned))
    if unplanned:
        out.append(f"operations changed on hosts the plan did not name: {unplanned}")
    return out
