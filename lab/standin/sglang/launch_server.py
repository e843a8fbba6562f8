#!/usr/bin/env python3
"""Lab stand-in for `python3 -m sglang.launch_server` (the lab has no GPU). It is not SGLang: it
accepts exactly the flags sparkfleet renders for SGLang (anything else is refused, no
abbreviations), runs the same command on every rank like a real multi-node SGLang group (one rank
per node, TP x PP of them: a pair at TP 2, four nodes at TP 2 x PP 2 or TP 4; no --headless: rank 0
serves HTTP, ranks > 0 join it over --dist-init-addr HOST:PORT), answers /health and /v1/models
once every rank has joined, and fails like a real SGLang 0.5.23 pair (below). Python 3.11
standard library only, Linux only. Never used by the deploy on real Sparks. Run it as `python3 -m
sglang.launch_server` with this file's parent directory on PYTHONPATH (the lab image installs it
so).

POST /v1/chat/completions (rank 0, OpenAI format) answers a canned reply: a call of the first tool
when "tools" are given, else a short text. Like a real engine it JIT-compiles kernels for the
request's shape on every rank first, into the persistent kernel caches named by the environment:
each rank writes its own files (named by rank), a shape seen before is a cache hit that writes
nothing, and the head answers only once every rank is done. Images are refused (400) under
--language-model-only.

With --enable-metrics, GET /metrics (open without the key, as SGLang's) gives the counters and gauges
SGLang's metrics collector keeps under their names (sglang:prompt_tokens_total, ...
sglang:num_queue_reqs); without it there is no such route (404).

Like SGLang, the ranks run in lockstep: every iteration of rank 0's scheduler loop, idle or not,
broadcasts its new requests to every rank over the Gloo group and waits for them, then runs the
batch (a forward) on every rank. So (the upstream code is named next to each behaviour below):
- A rank killed: the other rank's next broadcast fails ("Connection closed by peer"); its
  scheduler dies and the process exits SCHEDULER_DEATH_EXIT within a second.
- A rank frozen (SIGSTOP): the other rank blocks in the broadcast. Every request then blocks, with
  no timeout of its own; /health and /health_generate push a probe through the loop and answer 503
  when nothing came back within SGLANG_HEALTH_CHECK_TIMEOUT. With a batch in flight, the scheduler
  watchdog (--watchdog-timeout) ends the process 1.0-1.5 x that timeout after the last forward began,
  plus 5 s; idle, only the Gloo timeout (SFL_STANDIN_GLOO_TIMEOUT_S) ends it.
- Ranks > 0 serve no HTTP, and once joined they ignore SIGTERM (SGLang's warning is logged; only
  rank 0's shutdown, a dropped link or SIGKILL ends them).
- No heartbeat on the rank connections (no TCP keepalive).

Environment, as SGLang and torch read it: GLOO_SOCKET_IFNAME (required when --nnodes > 1: torch's
Gloo group binds to that netdev's address, and without it multi-node SGLang in Docker picks
loopback and its peers are refused; each rank's connection here is made from that address),
SGLANG_HEALTH_CHECK_TIMEOUT (rank 0: seconds /health waits for its probe, default 20, an integer
as srt/entrypoints/http_server.py reads it), the kernel cache variables of JIT_CACHES (SGLang's
set, roles/kernel_cache/schema.py CACHE_VARS["sglang"]; each used only when set and non-empty).
Stand-in only: SFL_STANDIN_JOIN_TIMEOUT_S (ranks > 0: how long to keep trying the head, default
600), SFL_STANDIN_JIT_MS (milliseconds of "compile time" per kernel file written, default 20),
SFL_STANDIN_GLOO_TIMEOUT_S (seconds a broadcast of the lockstep may wait for the other rank,
default 7200: the Gloo group's timeout, which no SGLang flag sets; shorten it to test)."""
import argparse
import contextlib
import fcntl
import hashlib
import hmac
import http.server
import json
import os
import queue
import shlex
import signal
import socket
import struct
import sys
import threading
import time
import uuid

OWNER = "sparkfleet-lab-standin"
RANK = "?"
# SGLang's names (python/sglang/srt/server_args.py): --kv-cache-dtype choices and the builtin
# --speculative-algorithm values.
KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16",
                   "fp4_e2m1")
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK")
SPECULATIVE_NUMBERS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
MAX_BODY = 64 << 20  # bytes of a POST body (images come inline as data: URLs)
REPLY = "sparkfleet lab stand-in reply"  # the text of every non-tool answer (4 words)
IMAGE_TOKENS = 256  # prompt tokens counted per image
# JIT kernel caches: a real engine compiles kernels per request shape and keeps them in these
# directories, which persist across restarts. The stand-in writes one file per cache and shape.
# SGLang's set, in the order of roles/kernel_cache/schema.py CACHE_VARS["sglang"] (a unit test
# compares them; this file imports nothing from the project).
JIT_CACHES = ("SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR", "SGLANG_DG_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
              "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "FLASHINFER_WORKSPACE_BASE", "TILELANG_CACHE_DIR",
              "CUTE_DSL_CACHE_DIR", "TVM_FFI_CACHE_DIR", "CUDA_CACHE_PATH")
