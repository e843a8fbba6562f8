"""The serving pair started and proven, as operation bodies: a rank's container up, the head's /health
200 within its bound (a worker lost meanwhile ends the wait at once, naming it), the API key required
on every inference route, and the engine's own KV cache holding max_model_len tokens.

roles/serving runs them after it restarts the pair; roles/kernel_cache's prewarm, which restarts the
pair around its warm-up, runs the same proof (roles/serving/checks.py decides; this module only waits).
"""
import time

from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError

from roles.guards.kv_budget import engine_kv_tokens
from roles.serving.facts import health_command
from sparkfleet.inventory import cluster_from_state
from sparkfleet.model.engine import WORKER_UNIT
from sparkfleet.progress import Ticker, phase_text
from sparkfleet.run_failure import RunFailed, RunFailure, journal


# Seconds between two polls of a rank's container or of the head's /health, each one short command over
# the deploy's open SSH connection: a pair that is up is seen within a second, not up to 3 s later (every
# restart waits once for each; the lab's `make test` restarts a pair about 60 times).
POLL_S = 1.0


def _node(name: str):
    """The config model's node `name` (its management address: where the operator's ssh goes)."""
    return cluster_from_state(state).node(name)


def container_failure(node, unit: str, timeout_s: int) -> RunFailure:
    return RunFailure(
        host=node.name, waited_for=f"{unit}'s container to run (up to {timeout_s} s after its start)",
        what=f"{unit} container not running after {timeout_s} s", log=journal(node.management_address, unit),
        key="serving_profile",
        next_step=(f"read the unit's log for why docker did not start the engine (the image, a mount, the GPU "
                   f"runtime); fix it, or choose another serving_profile, then re-deploy (the pair restarts)"))


def health_failure(node, unit: str, timeout_s: int, code: str) -> RunFailure:
    return RunFailure(
        host=node.name, waited_for=f"the head's /health to answer 200 (up to {timeout_s} s)",
        what=f"/health not 200 after {timeout_s} s (last: {code or 'no answer'})",
        log=journal(node.management_address, unit), key="serving_health_timeout_s",
        next_step=(f"read the head's log: an engine error (out of memory, NCCL, a model that does not load) is "
                   f"fixed in data or the profile, then re-deploy (the pair restarts); if it was still loading, "
                   f"raise serving_health_timeout_s (now {timeout_s})"))


def worker_lost_failure(node, head: str, before: str, now: str, elapsed: float) -> RunFailure:
    return RunFailure(
        host=node.name, waited_for=f"the head's /health while the pair started (the worker's container: {before})",
        what=(f"the worker's engine exited while the pair was starting ({elapsed:.0f} s into the head's start; its "
              f"container: {before} -> {now}); {head} cannot finish starting without it"),
        log=journal(node.management_address, WORKER_UNIT), key="serving_profile",
        next_step=(f"read the worker's log for why its engine exited (out of memory, NCCL, the fabric); fix it "
                   f"(the profile: serving_profile, or the node), then re-deploy: a re-run restarts the pair"))


def kv_failure(node, unit: str, tokens: int, max_model_len: int) -> RunFailure:
    profile = node.serving_profile
    return RunFailure(
        host=node.name, waited_for=f"the engine's KV cache to hold max_model_len {max_model_len} tokens",
        what=f"the engine's KV cache holds {tokens} tokens < max_model_len {max_model_len}",
        log=journal(node.management_address, unit), key="serving_profile",
        next_step=(f"one long request would not fit: lower max_model_len or raise gpu_memory_utilization in "
                   f"roles/serving/profiles/{profile}.yaml (a profile's fields: no data key overrides them; your "
                   f"site's profiles/{profile}.yaml with `base: {profile}` and the fields changes only them), or set serving_profile to one that fits; then re-deploy"))


def wait_for_container(unit: str, timeout_s: int = 120) -> None:
    """Operation body: until the rank's container runs (the worker is up and dialling the head)."""

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ok, out = host.run_shell_command(StringCommand(f"docker inspect --format '{{{{.State.Status}}}}' {unit}"))
        if ok and out.stdout.strip() == "running":
            return
        time.sleep(POLL_S)
    _, log = host.run_shell_command(StringCommand(f"journalctl -u {unit} -n 20 --no-pager"))
    raise RunFailed(container_failure(_node(host.name), unit, timeout_s), log.stdout)


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
        raise RunFailed(kv_failure(cluster_from_state(state).node(host.name), unit, tokens, max_model_len))
    else:
        logger.info(f"    [{host.name}] engine KV cache {tokens} tokens >= max_model_len {max_model_len}")


# Asked without the key, each must answer 401: the key check's own route, and the two inference
# routes (vLLM 0.33.0 serves POST /invocations with no key of its own: sparkfleet/model/api_proxy.py).
KEYLESS_PROBES = (("GET", "/v1/models"), ("POST", "/invocations"), ("POST", "/v1/chat/completions"))


