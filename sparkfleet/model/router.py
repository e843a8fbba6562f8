"""Data of roles/router: one endpoint for every serving group that serves the same model.

Part of sparkfleet/config.py's NodeConfig. The fleet has one router: its keys are the same on every
node (router_problems, run with the other cluster checks before any connection), router_node names
a node of the inventory, and router_port is free on that node.
"""
from typing import Literal

from pydantic import BaseModel, Field

from sparkfleet.model.serving import node_profile
from sparkfleet.refusal import Problem

# The router's pinned release: smg (the Shepherd Model Gateway), from PyPI. Each version's wheels
# and their sha256 are in roles/router/wheels.py; only those versions are accepted.
ROUTER_VERSIONS = ("1.13.0",)


class RouterData(BaseModel):
    router_node: str | None = Field(
        None, description="the inventory name of the node that runs the router: one endpoint in front of every "
        "serving group serving the same model as that node's group; none: no router. See docs/fleet.md#router"
    )
    router_port: int = Field(
        8100, ge=1, le=65535, description="the router's port on `router_node` (every address; reached from "
        "`firewall_api_allowed_networks`, with the API key): its gate, HAProxy, over TLS, in front of smg on "
        "`router_smg_port`; must differ from every port that node listens on. See docs/fleet.md#router"
    )
    router_smg_port: int = Field(
        18100, ge=1024, le=65535, description="smg's own HTTP port on `router_node`, on 127.0.0.1 only, behind the "
        "router's gate on `router_port` (only root's and HAProxy's sockets reach it); must differ from every port "
        "that node listens on. See docs/security.md#the-router-behind-the-same-gate"
    )
    router_metrics_port: int = Field(
        29000, ge=1024, le=65535, description="the router's Prometheus metrics (smg's exporter), on `router_node`'s "
        "127.0.0.1 only; must differ from every port that node listens on"
    )
    router_health_check_interval_s: int = Field(
        10, ge=1, description="seconds between the router's health checks of each group's head (`GET /health`)"
    )
    router_health_check_timeout_s: int = Field(
        5, ge=1, description="seconds the router waits for one health check's answer"
    )
    router_health_failure_threshold: int = Field(
        2, ge=1, description="consecutive failed health checks after which the router stops routing to a group: "
        "within this x (`router_health_check_interval_s` + `router_health_check_timeout_s`)"
    )
    router_health_success_threshold: int = Field(
        2, ge=1, description="consecutive passed health checks after which the router routes to a recovered group "
        "again"
    )
    router_outage_accepted: bool = Field(
        False, description="true: a group's turn may take the last group the router routes for its model out of "
        "routing (the endpoint then serves nothing for its cold start); false: such a run is refused before any "
        "change, naming the group. See docs/fleet.md#a-fleet-serving-groups"
    )
    router_version: Literal[ROUTER_VERSIONS] = Field(
        "1.13.0", description="the pinned smg release; its wheels' sha256 per architecture are in "
        "`roles/router/wheels.py`"
    )


ROUTER_KEYS = tuple(RouterData.model_fields)


def router_problems(nodes) -> list[Problem]:
    """The fleet has one router: the same router_* settings on every node, a router_node that is a node
    of the inventory, a router_port free on it, and one API key file setting for the fleet (the router
    presents one key to every group's head: roles/router/fleet_key.py)."""
    problems: list[Problem] = []
    names = [n.name for n in nodes]
    for key in ROUTER_KEYS:
        values = {getattr(n, key) for n in nodes}
        if len(values) > 1:
            found = ", ".join(f"{n.name}={getattr(n, key)!r}" for n in nodes)
            problems.append(Problem(f"key '{key}' differs between nodes ({found}); the fleet has one router",
                                    names, key=key, fix="set it once for every node (group_data)"))
    if problems or not nodes or nodes[0].router_node is None:
        return problems
    wanted = nodes[0].router_node
    router = next((n for n in nodes if n.name == wanted), None)
    if router is None:
        return [Problem(f"key 'router_node' = {wanted!r} is not a node of the inventory; allowed: "
                        f"{', '.join(sorted(names))} (or none: no router)", names, key="router_node",
                        fix="name one of the inventory's nodes")]
    files = {n.serving_api_key_file for n in nodes}
    if len(files) > 1:
        found = ", ".join(f"{n.name}={n.serving_api_key_file!r}" for n in nodes)
        problems.append(Problem(
            f"key 'serving_api_key_file' differs between nodes ({found}); behind the router the fleet has one API "
            f"key, the router group's head's, written by the deploy to every routed head and to {wanted}", names,
            key="serving_api_key_file", fix="set it once for every node (group_data), or not at all"))
    taken = {router.fanout_rsync_port: "fanout_rsync_port", router.fanout_http_port: "fanout_http_port"}
    if router.is_head:
        try:
            profile = node_profile(router)
        except Exception:  # a profile that does not load is refused by the serving checks
            profile = None
        taken[router.docker_registry_port] = "docker_registry_port"
        if profile is not None:
            taken[profile.port] = f"profile {profile.name}'s port"
            taken[profile.master_port] = f"profile {profile.name}'s master_port"
            taken[router.api_proxy_engine_port] = "api_proxy_engine_port"
    # The router's own ports, each against everything before it.
    for key in ("router_port", "router_smg_port", "router_metrics_port"):
        port = getattr(router, key)
        if port in taken:
            problems.append(Problem(
                f"key '{key}' = {port} is also {taken[port]} on {wanted}; every port that listens on the router node "
                f"must differ", [wanted], key=key, fix=f"set {key} to a free port"))
        taken.setdefault(port, key)
    return problems
