"""The serving pair as a whole: what each rank gets and whether the pair must restart (the waits
that prove it serves: roles/serving/ready.py).

A TP pair is one thing: a rank restarted alone leaves its peer hung while /health may stay green.
So the restart decision is taken once, at prepare time, for the whole pair: when any rank's unit,
environment or image changes, or any rank's unit or container is not running, the pair restarts,
head stopped first, workers started first, head last.
"""
from dataclasses import dataclass

from pyinfra.facts.files import Sha1File

from roles.serving.facts import HeadHealth, UnitState, is_serving
from sparkfleet.model.tls import api_base, curl_tls
from sparkfleet.inventory import cluster_from_state
from sparkfleet.model.engine import (
    IMAGE_VAR,
    env_file_path,
    exec_start,
    image_pin_path,
    mounted_files,
    rank_env,
    unit_name,
)
from sparkfleet.model.monitoring import TEXTFILE_DIR
from sparkfleet.model.serving import SFL_GID, node_profile
from sparkfleet.once import per_host
from sparkfleet.render import render, sha1_text
from sparkfleet.roce_gid import resolve_gid_index
from sparkfleet.verdicts import PairState  # noqa: F401 (this role's verdict, on the ground floor)


def unit_path(node) -> str:
    return f"/etc/systemd/system/{unit_name(node)}.service"


def rendered_files(cluster, node, gid_index: int | None) -> dict[str, tuple[str, str]]:
    """{path on the node: (text, mode)} of what roles/serving writes on `node`."""
    profile = node_profile(node)
    env_file = env_file_path(node, node.serving_dir)
    env = rank_env(profile, cluster, node, gid_index)
    unit_text = render(
        "serving",
        unit_path(node),
        node=node,
        cluster=cluster,
        profile=profile,
        unit=unit_name(node),
        firewall_enabled=node.firewall_enabled,
        env_file=env_file,
        gid_script=SFL_GID,
        gid_textfile_dir=TEXTFILE_DIR if node.monitoring_enabled else None,
        drop_caches=node.serving_drop_caches,
        exec_start=exec_start(profile, cluster, node, env_file),
        image_file=None if node.is_head else image_pin_path(node),
        image_var=IMAGE_VAR,
    )
    env_text = render("serving", "/etc/sparkfleet/rank.env", node=node, profile=profile, env=env)
    # Besides: SGLang's logging config, without the line that prints its resolved arguments.
    return {env_file: (env_text, "0600"), unit_path(node): (unit_text, "0644"), **mounted_files(profile, node)}


def rendered_paths(node) -> list[str]:
    """Where rendered_files() writes on `node`, in its order, from data alone: the facts read at
    prepare (each file's sha1) need no render."""
    env_file = env_file_path(node, node.serving_dir)
    return [env_file, unit_path(node), *mounted_files(node_profile(node), node)]


@dataclass(frozen=True)
class ServingFacts:
    """What the verdict reads, at prepare: per rank its RoCE GID index (as resolved from sysfs), the
    sha1 of each file roles/serving writes there, its unit (UnitState); the head's /health."""
    gid_index: dict[str, int | None]
    sums: dict[str, dict[str, str | None]]  # node -> path -> sha1 (None: absent)
    units: dict[str, dict]
    healthy: bool


def serving_facts(state) -> ServingFacts:
    """Every fact decide() reads, every rank at once."""
    cluster = cluster_from_state(state)
    profile = node_profile(cluster.head)

    def read(node_host):
        node = cluster.node(node_host.name)
        gid = resolve_gid_index(node_host, node)
        return gid, {path: node_host.get_fact(Sha1File, path=path) for path in rendered_paths(node)}, \
            node_host.get_fact(UnitState, unit=unit_name(node))

    read_by_node = per_host(state, read)
    # Whether the head serves now, restart or not: a group that serves is upgraded in its own turn
    # (roles/rolling), so the others keep answering meanwhile. Through the proxy as clients ask it
    # (TLS, verified), or in plain HTTP from a proxy deployed before TLS (this run's step 7b2 moves it).
    head = cluster.head
    healthy = state.inventory.get_host(head.name).get_fact(
        HeadHealth, api=api_base(head, profile.port), tls=curl_tls(head),
        plain_port=profile.port if head.tls_enabled else None)
    return ServingFacts(gid_index={n: g for n, (g, _, _) in read_by_node.items()},
                        sums={n: sums for n, (_, sums, _) in read_by_node.items()},
                        units={n: unit for n, (_, _, unit) in read_by_node.items()}, healthy=healthy)


def decide(facts: ServingFacts, cluster) -> PairState:
    """This role's own verdict, a pure function of the facts: each rank's files as rendered against
    what the node has, each unit serving or not, the head's /health. Whether the pair restarts is
    this and every other role's verdict together (tools/plan.py composes it: restart_reasons)."""
    reasons, rendered = [], {}
    for name, sums in facts.sums.items():
        node = cluster.node(name)
        files = rendered[name] = rendered_files(cluster, node, facts.gid_index[name])
        for path, (text, _mode) in files.items():
            if sums.get(path) != sha1_text(text):
                reasons.append(f"{name}: {path} changed")
        unit = facts.units[name]
        if not is_serving(unit):
            reasons.append(
                f"{name}: {unit_name(node)} is {unit.get('active') or 'unknown'}, "
                f"container {unit.get('container') or 'unknown'}"
            )
    return PairState(restart=bool(reasons), reasons=tuple(reasons), files=rendered, healthy=facts.healthy)
