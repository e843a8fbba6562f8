"""bench/bringup.py's pure parts, no lab: the phase graph as data, the phases of a deploy's record (the
receipt's deploy_steps) and the critical path through them. The benchmark itself runs on the lab
(`make bench`); no wall-clock time is asserted here."""
from pathlib import Path

import pytest

from bench.bringup import (
    HUB_FETCH_FOLLOWS, MUST_FOLLOW, PHASE_STEPS, RECORDED_BUILD_S, UPLINK_KIB_S, busy, critical_path, for_path,
    graph_for, outside, phase_intervals, phase_of,
)
from roles.image.commands import build_step, pull_step as image_pull_step, push_step
from roles.receipt.receipt import RECEIPT_STEP, deploy_steps
from roles.weights.checks import fetch_step, pull_step as weights_pull_step
from sparkfleet.config import build_cluster
from sparkfleet.model.engine import HEAD_UNIT, WORKER_UNIT
from sparkfleet.model.serving import node_profile
from sparkfleet.progress import Span
from tests.unit.helpers import pair

REPO = Path(__file__).resolve().parents[2]
CHAIN = ["build image", "ship image", "prewarm", "start", "receipt"]


def intervals(**phases):
    """phase (with _ for spaces) -> [(start, end), ...]."""
    return {name.replace("_", " "): spans for name, spans in phases.items()}


# ------------------------------------------------------------------------------------ the graph

def test_the_graph_and_the_phase_table_name_the_same_phases_and_every_edge_a_phase():
    assert list(MUST_FOLLOW) == list(PHASE_STEPS)
    assert all(set(before) <= set(MUST_FOLLOW) for before in MUST_FOLLOW.values())
    assert set(HUB_FETCH_FOLLOWS) <= set(MUST_FOLLOW)


def test_the_graph_is_the_deploys_data_flow():
    """Each edge the deploy's data needs, none it does not: the fetch needs no image (but from the hub,
    whose client runs in the image), the weights ship after the head's manifest, the prewarm needs both."""
    assert MUST_FOLLOW["fetch weights"] == () and MUST_FOLLOW["build image"] == ()
    assert MUST_FOLLOW["ship image"] == ("build image",) and MUST_FOLLOW["ship weights"] == ("fetch weights",)
    assert set(MUST_FOLLOW["prewarm"]) == {"ship image", "ship weights"}
    assert graph_for("http://198.18.0.1:8089/uplink/54") == MUST_FOLLOW
    assert graph_for("/srv/models") == MUST_FOLLOW
    assert graph_for("hub")["fetch weights"] == ("build image",)
    assert {k: v for k, v in graph_for("hub").items() if k != "fetch weights"} == {
        k: v for k, v in MUST_FOLLOW.items() if k != "fetch weights"}


# ---------------------------------------------------------------------------- the critical path

def test_serial_phases_the_longer_branch_is_the_path():
    # one after the other, as the deploy runs them today: build 10, fetch 14, ship image 5, weights 2, ...
    measured = intervals(build_image=[(0, 10)], fetch_weights=[(10, 24)], ship_image=[(24, 29)],
                         ship_weights=[(29, 31)], prewarm=[(32, 52)], start=[(53, 61)], receipt=[(62, 64)])
    seconds, chain = critical_path(MUST_FOLLOW, measured)
    assert chain == ["fetch weights", "ship weights", "prewarm", "start", "receipt"]  # 14 + 2 > 10 + 5
    assert seconds == 14 + 2 + 20 + 8 + 2
    assert outside(0, 64, measured) == 3  # 31-32, 52-53, 61-62: in no phase
    # a build longer by 2 s: the other branch
    longer = {**measured, "build image": [(-2, 10)]}
    assert critical_path(MUST_FOLLOW, longer) == (12 + 5 + 20 + 8 + 2, CHAIN)


