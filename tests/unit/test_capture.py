"""`sparkfleet capture` bundles replayed as the facts of their nodes (sparkfleet/capture.py, tools/replay.py).

The bundle here was captured from the lab pair after a deploy (`make capture INVENTORY=lab/inventory.py
OUT=tests/unit/fixtures/capture-lab.json`): every fact's command as it ran and its raw output. Replayed,
each record goes through the fact's own parser, and the deploy's own readers and verdicts take the
plan from it with no host connected: the settled pair it was captured from does nothing. A bundle
that lacks a fact the deploy reads, or holds one that says otherwise, is seen for what it is.
"""
import copy
import json

import pytest

from sparkfleet import capture
from tests.unit.helpers import CAPTURES
from tools.replay import replay_plan

LAB_BUNDLE = CAPTURES.parent / "capture-lab.json"
LAB_INVENTORY = "lab/inventory.py"


@pytest.fixture(scope="module")
def lab_bundle():
    return capture.load(LAB_BUNDLE)


@pytest.fixture(autouse=True)
def lab_as_captured(monkeypatch, tmp_path):
    """lab/inventory.py reads the running lab's state (its netplan renderer, which lab tiers running beside
    this one switch): the replay takes the lab's data as it was captured, on a lab brought up by default
    (NetworkManager, the renderer file absent), whatever the machine's lab does meanwhile."""
    monkeypatch.setenv("SFL_LAB_STATE", str(tmp_path))


def test_the_lab_bundle_holds_both_nodes_and_says_what_captured_it(lab_bundle):
    assert set(lab_bundle["nodes"]) == {"spark-a", "spark-b"}
    assert lab_bundle["sparkfleet"]["version"] and lab_bundle["sparkfleet"]["commit"]
    assert [r["what"] for r in lab_bundle["runs"]] == ["plan", "doctor"]
    for records in lab_bundle["nodes"].values():
        facts = {r["fact"] for r in records}
        # The deploy's first read of a node, and the plan's reads of the pair's state.
        assert {"roles.preflight.facts.NodeFacts", "roles.serving.facts.UnitState"} <= facts, facts
        assert all(r["command"] and isinstance(r["stdout"], list) for r in records)


def test_every_record_goes_through_its_facts_own_parser(lab_bundle):
    for host, records in lab_bundle["nodes"].items():
        for record in records:
            cls = capture.fact_class(record["fact"])
            try:
                capture.processed(cls, record)
            except Exception as err:  # the message names the record, not only the parser's line
                pytest.fail(f"{host}: {record['fact']}({record['kwargs']}) does not parse: {err!r}")


def test_the_plan_replayed_from_the_settled_lab_pair_does_nothing(lab_bundle):
    plans = replay_plan(lab_bundle, LAB_INVENTORY)
    assert set(plans) == {"pair"}
    decisions = plans["pair"]
    # A change to what the deploy renders or reads makes the captured pair out of date: deploy the lab
    # and capture it again (the module's docstring says how); the plan says what moved.
    assert decisions.summary.actions() == [], (f"the lab bundle replays to {decisions.summary.actions()}: "
                                               f"re-capture it after a lab deploy (see this module's docstring)")
    assert decisions.serving.healthy and not decisions.serving.restart
    assert decisions.fabric.converged
    assert all(m.total_gib > 0 for m in decisions.memory.values())


def test_a_replayed_node_that_says_otherwise_changes_the_plan(lab_bundle):
    """The replay is the node's word: the worker's rank file sums gone from the bundle make the plan
    restart the pair, as a deploy would on a worker whose files changed."""
    bundle = copy.deepcopy(lab_bundle)
    serving = [r for r in bundle["nodes"]["spark-b"] if r["fact"] == "roles.serving.facts.UnitState"]
    assert serving, "the bundle holds the worker's unit state"
    for record in serving:
        record["stdout"] = [line for line in record["stdout"] if not line.startswith("active=")] + ["active=inactive"]
    decisions = replay_plan(bundle, LAB_INVENTORY)["pair"]
    assert decisions.serving.restart, decisions.serving


def test_the_firewall_is_decided_from_the_facts_the_lab_recorded_and_moves_where_a_node_says_so(lab_bundle):
    """The facts pass's firewall reader asks what the firewall step asked (ManagementSubnet at the
    management address, LiveMarker, Which nft): the lab's recorded live markers are the tables data
    renders today, so nothing moves; the worker's table gone from its record, the plan applies it
    there and names it in the group's line."""
    decisions = replay_plan(lab_bundle, LAB_INVENTORY)["pair"]
    assert sorted(decisions.firewall) == ["spark-a", "spark-b"]
    assert all(p.live == p.want and p.subnet == "198.18.0.0/24" and not p.install_nft and p.problem is None
               for p in decisions.firewall.values()), decisions.firewall
    bundle = copy.deepcopy(lab_bundle)
    marker = [r for r in bundle["nodes"]["spark-b"] if r["fact"] == "sparkfleet.firewall_facts.LiveMarker"]
    assert marker, "the bundle holds the worker's live marker"
    marker[0]["stdout"] = []  # `nft list table` found none
    moved = replay_plan(bundle, LAB_INVENTORY)["pair"]
    assert moved.firewall["spark-b"].apply and not moved.firewall["spark-a"].apply
    assert moved.summary.firewall == "applied on spark-b (no table live)"
    assert moved.summary.actions() == ["change the firewall: applied on spark-b (no table live)"]


def test_a_bundle_without_a_fact_the_deploy_reads_fails_naming_it(lab_bundle):
    bundle = copy.deepcopy(lab_bundle)
    bundle["nodes"]["spark-b"] = [r for r in bundle["nodes"]["spark-b"] if r["fact"] != "roles.preflight.facts.NodeFacts"]
    with pytest.raises(LookupError, match="roles.preflight.facts.NodeFacts of spark-b"):
        replay_plan(bundle, LAB_INVENTORY)


def test_records_read_twice_are_kept_once_in_first_read_order():
    lines = [{"host": "a", "fact": "m.F", "kwargs": {"x": 1}, "command": "c1", "status": True, "stdout": ["1"]},
             {"host": "a", "fact": "m.G", "kwargs": {}, "command": "c2", "status": True, "stdout": []},
             {"host": "a", "fact": "m.F", "kwargs": {"x": 1}, "command": "c1", "status": True, "stdout": ["2"]},
             {"host": "b", "fact": "m.F", "kwargs": {"x": 1}, "command": "c1", "status": False, "stdout": []}]
    nodes = capture.merge_records(lines)
    assert [r["fact"] for r in nodes["a"]] == ["m.F", "m.G"] and nodes["a"][0]["stdout"] == ["1"]
    assert nodes["b"][0]["status"] is False and "host" not in nodes["b"][0]


def test_a_bundle_of_another_format_is_refused(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"format": 99, "nodes": {}}))
    with pytest.raises(ValueError, match="bundle format 99"):
        capture.load(path)