JIT_FILE_BYTES = 4096
JIT_LOCK = threading.Lock()  # one compile at a time per process
STARTUP = ("startup", 0)  # the shape of the model's load-time kernels (the field report's TileLang ones)
# The Gloo group of every rank's scheduler (tp_group.cpu_group) times out after 120 * 60 s:
# srt/distributed/parallel_state.py GroupCoordinator.__init__, gloo_timeout=timedelta(seconds=120 * 60);
# --dist-timeout does not reach it. SFL_STANDIN_GLOO_TIMEOUT_S replaces it in the stand-in.
GLOO_TIMEOUT_S = 120 * 60
# The real scheduler loop spins; the stand-in's idle iterations pause this long (no work, less CPU).
IDLE_TICK_S = 0.05
# srt/utils/watchdog.py WatchdogRaw._watchdog_once: after a watchdog timeout it sleeps 5 s ("so that
# the parent process can print the error"), then SIGQUITs the parent.
WATCHDOG_GRACE_S = 5
# The exit status once a scheduler died (an exception, a watchdog timeout). Real SGLang: the
# scheduler SIGQUITs its parent (srt/managers/scheduler.py run_scheduler_process), whose
# launch_phase_sigquit_handler (srt/entrypoints/engine.py) calls kill_process_tree(os.getpid()),
# which SIGKILLs the tree and the process itself: status 137 in the container. The stand-in exits 1,
# as it always did on a dropped rank: a failure to systemd's Restart=on-failure either way, and a 1
# tells a stand-in exit from a real SIGKILL.
SCHEDULER_DEATH_EXIT = 1
ENGINE_ERROR_MESSAGE = "Internal server error"  # unused: a stalled loop holds a stream, it never fails it



def log(msg):
    print(f"sglang-standin[rank {RANK}]: {msg}", flush=True)


def scheduler_died(prefix, error):
    """A scheduler exception, as SGLang ends on one: run_scheduler_process (srt/managers/scheduler.py)
    logs "Scheduler hit an exception" and SIGQUITs its parent, whose launch_phase_sigquit_handler
    (srt/entrypoints/engine.py) kills the process tree. Exits SCHEDULER_DEATH_EXIT at once."""
    log(f"[{prefix}] Scheduler hit an exception: Traceback (most recent call last): ... "
        f"in broadcast_pyobj ... RuntimeError: {error}")
    sigquit()


def sigquit():
    log("Received sigquit from a child process. It usually means the child failed.")
    log(f"exiting {SCHEDULER_DEATH_EXIT} (real SGLang SIGKILLs its own process tree here: status 137)")
    sys.stdout.flush()
    os._exit(SCHEDULER_DEATH_EXIT)


def gloo_closed(peer):
    return f"[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [{peer[0]}]:{peer[1]}"


def gloo_timed_out(seconds, op):
    return (f"[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
            f"{round(seconds * 1000)}ms for {op} operation to complete")


class Progress:
    """What a scheduler's watchdog reads: forward_ct (batches begun) and cur_batch_for_debug (the
    batch of the current iteration, None when idle), as srt/managers/scheduler.py keeps them."""

    def __init__(self):
        self.forward_ct = 0
        self.cur_batch = None


def scheduler_watchdog(timeout, progress, prefix):
    """--watchdog-timeout, as create_scheduler_watchdog (srt/managers/scheduler_components/
    invariant_checker.py) builds it on every rank: WatchdogRaw (srt/utils/watchdog.py), active only
    while a batch is in flight, checks every timeout / 2 and fires once forward_ct has not moved for
    more than `timeout`, i.e. 1.0-1.5 x timeout after the last forward began; then it logs, waits
    WATCHDOG_GRACE_S and SIGQUITs the process. Idle, it never fires."""

    def watch():
        last_counter, last_time = 0, time.perf_counter()  # _watchdog_once, line for line
        while True:
            current = time.perf_counter()
            batch = progress.cur_batch
            if batch is not None:
                if last_counter == progress.forward_ct:
                    if current > last_time + timeout:
                        break
                else:
                    last_counter, last_time = progress.forward_ct, current
            time.sleep(max(timeout / 2, 0.01))
        log(f"[{prefix}] Scheduler debug info:\nscheduler.cur_batch_for_debug.batch_size()={len(batch)}")
        log(f"[{prefix}] Scheduler watchdog timeout (self.watchdog_timeout={timeout!r}, self.soft=False)")
        time.sleep(WATCHDOG_GRACE_S)
        sigquit()
    threading.Thread(target=watch, daemon=True).start()