def test_overlapped_phases_the_same_path_and_overlaps_counted_once():
    # the fetch while the image builds (issue 44 item 2), two models fetched at once, pushes overlapping
    measured = intervals(build_image=[(0, 10)], fetch_weights=[(0, 8), (2, 12)], ship_image=[(10, 13), (12, 15)],
                         ship_weights=[(12, 14)], prewarm=[(15, 35)], start=[(35, 43)], receipt=[(43, 45)])
    assert busy(measured["fetch weights"]) == 12 and busy(measured["ship image"]) == 5
    seconds, chain = critical_path(MUST_FOLLOW, measured)
    assert (seconds, chain) == (10 + 5 + 20 + 8 + 2, CHAIN)  # 10 + 5 > 12 + 2
    assert outside(0, 45, measured) == 0  # the wall time is the critical path: a ratio of 1.0


def test_a_phase_not_needed_weighs_nothing_and_still_orders_the_others():
    # the weights already on every node: no fetch, no fan-out; the prewarm still follows the build
    measured = intervals(build_image=[(0, 10)], ship_image=[(10, 15)], prewarm=[(15, 35)], start=[(35, 43)],
                         receipt=[(43, 45)])
    assert critical_path(MUST_FOLLOW, measured) == (45, CHAIN)
    # the image already on the workers too: the build alone before the prewarm
    measured = intervals(build_image=[(0, 10)], prewarm=[(10, 30)], start=[(30, 38)], receipt=[])
    assert critical_path(MUST_FOLLOW, measured) == (38, ["build image", "prewarm", "start"])
    # a fetch longer than build + push: the path goes through the fetch
    measured = intervals(build_image=[(0, 10)], fetch_weights=[(0, 40)], ship_image=[(10, 15)], prewarm=[(40, 60)])
    assert critical_path(MUST_FOLLOW, measured) == (60, ["fetch weights", "prewarm"])
    assert critical_path(MUST_FOLLOW, {}) == (0, [])


def test_from_the_hub_the_fetch_follows_the_build():
    measured = intervals(build_image=[(0, 10)], fetch_weights=[(0, 12)], ship_image=[(10, 15)],
                         ship_weights=[(12, 14)], prewarm=[(15, 35)])
    assert critical_path(MUST_FOLLOW, measured) == (35, ["build image", "ship image", "prewarm"])
    assert critical_path(graph_for("hub"), measured) == (
        44, ["build image", "fetch weights", "ship weights", "prewarm"])


def test_a_pull_that_followed_the_fetch_weighs_only_what_it_did_after_the_fetchs_end():
    # the worker's pull began with the fetch (issue 44 item 2) and ended 3 s after it
    measured = intervals(build_image=[(0, 10)], fetch_weights=[(0, 40)], ship_image=[(10, 15)],
                         ship_weights=[(1, 43)], prewarm=[(43, 63)])
    weighed = for_path(measured)
    assert weighed["ship weights"] == [(40, 43)] and weighed["fetch weights"] == [(0, 40)]
    assert critical_path(MUST_FOLLOW, weighed) == (63, ["fetch weights", "ship weights", "prewarm"])
    # unweighed, the pull's waiting would count twice: a path longer than the wall time
    assert critical_path(MUST_FOLLOW, measured)[0] == 102
    # a pull after the fetch (the head had it), or no fetch at all: as measured
    after = intervals(fetch_weights=[(0, 40)], ship_weights=[(41, 45)])
    assert for_path(after) == after
    assert for_path(intervals(ship_weights=[(1, 4)])) == intervals(ship_weights=[(1, 4)])
    # wholly inside the fetch (the last file landed before the fetch's own end): nothing follows it
    assert for_path(intervals(fetch_weights=[(0, 40)], ship_weights=[(1, 39)]))["ship weights"] == []


def test_a_graph_that_cannot_give_a_path_is_refused_naming_the_phase():
    with pytest.raises(ValueError, match="measured phases the graph does not have: warm-up"):
        critical_path(MUST_FOLLOW, {"warm-up": [(0, 1)]})
    with pytest.raises(ValueError, match="'prewarm' must follow ship kernels, which the graph does not have"):
        critical_path({**MUST_FOLLOW, "prewarm": ("ship kernels",)}, {})
    with pytest.raises(ValueError, match="cycle through 'build image'"):
        critical_path({**MUST_FOLLOW, "build image": ("receipt",)}, {"build image": [(0, 1)]})


