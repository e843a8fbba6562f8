"""The lab's SGLang stand-in (lab/standin/sglang/launch_server.py), run as the lab image runs it:
`python3 -m sglang.launch_server` with lab/standin on PYTHONPATH, on 127.0.0.1 with free ports and
GLOO_SOCKET_IFNAME=lo. Every wait is bounded, and every process a test starts is killed when the
test ends."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.unit.test_lab_standin import JIT_CACHES, MODEL, constant, free_port, get, post_chat, \
    post_completion, wait_for
from tests.unit.test_serving_engines import STANDIN


def env(**extra):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("VLLM_", "SFL_STANDIN_", "GLOO_", "SGLANG_")) and k not in JIT_CACHES}
    e.update({"PYTHONPATH": str(STANDIN), "PYTHONDONTWRITEBYTECODE": "1", "GLOO_SOCKET_IFNAME": "lo",
              "SFL_STANDIN_JOIN_TIMEOUT_S": "10", **extra})
    return {k: v for k, v in e.items() if v is not None}


def command(*args):
    return [sys.executable, "-m", "sglang.launch_server", *args]


@pytest.fixture
def run(launch):
    """run(*args, **env) starts the stand-in; all started processes are killed at teardown."""
    return lambda *args, **extra_env: launch(command(*args), env(**extra_env))


@pytest.fixture
def ports():
    return {"http": free_port(), "dist": free_port()}


def rank_args(ports, rank, model=MODEL, nnodes="2", tp="2"):
    """What sparkfleet renders for SGLang (qwen3.8-flash-next's flags), on 127.0.0.1."""
    args = ["--model-path", model, "--revision", "main", "--served-model-name", "lab", "--tp-size", tp,
            "--dist-init-addr", f"127.0.0.1:{ports['dist']}", "--nnodes", nnodes, "--node-rank", rank,
            "--mem-fraction-static", "0.75", "--context-length", "4096", "--chunked-prefill-size", "8192",
            "--kv-cache-dtype", "auto", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--tool-call-parser", "qwen25",
            "--reasoning-parser", "qwen3", "--enable-multimodal", "--trust-remote-code"]
    return args + (["--host", "127.0.0.1", "--port", str(ports["http"])] if rank == "0" else [])


def start_pair(run, ports, extra=(), head_env=None, worker_env=None):
    """Both ranks up (rank 0 first), `extra` flags on both, and /health 200."""
    head = run(*rank_args(ports, "0"), *extra, **(head_env or {}))
    wait_for(lambda: get(ports["http"], "/health")[0], what="the head's HTTP server")
    worker = run(*rank_args(ports, "1"), *extra, **(worker_env or {}))
    wait_for(lambda: get(ports["http"], "/health")[0] == 200, what="/health 200 after rank 1 joined")
    return head, worker


def in_background(call, *args, **kwargs):
    """Run call(*args, **kwargs) in a daemon thread; its outcome (a result or the exception) lands in
    the returned list."""
    outcome = []

    def target():
        try:
            outcome.append(call(*args, **kwargs))
        except Exception as e:  # the server died under the request
            outcome.append(e)
    threading.Thread(target=target, daemon=True).start()
    return outcome


def test_head_waits_for_every_rank_then_serves(run, ports):
    head = run(*rank_args(ports, "0"))
    status, body = wait_for(lambda: get(ports["http"], "/health")[0] and get(ports["http"], "/health"),
                            what="the head's HTTP server")
    assert status == 503 and body["missing"] == [1]
    assert get(ports["http"], "/v1/models")[0] == 503

    worker = run(*rank_args(ports, "1"))
    wait_for(lambda: get(ports["http"], "/health")[0] == 200, what="/health 200 after rank 1 joined")
    assert get(ports["http"], "/health") == (200, {"status": "ok", "ranks": 2})
    assert get(ports["http"], "/v1/models") == (200, {"object": "list", "data": [
        {"id": "lab", "object": "model", "owned_by": "sparkfleet-lab-standin", "max_model_len": 4096}]})
    status, ranks = get(ports["http"], "/ranks")
    assert status == 200 and [r["rank"] for r in ranks] == [0, 1]
    assert ranks[1]["host_ip"] == ranks[1]["peer_ip"] == "127.0.0.1"  # joined from GLOO_SOCKET_IFNAME's address

    head.send_signal(signal.SIGTERM)
    assert head.wait(timeout=5) == 0
    assert worker.wait(timeout=5) == 1  # its head went away
    out = head.communicate(timeout=5)[0]
    assert "sglang-standin[rank 0]: argv: python3 -m sglang.launch_server --model-path org/lab-model" in out
    assert f"all 2 ranks joined; serving {MODEL} on 127.0.0.1:{ports['http']}" in out
    assert "joined head 127.0.0.1" in worker.communicate(timeout=5)[0]


def test_ranks_above_0_serve_no_http_even_when_given_a_port(run, ports):
    head = run(*rank_args(ports, "0"))
    wait_for(lambda: get(ports["http"], "/health")[0], what="the head's HTTP server")
    worker_port = free_port()  # SGLang accepts --host/--port on every rank; only rank 0 listens
    worker = run(*rank_args(ports, "1"), "--host", "127.0.0.1", "--port", str(worker_port))
    wait_for(lambda: get(ports["http"], "/health")[0] == 200, what="/health 200 after rank 1 joined")
    assert get(worker_port, "/health") == (None, None)
    assert head.poll() is None and worker.poll() is None



def test_a_completion_goes_through_the_scheduler_loop_and_a_frozen_worker_holds_it(run, ports):
    """POST /v1/completions (the watchdog's probe) answers a text_completion cut to max_tokens; with a
    rank frozen it waits, unanswered, like every request in SGLang's stalled loop."""
    _, worker = start_pair(run, ports)
    status, body = post_completion(ports["http"])
    assert status == 200 and body["object"] == "text_completion", body
    assert body["choices"][0]["text"] == "sparkfleet"
    assert post_completion(ports["http"], {"model": "lab", "prompt": []})[0] == 400
    worker.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(TimeoutError):
            post_completion(ports["http"], timeout=3)
    finally:
        worker.send_signal(signal.SIGCONT)

def test_a_joined_worker_ignores_sigterm_until_its_head_goes(run, ports):
    head, worker = start_pair(run, ports)
    worker.send_signal(signal.SIGTERM)
    time.sleep(1)
    assert worker.poll() is None  # SGLang's rank >= 1 waits for rank 0's ShutdownReq instead
    assert get(ports["http"], "/health") == (200, {"status": "ok", "ranks": 2})
    assert get(ports["http"], "/health_generate") == (200, {"status": "ok", "ranks": 2})
    assert post_chat(ports["http"])[0] == 200  # the pair still serves
    head.send_signal(signal.SIGTERM)
    assert head.wait(timeout=5) == 0
    assert worker.wait(timeout=5) == 1
    assert ("SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast to stop the "
            "schedulers.") in worker.communicate(timeout=5)[0]


def test_a_worker_sigterm_before_it_joined_exits_0(run, ports):
    worker = run(*rank_args(ports, "1"))  # no head yet: still joining, SIGTERM is not replaced
    time.sleep(0.5)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=5) == 0


