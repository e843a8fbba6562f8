"""POST /v1/chat/completions and the JIT kernel-cache emulation of both lab stand-ins
(lab/standin/vllm, lab/standin/sglang/launch_server.py): every rank writes its own files into the
cache directories its environment names, once per request shape, and the head answers only once
every rank is done. Subprocesses on 127.0.0.1 with free ports, each rank with its own tmp cache
directories; every wait is bounded, and every process a test starts is killed when the test ends."""
import hashlib
import json
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from tests.unit import test_lab_standin as vllm
from tests.unit import test_lab_standin_sglang as sglang
from tests.unit.test_lab_standin import ENGINE_JIT_CACHES, MODEL, free_port, get, wait_for

ENGINES = ("vllm", "sglang")
STARTUP = ("startup", 0)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {}}}]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def argv(engine, ports, rank, vision=True):
    """One rank's command line of a 2-rank pair (the existing tests' flags); vision off by
    --limit-mm-per-prompt {"image": 0} (vLLM) or --language-model-only (SGLang)."""
    if engine == "vllm":
        if rank == 0:
            # tools answered as a profile with a tool parser serves them (vLLM refuses tool_choice
            # "auto" without both flags, and the stand-in with it)
            extra = ["--enable-auto-tool-choice", "--tool-call-parser", "glm47"]
            extra += [] if vision else ["--limit-mm-per-prompt", '{"image": 0}']
            return [sys.executable, str(vllm.VLLM), *vllm.head_args(ports, *extra)]
        return [sys.executable, str(vllm.VLLM), *vllm.worker_args(ports, rank=str(rank))]
    args = sglang.rank_args(ports, str(rank))
    if not vision:
        args = [a for a in args if a != "--enable-multimodal"] + ["--language-model-only"]
    return sglang.command(*args)


