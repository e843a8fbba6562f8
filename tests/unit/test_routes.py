"""Routing converges to the plan (roles/rolling/routes.py): which drained groups are routed again
before any turn, and which turn would drain the last routed group of a model; and the doctor's
router rows (roles/router/control.py)."""
from types import SimpleNamespace

import pytest

from roles.rolling import routes
from roles.rolling.routes import Backend, routing_plan
from roles.router import control
from roles.router.node_config import backend_url
from sparkfleet.config import build_cluster
from sparkfleet.plan_types import FleetPlan
from sparkfleet.refusal import Refusal
from tests.unit.test_router_render import fleet_hosts


def b(group, state, healthy=True, restart=False, model="m"):
    return Backend(group, f"http://{group}:8000", model, state, healthy, restart)


def test_a_healthy_group_an_earlier_run_left_drained_is_routed_again_before_any_turn():
    plan = routing_plan([b("g1", "routed"), b("g2", "drained")], [["g1"], ["g2"]], False)
    assert plan.route_again == ("g2",) and plan.last_routed == {}


@pytest.mark.parametrize("backend", [
    b("g2", "drained", healthy=False),  # it does not serve: its turn repairs it and routes it
    b("g2", "drained", restart=True),  # it restarts in this run: its own turn ends by routing it
    b("g2", "unhealthy"),  # registered: the router routes it again once its health checks pass
    b("g2", "draining"),
    b("g2", None),  # not in the router's config yet: the router's restart (step 12) routes it
])
def test_nothing_else_is_routed_before_the_turns(backend):
    assert routing_plan([b("g1", "routed"), backend], [["g1"], ["g2"]], False).route_again == ()


def test_the_last_routed_group_of_a_model_is_not_drained_and_the_refusal_names_the_others():
    plan = routing_plan([b("g1", "routed", restart=True), b("g2", "unhealthy", healthy=False, restart=False)],
                        [["g1"], ["g2"]], False)
    assert list(plan.last_routed) == ["g1"]
    assert plan.last_routed["g1"] == (
        "serving group g1 is the last group the router routes for model 'm' (g2: unhealthy); draining it for its "
        "restart leaves the fleet's endpoint serving nothing for a whole cold start")
    alone = routing_plan([b("g1", "routed", restart=True)], [["g1"]], False)
    assert "(the only group serving it)" in alone.last_routed["g1"]


def test_an_accepted_outage_is_said_and_not_refused():
    plan = routing_plan([b("g1", "routed", restart=True)], [["g1"]], True)
    assert plan.last_routed == {} and list(plan.accepted) == ["g1"]
    printed = FleetPlan(turns=["g1"], router="spark-a", routing={"g1": "routed"}, outage_accepted=plan.accepted)
    assert printed.router_lines()[1] == f"    g1: {plan.accepted['g1']}; router_outage_accepted is true: its turn drains it anyway"


@pytest.mark.parametrize("backends, turns, refused", [
    # Both serve and restart: g2 is routed while g1 takes its turn, g1 is routed again before g2's.
    ([b("g1", "routed", restart=True), b("g2", "routed", restart=True)], [["g1"], ["g2"]], []),
    # g2 is down: its turn comes first (turn_sequence) and ends routed, so g1 may be drained after it.
    ([b("g1", "routed", restart=True), b("g2", "unhealthy", healthy=False, restart=True)], [["g2"], ["g1"]], []),
    # ... but not before it: g1's drain would leave nothing routed.
    ([b("g1", "routed", restart=True), b("g2", "unhealthy", healthy=False, restart=True)], [["g1"], ["g2"]], ["g1"]),
    # The drained g2 serves: routed again first, so g1 is not the last.
    ([b("g1", "routed", restart=True), b("g2", "drained")], [["g1"], ["g2"]], []),
    # Another model's group routes nothing for this one.
    ([b("g1", "routed", restart=True), b("g2", "routed", model="other")], [["g1"], ["g2"]], ["g1"]),
    # A group that is not routed loses no routing by its drain.
    ([b("g1", "unhealthy", healthy=False, restart=True)], [["g1"]], []),
    # Two groups in one turn (none served): they are not counted for each other.
    ([b("g1", "routed", restart=True), b("g2", "routed", restart=True)], [["g1", "g2"]], ["g1", "g2"]),
])
def test_turns_are_walked_in_order_and_a_group_whose_turn_ended_counts_as_routed(backends, turns, refused):
    assert sorted(routing_plan(backends, turns, False).last_routed) == refused


