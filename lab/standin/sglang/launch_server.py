#!/usr/bin/env python3
"""Lab stand-in for `python3 -m sglang.launch_server` (the lab has no GPU). It is not SGLang: it
accepts exactly the flags sparkfleet renders for SGLang (anything else is refused, no
abbreviations), runs the same command on every rank like a real multi-node SGLang pair (no
--headless: rank 0 serves HTTP, ranks > 0 join it over --dist-init-addr HOST:PORT), answers
/health and /v1/models once every rank has joined, and fails like a real pair (a rank drops, its
peer exits 1). Python 3.11 standard library only, Linux only. Never used by the deploy on real
Sparks. Run it as `python3 -m sglang.launch_server` with this file's parent directory on
PYTHONPATH (the lab image installs it so).

Environment: GLOO_SOCKET_IFNAME (required when --nnodes > 1: torch's Gloo group binds to that
netdev's address, and without it multi-node SGLang in Docker picks loopback and its peers are
refused; each rank's connection here is made from that address), SFL_STANDIN_JOIN_TIMEOUT_S
(ranks > 0: how long to keep trying the head, default 600)."""
import argparse
import fcntl
import http.server
import json
import os
import shlex
import signal
import socket
import struct
import sys
import threading
import time

OWNER = "sparkfleet-lab-standin"
RANK = "?"
# SGLang's names (python/sglang/srt/server_args.py): --kv-cache-dtype choices and the builtin
# --speculative-algorithm values.
KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16",
                   "fp4_e2m1")
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK")
SPECULATIVE_NUMBERS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


def log(msg):
    print(f"sglang-standin[rank {RANK}]: {msg}", flush=True)


def keepalive(conn):
    """Notice a peer that vanished without closing (host frozen, cable pulled) within ~15 s."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 5)):
        if hasattr(socket, opt):
            conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)


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


def parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m sglang.launch_server", allow_abbrev=False,
                                description="sparkfleet lab stand-in for SGLang's launch_server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--revision")
    p.add_argument("--served-model-name")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--dist-init-addr", type=host_port)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--mem-fraction-static", type=fraction)
    p.add_argument("--context-length", type=int)
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    p.add_argument("--speculative-algorithm", choices=SPECULATIVE_ALGORITHMS)
    for name in SPECULATIVE_NUMBERS:
        p.add_argument("--" + name.replace("_", "-"), type=int)
    p.add_argument("--speculative-draft-model-path")
    p.add_argument("--tool-call-parser")
    p.add_argument("--reasoning-parser")
    p.add_argument("--enable-multimodal", action="store_true")
    p.add_argument("--language-model-only", action="store_true")
    p.add_argument("--trust-remote-code", action="store_true")
    a = p.parse_args(argv)
    if a.nnodes < 1:
        p.error(f"--nnodes must be >= 1, got {a.nnodes}")
    if not 0 <= a.node_rank < a.nnodes:
        p.error(f"--node-rank {a.node_rank} is out of range for --nnodes {a.nnodes} (ranks are 0..{a.nnodes - 1})")
    if a.tp_size < 1 or a.tp_size % a.nnodes:
        p.error(f"--tp-size {a.tp_size} is not a multiple of --nnodes {a.nnodes}: every node holds "
                "tp_size / nnodes GPUs")
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
    return a


def hello_of(args):
    return {"rank": args.node_rank, "host_ip": args.host_ip, "model": args.model_path,
            "nnodes": args.nnodes, "tp_size": args.tp_size}


class Head:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.joined = {}  # rank -> {"host_ip", "peer_ip", "peer_port"}
        self.failed = threading.Event()
        self.name = args.served_model_name or args.model_path

    def missing(self):
        with self.lock:
            return [r for r in range(1, self.args.nnodes) if r not in self.joined]

    def refusal(self, hello):
        """Why a rank's hello is refused (None: accepted). Called with the lock held."""
        mine = hello_of(self.args)
        for key in ("model", "nnodes", "tp_size"):
            if hello.get(key) != mine[key]:
                return f"{key} {hello.get(key)!r} differs from the head's {mine[key]!r}"
        rank = hello.get("rank")
        if not isinstance(rank, int) or not 1 <= rank < self.args.nnodes:
            return f"rank {rank!r} is not in 1..{self.args.nnodes - 1}"
        if rank in self.joined:
            return f"rank {rank} already joined from {self.joined[rank]['peer_ip']}"
        return None

    def member(self, conn, peer):
        try:
            conn.settimeout(10)
            hello = json.loads(conn.makefile("rb").readline(4096))
            if not isinstance(hello, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            log(f"refused a connection from {peer[0]}:{peer[1]}: no valid hello ({e})")
            conn.close()
            return
        with self.lock:
            why = self.refusal(hello)
            if not why:
                rank = hello["rank"]
                self.joined[rank] = {"host_ip": hello.get("host_ip"), "peer_ip": peer[0], "peer_port": peer[1]}
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
        if complete:
            log(f"all {self.args.nnodes} ranks joined; serving {self.args.model_path} on {self.args.host}:{self.args.port}")
        try:
            conn.sendall(b'{"ok": true}\n')
            keepalive(conn)
            conn.settimeout(None)
            while conn.recv(4096):
                pass
        except OSError:
            pass
        log(f"rank {rank} ({peer[0]}) dropped its connection; the pair is broken, exiting 1")
        self.failed.set()

    def route(self, path):
        missing, n = self.missing(), self.args.nnodes
        if path == "/ranks":
            with self.lock:
                rows = [{"rank": r, **self.joined[r]} for r in sorted(self.joined)]
            return 200, [{"rank": 0, "host_ip": self.args.host_ip, "peer_ip": None, "peer_port": None}] + rows
        if path == "/health":
            return (503, {"status": "waiting", "ranks": n, "missing": missing}) if missing else \
                (200, {"status": "ok", "ranks": n})
        if path == "/v1/models":
            return (503, {"object": "error", "message": f"waiting for ranks {missing}"}) if missing else \
                (200, {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": OWNER,
                                                   "max_model_len": self.args.context_length}]})
        return 404, {"object": "error", "message": f"no route {path}"}

    def run(self):
        head = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                code, body = head.route(self.path.split("?", 1)[0])
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

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
        while not self.failed.wait(0.5):
            pass
        return 1


def join(args):
    """Rank > 0: no HTTP server, as in SGLang; joins the head and lives as long as the link."""
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
    try:
        conn.sendall((json.dumps(hello_of(args)) + "\n").encode())
        conn.settimeout(30)
        answer = json.loads(conn.makefile("rb").readline(4096) or b"{}")
    except (OSError, ValueError) as e:
        log(f"no answer from the head ({e}); exiting 1")
        return 1
    if not answer.get("ok"):
        log(f"the head refused rank {args.node_rank}: {answer.get('error', 'connection closed')}; exiting 1")
        return 1
    log(f"joined head {head[0]}:{head[1]} as rank {args.node_rank} of {args.nnodes}")
    keepalive(conn)
    conn.settimeout(None)
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    log("the head dropped the connection; the pair is broken, exiting 1")
    return 1


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
