"""Run every guard over live facts and the rendered pair; print one table; refuse with the numbers."""
from pyinfra import logger
from pyinfra.api.exceptions import DeployError

from sparkfleet.decided import decisions
from sparkfleet.model.engine_advisories import advisories_refused
from sparkfleet.model.guard_rules import GIB, license_gate, memory_admission, refused_settings, top_consumers
from roles.guards.facts import ContainerMemory, ModelFiles, ProcessMemory
from roles.guards.kv_budget import PP_LAYER_PARTITION, kv_budget
from sparkfleet.model.engine import engine_args, env_file_path, pinned_env, unit_name
from sparkfleet.model.serving import node_profile
from sparkfleet.model.weights import model_dir
from sparkfleet.inventory import cluster_from_state
from sparkfleet.keyvalue import key_values
from sparkfleet.once import active_hosts, at_once, once_per_run, per_host
from sparkfleet.verdicts import NodeMemory


def _guards(state, files: dict[str, dict[str, tuple[str, str]]], memory: dict[str, NodeMemory]) -> list[str]:
    """files: node -> {path: (text, mode)} of what roles/serving writes there, as the plan rendered it
    (roles/serving/checks.py decide); memory: node -> its memory as preflight read it (the plan's)."""
    cluster = cluster_from_state(state)
    problems, rows = [], []
    in_use = per_host(state, lambda h: _memory_facts(h, cluster.node(h.name)))
    for node_host in active_hosts(state):
        node = cluster.node(node_host.name)
        profile = node_profile(node)
        m = memory[node.name]
        env_text = files[node.name][env_file_path(node, node.serving_dir)][0]
        problems += refused_settings(
            node.name, engine_args(profile, cluster, node), key_values(env_text.splitlines()),
            node.is_head, profile.engine, node.allow_ray_backend,
        )
        consumers = top_consumers(in_use[node.name]["processes"])
        engine_use = in_use[node.name]["engine_bytes"]
        total, free = m.total_gib, m.available_gib
        if engine_use is None:  # the engine will start from nothing: it must fit in what is free now
            refusal = memory_admission(node.name, profile.gpu_memory_utilization, total, free, node.guard_min_headroom_gib,
                                       profile=node.serving_profile)
            verdict = "refused" if refusal else "fits"
            if refusal:
                problems.append(refusal)
        else:
            verdict = f"engine running ({engine_use / GIB:.2f} GiB)"
        rows.append(
            f"{node.name:<10} {profile.gpu_memory_utilization:.2f} x {total:.2f} = "
            f"{profile.gpu_memory_utilization * total:6.2f} GiB needed, {free:6.2f} GiB free: {verdict}; "
            f"largest outside the engine: " + (", ".join(f"{c} {g:.2f} GiB" for c, g in consumers) or "none")
        )
    head_facts = in_use.get(cluster.head.name) or _memory_facts(state.inventory.get_host(cluster.head.name), cluster.head)
    problems += _kv_budget(cluster, memory, rows, head_facts)
    head_profile = node_profile(cluster.head)
    gate = license_gate(head_profile, cluster.head.deployment_purpose, cluster.head.drafter_license_acknowledged)
    if gate:
        problems.append(gate)
    logger.info("--> sparkfleet guards:\n" + "\n".join(rows) + "\n")
    return problems


def _memory_facts(node_host, node) -> dict:
    """One node's facts for the guards (each node's gathered at once with the others'): its
    processes, its engine's use, and on the head the model's and the drafter's files."""
    reads = {
        "processes": lambda: node_host.get_fact(ProcessMemory),
        "engine_bytes": lambda: node_host.get_fact(ContainerMemory, container=unit_name(node)),
    }
    if node.is_head:
        profile = node_profile(node)
        reads["model"] = lambda: node_host.get_fact(ModelFiles, path=model_dir(node, profile.model))
        if profile.speculative and profile.speculative.draft_model:
            reads["drafter"] = lambda: node_host.get_fact(ModelFiles, path=model_dir(node, profile.speculative.draft_model))
    return dict(zip(reads, at_once(*reads.values())))  # at once: one after the other, a round trip each


def _kv_budget(cluster, memory: dict[str, NodeMemory], rows, head_facts: dict) -> list[str]:
    """The longest context that fits per rank, from config.json and the weights on the head."""
    import json

    profile = node_profile(cluster.head)
    model = head_facts["model"]
    if not model["config"]:
        rows.append(f"kv budget: not checked (no {model_dir(cluster.head, profile.model)}/config.json on the head yet)")
        return []
    drafter_bytes = head_facts["drafter"]["weights_bytes"] if "drafter" in head_facts else 0
    problems = []
    for node in cluster.nodes:
        if node.name not in memory:
            continue
        tokens, refusal = kv_budget(
            node.name,
            utilization=profile.gpu_memory_utilization,
            mem_total_gib=memory[node.name].total_gib,
            weights_gib=model["weights_bytes"] / GIB,
            drafter_gib=drafter_bytes / GIB,
            reserve_gib=node.guard_kv_reserve_gib,
            config=json.loads(model["config"]),
            kv_cache_dtype=profile.kv_cache_dtype,
            # Per rank for the group's TP x PP split: its stage's layers, its share (kv_budget).
            engine=profile.engine,
            tensor_parallel_size=profile.tensor_parallel_size,
            pipeline_parallel_size=profile.pipeline_parallel_size,
            rank=node.rank,
            max_model_len=profile.max_model_len,
            layer_partition=pinned_env(profile, node).get(PP_LAYER_PARTITION[profile.engine]),
        )
        rows.append(f"kv budget on {node.name}: ~{tokens} tokens fit (max_model_len {profile.max_model_len})")
        if refusal:
            problems.append(refusal)
    return problems


def guard_problems(state, files: dict[str, dict[str, tuple[str, str]]], memory: dict[str, NodeMemory]) -> list[str]:
    """Every guard's refusal for the group, once per run; `files`: the ranks' rendered files, `memory`:
    each node's memory, both the run's plan's."""
    return once_per_run(state, "guards", lambda: _guards(state, files, memory))


def run_guards(state) -> None:
    """Step 2: the guards, on the ranks' files as the run's plan (step 1b) rendered them."""
    plan = decisions(state)
    problems = guard_problems(state, plan.serving.files, plan.memory)
    # Known-vulnerable engines (sparkfleet/model/engine_advisories.py), for the version the image this
    # run serves ships, where the head already holds it; one the run builds is held to them at step 7a.
    head = cluster_from_state(state).head
    if plan.summary.engine_version:
        problems += [f"{head.serving_group or 'pair'}: {line}" for line in advisories_refused(
            node_profile(head).engine, plan.summary.engine_version, head.serving_engine_advisories_acknowledged)]
    if problems:
        raise DeployError("guards refused the deploy, nothing was changed:\n  " + "\n  ".join(problems))