def jit_compile(args, shape):
    """Compile `shape` (kind, bucket) on this rank: one file per set cache variable,
    <dir>/<key[:2]>/<key>.json, its key hashed from the variable, the shape and the rank. A file
    already there is a cache hit and is left alone, so each shape compiles once per rank."""
    kind, bucket = shape = tuple(shape)
    compiled = cached = failed = 0
    with JIT_LOCK:
        for var in JIT_CACHES:
            base = os.environ.get(var)
            if not base:
                continue
            key = hashlib.sha256(f"{var}|{shape}|rank{args.node_rank}".encode()).hexdigest()[:20]
            path = os.path.join(base, key[:2], key + ".json")
            if os.path.exists(path):
                cached += 1
                continue
            doc = json.dumps({"cache": var, "shape": shape, "rank": args.node_rank}, sort_keys=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(tmp, "wb") as f:
                    f.write((doc.ljust(JIT_FILE_BYTES - 1) + "\n").encode())  # space filler: still JSON
                os.replace(tmp, path)  # atomic: nobody (a cache merge) sees half a file
            except OSError as e:
                log(f"jit: cannot write {path}: {e}")
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                failed += 1
                continue
            compiled += 1
            time.sleep(args.jit_ms / 1000)  # compile time
    log(f"jit: {kind}/{bucket}: compiled {compiled}, cached {cached}" + (f", failed {failed}" if failed else ""))


def tick_request(line):
    """The head's lockstep line {"tick": n, "reqs": k, "jit": [[kind, bucket], ...]} as
    (n, k, shapes), or None."""
    try:
        tick = json.loads(line)
        n, reqs, shapes = tick["tick"], tick["reqs"], [tuple(shape) for shape in tick["jit"]]
    except (ValueError, KeyError, TypeError):
        return None
    if type(n) is not int or type(reqs) is not int or not all(
            len(shape) == 2 and isinstance(shape[0], str) and type(shape[1]) is int for shape in shapes):
        return None
    return n, reqs, shapes


def openai_error(code, message, param=None):
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(code, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def json_body(data):
    """The request body as a JSON object; ValueError saying what is wrong."""
    try:
        req = json.loads(data)
    except ValueError as e:
        raise ValueError(f"the body is not valid JSON ({e})")
    if not isinstance(req, dict):
        raise ValueError("the body must be a JSON object")
    return req


def chat_request(req):
    """Check a chat completion body (json_body's object); (model, words, images, tools, max_tokens),
    where words counts the whitespace-separated words of every text part. Raises ValueError saying
    what is wrong."""
    model, messages, tools, max_tokens = (req.get(k) for k in ("model", "messages", "tools", "max_tokens"))
    if not isinstance(model, str):
        raise ValueError("'model' must be a string")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    words = images = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        content = message.get("content")
        if content is None:  # an assistant turn that only called tools
            continue
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(parts, list):
            raise ValueError(f"messages[{i}].content must be a string or a list of parts")
        for j, part in enumerate(parts):
            part = part if isinstance(part, dict) else {}
            if part.get("type") == "text" and isinstance(part.get("text"), str):
                words += len(part["text"].split())
            elif part.get("type") == "image_url" and isinstance(part.get("image_url"), dict) \
                    and isinstance(part["image_url"].get("url"), str):
                images += 1
            else:
                raise ValueError(f"messages[{i}].content[{j}] must be {{'type': 'text', 'text': ...}} "
                                 "or {'type': 'image_url', 'image_url': {'url': ...}}")
    tools = [] if tools is None else tools
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str)
            and isinstance(t["function"].get("parameters", {}), dict) for t in tools):
        raise ValueError("'tools' must be a list of {'type': 'function', 'function': {'name': ..., "
                         "'parameters': {...}}}")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise ValueError("'max_tokens' must be a positive integer")
    if req.get("stream") and tools:
        raise ValueError("'stream' with 'tools' is not supported by the lab stand-in")
    return model, words, images, tools, max_tokens


def stream_request(req):
    """A streamed chat completion's settings, or None when 'stream' is not true: {"usage": bool,
    "words": [...]} where words are the reply's tokens (one word each). Like the real engines' sampling
    parameters: the reply ends after REPLY (the stand-in's end of sequence) unless 'ignore_eos' is true,
    in which case it runs to 'max_tokens'; 'min_tokens' keeps it going at least that long (REPLY's
    words again and again). Both engines read the two per request: vLLM 0.33's
    entrypoints/openai/chat_completion/protocol.py and SGLang 0.5.23's srt/entrypoints/openai/protocol.py
    (ChatCompletionRequest.min_tokens, .ignore_eos). `req` is json_body's object. Raises ValueError
    saying what is wrong."""
    if not req.get("stream"):
        return None
    options = req.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ValueError("'stream_options' must be an object")
    max_tokens, min_tokens, ignore_eos = req.get("max_tokens"), req.get("min_tokens") or 0, req.get("ignore_eos")
    if type(min_tokens) is not int or min_tokens < 0:
        raise ValueError("'min_tokens' must be a non-negative integer")
    if ignore_eos not in (None, True, False):
        raise ValueError("'ignore_eos' must be a boolean")
    reply = REPLY.split()
    n = max(len(reply), min_tokens) if not ignore_eos else (max_tokens or len(reply))
    n = min(n, max_tokens) if max_tokens else n
    words = [reply[i % len(reply)] for i in range(n)]
    return {"usage": bool(options.get("include_usage")), "words": words,
            "finish": "length" if max_tokens and n == max_tokens and (ignore_eos or n != len(reply)) else "stop"}


