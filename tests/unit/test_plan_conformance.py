"""tests/e2e/plan_conformance.py: the printed plan read back, and a run held to it (the lab's deploy()
applies it to every deploy; here, on output in pyinfra's and the plan's own format)."""
from pathlib import Path

from sparkfleet.plan_types import AFTER_BUILD_STEP, WARM_AFTER_BUILD
from tests.e2e.lab import Run
from tests.e2e.plan_conformance import APPLY, IMAGE_BUILD_START, IMAGE_PULL_START, PlannedFleet, mismatches, parse_plan
from tests.e2e.plan_conformance import parse_fleet as parse_plan_fleet

PLAN = """\
--> sparkfleet plan: 2 serving group(s), 2 with changes (decided before any change; the roles execute this plan)
    group  profile             nodes (head first)  fetch     build  ship over the fabric      warm     restart
    g1     glm-5.3-flash-exl3  spark-a, spark-b    2 models  yes    spark-b: image, 2 models  prewarm  yes
    g2     glm-5.3-flash-exl3  spark-c, spark-d    -         -      -                         -        no, serving
      g1 fetches: brandonmusic/GLM-5.3-Flash-tr3-4bpw, incoai/GLM-5.3-Flash-DFlash2
      g1 restarts: image sparkfleet/glm-5.3-flash-exl3:fd5f is new or differs between nodes
    rolling: g1 (one group at a time)
"""


def ran(*ops):
    """pyinfra's output for operations (name, {host: result})."""
    lines = [PLAN]
    for name, results in ops:
        lines.append(f"--> Starting operation: roles/serving/tasks.py | {name}")
        lines += [f"    [{h}] {r}" for h, r in results.items()]
    return Run(0, "\n".join(lines))


G1_AS_PLANNED = [
    ("Start building sparkfleet/glm:fd5f on the head, in the background", {"spark-a": "Success"}),
    ("Start the head's weights fetch in the background (the hub's client, in the image just built)",
     {"spark-a": "Success", "spark-c": "No changes"}),
    ("Start the workers' pulls of the weights the head fetches, in the background (after the build)",
     {"spark-b": "Success", "spark-d": "No changes"}),
    ("Fetch m1 at abc on the head (hub)", {"spark-a": "Success", "spark-c": "No changes"}),
    ("Fetch m2 at def on the head (hub)", {"spark-a": "Success"}),
    ("Build sparkfleet/glm:fd5f on the head", {"spark-a": "Success"}),
    ("Start pulling sparkfleet/glm:fd5f from the head, in the background", {"spark-b": "Success"}),
    ("Send m1 to the workers over the fabric", {"spark-b": "Success"}),
    ("Send m2 to the workers over the fabric", {"spark-b": "Success"}),
    ("Pull sparkfleet/glm:fd5f from the head", {"spark-b": "Success"}),
    ("Prewarm and merge the kernel caches", {"spark-a": "Success"}),
    ("Restart the workers (workers first)", {"spark-b": "Success"}),
    ("Start the head (every worker is up)", {"spark-a": "Success"}),
    ("Write /etc/sparkfleet/sparkfleet-head.env", {"spark-a": "Success", "spark-c": "No changes"}),
]


def test_the_table_is_read_back():
    changes, plans = parse_plan(PLAN)
    assert changes == 2 and sorted(plans) == ["g1", "g2"]
    g1, g2 = plans["g1"], plans["g2"]
    assert g1.nodes == ["spark-a", "spark-b"] and g1.fetch == 2 and g1.build and g1.restart
    assert g1.ship_image == {"spark-b"} and g1.ship_models == {"spark-b": 2} and g1.warm == "prewarm"
    assert g2.head == "spark-c" and not (g2.fetch or g2.build or g2.ship_image or g2.restart) and g2.warm == "-"


def test_a_run_that_did_what_its_plan_printed_passes():
    run = ran(*G1_AS_PLANNED)
    assert mismatches(run.output, run.changed()) == []


def test_a_worker_that_did_not_follow_the_heads_fetch_is_named():
    run = ran(*[(op, r) for op, r in G1_AS_PLANNED if not op.startswith("Start the workers' pulls")])
    assert mismatches(run.output, run.changed()) == [
        "g1: the pull following the fetch started in the background on spark-b: the plan said True, the run did False"]