def single_argv(engine, port):
    if engine == "vllm":
        return [sys.executable, str(vllm.VLLM), "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    return sglang.command("--model-path", MODEL, "--host", "127.0.0.1", "--port", str(port))


def rank_env(engine, cache_root=None, **extra):
    """The engine's test environment; with cache_root, every cache variable of the engine set below it."""
    caches = {var: str(cache_root / var.lower()) for var in ENGINE_JIT_CACHES[engine]} if cache_root else {}
    return (vllm.env if engine == "vllm" else sglang.env)(**caches, **extra)


def kernels(engine, rank, *shapes):
    """The cache files rank `rank` of `engine` writes for `shapes`, relative to its cache root."""
    out = set()
    for var in ENGINE_JIT_CACHES[engine]:
        for shape in shapes:
            key = hashlib.sha256(f"{var}|{shape}|rank{rank}".encode()).hexdigest()[:20]
            out.add(f"{var.lower()}/{key[:2]}/{key}.json")
    return out


def files(root):
    """{path relative to root: bytes} of every file below root. A rank writes each cache file to a
    temporary name and renames it; one renamed between the listing and the read is left out (the
    caller waits and reads again)."""
    out = {}
    for p in sorted(root.rglob("*")):
        try:
            out[p.relative_to(root).as_posix()] = p.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            continue
    return out


def post(port, body, path="/v1/chat/completions"):
    """(status, parsed JSON body) of a POST; body is a dict (sent as JSON) or raw bytes."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=15) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def chat(content, model="lab", **extra):
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 16, **extra}


def words(n):
    return " ".join(f"w{i}" for i in range(n))


@pytest.fixture
def pair(launch, tmp_path):
    """pair(engine, caches=True, vision=True, worker_env={}) starts a 2-rank pair and waits for
    /health 200 and, with caches, for both ranks' startup kernels. Each rank runs in its own empty
    working directory (cwd0, cwd1) with its caches below its own root (rank0, rank1)."""

    def start(engine, caches=True, vision=True, worker_env=None):
        port, rendezvous = free_port(), free_port()
        ports = {"http": port, "master": rendezvous, "dist": rendezvous}
        roots = [tmp_path / "rank0", tmp_path / "rank1"]
        cwds = [tmp_path / "cwd0", tmp_path / "cwd1"]
        for d in cwds:
            d.mkdir()
        head = launch(argv(engine, ports, 0, vision), rank_env(engine, caches and roots[0]), cwds[0])
        wait_for(lambda: get(port, "/health")[0], what="the head's HTTP server")
        worker = launch(argv(engine, ports, 1, vision), rank_env(engine, caches and roots[1], **(worker_env or {})),
                        cwds[1])
        wait_for(lambda: get(port, "/health")[0] == 200, what="/health 200 after rank 1 joined")
        if caches:
            for rank, root in enumerate(roots):
                wait_for(lambda: root.is_dir() and set(files(root)) == kernels(engine, rank, STARTUP), timeout=10,
                         what=f"rank {rank}'s startup kernels")
        return SimpleNamespace(head=head, worker=worker, port=port, roots=roots, cwds=cwds, ports=ports)

    return start


def stop(p, engine):
    """Stop both ranks, head first (SIGTERM, exit 0), and return their output. SGLang's worker then
    exits 1 (its Gloo broadcast fails); vLLM's headless worker outlives its head and needs a SIGTERM."""
    p.head.send_signal(signal.SIGTERM)
    assert p.head.wait(timeout=5) == 0
    if engine == "vllm":
        time.sleep(0.2)
        assert p.worker.poll() is None
        p.worker.send_signal(signal.SIGTERM)
    assert p.worker.wait(timeout=5) == (0 if engine == "vllm" else 1)
    return p.head.communicate(timeout=5)[0], p.worker.communicate(timeout=5)[0]


@pytest.mark.parametrize("engine", ENGINES)
def test_startup_kernels_are_written_on_every_rank_named_by_rank(pair, engine):
    p = pair(engine)
    names = []
    for rank, root in enumerate(p.roots):
        on_disk = files(root)
        assert set(on_disk) == kernels(engine, rank, STARTUP)  # <var dir>/<key[:2]>/<key>.json, one per cache
        for rel, data in on_disk.items():
            assert len(data) == 4096
            var = next(v for v in ENGINE_JIT_CACHES[engine] if rel.startswith(v.lower() + "/"))
            assert json.loads(data) == {"cache": var, "shape": ["startup", 0], "rank": rank}
        names.append({rel.rsplit("/", 1)[1] for rel in on_disk})
    assert len(names[0]) == len(names[1]) == len(ENGINE_JIT_CACHES[engine])
    assert not names[0] & names[1]  # every file differs by name between the ranks: a merge has work to do


@pytest.mark.parametrize("engine", ENGINES)
def test_each_shape_compiles_once_on_every_rank_and_is_settled_when_answered(pair, engine):
    p = pair(engine)
    status, body = post(p.port, chat("Say hello in one word."))
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["model"] == "lab"
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert body["usage"]["prompt_tokens"] == 5
    assert body["usage"]["total_tokens"] == 5 + body["usage"]["completion_tokens"]
    for rank, root in enumerate(p.roots):  # no waiting: the answer comes once every rank compiled
        assert set(files(root)) == kernels(engine, rank, STARTUP, ("text", 16))

    before = [files(root) for root in p.roots]
    assert post(p.port, chat("Say goodbye in two words."))[0] == 200  # same shape: all cache hits
    assert [files(root) for root in p.roots] == before

    status, body = post(p.port, chat(words(40)))  # 40 words: the next buckets up, 64
    assert status == 200 and body["usage"]["prompt_tokens"] == 40
    for rank, root in enumerate(p.roots):
        assert set(files(root)) == kernels(engine, rank, STARTUP, ("text", 16), ("text", 64))
        assert not any(rel.endswith(".tmp") for rel in files(root))

    head_out, worker_out = stop(p, engine)
    n = len(ENGINE_JIT_CACHES[engine])
    for rank, out in enumerate((head_out, worker_out)):
        assert f"[rank {rank}]: jit: startup/0: compiled {n}, cached 0" in out
        assert f"[rank {rank}]: jit: text/16: compiled {n}, cached 0" in out
        assert f"[rank {rank}]: jit: text/16: compiled 0, cached {n}" in out
        assert f"[rank {rank}]: jit: text/64: compiled {n}, cached 0" in out


@pytest.mark.parametrize("engine", ENGINES)
def test_tools_answer_a_call_of_the_first_tool(pair, engine):
    p = pair(engine)
    status, body = post(p.port, chat("What is the weather in Paris?", tools=TOOLS, tool_choice="auto"))
    assert status == 200, body
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"] == {"name": "get_weather", "arguments": "{}"}
    assert body["usage"]["prompt_tokens"] == 6
    for rank, root in enumerate(p.roots):
        assert set(files(root)) == kernels(engine, rank, STARTUP, ("tools", 16))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("vision", [True, False])
def test_images_compile_their_own_kernels_or_are_refused_without_vision(pair, engine, vision):
    p = pair(engine, vision=vision)
    status, body = post(p.port, chat([{"type": "text", "text": "Describe this image."}, IMAGE], tools=TOOLS))
    if vision:
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] == 3 + 256
        assert body["choices"][0]["finish_reason"] == "tool_calls"  # tools still answered; kind is image
        for rank, root in enumerate(p.roots):
            assert set(files(root)) == kernels(engine, rank, STARTUP, ("image", 16))
    else:
        assert status == 400 and body["error"]["type"] == "BadRequestError" and body["error"]["code"] == 400
        for rank, root in enumerate(p.roots):
            assert set(files(root)) == kernels(engine, rank, STARTUP)