def stream_events(model, prompt_tokens, stream, step):
    """The server-sent events of a streamed chat.completion, as the OpenAI servers of vLLM and SGLang
    send them: a first chunk with the role, one chunk per token, the last with its finish_reason, a
    usage chunk (no choices) when stream_options.include_usage, then [DONE]. step() runs one engine
    step over every rank before each token (the decode); when it returns False the stream ends with an
    error event."""
    rid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())

    def chunk(delta, finish=None, **extra):
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}] if delta is not None else []
        body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": choices, **extra}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    yield chunk({"role": "assistant", "content": ""})
    words = stream["words"]
    for i, word in enumerate(words):
        if i and not step():  # the first token came out of the prefill step
            yield b"data: " + json.dumps(openai_error(500, ENGINE_ERROR_MESSAGE)).encode() + b"\n\n"
            return
        last = i == len(words) - 1
        yield chunk({"content": word if i == 0 else " " + word}, stream["finish"] if last else None)
    if stream["usage"]:
        yield chunk(None, usage={"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                                 "total_tokens": prompt_tokens + len(words)})
    yield b"data: [DONE]\n\n"


def completion_request(data):
    """Check a (legacy) completion body: (model, words, max_tokens). The probe of the pair's watchdog
    sends one: {"model": ..., "prompt": "ping", "max_tokens": 1}. Raises ValueError saying what is wrong."""
    req = json_body(data)
    model, prompt, max_tokens = (req.get(k) for k in ("model", "prompt", "max_tokens"))
    if not isinstance(model, str):
        raise ValueError("'model' must be a string")
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt or not all(isinstance(p, str) for p in prompt):
        raise ValueError("'prompt' must be a string or a non-empty list of strings")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise ValueError("'max_tokens' must be a positive integer")
    if req.get("stream"):
        raise ValueError("'stream' is not supported by the lab stand-in")
    return model, sum(len(p.split()) for p in prompt), max_tokens


def completion_reply(model, prompt_tokens, max_tokens):
    """A text_completion: REPLY cut to max_tokens words."""
    words = REPLY.split()[:max_tokens]
    finish = "stop" if len(words) == len(REPLY.split()) else "length"
    return {"id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "text": " ".join(words), "logprobs": None,
                                         "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                      "total_tokens": prompt_tokens + len(words)}}



def jit_shape(words, images, tools):
    """The shape a request compiles kernels for: its kind, and its length bucket (the smallest power
    of two >= max(16, words))."""
    bucket = 16
    while bucket < words:
        bucket *= 2
    return ("image" if images else "tools" if tools else "text"), bucket


def chat_reply(model, prompt_tokens, tools, max_tokens):
    """A chat.completion: a call of the first tool with no arguments when tools are given, else
    REPLY (cut to max_tokens words)."""
    if tools:
        call = {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                "function": {"name": tools[0]["function"]["name"], "arguments": "{}"}}
        message, finish, completion = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls", 1
    else:
        words = REPLY.split()[:max_tokens]
        message = {"role": "assistant", "content": " ".join(words)}
        finish, completion = ("stop" if len(words) == len(REPLY.split()) else "length"), len(words)
    return {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                      "total_tokens": prompt_tokens + completion}}


def fraction(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {value}")
    return value


def host_port(text):
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT, got {text!r}")
    return host, int(port)


def interface_ipv4(name):
    """The IPv4 address of netdev `name` (SIOCGIFADDR), as Gloo would bind to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def with_config(parser, argv):
    """--config FILE as sglang/srt/utils/server_args_config_parser.py merges it: a YAML mapping of
    flag names to values, each key becoming `--<key>` as written (api-key, not api_key), put before
    the command line (which wins). The stand-in reads only `key: value` scalars (a double-quoted
    value, a number, true/false)."""
    if "--config" not in argv:
        return argv
    i = argv.index("--config")
    if i == len(argv) - 1:
        parser.error("No config file specified after --config flag!")
    path = argv[i + 1]
    if not path.endswith((".yaml", ".yml")):
        parser.error(f"Config file must be YAML format: {path}")
    extra = []
    try:
        text = open(path).read()
    except OSError as e:
        parser.error(f"cannot read --config {path}: {e.strerror}")
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition(":")
        value = value.strip()
        if not sep or not key.strip():
            parser.error(f"--config {path} line {n}: not 'key: value'")
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        flag = "--" + key.strip()
        if value == "true":
            extra.append(flag)
        elif value != "false":
            extra += [flag, value]
    return extra + argv[:i] + argv[i + 2:]


def parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m sglang.launch_server", allow_abbrev=False,
                                description="sparkfleet lab stand-in for SGLang's launch_server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--revision")
    p.add_argument("--served-model-name")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--pp-size", type=int, default=1)
    p.add_argument("--dist-init-addr", type=host_port)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--mem-fraction-static", type=fraction)
    p.add_argument("--context-length", type=int)
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    p.add_argument("--quantization")
    p.add_argument("--dist-timeout", type=int)
    p.add_argument("--watchdog-timeout", type=float, default=300.0)  # srt/arg_groups/fields/device.py: 300
    p.add_argument("--speculative-algorithm", choices=SPECULATIVE_ALGORITHMS)
    for name in SPECULATIVE_NUMBERS:
        p.add_argument("--" + name.replace("_", "-"), type=int)
    p.add_argument("--speculative-draft-model-path")
    p.add_argument("--tool-call-parser")
    p.add_argument("--reasoning-parser")
    p.add_argument("--enable-multimodal", action="store_true")
    p.add_argument("--language-model-only", action="store_true")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--api-key")
    p.add_argument("--allowed-media-domains", nargs="+")
    p.add_argument("--config")
    p.add_argument("--enable-metrics", action="store_true")  # srt/arg_groups/fields/observability.py
    a = p.parse_args(with_config(p, argv))
    if a.nnodes < 1:
        p.error(f"--nnodes must be >= 1, got {a.nnodes}")
    if not 0 <= a.node_rank < a.nnodes:
        p.error(f"--node-rank {a.node_rank} is out of range for --nnodes {a.nnodes} (ranks are 0..{a.nnodes - 1})")
    # srt/arg_groups/validation_hook.py check_server_args: (tp_size x pp_size) % nnodes == 0.
    if a.tp_size < 1 or a.pp_size < 1 or (a.tp_size * a.pp_size) % a.nnodes:
        p.error(f"--tp-size {a.tp_size} x --pp-size {a.pp_size} is not a multiple of --nnodes {a.nnodes}: every "
                "node holds tp_size x pp_size / nnodes GPUs")
    if a.nnodes > 1 and a.dist_init_addr is None:
        p.error(f"--nnodes {a.nnodes} needs --dist-init-addr HOST:PORT (the head's address, on every rank)")
    if a.enable_multimodal and a.language_model_only:
        p.error("--enable-multimodal and --language-model-only contradict each other")
    numbers = {n: getattr(a, n) for n in SPECULATIVE_NUMBERS}
    if a.speculative_algorithm is None:
        given = [n for n, v in numbers.items() if v is not None] + (
            ["speculative_draft_model_path"] if a.speculative_draft_model_path else [])
        if given:
            p.error(f"--{given[0].replace('_', '-')} without --speculative-algorithm")
    else:
        missing = [n for n, v in numbers.items() if v is None]
        if missing:
            p.error(f"--speculative-algorithm {a.speculative_algorithm} without --{missing[0].replace('_', '-')}: "
                    "sparkfleet pins every speculative setting")
        if a.speculative_eagle_topk == 1 and a.speculative_num_draft_tokens != a.speculative_num_steps + 1:
            p.error(f"--speculative-num-draft-tokens {a.speculative_num_draft_tokens} with --speculative-eagle-topk 1: "
                    f"SGLang silently replaces it by --speculative-num-steps + 1 = {a.speculative_num_steps + 1}")
    a.host_ip = None
    if a.nnodes > 1:
        ifname = os.environ.get("GLOO_SOCKET_IFNAME", "")
        if not ifname:
            p.error("GLOO_SOCKET_IFNAME is not set: with --nnodes > 1 every rank needs it (without it Gloo "
                    "binds loopback in a host-network container and the peer's connection is refused)")
        try:
            a.host_ip = interface_ipv4(ifname)
        except OSError as e:
            p.error(f"GLOO_SOCKET_IFNAME={ifname}: no IPv4 address on that netdev ({e.strerror or e})")
    try:
        a.join_timeout = float(os.environ.get("SFL_STANDIN_JOIN_TIMEOUT_S", "600"))
    except ValueError:
        p.error("SFL_STANDIN_JOIN_TIMEOUT_S must be a number of seconds")
    try:
        a.jit_ms = float(os.environ.get("SFL_STANDIN_JIT_MS") or "20")
        if not 0 <= a.jit_ms <= 60000:
            raise ValueError
    except ValueError:
        p.error("SFL_STANDIN_JIT_MS must be a number of milliseconds (0 to 60000)")
    try:
        a.gloo_timeout = float(os.environ.get("SFL_STANDIN_GLOO_TIMEOUT_S") or GLOO_TIMEOUT_S)
        if not a.gloo_timeout > 0:
            raise ValueError
    except ValueError:
        p.error("SFL_STANDIN_GLOO_TIMEOUT_S must be a positive number of seconds")
    # srt/entrypoints/http_server.py: HEALTH_CHECK_TIMEOUT = int(os.getenv("SGLANG_HEALTH_CHECK_TIMEOUT", 20)),
    # read when rank 0's HTTP server is imported; a value int() refuses fails the real server too.
    a.health_check_timeout = None
    if a.node_rank == 0:
        try:
            a.health_check_timeout = int(os.getenv("SGLANG_HEALTH_CHECK_TIMEOUT", 20))
        except ValueError as e:
            p.error(f"SGLANG_HEALTH_CHECK_TIMEOUT: {e} (srt/entrypoints/http_server.py reads it with int())")
    # This node's first PP stage and TP rank, as srt/entrypoints/engine.py _calculate_rank_ranges places
    # them; the scheduler's log prefix shows the stage when pp_size > 1 (srt/managers/scheduler.py).
    nodes_per_stage = max(a.nnodes // a.pp_size, 1)
    a.pp_rank = max(a.pp_size // a.nnodes, 1) * (a.node_rank // nodes_per_stage)
    a.tp_rank = (a.tp_size // nodes_per_stage) * (a.node_rank % nodes_per_stage)
    a.prefix = (f"PP{a.pp_rank} " if a.pp_size > 1 else "") + f"TP{a.tp_rank}"
    return a


def hello_of(args):
    return {"rank": args.node_rank, "host_ip": args.host_ip, "model": args.model_path,
            "nnodes": args.nnodes, "tp_size": args.tp_size, "pp_size": args.pp_size}


class Link:
    """The head's end of a joined rank's rendezvous connection. Head.member() reads it (the rank's
    answers go to `answers`, then None once it dropped); only the scheduler thread sends on it and
    waits for its answers, and `lock` is held while the hello is answered, so no tick overtakes it."""

    def __init__(self, rank, conn, peer):
        self.rank, self.conn, self.peer = rank, conn, peer
        self.lock = threading.Lock()
        self.answers = queue.Queue()

    def send(self, message):
        self.conn.sendall((json.dumps(message) + "\n").encode())

    def expect(self, key, n, deadline):
        """Wait for the rank's {key: n}: True once it came, False at `deadline` (None: no deadline),
        None once the rank dropped."""
        while True:
            try:
                answer = self.answers.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return False
            if answer is None:
                self.answers.put(None)  # stays dropped for every later wait
                return None
            if answer.get(key) == n:
                return True


class Item:
    """A unit of work for the scheduler loop: a request's kernel shape, or None for /health's probe
    (a 1-token generate that compiles nothing new). `done` is set once its batch ran on every rank."""

    def __init__(self, shape):
        self.shape = shape
        self.done = threading.Event()


class Head:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.joined = {}  # rank -> {"host_ip", "peer_ip", "peer_port"}
        self.links = {}  # rank -> Link
        self.started = threading.Event()  # set once this rank's startup kernels are compiled
        self.up = threading.Event()  # set once the first iteration ran on every rank (ServerStatus.Up)
        self.cond = threading.Condition()  # guards pending, completed, last_receive
        self.pending = []  # Items not yet taken by the scheduler loop
        self.completed = 0  # Items whose batch ran (the tokenizer manager's received outputs)
        self.last_receive = time.time()
        self.progress = Progress()
        self.name = args.served_model_name or args.model_path
        # --enable-metrics: what SGLang's metrics collector counts (srt/observability/metrics_collector.py),
        # under its names; the running gauge counts requests between arrival and answer.
        self.counts = {"sglang:prompt_tokens_total": 0, "sglang:generation_tokens_total": 0,
                       "sglang:num_requests_total": 0}
        self.running = 0

    def missing(self):
        with self.lock:
            return [r for r in range(1, self.args.nnodes) if r not in self.joined]

    def refusal(self, hello):
        """Why a rank's hello is refused (None: accepted). Called with the lock held."""
        mine = hello_of(self.args)
        for key in ("model", "nnodes", "tp_size", "pp_size"):
            if hello.get(key) != mine[key]:
                return f"{key} {hello.get(key)!r} differs from the head's {mine[key]!r}"
        rank = hello.get("rank")
        if not isinstance(rank, int) or not 1 <= rank < self.args.nnodes:
            return f"rank {rank!r} is not in 1..{self.args.nnodes - 1}"
        if rank in self.joined:
            return f"rank {rank} already joined from {self.joined[rank]['peer_ip']}"
        return None

    def member(self, conn, peer):
        reader = conn.makefile("rb")  # one buffered reader for the connection's whole life
        try:
            conn.settimeout(10)
            hello = json.loads(reader.readline(4096))
            if not isinstance(hello, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            log(f"refused a connection from {peer[0]}:{peer[1]}: no valid hello ({e})")
            conn.close()
            return
        link = Link(hello.get("rank"), conn, peer)
        with link.lock:  # until the hello is answered: no request's jit line may overtake the answer
            with self.lock:
                why = self.refusal(hello)
                if not why:
                    rank = hello["rank"]
                    self.joined[rank] = {"host_ip": hello.get("host_ip"), "peer_ip": peer[0], "peer_port": peer[1]}
                    self.links[rank] = link
                    complete = len(self.joined) == self.args.nnodes - 1
            if why:
                log(f"refused rank {hello.get('rank')!r} from {peer[0]}: {why}")
                try:
                    conn.sendall((json.dumps({"ok": False, "error": why}) + "\n").encode())
                except OSError:
                    pass
                conn.close()
                return
            log(f"rank {rank} joined from {peer[0]}")
            with contextlib.suppress(OSError):  # a failed answer is a drop: the read below notices it
                conn.sendall(b'{"ok": true}\n')
        if complete:
            log(f"all {self.args.nnodes} ranks joined; serving {self.args.model_path} on {self.args.host}:{self.args.port}")
            jit_compile(self.args, STARTUP)
            self.started.set()
        try:
            conn.settimeout(None)  # no keepalive, no timeout: Gloo sets neither on its sockets
            for line in reader:  # until the rank drops: its answers to the scheduler's ticks
                try:
                    answer = json.loads(line)
                except ValueError:
                    answer = None
                if isinstance(answer, dict):
                    link.answers.put(answer)
                else:
                    log(f"rank {rank}: ignoring a line that is no JSON object: {line[:100]!r}")
        except OSError:
            pass
        link.answers.put(None)  # the scheduler's next broadcast fails on it
        log(f"rank {rank} ({peer[0]}) dropped its connection; the pair is broken")

    def scheduler(self):
        """Rank 0's scheduler loop (srt/managers/scheduler.py event_loop_normal). Each iteration, idle
        included: ingest_requests -> recv_requests -> _broadcast_reqs_across_ranks
        (srt/managers/scheduler_components/request_receiver.py) -> broadcast_pyobj on the Gloo group:
        here a tick with the new work to every rank, waited for up to the Gloo timeout. Then
        cur_batch_for_debug = the batch (None when idle) and, with a batch, run_batch: forward_ct += 1
        and the forward on every rank (each compiles the batch's new shapes), waited for without a
        bound of its own (the watchdog is the bound). A broadcast that fails or times out is a
        scheduler exception: the process exits."""
        self.started.wait()
        with self.lock:
            links = [self.links[r] for r in sorted(self.links)]
        scheduler_watchdog(self.args.watchdog_timeout, self.progress, self.args.prefix)
        gloo = self.args.gloo_timeout
        n = 0
        while True:
            with self.cond:
                if not self.pending:
                    self.cond.wait(IDLE_TICK_S)
                items, self.pending = self.pending, []
            n += 1
            shapes = list(dict.fromkeys(item.shape for item in items if item.shape))
            tick = {"tick": n, "reqs": len(items), "jit": [list(shape) for shape in shapes]}
            deadline = time.monotonic() + gloo
            for link in links:
                try:
                    link.send(tick)
                except OSError:
                    scheduler_died(self.args.prefix, gloo_closed(link.peer))
            for link in links:
                got = link.expect("got", n, deadline)
                if not got:
                    scheduler_died(self.args.prefix, gloo_timed_out(gloo, "send") if got is False else
                                   gloo_closed(link.peer))
            self.progress.cur_batch = items or None
            if items:
                self.progress.forward_ct += 1
                for shape in shapes:
                    jit_compile(self.args, shape)
                for link in links:
                    if link.expect("done", n, None) is None:
                        scheduler_died(self.args.prefix, gloo_closed(link.peer))
                for item in items:
                    item.done.set()
            with self.cond:
                self.completed += len(items)
                if items:
                    self.last_receive = time.time()
                self.cond.notify_all()
            self.up.set()

    def decode(self, shape):
        """One more iteration of the loop for a streamed request (its next token)."""
        item = Item(shape)
        self.submit(item)
        item.done.wait()
        return True

    def submit(self, item):
        with self.cond:
            self.pending.append(item)
            self.cond.notify_all()

    def health(self):
        """/health and /health_generate, one handler in SGLang (srt/entrypoints/http_server.py
        health_generate): 503 while starting; else a 1-token generate goes through the scheduler loop
        and the answer is 200 as soon as any output arrives after it was sent (last_receive_tstamp),
        503 after SGLANG_HEALTH_CHECK_TIMEOUT without one. (The real handler looks once a second;
        the stand-in answers at once.)"""
        if not self.up.is_set():
            return 503, {"status": "starting", "ranks": self.args.nnodes}
        timeout, tic = self.args.health_check_timeout, time.time()
        probe = Item(None)
        with self.cond:
            before = self.completed
            self.pending.append(probe)
            self.cond.notify_all()
            if self.cond.wait_for(lambda: self.completed > before, timeout=timeout):
                return 200, {"status": "ok", "ranks": self.args.nnodes}
            with contextlib.suppress(ValueError):  # the probe is dropped, as its rid is
                self.pending.remove(probe)
            last = self.last_receive
        log(f"Health check failed. Server couldn't get a response from detokenizer for last {timeout} seconds. "
            f"tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. "
            f"last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(last))}")
        return 503, {"status": "unhealthy", "ranks": self.args.nnodes}

    def chat(self, data):
        """POST /v1/chat/completions: (status, body). Answered once every rank has compiled the
        request's shape, so the kernel caches are settled when the answer arrives."""
        missing = self.missing()
        if missing:
            return 503, {"object": "error", "message": f"waiting for ranks {missing}"}
        try:
            req = json_body(data)  # parsed once: a body may carry inline images up to MAX_BODY
            model, words, images, tools, max_tokens = chat_request(req)
            stream = stream_request(req)
        except ValueError as e:
            return 400, openai_error(400, str(e))
        if model != self.name:
            return 404, openai_error(404, f"The model `{model}` does not exist.", "model")
        if images and self.args.language_model_only:
            return 400, openai_error(400, "image input is disabled: the server runs with --language-model-only")
        shape = jit_shape(words, images, tools)
        item = Item(shape)
        self.served(item, words + IMAGE_TOKENS * images, max_tokens)  # no timeout of its own, as in SGLang
        if stream:  # each further token goes through the loop again, batched with whatever else runs
            return 200, stream_events(self.name, words + IMAGE_TOKENS * images, stream, lambda: self.decode(shape))
        return 200, chat_reply(self.name, words + IMAGE_TOKENS * images, tools, max_tokens)

    def complete(self, data):
        """POST /v1/completions (sglang/srt/entrypoints/http_server.py openai_v1_completions): a text
        prompt through the same scheduler loop as a chat completion, so a stalled loop holds it."""
        missing = self.missing()
        if missing:
            return 503, {"object": "error", "message": f"waiting for ranks {missing}"}
        try:
            model, words, max_tokens = completion_request(data)
        except ValueError as e:
            return 400, openai_error(400, str(e))
        if model != self.name:
            return 404, openai_error(404, f"The model `{model}` does not exist.", "model")
        self.served(Item(jit_shape(words, 0, [])), words, max_tokens)
        return 200, completion_reply(self.name, words, max_tokens)

    def served(self, item, prompt_tokens, max_tokens):
        """Submit a request's item and wait until its batch ran, counted as SGLang's metrics count it."""
        with self.cond:
            self.running += 1
        try:
            self.submit(item)
            item.done.wait()
        finally:
            with self.cond:
                self.running -= 1
                self.counts["sglang:num_requests_total"] += 1
                self.counts["sglang:prompt_tokens_total"] += prompt_tokens
                self.counts["sglang:generation_tokens_total"] += max(1, max_tokens or 1)

    def metrics(self) -> str:
        """GET /metrics with --enable-metrics (sglang/srt/utils/common.py add_prometheus_middleware), in
        the Prometheus text format; without it SGLang has no such route."""
        labels = f'{{model_name="{self.name}"}}'
        with self.cond:
            queued = sum(1 for i in self.pending if i.shape is not None)
            rows = [(name, "counter", value) for name, value in self.counts.items()]
            rows += [("sglang:num_running_reqs", "gauge", max(0, self.running - queued)),
                     ("sglang:num_queue_reqs", "gauge", queued)]
        return "".join(f"# TYPE {name} {kind}\n{name}{labels} {float(value)}\n" for name, kind, value in rows)

    def route(self, path):
        missing, n = self.missing(), self.args.nnodes
        if path == "/ranks":
            with self.lock:
                rows = [{"rank": r, **self.joined[r]} for r in sorted(self.joined)]
            return 200, [{"rank": 0, "host_ip": self.args.host_ip, "peer_ip": None, "peer_port": None}] + rows
        if path in ("/health", "/health_generate"):
            return (503, {"status": "waiting", "ranks": n, "missing": missing}) if missing else self.health()
        if path == "/v1/models":
            return (503, {"object": "error", "message": f"waiting for ranks {missing}"}) if missing else \
                (200, {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": OWNER,
                                                   "max_model_len": self.args.context_length}]})
        return 404, {"object": "error", "message": f"no route {path}"}

    def run(self):
        head = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def reply(self, code, body):
                if not isinstance(body, (dict, list)):  # a stream of server-sent events
                    self.send_response(code)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for event in body:
                        self.wfile.write(event)
                        self.wfile.flush()
                    self.close_connection = True
                    return
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def authorized(self):
                """sglang/srt/utils/auth.py: with --api-key, every path but /health*, /ready* and
                /metrics* needs 'Authorization: Bearer <key>' (401 otherwise)."""
                path = self.path.split("?", 1)[0]
                key = head.args.api_key
                if not key or self.command == "OPTIONS" or path.startswith(("/health", "/ready", "/metrics")):
                    return True
                scheme, _, param = (self.headers.get("Authorization") or "").partition(" ")
                if scheme.lower() == "bearer" and hmac.compare_digest(param, key):
                    return True
                self.reply(401, {"error": "Unauthorized"})
                return False

            def do_GET(self):
                if not self.authorized():
                    return
                if self.path.split("?", 1)[0] == "/metrics" and head.args.enable_metrics:
                    data = head.metrics().encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.reply(*head.route(self.path.split("?", 1)[0]))

            def do_POST(self):
                path = self.path.split("?", 1)[0]
                if not self.authorized():
                    return
                if path not in ("/v1/chat/completions", "/v1/completions"):
                    return self.reply(404, {"object": "error", "message": f"no route {path}"})
                length = self.headers.get("Content-Length", "")
                if not length.isdigit() or int(length) > MAX_BODY:
                    return self.reply(400, openai_error(400, f"a JSON body with a Content-Length of at most "
                                                             f"{MAX_BODY} bytes is required"))
                body = self.rfile.read(int(length))
                self.reply(*(head.chat(body) if path == "/v1/chat/completions" else head.complete(body)))

            def log_message(self, *_):  # no line per request: probes poll /health
                pass

        try:
            httpd = http.server.ThreadingHTTPServer((self.args.host, self.args.port), Handler)
            httpd.daemon_threads = True
        except OSError as e:
            log(f"cannot serve HTTP on {self.args.host}:{self.args.port}: {e}")
            return 1
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        if self.args.nnodes > 1:
            addr = self.args.dist_init_addr
            try:
                srv = socket.create_server(addr, backlog=16)
            except OSError as e:
                log(f"cannot listen on --dist-init-addr {addr[0]}:{addr[1]}: {e}")
                return 1
            log(f"dist-init listening on {addr[0]}:{addr[1]}, waiting for ranks {self.missing()}")

            def accept():
                while True:
                    conn, peer = srv.accept()
                    threading.Thread(target=self.member, args=(conn, peer), daemon=True).start()
            threading.Thread(target=accept, daemon=True).start()
        else:
            log(f"single node; serving {self.args.model_path} on {self.args.host}:{self.args.port}")
            jit_compile(self.args, STARTUP)
            self.started.set()
        threading.Thread(target=self.scheduler, daemon=True).start()
        while True:  # until a signal, or a scheduler's death (os._exit)
            time.sleep(3600)


def join(args):
    """Rank > 0: no HTTP server, as in SGLang; joins the head, then runs its side of the lockstep:
    each of the head's ticks is acknowledged (the broadcast received), and one that carries a batch
    is run (its new shapes compiled) and reported done. It lives as long as the link."""
    head, timeout = args.dist_init_addr, args.join_timeout
    deadline, last_note, tries = time.monotonic() + timeout, float("-inf"), 0
    log(f"joining head {head[0]}:{head[1]} from {args.host_ip} (for up to {timeout:g} s)")
    while True:
        tries += 1
        try:
            conn = socket.create_connection(head, timeout=5, source_address=(args.host_ip, 0))
            break
        except OSError as e:
            now = time.monotonic()
            if now >= deadline:
                log(f"head {head[0]}:{head[1]} not reachable after {timeout:g} s ({tries} tries, last: {e}); exiting 1")
                return 1
            if now - last_note >= 30:
                log(f"head {head[0]}:{head[1]} not reachable yet ({e}); retrying")
                last_note = now
            time.sleep(min(0.5, max(0.0, deadline - now)))
    reader = conn.makefile("rb")  # one buffered reader: the head's jit lines may follow its answer at once
    try:
        conn.sendall((json.dumps(hello_of(args)) + "\n").encode())
        conn.settimeout(30)
        answer = json.loads(reader.readline(4096) or b"{}")
    except (OSError, ValueError) as e:
        log(f"no answer from the head ({e}); exiting 1")
        return 1
    if not answer.get("ok"):
        log(f"the head refused rank {args.node_rank}: {answer.get('error', 'connection closed')}; exiting 1")
        return 1
    log(f"joined head {head[0]}:{head[1]} as rank {args.node_rank} of {args.nnodes}")
    peer = conn.getpeername()[:2]
    jit_compile(args, STARTUP)

    # srt/entrypoints/engine.py: once its schedulers are ready, a rank >= 1 replaces SIGTERM by a
    # handler that only logs; rank 0's ShutdownReq broadcast (or a kill) ends it, so `docker stop`
    # costs the container's stop timeout unless the head stopped first.
    def sigterm_handler(_signum, _frame):
        log(f"SIGTERM received on node_rank {args.node_rank}; waiting for the rank-0 ShutdownReq broadcast "
            "to stop the schedulers.")
    signal.signal(signal.SIGTERM, sigterm_handler)

    progress = Progress()
    scheduler_watchdog(args.watchdog_timeout, progress, args.prefix)
    conn.settimeout(args.gloo_timeout)  # no keepalive: Gloo sets none; its timeout bounds each receive
    try:
        while True:  # event_loop_normal on this rank: ingest (the broadcast from rank 0), then the batch
            try:
                line = reader.readline()
            except TimeoutError:
                scheduler_died(args.prefix, gloo_timed_out(args.gloo_timeout, "recv"))
            if not line:
                break
            tick = tick_request(line)
            if tick is None:
                log(f"ignoring a line from the head that is no tick: {line[:100]!r}")
                continue
            n, reqs, shapes = tick
            conn.sendall((json.dumps({"got": n}) + "\n").encode())
            progress.cur_batch = [None] * reqs or None  # kept while blocked in the next broadcast
            if reqs:
                progress.forward_ct += 1
                for shape in shapes:
                    jit_compile(args, shape)
                conn.sendall((json.dumps({"done": n}) + "\n").encode())
    except OSError:
        pass
    log("the head dropped the connection; the pair is broken")
    scheduler_died(args.prefix, gloo_closed(peer))


def main(argv):
    global RANK
    RANK = next((v for k, v in zip(argv, argv[1:]) if k == "--node-rank"), "?")  # until parsed
    log("argv: " + shlex.join(["python3", "-m", "sglang.launch_server", *argv]))
    args = parse(argv)
    RANK = str(args.node_rank)

    def stop(signum, _frame):
        log(f"{signal.Signals(signum).name}: exiting 0")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return join(args) if args.node_rank > 0 else Head(args).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