def test_no_plan_printed_is_nothing_to_hold_a_run_to():
    assert mismatches("--> Loading inventory...\nrefused", []) == []


def test_a_restart_outside_the_plan_and_a_planned_step_that_did_not_run_are_named():
    run = ran(*[op for op in G1_AS_PLANNED if not op[0].startswith("Send m2")],
              ("Start the head (every worker is up)", {"spark-c": "Success"}),
              ("Bring the kernel caches in line with the head's", {"spark-c": "Success"}))
    assert mismatches(run.output, run.changed()) == [
        "g1: models sent to spark-b: the plan said 2, the run did 1",
        "g2: kernel caches brought in line (sync, link, expire): the plan said False, the run did True",
        "g2: pair restart (nodes restarted): the plan said [], the run did ['spark-c']",
    ]


def test_a_planned_restart_that_skipped_a_worker_is_named():
    run = ran(*[op for op in G1_AS_PLANNED if op[0] != "Restart the workers (workers first)"])
    assert mismatches(run.output, run.changed()) == [
        "g1: pair restart (nodes restarted): the plan said ['spark-a', 'spark-b'], the run did ['spark-a']"]


def test_a_prewarm_left_until_after_the_build_is_held_to_its_own_step():
    """A recipe bump on a pair an engine warmed (issue 44): the warm cell says the step decides after
    the build; its one operation must run, and neither a planned prewarm nor a repair is expected."""
    plan = PLAN.replace("prewarm  yes", "after the build: reuse or prewarm  yes")
    after = [op if op[0] != "Prewarm and merge the kernel caches" else (AFTER_BUILD_STEP, {"spark-a": "Success"})
             for op in G1_AS_PLANNED]
    lines = [plan] + [f"--> Starting operation: roles/kernel_cache/tasks.py | {name}\n"
                      + "\n".join(f"    [{h}] {r}" for h, r in results.items()) for name, results in after]
    run = Run(0, "\n".join(lines))
    assert parse_plan(plan)[1]["g1"].warm == WARM_AFTER_BUILD
    assert mismatches(run.output, run.changed()) == []
    skipped = Run(0, "\n".join(line for line in lines if AFTER_BUILD_STEP not in line))
    assert mismatches(skipped.output, skipped.changed()) == [
        "g1: kernel caches reused or prewarmed as decided after the build: the plan said True, the run did False"]


FIXTURES = Path(__file__).parent / "fixtures"


def test_a_recorded_first_lab_deploy_did_what_its_plan_printed():
    run = Run(0, (FIXTURES / "lab-first-deploy-output.txt").read_text())
    changes, plans = parse_plan(run.output)
    pair = plans["pair"]
    assert changes == 1 and pair.nodes == ["spark-a", "spark-b"] and pair.build and pair.fetch == 2
    assert pair.ship_image == {"spark-b"} and pair.ship_models == {"spark-b": 2} and pair.warm == "prewarm"
    assert pair.restart and len(run.changed()) > 20
    assert mismatches(run.output, run.changed()) == []
    # Fresh hosts, no table live: the plan printed the firewall's line and the run applied both tables;
    # the same run with the tables' applies lost names them.
    assert pair.firewall_applied == ["spark-a", "spark-b"]
    assert mismatches(run.output, [(op, h) for op, h in run.changed() if APPLY not in op]) == [
        "pair: firewall table applied on: the plan said ['spark-a', 'spark-b'], the run did []"]
    # The fetch was started in the background before it was waited for; without its start, named.
    assert mismatches(run.output, [(op, h) for op, h in run.changed() if not op.startswith("Start the head's weights")]) \
        == ["pair: the fetch started in the background on spark-a: the plan said True, the run did False"]
    # And the worker's pull, following that fetch: without its start, named too.
    assert mismatches(run.output, [(op, h) for op, h in run.changed() if not op.startswith("Start the workers' pulls")]) \
        == ["pair: the pull following the fetch started in the background on spark-b: the plan said True, the run did False"]
    # So was the worker's pull of the image: started once the head pushed, it ran while the weights were
    # sent and the head's engine proof and proxy ran, and was waited for before the collective ran in it.
    order = [line.split(" | ", 1)[1].strip() for line in run.output.splitlines() if line.startswith("--> Starting operation: ")]
    first = lambda prefix: next(i for i, op in enumerate(order) if op.startswith(prefix))  # noqa: E731
    assert (first("Push ") < first(IMAGE_PULL_START) < first("Send ") < first("Prove the command lines ")
            < first("Run sparkfleet-api-proxy") < first("Pull ") < first("Record the passed fabric speed proof")), order
    # Without its start, named.
    assert mismatches(run.output, [(op, h) for op, h in run.changed() if not op.startswith(IMAGE_PULL_START)]) \
        == ["pair: image pull started in the background on spark-b: the plan said True, the run did False"]
    # The head's build started in the background right after Docker, before the fabric, its proofs and
    # the file path, and was waited for before anything ran the image; without its start, named.
    assert (first("Restart Docker ") < first(IMAGE_BUILD_START) < first("Apply netplan ") < first("Prove jumbo frames ")
            < first("Prove the fabric's speed") < first("Start the head's weights fetch") < first("Build ")
            < first("Push ")), order
    assert mismatches(run.output, [(op, h) for op, h in run.changed() if not op.startswith(IMAGE_BUILD_START)]) \
        == ["pair: the build started in the background on spark-a: the plan said True, the run did False"]
    # The same run with the worker's restart lost: named.
    without = [(op, h) for op, h in run.changed() if op != "Restart the workers (workers first)"]
    assert mismatches(run.output, without) == [
        "pair: pair restart (nodes restarted): the plan said ['spark-a', 'spark-b'], the run did ['spark-a']"]


