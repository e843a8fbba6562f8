"""The doctor: every guard and the fabric, docker, image and serving checks on live machines,
read-only, as one table. For after a reboot or a firmware update: `make doctor`.

Health is the watchdog's probe (`sfl_watch.py probe`, as root on the head: a 1-token completion
through the API with the key, every rank's container running and no engine process stopped), never
/health alone; each worker's own probe too (its container and processes, seen on the worker). With
the watchdog on, each node's watchdog must run, be enabled as data says, and its own verdict
(`sfl_watch.py status`) must pass: a watchdog that gave up fails the doctor with its reason. With a
router, a row per serving group: routed, or drained, draining, unhealthy (each a failure), and the router's
gate's: it runs and holds the router's port alone, smg on loopback only. With TLS, a row per head and one
for the router's gate: each answers /health through TLS verified with the node's trust bundle, and its
certificate is not within tls_renew_before_days of its end.

It defines no operation and changes nothing; it exits non-zero when any check fails.
"""
from pyinfra import logger
from pyinfra.api.exceptions import DeployError

from roles.api_proxy.checks import UNIT_PATH as PROXY_UNIT_PATH
from roles.api_proxy.checks import ApiProxyHost, Listeners, listener_problems
from roles.docker.checks import DockerInfo, docker_info_problems
from roles.fabric.checks import node_status, ping_failures
from sparkfleet.fabric_others import fabric_others, netconfig_problems, renderer_in_effect
from roles.fingerprint.checks import doctor_rows as fingerprint_rows
from roles.firewall import checks as firewall_checks
from roles.guards.run import guard_problems
from roles.image.checks import ids_differ_message
from roles.monitoring.checks import listener_problems as monitoring_listeners
from roles.preflight.checks import cabled_port_failures, port_note, preflight_rows
from roles.router.control import doctor_rows
from roles.router.facts import RouterRouting
from roles.router.gate import GATE_UNIT, gate_listener_problems
from roles.router.node_config import router_node
from roles.serving.facts import HeadHealth, UnitState, is_serving
from sparkfleet.model.tls import api_base, ca_bundle_path, curl_tls
from roles.tls.checks import ServedTls
from roles.tls.checks import doctor_problems as tls_doctor_problems
from roles.watchdog.facts import WatchdogUnit, WatchProbe, WatchStatus
from sparkfleet.inventory import cluster_from_state, fleet_from_state
from sparkfleet.model.engine import unit_name
from sparkfleet.model.fabric import NETPLAN_FILE
from sparkfleet.model.known_bad import known_bad_findings
from sparkfleet.model.monitoring import monitoring_node_name
from sparkfleet.model.serving import node_profile
from sparkfleet.model.watchdog import SFL_WATCH, WATCH_UNIT
from sparkfleet.once import active_hosts, fleet_hosts, once_per_fleet, per_group
from tools.plan import fleet_key_decision, group_decisions, group_facts


