"""The plan of captured machines: the deploy's readers and verdicts run on a `sparkfleet capture`
bundle (sparkfleet/capture.py) instead of live nodes. Above the roles, like tools/plan.py."""
from __future__ import annotations

from pyinfra.context import ctx_state

from sparkfleet.capture import replay_facts, replay_state
from sparkfleet.inventory import fleet_from_state
from sparkfleet.once import per_group
from tools.plan import decide_group, fleet_key_decision, group_facts


def replay_plan(bundle: dict, inventory: str | None = None) -> dict:
    """group name -> the deploy's decisions (tools/plan.py decide_group) taken from the bundle's
    facts alone: what a deploy of the captured machines would have done when they were captured."""
    state = replay_state(bundle, inventory)
    with replay_facts(bundle), ctx_state.use(state):
        key = fleet_key_decision(state)
        return per_group(state, lambda group: decide_group(group_facts(state, group), group, key,
                                                                 fleet_from_state(state)))
