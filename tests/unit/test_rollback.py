"""Rollback means the last good commit: the head's history of what was attempted and what served
(roles/serving/history.py), the choice of the commit `make rollback` returns to, and what a failed
prewarm does to return to the previous production (roles/kernel_cache/checks.py)."""
import subprocess

import pytest
from pyinfra.api.exceptions import DeployError

from roles.kernel_cache import checks as kc
from roles.serving.history import (
    Event, NothingToRollBackTo, RecipeHistory, describe, last_served, parse_history, record_command,
    rollback_message, rollback_target, same_commit,
)
from sparkfleet.config import build_cluster
from tests.unit.helpers import pair

V1, V2, V3 = "1" * 40, "2" * 40, "3" * 40
PROFILE = "glm-5.3-flash-exl3"
PATH = "/var/lib/sparkfleet/recipes/glm-5.3-flash-exl3.history"


def history(*lines):
    return parse_history([f"2030-01-0{i + 1}T00:00:00Z {line}" for i, line in enumerate(lines)])


def target(events, data_commit):
    return rollback_target(events, data_commit, "spark-a", PROFILE, PATH)


# --- the history ---------------------------------------------------------------------------------

def test_history_lines_parse_to_events_and_a_bad_line_is_skipped():
    events = parse_history([
        f"2030-01-01T00:00:00Z served {V1}",
        f"2030-01-02T00:00:00Z attempted {V2}",
        "garbage",
        f"2030-01-02T00:00:01Z exploded {V2}",
        "",
        f"2030-01-02T00:05:00Z failed {V2}",
    ])
    assert events == [
        Event("2030-01-01T00:00:00Z", "served", V1),
        Event("2030-01-02T00:00:00Z", "attempted", V2),
        Event("2030-01-02T00:05:00Z", "failed", V2),
    ]


def test_a_deployed_file_of_an_older_sparkfleet_reads_as_served_events_before_the_history():
    events = parse_history([f"2030-01-03T00:00:00Z attempted {V3}"], [f"{V1}\n", "\n", V2])
    assert events == [Event(None, "served", V1), Event(None, "served", V2), Event("2030-01-03T00:00:00Z", "attempted", V3)]
    assert last_served(events) == V2


def test_the_fact_reads_both_files():
    fact = RecipeHistory()
    command = fact.command(path=PATH, deployed="/x/glm.deployed")
    assert PATH in command and "/x/glm.deployed" in command
    events = fact.process([f"D {V1}", f"H 2030-01-01T00:00:00Z served {V2}", "H not an event"])
    assert events == [Event(None, "served", V1), Event("2030-01-01T00:00:00Z", "served", V2)]
    assert fact.process([]) == []


def test_an_event_is_appended_with_the_utc_time(tmp_path):
    path = tmp_path / "recipes" / "p.history"  # its directory is created
    for event, commit in (("attempted", V2), ("failed", V2), ("served", V1)):
        subprocess.run(["sh", "-c", record_command(str(path), event, commit)], check=True)
    events = parse_history(path.read_text().splitlines())
    assert [(e.event, e.commit) for e in events] == [("attempted", V2), ("failed", V2), ("served", V1)]
    assert all(e.time and e.time.endswith("Z") and e.time[4] == "-" and "T" in e.time for e in events)
    with pytest.raises(ValueError):
        record_command(str(path), "maybe", V1)


def test_an_abbreviated_commit_names_the_same_one():
    assert same_commit(V1, V1[:12]) and same_commit(V1[:12], V1)
    assert not same_commit(V1, V2) and not same_commit(V1, "") and not same_commit(None, V1)


# --- the rollback target -------------------------------------------------------------------------

def test_after_a_failed_upgrade_rollback_returns_to_the_commit_that_served():
    # v1 served; v2 attempted, failed (never served); data names v2.
    events = history(f"served {V1}", f"attempted {V2}", f"failed {V2}", f"served {V1}")
    choice = target(events, V2)
    assert (choice.current, choice.target, choice.served_at) == (V2, V1, "2030-01-04T00:00:00Z")
    assert "never served" in choice.current_note and "last failed 2030-01-03T00:00:00Z" in choice.current_note


def test_served_only_v1_data_v2_returns_to_v1():
    assert target(history(f"served {V1}"), V2).target == V1


def test_after_v2_served_rollback_returns_to_v1():
    events = history(f"attempted {V1}", f"served {V1}", f"attempted {V2}", f"served {V2}")
    choice = target(events, V2)
    assert choice.target == V1 and choice.served_at == "2030-01-02T00:00:00Z"
    assert "last served 2030-01-04T00:00:00Z" in choice.current_note


def test_the_newest_served_commit_other_than_datas_wins():
    events = history(f"served {V1}", f"served {V3}", f"served {V2}")
    assert target(events, V2).target == V3
    assert target(events, V2[:12]).target == V3  # an abbreviated commit in data is the same commit


def test_an_older_deployed_file_is_enough_to_roll_back():
    assert rollback_target(parse_history([], [V1, V2]), V2, "spark-a", PROFILE, PATH).target == V1


@pytest.mark.parametrize("events", [
    [],
    history(f"attempted {V2}", f"failed {V2}"),
    history(f"served {V2}"),
])
def test_nothing_served_but_datas_commit_is_refused_naming_the_head_and_the_profile(events):
    with pytest.raises(NothingToRollBackTo) as refused:
        target(events, V2)
    assert isinstance(refused.value, DeployError)  # a refusal block, no traceback (sparkfleet.run)
    text = str(refused.value)
    assert "spark-a" in text and PROFILE in text and V2 in text and PATH in text
    assert "nothing to roll back to" in text