def test_killing_the_worker_stops_the_head(run, ports):
    head, worker = start_pair(run, ports)
    worker.kill()
    assert head.wait(timeout=5) == constant(STANDIN / "sglang" / "launch_server.py", "SCHEDULER_DEATH_EXIT") == 1
    out = head.communicate(timeout=5)[0]
    assert "rank 1 (127.0.0.1) dropped its connection" in out
    assert "[TP0] Scheduler hit an exception" in out and "Connection closed by peer [127.0.0.1]:" in out
    assert "Received sigquit from a child process. It usually means the child failed." in out


def test_killing_the_head_stops_the_worker(run, ports):
    head, worker = start_pair(run, ports)
    head.kill()
    assert worker.wait(timeout=5) == 1
    out = worker.communicate(timeout=5)[0]
    assert "the head dropped the connection" in out
    assert "[TP1] Scheduler hit an exception" in out and "Connection closed by peer [127.0.0.1]:" in out


GLOO_S = 7  # SFL_STANDIN_GLOO_TIMEOUT_S below (SGLang's Gloo group: 7200 s)


def test_a_frozen_idle_worker_fails_health_and_holds_requests_until_the_gloo_timeout(run, ports):
    """Idle, nothing is in flight: the scheduler watchdog stays inactive (it would have ended the head
    after 1.0-1.5 x 0.5 s + 5 s), /health's probe gets no answer (503 after SGLANG_HEALTH_CHECK_TIMEOUT),
    a request waits, and only the Gloo timeout of the blocked broadcast ends the head."""
    head, worker = start_pair(run, ports, extra=("--watchdog-timeout", "0.5"),
                              head_env={"SGLANG_HEALTH_CHECK_TIMEOUT": "2", "SFL_STANDIN_GLOO_TIMEOUT_S": str(GLOO_S)})
    time.sleep(0.3)  # past the iteration right after /health's probe: the loop is idle
    worker.send_signal(signal.SIGSTOP)
    frozen = time.monotonic()
    assert get(ports["http"], "/health", timeout=6) == (503, {"status": "unhealthy", "ranks": 2})
    assert 2 <= time.monotonic() - frozen < 3.5
    answer = in_background(post_chat, ports["http"], timeout=GLOO_S + 5)
    time.sleep(GLOO_S - 1 - (time.monotonic() - frozen))
    assert head.poll() is None and answer == []  # no watchdog exit, the request still unanswered
    assert head.wait(timeout=4) == 1
    assert time.monotonic() - frozen >= GLOO_S - 0.5
    wait_for(lambda: answer, what="the held request to fail with the head")
    assert isinstance(answer[0], Exception), answer  # never answered: the connection died with the head
    out = head.communicate(timeout=5)[0]
    assert ("Health check failed. Server couldn't get a response from detokenizer for last 2 seconds. "
            "tic start time: ") in out
    assert f"Timed out waiting {GLOO_S * 1000}ms for send operation to complete" in out
    assert "Scheduler watchdog timeout" not in out