def test_the_firewall_is_applied_and_removed_where_the_plan_printed_and_nowhere_else():
    """The firewall's line under the table (tools/plan.py plan_table, its own printer) against the
    'Apply the nftables table ...' and 'Remove the nftables table ...' operations the run changed."""
    from sparkfleet.plan_types import GroupPlan
    from tools.plan import plan_table

    plans = {"g1": GroupPlan(group="g1", profile="p", image="i", nodes=["spark-a", "spark-b"],
                             firewall="applied on spark-a (no table live); applied on spark-b (the live table is not "
                                      "the rendered one)"),
             "g2": GroupPlan(group="g2", profile="p", image="i", nodes=["spark-c", "spark-d"],
                             firewall="removed on spark-d (firewall_enabled is false)")}
    head = "--> sparkfleet plan: 2 serving group(s), 2 with changes (decided before any change; the roles execute this plan)"
    printed = "\n".join([head, *("    " + line for line in plan_table(plans)), ""])
    assert "      g1 firewall: applied on spark-a (no table live); applied on spark-b" in printed
    _, parsed = parse_plan(printed)
    assert parsed["g1"].firewall_applied == ["spark-a", "spark-b"] and parsed["g2"].firewall_removed == ["spark-d"]

    def run(*ops):
        lines = [printed] + [f"--> Starting operation: roles/firewall/tasks.py | {name}\n    [{h}] Success"
                             for name, h in ops]
        return Run(0, "\n".join(lines))

    apply = "Apply the nftables table inet sparkfleet (one transaction)"
    remove = "Remove the nftables table inet sparkfleet (firewall_enabled is false)"
    good = run((apply, "spark-a"), (apply, "spark-b"), (remove, "spark-d"))
    assert mismatches(good.output, good.changed()) == []
    bad = run((apply, "spark-a"), (apply, "spark-c"), (remove, "spark-c"))
    assert mismatches(bad.output, bad.changed()) == [
        "g1: firewall table applied on: the plan said ['spark-a', 'spark-b'], the run did ['spark-a']",
        "g2: firewall table applied on: the plan said [], the run did ['spark-c']",
        "g2: firewall table removed on: the plan said ['spark-d'], the run did ['spark-c']",
    ]


def test_a_recorded_unchanged_lab_deploy_planned_nothing_and_changed_nothing():
    run = Run(0, (FIXTURES / "lab-unchanged-deploy-output.txt").read_text())
    changes, plans = parse_plan(run.output)
    assert changes == 0 and not plans["pair"].restart and run.changed() == []
    assert mismatches(run.output, run.changed()) == []
    # A restart the empty plan did not announce: named.
    assert mismatches(run.output, [("Start the head (every worker is up)", "spark-a")]) == [
        "pair: pair restart (nodes restarted): the plan said [], the run did ['spark-a']"]