def test_the_rollback_message_says_from_to_when_and_what_to_set_in_data():
    choice = target(history(f"served {V1}", f"attempted {V2}", f"failed {V2}"), V2)
    text = rollback_message(choice, PROFILE, "sparkfleet/glm")
    assert f"{PROFILE} recipe {V2} -> {V1}" in text
    assert "last served 2030-01-01T00:00:00Z" in text and "never served" in text
    assert f'set serving_recipe_commit = "{V1}" in data' in text
    assert f"sparkfleet/glm:{V1}" in text and "no rebuild" in text


def test_describe_a_commit_without_events():
    assert describe([], V1) == "never served"


# --- a failed prewarm ----------------------------------------------------------------------------

def test_units_that_come_back_after_a_failed_prewarm_were_active_or_are_enabled():
    states = {"a": "active enabled", "b": "inactive enabled", "c": "active disabled", "d": "inactive disabled",
              "e": "inactive", "f": "activating static", "g": ""}
    assert kc.units_to_restore(states) == {"a", "b", "c", "f"}
    assert kc.unit_state_command("sparkfleet-head").count("sparkfleet-head.service") == 2


def test_the_commit_of_an_image_is_its_tag():
    assert kc.commit_of(f"sparkfleet/glm:{V1}") == V1
    assert kc.commit_of("198.19.77.1:5000/sparkfleet/glm") is None
    assert kc.commit_of("sparkfleet/glm:latest") is None and kc.commit_of("") is None


def test_the_failure_message_names_the_prewarm_failure_and_what_serves():
    ok = kc.prewarm_failure_message("the prewarm failed: X", "img:v1 (recipe v1)", None)
    assert ok.startswith("the prewarm failed: X\n") and "The previous production is serving again: img:v1" in ok
    bad = kc.prewarm_failure_message("the prewarm failed: X", None, "spark-a: /health not 200")
    assert "Restarting the previous production failed too: spark-a: /health not 200" in bad
    assert "NOT serving" in bad


class FakeNodes:
    """kernel_cache's _Nodes on a lab-shaped pair: records every command, answers what a pair does."""

    def __init__(self, worker_runs=True):
        self.cluster = build_cluster(pair())
        self.commands = []
        self.worker_runs = worker_runs

    def run(self, name, command, what, check=True):
        self.commands.append((name, command))
        if command.startswith("docker inspect --format '{{.State.Status}}'"):
            return "running\n" if self.worker_runs else "exited\n"
        if command.startswith("docker inspect --format '{{.Config.Image}}'"):
            return f"sparkfleet/glm-5.3-flash-exl3:{V1}\n"
        return ""


@pytest.fixture
def health(monkeypatch):
    calls = []
    monkeypatch.setattr(kc, "wait_for_health", lambda **kw: calls.append(kw))  # the name the prewarm calls
    monkeypatch.setattr(kc.time, "sleep", lambda s: None)
    return calls


def profile_of(nodes):
    from sparkfleet.model.serving import node_profile

    return node_profile(nodes.cluster.head)


def test_a_failed_prewarm_relinks_and_restarts_the_previous_production_workers_first(health):
    nodes = FakeNodes()
    old, new = "aaaaaaaaaaaa", "bbbbbbbbbbbb"
    restored, problem = kc._restore_production(
        nodes, profile_of(nodes), new, {"spark-a": old, "spark-b": old}, {"spark-a", "spark-b"}, PATH)
    assert problem is None
    assert restored == (f"sparkfleet/glm-5.3-flash-exl3:{V1} (recipe {V1}) on kernel-cache generation {old}; "
                        "restarted spark-b then spark-a; /health 200")
    cmds = nodes.commands
    relinks = [i for i, (_, c) in enumerate(cmds) if f"ln -sfn {old} current" in c]
    worker = cmds.index(("spark-b", "systemctl restart sparkfleet-worker.service"))
    head = cmds.index(("spark-a", "systemctl restart sparkfleet-head.service"))
    assert len(relinks) == 2 and max(relinks) < worker < head
    assert [h["unit"] for h in health] == ["sparkfleet-head"]
    served = [c for n, c in cmds if "served" in c]
    assert served == [record_command(PATH, "served", V1)] and cmds[-1][0] == "spark-a"


def test_a_first_deploy_whose_prewarm_fails_restarts_nothing(health):
    nodes = FakeNodes()
    restored, problem = kc._restore_production(nodes, profile_of(nodes), "bbbbbbbbbbbb", {}, set(), PATH)
    assert restored is None and "nothing to restart" in problem and "spark-a" in problem
    assert not [c for _, c in nodes.commands if "systemctl restart" in c or "ln -sfn" in c]
    assert health == []


def test_a_production_that_does_not_come_back_is_said_plainly(health, monkeypatch):
    nodes = FakeNodes(worker_runs=False)
    clock = iter(range(0, 10_000, 100))
    monkeypatch.setattr(kc.time, "monotonic", lambda: next(clock))
    restored, problem = kc._restore_production(
        nodes, profile_of(nodes), "bbbbbbbbbbbb", {"spark-a": "aaaaaaaaaaaa"}, {"spark-a", "spark-b"}, PATH)
    assert restored is None and "spark-b: sparkfleet-worker container not running" in problem
    assert ("spark-a", "systemctl restart sparkfleet-head.service") not in nodes.commands
