"""One serving group at a time (roles/rolling): the turns, the check before a turn, and the router
calls at a turn's ends."""
from types import SimpleNamespace

import pytest
from pyinfra.api.exceptions import DeployError
from pyinfra.context import ctx_host, ctx_state

from roles.rolling import checks
from sparkfleet.config import build_cluster
from sparkfleet.plan_types import turn_order
from tests.unit.test_fleet_config import two_pairs


def plans(**healthy):
    return {g: SimpleNamespace(healthy=h, restart=True) for g, h in healthy.items()}


@pytest.fixture
def fleet(monkeypatch):
    fleet = build_cluster(two_pairs("switch"))
    monkeypatch.setattr(checks, "fleet_from_state", lambda state: fleet)
    return fleet


@pytest.mark.parametrize("healthy, turns", [
    ({"g1": True, "g2": True}, ["g1", "g2"]),
    ({"g1": False, "g2": True}, ["g1", "g2"]),  # g2 serves: it keeps answering while g1 takes its turn
    ({"g1": True, "g2": False}, ["g2", "g1"]),  # g2 is repaired (and routed) before g1, which serves, is drained
    ({"g1": False, "g2": False}, ["g1+g2"]),  # none serves (a first bring-up): one turn for all
])
def test_one_group_per_turn_while_any_serves(fleet, healthy, turns):
    assert turn_order(plans(**healthy), list(fleet.groups)) == turns  # decided once, at step 1b (tools/plan.py)
    assert sorted(g for t in turns for g in checks.turn_groups(t)) == ["g1", "g2"]


def test_a_group_with_no_host_in_the_run_still_takes_its_turn_after_the_planned_ones():
    assert turn_order(plans(g2=True), ["g1", "g2", "g3"]) == ["g2", "g1", "g3"]


def test_every_step_reads_the_turns_the_plan_decided():
    """roles/rolling's turn_order is the fleet decision's, read; it takes none of its own."""
    from sparkfleet.decided import FleetDecision, NotDecided
    from sparkfleet.plan_types import FleetPlan

    state = SimpleNamespace()
    with pytest.raises(NotDecided):
        checks.turn_order(state)
    state._sparkfleet_fleet_decision = FleetDecision(summary=FleetPlan(turns=["g2", "g1"]), key=None)
    assert checks.turn_order(state) == ["g2", "g1"]


class Host:
    def __init__(self, name, active=True):
        self.name, self.active, self.commands = name, active, []

    def run_shell_command(self, command, **_):
        text = str(command)
        self.commands.append(text)
        if "is-active" in text:
            return True, SimpleNamespace(stdout="active\n" if self.active else "inactive\n")
        return True, SimpleNamespace(stdout_lines=['[{"url": "u", "state": "drained"}]'], stderr_lines=[])


def state_with(*hosts, failed=()):
    by_name = {h.name: h for h in hosts}
    return SimpleNamespace(inventory=SimpleNamespace(get_host=by_name.__getitem__),
                           failed_hosts={by_name[n] for n in failed})


@pytest.mark.parametrize("active", [True, False])
def test_a_turn_drains_at_the_router_only_when_it_runs(active):
    router = Host("spark-a", active)
    with ctx_state.use(state_with(router)):
        checks.drain("g2", "spark-a", "http://198.18.0.13:8000", 30)
    drains = [c for c in router.commands if " drain " in c]
    if active:
        assert drains == ["python3 /usr/local/libexec/sparkfleet/sfl_router.py drain /etc/sparkfleet/router.json "
                          "http://198.18.0.13:8000 30"]
    else:
        assert drains == []


def test_a_group_that_does_not_serve_after_its_turn_is_not_put_back_and_stops_the_run():
    router, head = Host("spark-a"), Host("spark-c")
    head.run_shell_command = lambda command, **_: (False, SimpleNamespace(stdout="chat completion answered 500",
                                                                          stderr=""))
    with ctx_state.use(state_with(router, head)), ctx_host.use(head):
        with pytest.raises(DeployError, match="serving group g2 did not come back: chat completion answered 500; "
                                              "the next group is not started"):
            checks.prove_and_undrain("g2", "probe", "spark-a", "http://198.18.0.13:8000", 30)
    assert not [c for c in router.commands if "undrain" in c]


def test_a_turn_is_refused_when_a_host_of_an_earlier_group_failed(fleet):
    state = state_with(Host("spark-a"), Host("spark-b"), failed=["spark-b"])
    with ctx_state.use(state):
        with pytest.raises(DeployError, match="serving group g2 is not started: spark-b of an earlier group"):
            checks.previous_came_back("g2", ["g1"])
        checks.previous_came_back("g1", [])  # nothing earlier: nothing to check