PLAN_OUTPUT = """--> sparkfleet plan, per serving group:
  pair: build sparkfleet/x:v2; restart the group (image sparkfleet/x:v2 is new or differs between nodes)
--> operations a deploy would run:
  spark-a: 2 operation(s) would run:
    roles/image/tasks.py | Build sparkfleet/x:v2 on the head
    roles/serving/tasks.py | Write /etc/sparkfleet/sparkfleet-head.env / Write /etc/sparkfleet/sparkfleet-worker.env
  spark-a: 1 more only if an earlier step changes (their _if=)
  spark-b: none would run
--> a deploy would change something: 1 serving group(s) by the plan, 2 operation(s) would run: exit 2
"""


def test_a_deploy_that_ran_the_planned_operations_matches_its_plan():
    from tests.e2e.plan_conformance import operations_mismatches

    # pyinfra prints an operation with a name per host as all its names (tests/e2e/lab.py Run keeps the first's
    # include prefixes off): lab-first-deploy-output.txt
    both = ("Write /etc/sparkfleet/sparkfleet-head.env, roles/rolling/turn.py | roles/serving/tasks.py | "
            "Write /etc/sparkfleet/sparkfleet-worker.env")
    changed = [("Build sparkfleet/x:v2 on the head", "spark-a"), (both, "spark-a"),
               ("Reload systemd (unit changed)", "spark-a")]  # the one that runs only if the unit file changed
    assert operations_mismatches(PLAN_OUTPUT, changed) == []


def test_a_planned_operation_that_did_not_run_or_one_too_many_is_named():
    from tests.e2e.plan_conformance import operations_mismatches

    assert operations_mismatches(PLAN_OUTPUT, [("Write /etc/sparkfleet/sparkfleet-head.env", "spark-a")]) == [
        "spark-a: planned to run Build sparkfleet/x:v2 on the head, did not change"]
    too_many = [("Build sparkfleet/x:v2 on the head", "spark-a"), ("Write /etc/sparkfleet/sparkfleet-head.env", "spark-a"),
                ("Reload systemd (unit changed)", "spark-a"), ("Restart Docker (daemon.json changed)", "spark-a"),
                ("Restart the workers (workers first)", "spark-b")]
    problems = operations_mismatches(PLAN_OUTPUT, too_many)
    assert problems[0].startswith("spark-a: 2 operation(s) changed outside the plan's list, which counted 1")
    assert problems[1].startswith("spark-b: 1 operation(s) changed outside the plan's list, which counted 0")


def test_a_host_planned_under_one_of_an_operations_names_matches_the_operation_printed_with_all():
    """Hosts are prepared one after the other: the first host planned knows only its own name of a
    shared operation (`Write .../sparkfleet-worker.env` on the worker), the deploy prints all."""
    from tests.e2e.plan_conformance import operations_mismatches, printed_names

    both = ("Write /etc/sparkfleet/sparkfleet-head.env, roles/rolling/turn.py | roles/serving/tasks.py | "
            "Write /etc/sparkfleet/sparkfleet-worker.env")
    assert printed_names(both) == {"Write /etc/sparkfleet/sparkfleet-head.env", "Write /etc/sparkfleet/sparkfleet-worker.env"}
    assert printed_names("Check docker info") == {"Check docker info"}
    worker_first = PLAN_OUTPUT.replace("  spark-b: none would run\n", "  spark-b: 1 operation(s) would run:\n"
                                       "    roles/serving/tasks.py | Write /etc/sparkfleet/sparkfleet-worker.env\n")
    changed = [("Build sparkfleet/x:v2 on the head", "spark-a"), (both, "spark-a"), (both, "spark-b")]
    assert operations_mismatches(worker_first, changed) == []
    assert operations_mismatches(worker_first, changed[:2]) == [
        "spark-b: planned to run Write /etc/sparkfleet/sparkfleet-worker.env, did not change"]


# ------------------------------------------------------------------ the fleet's lines (issue 42 item 1)