def _checks(state, group) -> list[tuple[str, str, list[str]]]:
    """(check, host, problems) rows of one serving group; an empty problem list is a pass."""
    cluster = cluster_from_state(state)
    profile = node_profile(cluster.head)
    hosts = {h.name: h for h in active_hosts(state)}
    rows = []
    for node, facts, failures in preflight_rows(state):
        rows += preflight_doctor_rows(node, facts, failures)
    # The deploy's plan for this group (tools/plan.py: the same facts and verdicts a deploy takes,
    # and `sparkfleet plan` prints); a plan that cannot be taken fails the rows that read it.
    try:
        planned, no_plan = group_decisions(state, group, fleet_key_decision(state)), None
    except DeployError as err:
        planned, no_plan = None, str(err)
    try:
        rows.append(("guards", "all", [no_plan] if planned is None else guard_problems(state, planned.serving.files, planned.memory)))
    except DeployError as err:
        rows.append(("guards", "all", [str(err)]))
    firewall = firewall_rows(state, group)
    links, problems_of = {}, {}
    for name, h in hosts.items():
        links[name], drift, file_current = node_status(h, cluster.node(name))
        problems_of[name] = [f"{name}: {d}" for d in drift]
        if not file_current:
            problems_of[name].append(f"{name}: {NETPLAN_FILE} missing or not as the data renders it")
    for name, h in hosts.items():
        node = cluster.node(name)
        problems = problems_of[name]
        problems += ping_failures(h, node, cluster, links)  # each peer, over each half of the port
        rows.append(("fabric", name, problems))
        rows.append(("netconfig", name, *netconfig_row(node, *fabric_others(state)[name])))
        rows.append(("firewall", name, firewall[name]))
        rows.append(("docker", name, docker_info_problems(node, cluster, h.get_fact(DockerInfo))))
        unit = h.get_fact(UnitState, unit=unit_name(node))
        rows.append(("serving", name, [] if is_serving(unit) else [
            f"{name}: {unit_name(node)} {unit.get('active')}, container {unit.get('container')}"]))
        listening = []
        if node.is_head:
            proxy = h.get_fact(ApiProxyHost, unit_path=PROXY_UNIT_PATH)
            listening += listener_problems(node, h.get_fact(Listeners), proxy["active"])
        listening += monitoring_listeners(node, monitoring_node_name(list(fleet_from_state(state).nodes)),
                                          h.get_fact(Listeners))
        if node.is_head or node.monitoring_enabled:
            rows.append(("listeners", name, listening))
        if node.is_head and node.tls_enabled:  # the API over TLS, as a client verifies it (roles/tls)
            served = h.get_fact(ServedTls, api=api_base(node, node_profile(node).port), bundle=ca_bundle_path(node),
                                port=node_profile(node).port)
            rows.append(("tls", name, tls_doctor_problems(node, served)))
    rows += fingerprint_rows(state)  # each node's values; a must-match field that differs fails
    # The deploy's own prepare-time verdicts (facts only): what a deploy would move is a failure here.
    if planned is not None:
        image, weights, caches = planned.image, planned.weights, planned.caches
        rows.append(("image", "all", [] if image.same_everywhere else [ids_differ_message(image.ids, profile.image_ref)]))
        rows.append(("weights", "all", [f"{cluster.head.name}: {m}: {why}" for m, why in weights.fetch.items()]
                     + [f"{n}: {m}: {why}" for (m, n), why in weights.pull.items()]))
        rows.append(("caches", "all", (["generation never warmed (or image missing on the head)"] if caches.prewarm or caches.after_build else [])
                     + [f"{n}: {why}" for n, why in caches.sync.items()]
                     + [f"{n}: 'current' does not link to {caches.generation}" for n in caches.link]))
    else:  # the rows are kept, failing: a check that could not run is not a check that passed
        rows += [(row, "all", [f"not checked: no plan: {no_plan}"]) for row in ("image", "weights", "caches")]
    # Anything a deploy would do here is a failure, saying what and why.
    actions = planned.summary.actions() if planned is not None else [f"no plan: {no_plan}"]
    rows.append(("plan", group.group or "pair", [f"a deploy would {a}" for a in actions]))
    head = hosts.get(cluster.head.name)
    if head is not None:
        rows.append(("health", cluster.head.name, health_problems(cluster, hosts, profile.port)))
    for name, h in hosts.items():
        node = cluster.node(name)
        if node.watchdog_enabled:
            rows.append(("watchdog", name, watchdog_problems(node, h.get_fact(WatchdogUnit), h.get_fact(WatchStatus))))
    return rows


def preflight_doctor_rows(node, facts: dict, failures: list[str]) -> list[tuple]:
    """The node's preflight row (an acknowledged known-bad entry noted) and its CX7 ports' row: which
    port shows a live cable, and the refusal when data names the other one (not counted twice)."""
    cabled = cabled_port_failures(node, facts)
    acknowledged = [f"{f.entry.id} ({f.acknowledged})" for f in known_bad_findings(facts, node.preflight_known_bad_acknowledged)
                    if f.acknowledged is not None]
    note = [f"known bad, acknowledged: {'; '.join(acknowledged)}"] if acknowledged else []
    return [("preflight", node.name, [f for f in failures if f not in cabled], *note),
            ("port", node.name, cabled, port_note(facts))]


def firewall_rows(state, group) -> dict[str, list[str]]:
    """Each node's live table inet sparkfleet against the one data renders: the firewall's own verdict
    (roles/firewall decide, as step 1b takes it) on the plan's facts pass, taken apart from the rest
    of the plan, so a plan another role cannot take still shows the firewall."""
    try:
        plans = firewall_checks.decide(group_facts(state, group)["firewall"], group, fleet_from_state(state))
    except DeployError as err:
        return {n.name: [f"not checked: {err}"] for n in group.nodes}
    return {name: [p.problem] if p.problem else firewall_checks.table_problems(group.node(name), p.live, p.want)
            for name, p in plans.items()}


def netconfig_row(node, facts: dict, others) -> tuple[list[str], str]:
    """(problems, note): the renderer in effect, and every other configuration of the fabric netdev."""
    note = f"renderer {node.netplan_renderer} ({renderer_in_effect(facts)}); no other configuration"
    return netconfig_problems(node, facts, others), note


def probe_problem(name: str, probe: dict) -> str | None:
    """The problem a node's `sfl_watch.py probe` reports, or None when it passed."""
    if probe.get("rc") == "0":
        return None
    if probe.get("rc") == "absent":
        return f"{name}: the probe is not installed ({SFL_WATCH} or its config missing): deploy"
    return f"{name}: {probe.get('line') or 'the probe said nothing'} (probe exit {probe.get('rc')})"