@pytest.mark.parametrize("frozen", ["worker", "head"])
def test_a_rank_frozen_with_a_batch_in_flight_is_ended_by_the_other_ranks_watchdog(run, ports, tmp_path, frozen):
    """The frozen rank compiles slowly (0.5 s a request, under --watchdog-timeout 1: a request alone
    does not trip it); frozen mid-forward, the other rank's scheduler watchdog fires 1.0-2.0 x 1 s
    after the forward began (it looks every 0.5 s), logs, waits 5 s and ends its process."""
    slow = {"SGLANG_CACHE_DIR": str(tmp_path / "cache"), "SFL_STANDIN_JIT_MS": "500"}
    gloo = {"SFL_STANDIN_GLOO_TIMEOUT_S": "60"}
    head, worker = start_pair(run, ports, extra=("--watchdog-timeout", "1"),
                              head_env={**gloo, **(slow if frozen == "head" else {})},
                              worker_env={**gloo, **(slow if frozen == "worker" else {})})
    stalled, survivor = (worker, head) if frozen == "worker" else (head, worker)
    kernels = lambda: len([f for f in (tmp_path / "cache").rglob("*.json")])  # noqa: E731
    wait_for(lambda: kernels() == 1, what="the slow rank's startup kernels")
    assert post_chat(ports["http"])[0] == 200  # a 0.5 s forward: no watchdog
    assert kernels() == 2
    in_background(post_chat, ports["http"], " ".join(["word"] * 40), timeout=15)  # a new shape: 0.5 s again
    wait_for(lambda: kernels() == 3, what="the slow rank's forward")
    stalled.send_signal(signal.SIGSTOP)
    began = time.monotonic()
    assert survivor.wait(timeout=10) == 1
    assert 6 - 0.3 <= time.monotonic() - began <= 7 + 1
    out = survivor.communicate(timeout=5)[0]
    assert "Scheduler watchdog timeout (self.watchdog_timeout=1.0, self.soft=False)" in out
    assert "Received sigquit from a child process. It usually means the child failed." in out
    assert "Timed out waiting" not in out


@pytest.mark.parametrize("changes, why", [
    ({"model": "org/other-model"}, "model 'org/other-model' differs from the head's"),
    ({}, "rank 1 already joined"),
])
def test_head_refuses_a_wrong_model_or_a_duplicate_rank(run, ports, changes, why):
    head, _ = start_pair(run, ports)
    intruder = run(*rank_args(ports, "1", **changes))
    assert intruder.wait(timeout=5) == 1
    assert why in intruder.communicate(timeout=5)[0]
    assert head.poll() is None and get(ports["http"], "/health")[0] == 200


def test_head_refuses_a_rank_of_another_shape(run, ports):
    run(*rank_args(ports, "0"))
    wait_for(lambda: get(ports["http"], "/health")[0], what="the head's HTTP server")
    other = run(*rank_args(ports, "1", nnodes="3", tp="3"))
    assert other.wait(timeout=5) == 1
    assert "nnodes 3 differs from the head's 2" in other.communicate(timeout=5)[0]
    assert get(ports["http"], "/health")[1]["missing"] == [1]


def test_worker_gives_up_when_no_head_comes(run, ports):
    worker = run(*rank_args(ports, "1"), SFL_STANDIN_JOIN_TIMEOUT_S="1")
    assert worker.wait(timeout=5) == 1
    assert "not reachable after 1 s" in worker.communicate(timeout=5)[0]


