"""The serving pair as a whole: what each rank gets, whether the pair must restart, and the waits.

A TP pair is one thing: a rank restarted alone leaves its peer hung while /health may stay green.
So the restart decision is taken once, at prepare time, for the whole pair: when any rank's unit,
environment or image changes, or any rank's unit or container is not running, the pair restarts,
head stopped first, workers started first, head last.
"""
import time
from dataclasses import dataclass

from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.files import Sha1File

from roles.guards.kv_budget import engine_kv_tokens
from roles.serving.facts import (
    HeadHealth,
    RoceGids,
    UnitState,
    health_command,
    is_serving,
    nccl_auto_gid_index,
    pick_gid_index,
)
from sparkfleet.inventory import cluster_from_state
from sparkfleet.model.engine import (
    IMAGE_VAR,
    WORKER_UNIT,
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
    # Besides: SGLang's logging config, without the line that prints the API key.
    return {env_file: (env_text, "0600"), unit_path(node): (unit_text, "0644"), **mounted_files(profile, node)}


def rendered_paths(node) -> list[str]:
    """Where rendered_files() writes on `node`, in its order, from data alone: the facts read at
    prepare (each file's sha1) need no render."""
    env_file = env_file_path(node, node.serving_dir)
    return [env_file, unit_path(node), *mounted_files(node_profile(node), node)]


def resolve_gid_index(node_host, node) -> int | None:
    """This rank's RoCE v2 GID index, read from sysfs on every deploy; None without RDMA, and None
    with both halves of the port (NCCL then chooses per HCA: sparkfleet/model/engine.py), once each
    half's address is the GID NCCL will choose on its HCA."""
    if not node.rdma_hca:
        return None
    indices = [half_gid_index(node_host, node, half) for half in node.fabric_halves if half.hca]
    return indices[0] if len(indices) == 1 else None


def half_gid_index(node_host, node, half) -> int:
    """The index of ::ffff:<the half's address>, RoCE v2, on the half's netdev; with both halves,
    also the one NCCL's own choice (NCCL_IB_GID_INDEX=-1) lands on, or the deploy stops."""
    entries = node_host.get_fact(RoceGids, hca=half.hca)
    index = pick_gid_index(entries, half.ip, half.netdev)
    seen = "; ".join(f"{e['index']}: {e['gid']} {e['type']} {e['ndev']}" for e in entries) or "no GIDs"
    if index is None:
        raise DeployError(
            f"{node.name}: no RoCE v2 GID for {half.ip} on {half.hca}/{half.netdev} "
            f"(sysfs shows {seen}); is the fabric address up?"
        )
    if len(node.rdma_hcas) > 1:
        chosen = nccl_auto_gid_index(entries)
        if chosen != index:
            raise DeployError(
                f"{node.name}: NCCL would choose GID index {chosen} on {half.hca}, not {index} ({half.ip} on "
                f"{half.netdev}): with two HCAs NCCL_IB_GID_INDEX is -1 and NCCL takes the first IPv4 RoCE v2 GID "
                f"(sysfs shows {seen}); remove the other IPv4 address from {half.netdev}"
            )
    return index


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
    # (roles/rolling), so the others keep answering meanwhile.
    healthy = state.inventory.get_host(cluster.head.name).get_fact(HeadHealth, port=profile.port)
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


def wait_for_container(unit: str, timeout_s: int = 120) -> None:
    """Operation body: until the rank's container runs (the worker is up and dialling the head)."""

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ok, out = host.run_shell_command(StringCommand(f"docker inspect --format '{{{{.State.Status}}}}' {unit}"))
        if ok and out.stdout.strip() == "running":
            return
        time.sleep(2)
    _, log = host.run_shell_command(StringCommand(f"journalctl -u {unit} -n 20 --no-pager"))
    raise DeployError(f"{host.name}: {unit} container not running after {timeout_s} s:\n{log.stdout}")


def engine_kv_log_command(unit: str) -> str:
    """The KV-cache lines the unit's current run logged, and no earlier run's: the unit's journal since
    boot also holds the engine it replaced, whose line (the real vLLM's 131,072 tokens, before a switch
    to an SGLang profile, which logs none) would be read as this engine's. systemd gives each start an
    InvocationID, and journald stamps the unit's output with it (_SYSTEMD_INVOCATION_ID)."""
    return (f"id=$(systemctl show -p InvocationID --value {unit}); [ -n \"$id\" ] && "
            f"journalctl _SYSTEMD_INVOCATION_ID=\"$id\" --no-pager -o cat | grep 'KV cache size' | tail -n 20")


def check_engine_kv(host, unit: str, max_model_len: int) -> None:
    """The engine's own KV-cache size (from its start-up log) must hold max_model_len tokens."""

    _, log = host.run_shell_command(StringCommand(engine_kv_log_command(unit)))
    tokens = engine_kv_tokens(log.stdout)
    if tokens is None:
        logger.info(f"    [{host.name}] the engine logged no 'GPU KV cache size'; KV budget not verified")
    elif tokens < max_model_len:
        raise DeployError(
            f"{host.name}: the engine's KV cache holds {tokens} tokens < max_model_len {max_model_len}; "
            f"one long request would not fit (lower max_model_len or raise gpu_memory_utilization)"
        )
    else:
        logger.info(f"    [{host.name}] engine KV cache {tokens} tokens >= max_model_len {max_model_len}")


# Asked without the key, each must answer 401: the key check's own route, and the two inference
# routes (vLLM 0.33.0 serves POST /invocations with no key of its own: sparkfleet/model/api_proxy.py).
KEYLESS_PROBES = (("GET", "/v1/models"), ("POST", "/invocations"), ("POST", "/v1/chat/completions"))


def key_probe_command(port: int, curl_config: str) -> str:
    """The codes of KEYLESS_PROBES without the key, then GET /v1/models with it, on the head (the key
    from curl's root-only config file, never on a command line)."""
    base = f"http://127.0.0.1:{int(port)}"
    fmt = "-sS -m 10 -o /dev/null -w '%{http_code}'"
    keyless = " ".join(
        f"$(curl {fmt} -X {method}{' -H content-type:application/json -d {}' if method == 'POST' else ''} "
        f"{base}{path} 2>/dev/null)" for method, path in KEYLESS_PROBES)
    return f"echo {keyless} $(curl -K {curl_config} {fmt} {base}/v1/models 2>/dev/null)"


def check_api_key(host, port: int, curl_config: str) -> None:
    """The API refuses every probe without the key (401) and serves one with it (200)."""
    _, out = host.run_shell_command(StringCommand(key_probe_command(port, curl_config)))
    want = ["401"] * len(KEYLESS_PROBES) + ["200"]
    codes = (out.stdout.strip().split() + ["none"] * len(want))[:len(want)]
    if codes != want:
        answers = ", ".join(f"{m} {p} {c}" for (m, p), c in zip(KEYLESS_PROBES, codes))
        raise DeployError(
            f"{host.name}: without the API key {answers}; with it GET /v1/models {codes[-1]}; want 401 for each "
            f"and 200 (the API proxy must require the key in {curl_config}'s header on every path but /health)"
        )
    logger.info(f"    [{host.name}] {', '.join(f'{m} {p}' for m, p in KEYLESS_PROBES)}: 401 without the API key; "
                f"GET /v1/models 200 with it")


def container_identity_command(container: str) -> str:
    """`<running> <started at> <pid>` of a container, or `gone`."""
    return f"docker inspect -f '{{{{.State.Running}}}} {{{{.State.StartedAt}}}} {{{{.State.Pid}}}}' {container} 2>/dev/null || echo gone"


def worker_lost(before: str, now: str) -> bool:
    """Whether a worker's container seen as `before` at the start of the wait is no longer that running
    container (gone, stopped, or another one: systemd restarted the unit after its engine exited)."""
    return now != before or not now.startswith("true ")


def wait_for_health(unit: str, port: int, timeout_s: int, endpoint: str, max_model_len: int,
                    curl_config: str | None = None, key_file: str | None = None, workers: tuple[str, ...] = ()) -> None:
    """Operation body: poll the head's /health with progress, bounded; then prove the API key is
    required; print the endpoint and where its key is. A worker whose engine exits meanwhile ends the
    wait at once, naming it: found by the lab's real vLLM, a head whose worker died while the pair
    started waits for it for over ten minutes, deaf to SIGTERM, so the bound alone would spend all of
    serving_health_timeout_s (20 min by default) before saying anything."""

    peers = {name: state.inventory.get_host(name) for name in workers}
    identity = StringCommand(container_identity_command(WORKER_UNIT))

    def seen(peer) -> str:
        ok, out = peer.run_shell_command(identity)
        return out.stdout.strip() if ok else "unreachable"

    at_start = {name: seen(peer) for name, peer in peers.items()}
    start = time.monotonic()
    last_report = 0.0
    code = ""
    while (elapsed := time.monotonic() - start) < timeout_s:
        for name, peer in peers.items():
            now = seen(peer)
            if worker_lost(at_start[name], now):
                _, log = peer.run_shell_command(StringCommand(f"journalctl -u {WORKER_UNIT} -n 30 --no-pager -o cat"))
                raise DeployError(
                    f"{name}: the worker's engine exited while the pair was starting (its container: "
                    f"{at_start[name]} -> {now}), {elapsed:.0f} s into the head's start; the head cannot finish "
                    f"starting without it (a vLLM head waits for a lost worker, deaf to SIGTERM). A re-run "
                    f"restarts the pair. The worker's last lines:\n{log.stdout}")
        ok, out = host.run_shell_command(StringCommand(health_command(port)))
        code = out.stdout.strip() if ok else "no answer"
        if code == "200":
            key = f" (API key: root-only file {key_file} on {host.name})" if key_file else ""
            logger.info(f"    [{host.name}] /health 200 after {elapsed:.0f} s; serving at {endpoint}{key}")
            if curl_config:
                check_api_key(host, port, curl_config)
            check_engine_kv(host, unit, max_model_len)
            return
        if elapsed - last_report >= 15:
            logger.info(f"    [{host.name}] waiting for /health: {code or 'no answer'} ({elapsed:.0f} s of {timeout_s} s)")
            last_report = elapsed
        time.sleep(3)
    _, log = host.run_shell_command(StringCommand(f"journalctl -u {unit} -n 30 --no-pager"))
    raise DeployError(f"{host.name}: /health not 200 after {timeout_s} s (last: {code}):\n{log.stdout}")