# --------------------------------------------------------------- the phases of a deploy's record

def lab_names():
    """The real names of the steps of the lab's real-engine pair, from the functions the roles name them with."""
    cluster = build_cluster(pair(**{h: {"serving_profile": "lab-vllm-cpu", "weights_source": "http://198.18.0.1:8089",
                                        "gpu_expected": False} for h in ("spark-a", "spark-b")}))
    head = cluster.head
    profile = node_profile(head)
    return head, profile


def test_every_step_the_roles_name_is_in_its_phase_and_no_other_step_is():
    head, profile = lab_names()
    named = {
        "Pull base image sparkfleet-lab/engine-base:bookworm": "build image",
        build_step(profile): "build image",
        fetch_step(head, profile.model, profile.model_revision): "fetch weights",
        fetch_step(head, "org/drafter", "0" * 40): "fetch weights",
        push_step(profile): "ship image",
        image_pull_step(profile): "ship image",
        weights_pull_step(profile.model): "ship weights",
        "prewarm": "prewarm",
        f"start of {HEAD_UNIT}": "start",
        RECEIPT_STEP: "receipt",
        f"start of {WORKER_UNIT}": None,  # the worker's engine waits for the head's
        "Check out the recipe at 167932b6ffeb7f978ab15eaea5db2aac3ca0b3af": None,
        "Bring the kernel caches in line with the head's": None,
    }
    assert {step: phase_of(step) for step in named} == named


def test_a_receipts_record_gives_each_phase_its_steps_and_the_start_from_the_units_restart():
    head, profile = lab_names()
    spans = [Span("spark-a", "Pull base image base", 100.0, 101.0, True),
             Span("spark-a", build_step(profile), 101.0, 180.0, True),
             Span("spark-a", fetch_step(head, profile.model, "main"), 180.5, 262.0, True),
             Span("spark-a", push_step(profile), 262.0, 330.0, True),
             Span("spark-b", image_pull_step(profile), 330.5, 370.0, True),
             Span("spark-b", weights_pull_step(profile.model), 371.0, 385.0, True),
             Span("spark-a", "prewarm", 400.0, 464.0, True),
             Span("spark-a", f"start of {HEAD_UNIT}", 480.0, 500.0, True),
             Span("spark-c", "prewarm", 400.0, 470.0, True)]  # another group's: not in this receipt
    record = {"units_started_at": 476.5,
              "deploy_steps": deploy_steps(("spark-a", "spark-b"), "spark-a", 520.0, 524.0, spans)}
    measured = phase_intervals(record)
    assert measured == {
        "build image": [(100.0, 101.0), (101.0, 180.0)], "fetch weights": [(180.5, 262.0)],
        "ship image": [(262.0, 330.0), (330.5, 370.0)], "ship weights": [(371.0, 385.0)], "prewarm": [(400.0, 464.0)],
        "start": [(476.5, 500.0)], "receipt": [(520.0, 524.0)]}
    seconds, chain = critical_path(MUST_FOLLOW, measured)
    assert chain == CHAIN and seconds == pytest.approx(80 + 107.5 + 64 + 23.5 + 4)
    failed = {**record, "deploy_steps": [*record["deploy_steps"][:-1], {**record["deploy_steps"][-1], "ok": False}]}
    with pytest.raises(ValueError, match="'benchmark receipt' failed"):
        phase_intervals(failed)


# ------------------------------------------------------------------------------ the uplink's pace

def test_the_uplink_fetches_the_lab_model_in_about_the_recorded_build_time():
    """UPLINK_KIB_S is derived from recorded figures (bench/bringup.py says which): the lab real pair's
    model, written here as lab/model/make-models.py writes it, at that rate takes the build's 81 s."""
    import sys

    sys.path.insert(0, str(REPO / "lab" / "model"))
    import tiny_llama

    size = sum(len(data) for data in tiny_llama.files((REPO / "roles/receipt/corpus.txt").read_text()).values())
    assert size / 1024 / UPLINK_KIB_S == pytest.approx(RECORDED_BUILD_S, rel=0.05)