def test_single_node_serves_at_once(run, ports):
    run("--model-path", MODEL, "--host", "127.0.0.1", "--port", str(ports["http"]), GLOO_SOCKET_IFNAME=None)
    wait_for(lambda: get(ports["http"], "/v1/models")[0] == 200, what="/v1/models 200")
    assert get(ports["http"], "/v1/models")[1]["data"][0]["id"] == MODEL  # no --served-model-name


BASE = ["--model-path", MODEL]
PAIR = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:1"]
SPEC = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"]


@pytest.mark.parametrize("args, extra_env, message", [
    (["--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
    (["--headless"], {}, "unrecognized arguments: --headless"),  # SGLang has no --headless
    (["--tp", "2"], {}, "unrecognized arguments: --tp 2"),  # no abbreviations: --tp-size
    (["--tensor-parallel-size", "2"], {}, "unrecognized arguments"),  # vLLM's name
    (["--master-addr", "127.0.0.1"], {}, "unrecognized arguments"),
    (["--load-format", "dummy"], {}, "unrecognized arguments: --load-format dummy"),
    (["--no-ple-offload-embedding"], {}, "unrecognized arguments"),
    (["--kv-cache-dtype", "fp8_ds_mla"], {}, "invalid choice: 'fp8_ds_mla'"),
    (["--speculative-algorithm", "mtp"], {}, "invalid choice: 'mtp'"),
    (["--mem-fraction-static", "1.5"], {}, "must be in (0, 1)"),
    (PAIR[:4], {}, "needs --dist-init-addr HOST:PORT"),
    (["--nnodes", "2", "--dist-init-addr", "127.0.0.1"], {}, "must be HOST:PORT"),
    (["--nnodes", "2", "--node-rank", "2", "--tp-size", "2"], {}, "--node-rank 2 is out of range"),
    (["--nnodes", "2", "--tp-size", "3", "--dist-init-addr", "127.0.0.1:1"], {}, "not a multiple of --nnodes 2"),
    (PAIR, {"GLOO_SOCKET_IFNAME": None}, "GLOO_SOCKET_IFNAME is not set"),
    (PAIR, {"GLOO_SOCKET_IFNAME": "sfl-nonesuch0"}, "GLOO_SOCKET_IFNAME=sfl-nonesuch0: no IPv4 address"),
    (SPEC, {}, "without --speculative-num-draft-tokens"),
    (SPEC + ["--speculative-num-draft-tokens", "5"], {}, "silently replaces it by --speculative-num-steps + 1 = 4"),
    (["--speculative-num-steps", "3"], {}, "--speculative-num-steps without --speculative-algorithm"),
    (["--enable-multimodal", "--language-model-only"], {}, "contradict each other"),
    ([], {"SFL_STANDIN_JIT_MS": "soon"}, "SFL_STANDIN_JIT_MS must be a number of milliseconds"),
    ([], {"SFL_STANDIN_GLOO_TIMEOUT_S": "0"}, "SFL_STANDIN_GLOO_TIMEOUT_S must be a positive number of seconds"),
    ([], {"SGLANG_HEALTH_CHECK_TIMEOUT": "2.5"}, "SGLANG_HEALTH_CHECK_TIMEOUT: invalid literal for int()"),
])
def test_refusals_exit_2_saying_why(args, extra_env, message):
    p = subprocess.run(command(*BASE, *args), env=env(**extra_env), capture_output=True, text=True, timeout=10)
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in p.stderr


def metrics(port) -> tuple[int, dict[str, float]]:
    """GET /metrics: (status, {name: value}) of the Prometheus text format, labels dropped."""
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, {}
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            values[series.split("{", 1)[0]] = float(value)
    return 200, values


def test_with_enable_metrics_the_head_serves_sglang_s_counters_and_without_it_no_metrics_route(run, ports):
    """--enable-metrics (sparkfleet renders it on every SGLang rank): /metrics carries the counters and
    gauges the pair's watchdog weighs (roles/watchdog/node_config.py PROGRESS_METRICS), and a
    completion moves them. Without the flag SGLang mounts no /metrics."""
    from roles.watchdog.node_config import PROGRESS_METRICS
    head, worker = start_pair(run, ports, extra=("--enable-metrics",))
    status, before = metrics(ports["http"])
    wanted = PROGRESS_METRICS["sglang"]["progress"] + PROGRESS_METRICS["sglang"]["work"]
    assert status == 200 and sorted(before) == sorted(wanted), before
    assert post_completion(ports["http"])[0] == 200
    status, after = metrics(ports["http"])
    assert all(after[m] > before[m] for m in PROGRESS_METRICS["sglang"]["progress"]), (before, after)
    for p in (head, worker):
        p.kill()
    ports = {"http": free_port(), "dist": free_port()}
    start_pair(run, ports)
    assert metrics(ports["http"])[0] == 404