def test_the_doctor_has_a_router_row_per_group_and_fails_every_state_but_routed():
    groups = {"http://a:8000": "g1", "http://c:8000": "g2"}
    fleet, router = object(), SimpleNamespace(name="spark-a")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(control, "groups_by_url", lambda fleet, router: groups)
        rows = control.doctor_rows(fleet, router, {"http://a:8000": "routed", "http://c:8000": "drained"})
        assert [(r[0], r[1], bool(r[2])) for r in rows] == [("router", "g1", False), ("router", "g2", True)]
        assert "drained: out of routing although the router's config names it" in rows[1][2][0]
        for state in ("draining", "unhealthy", None):
            assert control.doctor_rows(fleet, router, {"http://a:8000": "routed", "http://c:8000": state})[1][2]
        (down,) = control.doctor_rows(fleet, router, None)
        assert down[1] == "spark-a" and "its unit is not active" in down[2][0]


# ------------------------------------------------------------------ the verdict at step 1b (routes.decide)

def group_plans(**groups):
    """group -> (healthy, restart), as the groups' plans say."""
    return {g: SimpleNamespace(healthy=h, restart=r) for g, (h, r) in groups.items()}


@pytest.fixture
def fleet():
    return build_cluster(fleet_hosts())


def urls(fleet, **states):
    return {backend_url(fleet.groups[g].head): s for g, s in states.items()}


def test_the_router_read_at_prepare_decides_what_is_routed_again_and_drained_in_turn_order(fleet):
    """g1 was left drained and serves, unchanged: routed again before any turn; g2 restarts: drained at
    its turn. The router's line is the one the fleet tier reads (tests/fleet/test_lab_fleet.py)."""
    table = urls(fleet, g1="drained", g2="routed")
    plan = routes.decide(fleet, table, group_plans(g1=(True, False), g2=(True, True)), ["g1", "g2"])
    assert (plan.router, plan.route_again, plan.drain, plan.last_routed) == ("spark-b", ("g1",), ("g2",), {})
    printed = FleetPlan(turns=["g1", "g2"], router=plan.router, routing=dict(plan.states), route_again=list(plan.route_again),
                        drain=list(plan.drain))
    assert printed.router_lines() == [
        "--> sparkfleet router on spark-b: g1 drained, g2 routed",
        "    routed again before any turn (an earlier run left them drained; they serve): g1",
        "    out of routing for their restart, routed again at their turn's end: g2"]
    both = routes.decide(fleet, urls(fleet, g1="routed", g2="routed"), group_plans(g1=(True, True), g2=(False, True)),
                         ["g2", "g1"])
    assert both.drain == ("g2", "g1") and both.route_again == ()


def test_a_router_that_is_not_running_drains_nothing_and_one_that_does_not_answer_is_drained_through(fleet):
    restarting = group_plans(g1=(True, True), g2=(True, False))
    down = routes.decide(fleet, None, restarting, ["g1", "g2"])
    assert (down.note, down.drain, down.route_again) == ("not running; it starts with every group (step 12)", (), ())
    mute = routes.decide(fleet, {"error": "connection refused"}, restarting, ["g1", "g2"])
    assert mute.drain == ("g1",) and mute.note == ("not answering (connection refused); routing is not checked "
                                                   "before the turns")
    assert routes.decide(build_cluster(fleet_hosts(router=None)), None, restarting, ["g1", "g2"]) == routes.RoutingPlan()


def test_a_drain_of_the_last_routed_group_is_refused_at_the_plan_naming_the_head_the_key_and_the_fix(fleet):
    plan = routes.decide(fleet, urls(fleet, g1="routed", g2="unhealthy"), group_plans(g1=(True, True), g2=(False, False)),
                         ["g2", "g1"])
    refused = routes.refusal(fleet, plan)
    assert isinstance(refused, Refusal)
    (problem,) = refused.problems
    assert problem.hosts == ("spark-a",) and problem.key == "router_outage_accepted"
    assert problem.detail.startswith("serving group g1 is the last group the router routes for model ")
    assert "set router_outage_accepted: true (allowed: true, false)" in problem.fix
    assert routes.refusal(fleet, routes.decide(fleet, urls(fleet, g1="routed", g2="routed"),
                                               group_plans(g1=(True, True), g2=(True, False)), ["g1", "g2"])) is None
