"""The end of one serving group's turn (deploy.py, after the turn's steps 7c-11, on the hosts of the
turn's group): a real request through both ranks proves the group serves, then it is routed again
(when a router routes to it); the next turn starts only then (roles/rolling/turn_start.py)."""
from pyinfra import host, state
from pyinfra.operations import python

from roles.rolling.checks import prove_and_undrain, drained_at
from roles.serving.api_key import curl_config
from sparkfleet.chat_request import request_command
from sparkfleet.decided import decisions
from sparkfleet.inventory import cluster_from_state
from sparkfleet.model.serving import node_profile
from sparkfleet.model.tls import api_base, curl_tls

node = cluster_from_state(state).node(host.name)
restart = decisions(state).serving.restart  # the group's plan (tools/plan.py): it stopped and started
group = node.serving_group
drained = drained_at(state, group)  # the plan's: drained at its turn's start, routed again here
router, url = drained if drained else (None, None)
profile = node_profile(node)
body = {"model": profile.api_model_name, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
# A real request (both ranks answer it), its HTTP code checked; the key from curl's root-only config.
probe = f"code=$({request_command(api_base(node, profile.port), curl_tls(node), body, curl_config(node))} 2>/dev/null); " \
        f"test \"$code\" = 200 && echo \"chat completion 200\" || {{ echo \"chat completion answered $code\"; false; }}"
python.call(
    name=f"Prove serving group {group} serves, and put it back in the router",
    function=prove_and_undrain,
    group=group,
    probe=probe,
    router=router.name if router else None,
    url=url,
    timeout_s=float(node.serving_health_timeout_s),
    _if=lambda: node.is_head and restart,
)
