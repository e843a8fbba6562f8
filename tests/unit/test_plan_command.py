"""`python -m sparkfleet plan` (sparkfleet/plan_command.py, sparkfleet/plan_ops.py): how each declared
operation is judged, the verdict on recorded lab plans, and the exit status when the deploy's
prepare fails or writes no plan.

The fixtures are the lab's own (tests/unit/fixtures/plan/lab-<case>/): `pyinfra -y --dry
lab/inventory.py deploy.py` with SPARKFLEET_PLAN_DIR set, on the lab after a deploy of v1:
unchanged; with the recipe bumped to v2 (pinned); with docker_log_max_file changed (a file beyond
the group plan)."""
import sys
from pathlib import Path

import pytest

from sparkfleet import plan_command
from sparkfleet.plan_command import CHANGES, ERROR, NO_CHANGES, read_plan, verdict
from sparkfleet.plan_ops import NOT_RUN, ONLY_IF, WOULD_RUN, judge

FIXTURES = Path(__file__).parent / "fixtures" / "plan"
V2 = "742fd91baa8990bf3275366183273ac4fecddeac"


def recorded(case: str):
    return read_plan(FIXTURES / f"lab-{case}")


def not_executed():
    raise RuntimeError("Cannot evaluate operation result before execution")  # pyinfra's OperationMeta


def never_generated():
    raise AssertionError("an operation with a condition is judged by its condition, not its commands")


@pytest.mark.parametrize("conditions, generated, expected", [
    ([lambda: True], never_generated, WOULD_RUN),  # a verdict, or sparkfleet.unchanged's reading says it differs
    ([lambda: True, lambda: False], never_generated, NOT_RUN),  # pyinfra calls them all: any false, it does not run
    ([not_executed], never_generated, ONLY_IF),  # `_if=earlier.did_change`
    ([not_executed, lambda: False], never_generated, NOT_RUN),  # false whatever the earlier one did
    ([], lambda: iter(["systemctl restart docker"]), WOULD_RUN),  # no condition: pyinfra's own commands say
    ([], lambda: iter([]), NOT_RUN),
])
def test_an_operation_is_judged_by_its_conditions_then_its_own_commands(conditions, generated, expected):
    assert judge(conditions, generated) == expected


def test_a_condition_that_fails_otherwise_is_not_hidden():
    with pytest.raises(KeyError):
        judge([lambda: {}["missing"]], never_generated)


def test_an_unchanged_lab_plans_nothing_and_exits_0():
    code, lines = verdict(*recorded("unchanged"))
    assert code == NO_CHANGES
    assert "  pair: nothing to do (serving)" in lines
    assert "  spark-a: none would run" in lines and "  spark-b: none would run" in lines
    # gated on an earlier operation's change: counted apart, never as a change
    assert any(line.startswith("  spark-a: ") and "more only if an earlier step changes" in line for line in lines)
    assert lines[-1] == "--> a deploy would change nothing: exit 0"


def test_a_recipe_bump_plans_the_groups_build_ship_warm_and_restart_and_the_operations_that_do_it():
    code, lines = verdict(*recorded("bump"))
    assert code == CHANGES
    [pair] = [line for line in lines if line.startswith("  pair: ")]
    assert pair.startswith(f"  pair: build sparkfleet/glm-5.3-flash-exl3:{V2}; ship image -> spark-b; "
                           f"warm the kernel caches (prewarm); restart the group (image ")
    assert "spark-b: /etc/sparkfleet/sparkfleet-worker.env changed" in pair  # the why, from the plan
    head = lines[lines.index("  spark-a: 21 operation(s) would run:"):lines.index("  spark-b: 9 operation(s) would run:")]
    worker = lines[lines.index("  spark-b: 9 operation(s) would run:"):]
    assert f"    roles/image/tasks.py | Build sparkfleet/glm-5.3-flash-exl3:{V2} on the head" in head
    assert "    roles/kernel_cache/tasks.py | Prewarm and merge the kernel caches" in head
    assert "    roles/serving/tasks.py | Start the head (every worker is up)" in head
    assert f"    roles/image/tasks.py | Pull sparkfleet/glm-5.3-flash-exl3:{V2} from the head" in worker
    assert "    roles/serving/tasks.py | Restart the workers (workers first)" in worker
    assert not [line for line in worker if "Build" in line or "Start the head" in line]
    assert lines[-1].endswith("1 serving group(s) by the plan, 30 operation(s) would run: exit 2")


def test_a_file_beyond_the_group_plan_is_a_change_named_per_host():
    code, lines = verdict(*recorded("docker"))
    assert code == CHANGES
    assert "  pair: nothing to do (serving)" in lines
    for host in ("spark-a", "spark-b"):
        at = lines.index(f"  {host}: 2 operation(s) would run:")
        assert lines[at + 1:at + 3] == ["    roles/docker/tasks.py | Write /etc/docker/daemon.json",
                                        "    roles/docker/tasks.py | Check docker info"]
    assert lines[-1].endswith("0 serving group(s) by the plan, 4 operation(s) would run: exit 2")


def fake_pyinfra(monkeypatch, tmp_path, script: str):
    """pyinfra replaced by a Python program (the deploy's prepare cannot run here): it gets the plan's
    own environment."""
    program = tmp_path / "fake.py"
    program.write_text(script)
    monkeypatch.setattr(plan_command, "pyinfra_command", lambda inventory, extra: [sys.executable, str(program)])