def fleet_run(fleet_plan, *ops, restart=("g1", "g2")):
    """A fleet deploy's output: the table and the fleet's lines as tools/plan.py prints them (its own
    functions, so the parser is held to the printer), then pyinfra's operation results."""
    from sparkfleet.plan_types import GroupPlan
    from tools.plan import fleet_lines, plan_table

    plans = {"g1": GroupPlan(group="g1", profile="glm-5.3-flash-exl3", image="i", nodes=["spark-a", "spark-b"],
                             restart="g1" in restart, reasons=["x"], healthy=True),
             "g2": GroupPlan(group="g2", profile="glm-5.3-flash-exl3", image="i", nodes=["spark-c", "spark-d"],
                             restart="g2" in restart, reasons=["y"], healthy=True)}
    lines = ["--> sparkfleet plan: 2 serving group(s), 2 with changes (decided before any change; the roles execute "
             "this plan)", *("    " + line for line in plan_table(plans)), *fleet_lines(plans, fleet_plan)]
    for name, results in ops:
        lines.append(f"--> Starting operation: roles/rolling/turn_start.py | {name}")
        lines += [f"    [{h}] {r}" for h, r in results.items()]
    return Run(0, "\n".join(lines))


def restarted(group, head, worker):
    return [("Restart the workers (workers first)", {worker: "Success"}),
            ("Start the head (every worker is up)", {head: "Success"})]


def rolled(*groups, drained=(), again=(), keys=()):
    """The operations of a rolling run: the route-again, then each group's turn in order."""
    ops = []
    if again:
        ops.append((f"Route again the serving groups an earlier run left drained ({', '.join(again)})",
                    {"spark-b": "Success"}))
    ops += [("Write the fleet's API key into /etc/sparkfleet/api-key (the router presents one key to every group)",
             {n: "Success"}) for n in keys]
    for g in groups:
        head, worker = {"g1": ("spark-a", "spark-b"), "g2": ("spark-c", "spark-d")}[g]
        if g in drained:
            ops.append((f"Take serving group {g} out of the router (it restarts)", {head: "Success"}))
        ops += restarted(g, head, worker)
        ops.append((f"Prove serving group {g} serves, and put it back in the router", {head: "Success"}))
    return ops


FLEET = dict(turns=["g2", "g1"], router="spark-b", routing={"g1": "routed", "g2": "drained"}, drain=["g2", "g1"],
             key_source="spark-a", key_writes=["spark-c"])


def test_a_fleet_run_that_took_the_printed_turns_drains_and_key_writes_passes():
    from sparkfleet.plan_types import FleetPlan

    run = fleet_run(FleetPlan(**FLEET), *rolled("g2", "g1", drained=("g2", "g1"), keys=("spark-c",)))
    assert "    turn order: g2, then g1" in run.output
    assert "--> sparkfleet router on spark-b: g1 routed, g2 drained" in run.output
    fleet = parse_plan_fleet(run.output)
    assert (fleet.router, fleet.drain, fleet.key_writes, fleet.turns) == ("spark-b", ["g2", "g1"], ["spark-c"],
                                                                           ["g2", "g1"])
    assert mismatches(run.output, run.changed()) == []


def test_fleet_actions_the_plan_did_not_print_or_printed_and_did_not_take_are_named():
    from sparkfleet.plan_types import FleetPlan

    # g1 not drained, the key written to spark-d instead of spark-c, g1 routed again unannounced, turns swapped.
    run = fleet_run(FleetPlan(**FLEET), *rolled("g1", "g2", drained=("g2",), again=("g1",), keys=("spark-d",)))
    assert mismatches(run.output, run.changed()) == [
        "fleet: groups routed again before any turn: the plan said [], the run did ['g1']",
        "fleet: groups taken out of routing for their restart: the plan said ['g1', 'g2'], the run did ['g2']",
        "fleet: nodes the fleet's API key was written to: the plan said ['spark-c'], the run did ['spark-d']",
        "fleet: the groups' turns, in order: the plan said g2, then g1, the run proved g1, g2",
    ]


def test_groups_restarted_together_are_proven_in_any_order_but_never_before_an_earlier_turn():
    """A first deploy restarts every group in one turn ('turn order: g1+g2'): pyinfra proves them in
    whichever order its operations run (the four-host lab's first run proved g2 first)."""
    from sparkfleet.plan_types import FleetPlan

    together = FleetPlan(**{**FLEET, "turns": ["g1+g2"], "drain": [], "routing": {}})
    for order in (("g1", "g2"), ("g2", "g1")):
        run = fleet_run(together, *rolled(*order, keys=("spark-c",)))
        assert "    turn order: g1+g2" in run.output
        assert mismatches(run.output, run.changed()) == [], order
    apart = FleetPlan(**{**FLEET, "turns": ["g1", "g2"], "drain": []})
    run = fleet_run(apart, *rolled("g2", "g1", keys=("spark-c",)))
    assert mismatches(run.output, run.changed()) == [
        "fleet: the groups' turns, in order: the plan said g1, then g2, the run proved g2, g1"]