def key_probe_command(api: str, tls: str, curl_config: str) -> str:
    """The codes of KEYLESS_PROBES without the key, then GET /v1/models with it, on the head, through the
    proxy as clients reach it (`api`, its certificate verified with `tls`: sparkfleet/model/tls.py); the
    key from curl's root-only config file, never on a command line."""
    base = api
    fmt = f"-sS -m 10 -o /dev/null -w '%{{http_code}}'{' ' + tls if tls else ''}"
    keyless = " ".join(
        f"$(curl {fmt} -X {method}{' -H content-type:application/json -d {}' if method == 'POST' else ''} "
        f"{base}{path} 2>/dev/null)" for method, path in KEYLESS_PROBES)
    return f"echo {keyless} $(curl -K {curl_config} {fmt} {base}/v1/models 2>/dev/null)"


def check_api_key(host, api: str, tls: str, curl_config: str) -> None:
    """The API refuses every probe without the key (401) and serves one with it (200)."""
    _, out = host.run_shell_command(StringCommand(key_probe_command(api, tls, curl_config)))
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


def engine_log_tail_command(unit: str) -> str:
    """The last lines the unit's current run logged (its InvocationID: engine_kv_log_command says why)."""
    return (f"id=$(systemctl show -p InvocationID --value {unit}); [ -n \"$id\" ] && "
            f"journalctl _SYSTEMD_INVOCATION_ID=\"$id\" -n 40 --no-pager -o cat")


def wait_for_health(unit: str, api: str, tls: str, timeout_s: int, endpoint: str, max_model_len: int,
                    curl_config: str | None = None, key_file: str | None = None, workers: tuple[str, ...] = (),
                    ca_file: str | None = None) -> None:
    """Operation body: poll the head's /health through the proxy (`api`, its certificate verified with
    `tls`), with progress, bounded; then prove the API key is required; print the endpoint, where its key
    is and what verifies its certificate (`ca_file`). A worker whose engine exits meanwhile ends the
    wait at once, naming it: found by the lab's real vLLM, a head whose worker died while the pair
    started waits for it for over ten minutes, deaf to SIGTERM, so the bound alone would spend all of
    serving_health_timeout_s (20 min by default) before saying anything."""

    peers = {name: state.inventory.get_host(name) for name in workers}
    identity = StringCommand(container_identity_command(WORKER_UNIT))

    def seen(peer) -> str:
        ok, out = peer.run_shell_command(identity)
        return out.stdout.strip() if ok else "unreachable"

    at_start = {name: seen(peer) for name, peer in peers.items()}
    # Every progress_interval_s, the engine's own phase: its log's last line (sparkfleet/progress.py).
    ticker = Ticker(f"{host.name}: start of {unit}", cluster_from_state(state).node(host.name).progress_interval_s,
                    logger.info)
    start = ticker.start
    code = ""
    try:
        while (elapsed := time.monotonic() - start) < timeout_s:
            for name, peer in peers.items():
                now = seen(peer)
                if worker_lost(at_start[name], now):
                    _, log = peer.run_shell_command(StringCommand(f"journalctl -u {WORKER_UNIT} -n 30 --no-pager -o cat"))
                    # (A vLLM head waits for a lost worker, deaf to SIGTERM: the wait ends here instead.)
                    raise RunFailed(worker_lost_failure(_node(name), host.name, at_start[name], now, elapsed), log.stdout)
            ok, out = host.run_shell_command(StringCommand(health_command(api, tls)))
            code = out.stdout.strip() if ok else "no answer"
            if code == "200":
                ticker.done()
                key = f" (API key: root-only file {key_file} on {host.name})" if key_file else ""
                cert = f"; its certificate verifies with {ca_file} on {host.name}" if ca_file else ""
                logger.info(f"    [{host.name}] /health 200 after {elapsed:.0f} s; serving at {endpoint}{key}{cert}")
                if curl_config:
                    check_api_key(host, api, tls, curl_config)
                check_engine_kv(host, unit, max_model_len)
                return
            if ticker.due():
                _, log = host.run_shell_command(StringCommand(engine_log_tail_command(unit)))
                ticker.report(f"{phase_text(log.stdout) or 'no log line yet'} (/health: {code or 'no answer'}, "
                              f"limit {timeout_s} s)")
            time.sleep(POLL_S)
        _, log = host.run_shell_command(StringCommand(f"journalctl -u {unit} -n 30 --no-pager"))
        raise RunFailed(health_failure(_node(host.name), unit, timeout_s, code), log.stdout)
    finally:
        ticker.done(ok=False)  # once: a success printed its own done line already (Ticker.done)