def test_a_failed_prepare_exits_1(monkeypatch, tmp_path, capsys):
    fake_pyinfra(monkeypatch, tmp_path, "import sys; sys.exit(2)")
    assert plan_command.main("lab/inventory.py") == ERROR
    assert "the deploy's prepare failed (pyinfra exit 2); nothing was changed" in capsys.readouterr().err


def test_a_prepare_that_wrote_no_plan_exits_1(monkeypatch, tmp_path, capsys):
    fake_pyinfra(monkeypatch, tmp_path, "pass")
    assert plan_command.main("lab/inventory.py") == ERROR
    assert "no plan to read" in capsys.readouterr().err


@pytest.mark.parametrize("case, code", [("unchanged", NO_CHANGES), ("bump", CHANGES)])
def test_the_plan_directory_named_in_the_environment_is_what_is_read(monkeypatch, tmp_path, capsys, case, code):
    fake_pyinfra(monkeypatch, tmp_path, (
        "import os, shutil\n"
        f"shutil.copytree({str(FIXTURES / f'lab-{case}')!r}, os.environ[{plan_command.PLAN_DIR_VAR!r}], "
        "dirs_exist_ok=True)\n"))
    assert plan_command.main("lab/inventory.py") == code
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"exit {code}")


def test_the_deploy_runs_dry_without_pyinfras_change_detection():
    cmd = plan_command.pyinfra_command("inventory.py", ["--limit", "spark-a"])
    assert cmd[1:] == ["-y", "--dry", "inventory.py", "deploy.py", "--limit", "spark-a"]


def test_an_operations_commands_are_generated_once_and_closed_at_once():
    ended = []

    def generated():  # as pyinfra's command_generator: the host is "in an operation" until it ends
        try:
            yield "first"
            yield "second"
        finally:
            ended.append(True)

    assert judge([], generated) == WOULD_RUN and ended == [True]


def test_a_fleets_plan_prints_its_turns_routing_and_key_after_the_groups_and_a_pairs_prints_none(tmp_path):
    """Step 1b writes the fleet's verdicts beside the groups' (tools/plan.py write_plan); the summary
    prints them after every group's lines, which stay together (tests/fleet/test_lab_fleet.py reads
    each group's line with its engine line under it). The recorded pair's plan has no fleet file:
    it prints as before."""
    import json

    from sparkfleet.plan_types import FleetPlan, GroupPlan
    from tools.plan import write_plan

    groups = {g: GroupPlan(group=g, profile="p", image="i", nodes=[h], healthy=True, engine="vllm 0.32.0 (unchanged)")
              for g, h in (("g1", "spark-a"), ("g2", "spark-c"))}
    fleet = FleetPlan(turns=["g1", "g2"], router="spark-a", routing={"g2": "routed", "g1": "drained"},
                      route_again=["g1"], key_source="spark-a", key_writes=["spark-c"])
    write_plan(groups, fleet, tmp_path)
    (tmp_path / "operations-spark-a.json").write_text(json.dumps([]))
    code, lines = verdict(*read_plan(tmp_path))
    assert code == NO_CHANGES
    assert lines[:9] == [
        "--> sparkfleet plan, per serving group:",
        "  g1: nothing to do (serving)", "  g1 engine: vllm 0.32.0 (unchanged)",
        "  g2: nothing to do (serving)", "  g2 engine: vllm 0.32.0 (unchanged)",
        "--> the fleet:",
        "  turn order: g1, then g2",
        "  router on spark-a: g2 routed, g1 drained",  # the router's own order, kept through the file
        "  routed again before any turn (an earlier run left them drained; they serve): g1",
    ]
    assert lines[9] == "  the fleet's API key (spark-a's) written into the key file of: spark-c"
    assert lines[10] == "--> operations a deploy would run:"
    _, pair_lines = verdict(*recorded("unchanged"))
    assert "--> the fleet:" not in pair_lines
    write_plan({"pair": groups["g1"]}, FleetPlan(turns=["pair"]), tmp_path)
    assert "--> the fleet:" not in verdict(*read_plan(tmp_path))[1]


def test_a_groups_firewall_change_is_one_of_its_actions_and_makes_the_plan_exit_2(tmp_path):
    """Step 1b writes the group's firewall line (roles/firewall summary) with its verdicts; `sparkfleet
    plan` names it among the group's actions, a change (exit 2) whatever the operations say."""
    import json

    from sparkfleet.plan_types import FleetPlan, GroupPlan
    from tools.plan import write_plan

    group = GroupPlan(group="pair", profile="p", image="i", nodes=["spark-a", "spark-b"], healthy=True,
                      firewall="applied on spark-b (no table live)")
    write_plan({"pair": group}, FleetPlan(turns=["pair"]), tmp_path)
    (tmp_path / "operations-spark-b.json").write_text(json.dumps([]))
    code, lines = verdict(*read_plan(tmp_path))
    assert code == CHANGES
    assert "  pair: change the firewall: applied on spark-b (no table live)" in lines
    assert lines[-1].startswith("--> a deploy would change something: 1 serving group(s) by the plan")