@pytest.mark.parametrize("engine", ENGINES)
def test_wrong_model_and_malformed_bodies_are_refused_and_compile_nothing(pair, engine):
    p = pair(engine)
    status, body = post(p.port, chat("hello", model=MODEL))  # the path, not --served-model-name
    assert status == 404 and body["error"]["type"] == "NotFoundError" and "does not exist" in body["error"]["message"]
    for bad in [b"{not json", b"[]", {"messages": [{"role": "user", "content": "hi"}]},
                {"model": "lab", "messages": []}, {"model": "lab", "messages": "hi"},
                {"model": "lab", "messages": [{"content": "hi"}]},
                chat([{"type": "audio", "audio": "x"}]), chat([{"type": "image_url", "image_url": "x"}]),
                chat(7), chat("hi", tools=[{"type": "function"}]), chat("hi", tools={"name": "f"}),
                chat("hi", max_tokens=0), chat("hi", max_tokens="16"), chat("hi", stream=True, min_tokens=-1),
                chat("hi", stream=True, tools=TOOLS)]:
        status, body = post(p.port, bad)
        assert status == 400, (bad, body)
        assert body["error"]["type"] == "BadRequestError" and body["error"]["message"], bad
    assert post(p.port, chat("hi"), path="/v1/completions")[0] == 400  # a chat body has no 'prompt'
    assert post(p.port, chat("hi"), path="/v1/embeddings")[0] == 404
    for rank, root in enumerate(p.roots):
        assert set(files(root)) == kernels(engine, rank, STARTUP)


@pytest.mark.parametrize("engine", ENGINES)
def test_503_until_every_rank_joined_and_no_kernels_before(launch, tmp_path, engine):
    port, rendezvous = free_port(), free_port()
    ports = {"http": port, "master": rendezvous, "dist": rendezvous}
    launch(argv(engine, ports, 0), rank_env(engine, tmp_path / "rank0"), tmp_path)
    wait_for(lambda: get(port, "/health")[0], what="the head's HTTP server")
    status, body = post(port, chat("hi"))
    assert status == 503 and "waiting for ranks [1]" in body["message"]
    assert not (tmp_path / "rank0").exists()  # the head compiles its startup kernels once the pair is whole
    launch(argv(engine, ports, 1), rank_env(engine, tmp_path / "rank1"), tmp_path)
    wait_for(lambda: get(port, "/health")[0] == 200, what="/health 200 after rank 1 joined")
    assert post(port, chat("hi"))[0] == 200