def health_problems(cluster, hosts, port: int) -> list[str]:
    """The head's probe (the pair serves a completion), then each worker's own (its rank runs, no
    process stopped). /health is shown beside a failure, never counted: it stays 200 through hangs."""
    head = hosts[cluster.head.name]
    problems = []
    problem = probe_problem(cluster.head.name, head.get_fact(WatchProbe))
    if problem:
        code = "200" if head.get_fact(HeadHealth, api=api_base(cluster.head, port), tls=curl_tls(cluster.head)) \
            else "not 200 (through the proxy, its certificate verified)"
        problems.append(f"{problem}; /health {code}")
    for worker in cluster.workers:
        h = hosts.get(worker.name)
        problem = h is not None and probe_problem(worker.name, h.get_fact(WatchProbe))
        if problem:
            problems.append(problem)
    return problems


def watchdog_problems(node, unit: dict, status: dict) -> list[str]:
    """The node's sparkfleet-watchdog: running, enabled as data says, and its own verdict ok."""
    name, problems = node.name, []
    if unit.get("active") != "active":
        problems.append(f"{name}: {WATCH_UNIT} is {unit.get('active') or 'unknown'} (a deploy that paused it did not "
                        f"finish? the next deploy starts it; or systemctl start {WATCH_UNIT})")
    want = "enabled" if node.serving_start_at_boot else "disabled"
    if (unit.get("enabled") == "enabled") != node.serving_start_at_boot:
        problems.append(f"{name}: {WATCH_UNIT} is {unit.get('enabled') or 'not installed'} at boot, data says {want} "
                        f"(serving_start_at_boot): deploy")
    if status.get("rc") == "absent":
        problems.append(f"{name}: {SFL_WATCH} or its config is missing: deploy")
    elif status.get("rc") != "0":
        verdict = status.get("verdict") or (status.get("text") or "").strip() or f"status exit {status.get('rc')}"
        problems.append(f"{name}: watchdog: {verdict}")
    return problems


def _table(rows) -> list[str]:
    lines = [f"{'check':<11} {'host':<10} result"]  # 11: "fingerprint"
    for check, host_name, problems, *note in rows:
        ok = "ok" + (f" ({note[0]})" if note else "")
        lines.append(f"{check:<11} {host_name:<10} " + (ok if not problems else "FAIL " + problems[0]))
        lines += [f"{'':<22}     {p}" for p in problems[1:]]
    return lines


def _doctor(state) -> None:
    """Every serving group's checks (at once, each in its own group: sparkfleet.once.per_group), a
    table per group, then one verdict for the fleet."""
    tables = per_group(state, lambda group: _checks(state, group))
    several = len(tables) > 1
    for name, rows in sorted(tables.items()):
        title = f" serving group {name}" if several else ""
        logger.info(f"--> sparkfleet doctor{title} (read-only):\n" + "\n".join(_table(rows)) + "\n")
    rows = [r for group_rows in tables.values() for r in group_rows]
    routing = _router_rows(state)
    if routing:
        logger.info(f"--> sparkfleet doctor router on {routing[0]} (read-only):\n" + "\n".join(_table(routing[1])) + "\n")
        rows += routing[1]
    failed = [r for r in rows if r[2]]
    if failed:
        raise DeployError(f"doctor: {len(failed)} of {len(rows)} checks failed (nothing was changed)")
    logger.info(f"--> sparkfleet doctor: all {len(rows)} checks passed")


def _router_rows(state):
    """(router node, its rows): a row per group the router routes to (routed, or what it is instead);
    None when the fleet has no router or the router node is not in this run."""

    fleet = fleet_from_state(state)
    router = router_node(fleet)
    if router is None or router.name not in {h.name for h in fleet_hosts(state)}:
        return None
    h = state.inventory.get_host(router.name)
    rows = doctor_rows(fleet, router, h.get_fact(RouterRouting))
    # The router's gate (roles/router/gate.py): it runs, holds router_port alone, smg stays on loopback; and
    # with TLS its certificate verifies with the node's bundle, as a client's would, and is not due.
    gate = h.get_fact(UnitState, unit=GATE_UNIT)
    rows.append(("listeners", "gate", gate_listener_problems(router, h.get_fact(Listeners),
                                                                            gate.get("active") == "active")))
    if router.tls_enabled:
        served = h.get_fact(ServedTls, api=api_base(router, router.router_port), bundle=ca_bundle_path(router),
                            port=router.router_port)
        rows.append(("tls", "gate", tls_doctor_problems(router, served)))
    return router.name, rows


def run_doctor(state) -> None:
    """Every host loads doctor.py; the checks run, and the tables print, once per run."""
    once_per_fleet(state, "doctor", lambda: _doctor(state))