def test_a_printed_route_again_must_run_on_the_router():
    from sparkfleet.plan_types import FleetPlan

    plan = FleetPlan(**{**FLEET, "route_again": ["g1"], "drain": ["g2"]})
    ops = rolled("g2", drained=("g2",), keys=("spark-c",))
    good = fleet_run(plan, ("Route again the serving groups an earlier run left drained (g1)", {"spark-b": "Success"}),
                     *ops, restart=("g2",))
    assert "routed again before any turn (an earlier run left them drained; they serve): g1" in good.output
    assert mismatches(good.output, good.changed()) == []
    elsewhere = fleet_run(plan, ("Route again the serving groups an earlier run left drained (g1)",
                                 {"spark-a": "Success"}), *ops, restart=("g2",))
    assert mismatches(elsewhere.output, elsewhere.changed()) == [
        "fleet: groups routed again on ['spark-a'], the router is spark-b"]


def test_a_pair_prints_no_fleet_line_and_is_held_to_none():
    from sparkfleet.plan_types import FleetPlan, GroupPlan
    from tools.plan import fleet_lines

    pair = {"pair": GroupPlan(group="pair", profile="p", image="i", nodes=["spark-a", "spark-b"], restart=True)}
    assert fleet_lines(pair, FleetPlan(turns=["pair"])) == []
    run = Run(0, (FIXTURES / "lab-first-deploy-output.txt").read_text())
    assert parse_plan_fleet(run.output) == PlannedFleet()


TLS_PLAN = """\
--> sparkfleet TLS: the fleet CA is created on spark-a in this run (its SHA-256 fingerprint is printed then); clients verify with it: ssh root@198.18.0.11 cat /etc/sparkfleet/tls/ca.crt > sparkfleet-ca.crt
    fleet CA created on: spark-a
    certificate issued for spark-a: no certificate yet
    trust bundle written on: spark-a
"""


def tls_run(*ops, plan=TLS_PLAN):
    lines = [PLAN, plan]
    for name, results in ops:
        lines.append(f"--> Starting operation: roles/tls/tasks.py | {name}")
        lines += [f"    [{h}] {r}" for h, r in results.items()]
    return Run(0, "\n".join(lines))


TLS_AS_PLANNED = [
    ("Create the fleet CA on spark-a", {"spark-a": "Success"}),
    ("Issue the certificate of spark-a from the fleet CA on spark-a", {"spark-a": "Success"}),
    ("Write the trust bundle /etc/sparkfleet/tls/ca.crt (the fleet CA is new)", {"spark-a": "Success"}),
]


def test_the_fleet_ca_certificates_and_bundles_are_made_where_the_plan_printed_and_nowhere_else():
    run = tls_run(*G1_AS_PLANNED, *TLS_AS_PLANNED)
    assert mismatches(run.output, run.changed()) == []
    extra = tls_run(*G1_AS_PLANNED, *TLS_AS_PLANNED,
                    ("Issue the certificate of spark-c from the fleet CA on spark-a", {"spark-c": "Success"}))
    assert mismatches(extra.output, extra.changed()) == [
        "TLS: issue: the plan said ['spark-a'], the run did ['spark-a', 'spark-c']"]
    missing = tls_run(*G1_AS_PLANNED, *TLS_AS_PLANNED[:1])
    assert mismatches(missing.output, missing.changed()) == [
        "TLS: issue: the plan said ['spark-a'], the run did []", "TLS: bundle: the plan said ['spark-a'], the run did []"]
    # the router hop's client certificate: issued where the plan printed it, and not elsewhere
    hop = ("Issue the router hop's client certificate on spark-a (/etc/sparkfleet/tls/router-hop.pem) from the fleet CA "
           "on spark-a", {"spark-a": "Success"})
    unplanned = tls_run(*G1_AS_PLANNED, *TLS_AS_PLANNED, hop)
    assert mismatches(unplanned.output, unplanned.changed()) == ["TLS: hop: the plan said [], the run did ['spark-a']"]
    planned = tls_run(*G1_AS_PLANNED, *TLS_AS_PLANNED, hop,
                      plan=TLS_PLAN + "    router hop's client certificate issued on spark-a: no certificate yet\n")
    assert mismatches(planned.output, planned.changed()) == []