@pytest.mark.parametrize("engine", ENGINES)
def test_without_cache_variables_nothing_is_written(pair, tmp_path, engine):
    p = pair(engine, caches=False)
    status, body = post(p.port, chat("hello there"))
    assert status == 200, body
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cwd0", "cwd1"]
    assert [list(cwd.iterdir()) for cwd in p.cwds] == [[], []]  # nor in the working directories
    head_out, worker_out = stop(p, engine)
    for rank, out in enumerate((head_out, worker_out)):
        assert f"[rank {rank}]: jit: startup/0: compiled 0, cached 0" in out
        assert f"[rank {rank}]: jit: text/16: compiled 0, cached 0" in out


@pytest.mark.parametrize("engine", ENGINES)
def test_the_head_waits_for_a_slow_rank(pair, engine):
    p = pair(engine, worker_env={"SFL_STANDIN_JIT_MS": "200"})  # rank 1 takes 0.2 s per cache file
    assert post(p.port, chat("hello"))[0] == 200
    assert set(files(p.roots[1])) == kernels(engine, 1, STARTUP, ("text", 16))


@pytest.mark.parametrize("engine", ENGINES)
def test_concurrent_requests_each_get_their_own_answer(pair, engine):
    p = pair(engine)
    bodies = [chat("hi"), chat(words(20)), chat(words(100)), chat("hi", tools=TOOLS), chat(words(20))]
    results = [None] * len(bodies)

    def ask(i):
        results[i] = post(p.port, bodies[i])
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert [r and r[0] for r in results] == [200] * len(bodies), results
    shapes = (STARTUP, ("text", 16), ("text", 32), ("text", 128), ("tools", 16))
    for rank, root in enumerate(p.roots):
        assert set(files(root)) == kernels(engine, rank, *shapes)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("killed", ["worker", "head"])
def test_a_dropped_rank_after_jit_traffic_ends_its_peer_as_the_engine_does(pair, engine, killed):
    """SGLang: the peer's next Gloo broadcast fails and it exits 1. vLLM: the peer carries on (the
    head with /health 200 until a request times out; the headless worker until a SIGTERM)."""
    p = pair(engine)
    assert post(p.port, chat("hi"))[0] == 200
    getattr(p, killed).kill()
    peer = p.head if killed == "worker" else p.worker
    if engine == "sglang":
        assert peer.wait(timeout=5) == 1
    else:
        time.sleep(0.5)
        assert peer.poll() is None
        if killed == "worker":
            assert get(p.port, "/health") == (200, {"status": "ok", "ranks": 2})
        peer.send_signal(signal.SIGTERM)
        assert peer.wait(timeout=5) == 0
    out = peer.communicate(timeout=5)[0]
    if engine == "sglang":  # the line real SGLang ends on
        assert "Scheduler hit an exception" in out and "Connection closed by peer [127.0.0.1]" in out
    if killed == "head":
        assert "the head dropped the connection" in out
    elif engine == "vllm":  # (an SGLang head's scheduler may fail its broadcast before its reader logs this)
        assert "rank 1 (127.0.0.1) dropped its connection" in out


@pytest.mark.parametrize("engine", ENGINES)
def test_a_single_node_compiles_on_its_own(launch, tmp_path, engine):
    port = free_port()
    launch(single_argv(engine, port), rank_env(engine, tmp_path / "rank0", GLOO_SOCKET_IFNAME=None), tmp_path)
    wait_for(lambda: get(port, "/health")[0] == 200, what="/health 200")
    status, body = post(port, chat("hi", model=MODEL))  # no --served-model-name: the model path
    assert status == 200 and body["model"] == MODEL
    assert set(files(tmp_path / "rank0")) == kernels(engine, 0, STARTUP, ("text", 16))


# --- A serving group of four ranks: TP 2 x PP 2 and TP 4 -------------------------------------

def group_argv(engine, ports, rank, tp, pp):
    """Rank `rank` of a four-node group at TP `tp` x PP `pp`: the pair's command line with the group's
    --nnodes, TP size and PP size (what sparkfleet renders: --pipeline-parallel-size / --pp-size)."""
    words = argv(engine, ports, rank)
    sizes = {"--nnodes": "4", "--tensor-parallel-size": str(tp), "--tp-size": str(tp)}
    words = [sizes.get(words[i - 1], w) if i else w for i, w in enumerate(words)]
    return words + ["--pipeline-parallel-size" if engine == "vllm" else "--pp-size", str(pp)]


@pytest.mark.parametrize("tp, pp", [(2, 2), (4, 1)], ids=["tp2-pp2", "tp4"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_four_rank_group_waits_for_every_rank_and_answers_over_all_of_them(launch, tmp_path, engine, tp, pp):
    """The head answers /health 200 only once its three peers joined, and a chat completion compiles
    the request's kernels on all four ranks before it is answered."""
    port, rendezvous = free_port(), free_port()
    ports = {"http": port, "master": rendezvous, "dist": rendezvous}
    roots = [tmp_path / f"rank{r}" for r in range(4)]
    ranks = [launch(group_argv(engine, ports, 0, tp, pp), rank_env(engine, roots[0]), tmp_path)]
    wait_for(lambda: get(port, "/health")[0], what="the head's HTTP server")
    for rank in (1, 2):
        ranks.append(launch(group_argv(engine, ports, rank, tp, pp), rank_env(engine, roots[rank]), tmp_path))
    wait_for(lambda: get(port, "/health")[1].get("missing") == [3], what="ranks 1 and 2 joined")
    assert get(port, "/health")[0] == 503 and post(port, chat("hi"))[0] == 503
    ranks.append(launch(group_argv(engine, ports, 3, tp, pp), rank_env(engine, roots[3]), tmp_path))
    wait_for(lambda: get(port, "/health")[0] == 200, what="/health 200 after rank 3 joined")
    assert get(port, "/health") == (200, {"status": "ok", "ranks": 4})
    assert [r["rank"] for r in get(port, "/ranks")[1]] == [0, 1, 2, 3]
    for rank, root in enumerate(roots):
        wait_for(lambda: root.is_dir() and set(files(root)) == kernels(engine, rank, STARTUP), timeout=10,
                 what=f"rank {rank}'s startup kernels")

    status, body = post(port, chat("Say hello in one word."))
    assert status == 200 and body["object"] == "chat.completion", body
    for rank, root in enumerate(roots):  # no waiting: answered once every rank compiled
        assert set(files(root)) == kernels(engine, rank, STARTUP, ("text", 16)), rank

    for p in ranks:
        p.kill()
    outs = [p.communicate(timeout=5)[0] for p in ranks]
    assert "all 4 ranks joined" in outs[0]
    if engine == "vllm":  # rank = PP stage x TP + TP rank (vllm/distributed/parallel_state.py)
        assert f"as rank 3 of 4 (PP stage {3 // tp}, TP rank {3 % tp})" in outs[3]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tp_times_pp_the_nodes_cannot_split_is_refused(launch, tmp_path, engine):
    """TP x PP must split evenly over --nnodes (vLLM's create_engine_config; SGLang's
    check_server_args): two ranks over four nodes are refused at start."""
    ports = {"http": free_port(), "master": free_port(), "dist": free_port()}
    words = group_argv(engine, ports, 1, 2, 1)
    p = launch(words, rank_env(engine), tmp_path)
    assert p.wait(timeout=10) == 2
    message = "must evenly divide the total world size (2)" if engine == "vllm" else \
        "--tp-size 2 x --pp-size 1 is not a multiple of --nnodes 4"
    assert message in p.communicate(timeout=5)[0]
