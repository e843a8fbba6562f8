"""The benchmark receipt (roles/receipt): its figures from llama-benchy's report, the comparison
`make status` prints, the fact that reads receipts back, and the load generator run for real against
the lab's vLLM stand-in (a two-rank pair on 127.0.0.1) with a key and a word-level tokenizer, directly
and through the receipt's tunnel (a Unix socket only the load generator's process may use), its
output cleared of the key."""
import copy
import importlib.util
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from roles.receipt.receipt import (
    RECEIPT_STEP, Receipts, Tunnel, deploy_steps, drops, figures, run_load, scrub, status_lines, table,
)
from sparkfleet.config import build_cluster
from sparkfleet.model.serving import node_profile
from sparkfleet.model.tls import ca_bundle_path
from sparkfleet.progress import Span
from tests.proxy_run import fleet_tls, running_proxy
from tests.unit.helpers import pair
from tests.unit import test_lab_standin as standin

REPO = Path(__file__).resolve().parents[2]
RECORDED = json.loads((REPO / "tests/unit/fixtures/receipt_lab.json").read_text())  # a lab deploy's receipt


def test_figures_are_llama_benchys_means_per_concurrency():
    got = figures(RECORDED["report"])
    assert [f["concurrency"] for f in got] == [1, 4]
    runs = {r["concurrency"]: r for r in RECORDED["report"]["benchmarks"]}
    for f in got:
        run = runs[f["concurrency"]]
        assert f["decode_tps_aggregate"] == round(run["tg_throughput"]["mean"], 2)
        assert f["decode_tps_per_request"] == round(run["tg_req_throughput"]["mean"], 2)
        assert f["ttft_ms"] == round(run["e2e_ttft"]["mean"], 2)
        assert (f["prompt_tokens"], f["decode_tokens"]) == (512, 64)


def scaled(receipt, key, concurrency, factor):
    out = copy.deepcopy(receipt)
    for f in out["figures"]:
        if f["concurrency"] == concurrency:
            f[key] = round(f[key] * factor, 2)
    return out


def test_a_drop_beyond_the_threshold_is_flagged_with_the_numbers_and_a_smaller_one_is_not():
    previous = RECORDED
    assert drops(previous, previous, 10) == []
    slower = scaled(previous, "decode_tps_aggregate", 4, 0.8)
    [line] = drops(slower, previous, 10)
    old = next(f for f in previous["figures"] if f["concurrency"] == 4)["decode_tps_aggregate"]
    assert line.startswith(f"DROP at concurrency 4: decode t/s aggregate {old} -> ") and "(-20.0 %, threshold 10 %)" in line
    assert drops(scaled(previous, "decode_tps_aggregate", 4, 0.95), previous, 10) == []
    assert drops(scaled(previous, "decode_tps_aggregate", 4, 1.5), previous, 10) == []  # faster is no drop
    [ttft] = drops(scaled(previous, "ttft_ms", 1, 1.25), previous, 10)  # for TTFT, higher is worse
    assert ttft.startswith("DROP at concurrency 1: TTFT ms") and "+25.0 %" in ttft


def test_status_shows_the_latest_then_the_previous_then_the_verdict():
    assert status_lines([], 10) == ["no receipt yet (one is taken after every deploy that restarts the pair)"]
    one = status_lines([RECORDED], 10)
    assert one[0].startswith(f"receipt {RECORDED['taken_at']}: profile glm-5.3-flash-exl3") and \
        one[-1] == "no previous receipt to compare with"
    latest = scaled(RECORDED, "decode_tps_per_request", 1, 0.5)
    two = status_lines([latest, RECORDED], 10)
    assert two[:len(table(latest).splitlines())] == table(latest).splitlines()
    assert any(line.startswith("previous receipt ") for line in two)
    assert two[-1].startswith("DROP at concurrency 1: decode t/s per request")
    assert status_lines([RECORDED, RECORDED], 10)[-1] == "no figure dropped by more than 10 %"


def test_the_receipt_keeps_its_pairs_steps_of_this_deploy_then_its_own():
    """What bench/bringup.py reads back: the pair's long steps in the order they ended, the other
    group's left out, and the receipt's own last, on the head."""
    spans = [Span("spark-a", "Build x on the head", 10.0, 60.0, True), Span("spark-c", "prewarm", 20.0, 30.0, True),
             Span("spark-b", "Pull x from the head", 61.0, 70.0, True), Span("spark-a", "prewarm", 71.0, 99.5, True)]
    steps = deploy_steps(("spark-a", "spark-b"), "spark-a", 120.0, 124.25, spans)
    assert [(s["host"], s["step"]) for s in steps] == [
        ("spark-a", "Build x on the head"), ("spark-b", "Pull x from the head"), ("spark-a", "prewarm"),
        ("spark-a", RECEIPT_STEP)]
    assert steps[-1] == {"host": "spark-a", "step": RECEIPT_STEP, "start": 120.0, "end": 124.25, "ok": True}
    assert json.loads(json.dumps(steps)) == steps  # as the receipt's JSON keeps them


def test_the_receipts_fact_reads_the_newest_two_and_skips_a_torn_file():
    fact = Receipts()
    assert "sort -r | head -2" in fact.command("/var/lib/sparkfleet/receipts/p")
    text = json.dumps(RECORDED, indent=1)
    assert fact.process(text.splitlines() + ["#--", "{not json", "#--"]) == [RECORDED]
    assert fact.process([]) == []


def make_models():
    spec = importlib.util.spec_from_file_location("make_models", REPO / "lab/model/make-models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_load_generator_measures_a_real_stand_in_pair_with_the_key_from_stdin(launch, tmp_path):
    """llama-benchy's load through the key-protected API of a two-rank stand-in: a streamed first
    token first, then one pass per concurrency with exactly the asked decode length."""
    (tmp_path / "tokenizer.json").write_bytes(make_models().tokenizer_json())
    ports, key = {"http": standin.free_port(), "master": standin.free_port()}, "k" * 32
    run = lambda *args, **extra: launch([sys.executable, str(standin.VLLM), *args], standin.env(**extra))  # noqa: E731
    standin.start_pair(run, ports, head_env={"VLLM_API_KEY": key})
    base = f"http://127.0.0.1:{ports['http']}/v1"
    job = {"base_url": base, "api_key": key, "model": "lab", "tokenizer": str(tmp_path), "prompt_tokens": 64,
           "decode_tokens": 16, "concurrency": [1, 2], "runs": 1, "timeout_s": 30}
    before = time.time()
    done = subprocess.run([sys.executable, "-m", "roles.receipt.loadgen"], input=json.dumps(job), cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert before < result["first_token_at"] < time.time()
    got = figures(result["report"])
    assert [(f["concurrency"], f["decode_tokens"]) for f in got] == [(1, 16), (2, 16)]
    assert all(f["decode_tps_aggregate"] > 0 and f["ttft_ms"] > 0 for f in got)
    wrong = subprocess.run([sys.executable, "-m", "roles.receipt.loadgen"], input=json.dumps({**job, "api_key": "x" * 32}),
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert wrong.returncode != 0 and "401" in wrong.stderr


class LoopbackTransport:
    """paramiko's Transport as the Tunnel uses it, its direct-tcpip channels as TCP connections on this
    machine (the head's API on 127.0.0.1 here): what the tunnel is judged on is its controller end."""

    def __init__(self):
        self.opened = 0

    def open_channel(self, kind, dest, origin):
        assert kind == "direct-tcpip" and dest[0] == "127.0.0.1"
        self.opened += 1
        return socket.create_connection(dest, timeout=10)


def test_the_load_generator_measures_the_stand_in_through_the_tunnel_and_only_it_is_served(launch, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes(make_models().tokenizer_json())
    ports, key = {"http": standin.free_port(), "master": standin.free_port()}, "k" * 32
    run = lambda *args, **extra: launch([sys.executable, str(standin.VLLM), *args], standin.env(**extra))  # noqa: E731
    standin.start_pair(run, ports, head_env={"VLLM_API_KEY": key})
    transport = LoopbackTransport()
    tunnel = Tunnel(transport, ports["http"])
    try:
        job = {"base_url": "http://127.0.0.1/v1", "unix_socket": tunnel.path, "api_key": key, "model": "lab",
               "tokenizer": str(tmp_path), "prompt_tokens": 64, "decode_tokens": 16, "concurrency": [1, 2],
               "runs": 1, "timeout_s": 30}
        done = run_load(job, tunnel, 120)
        assert done.returncode == 0, done.stderr
        got = figures(json.loads(done.stdout)["report"])
        assert [(f["concurrency"], f["decode_tokens"]) for f in got] == [(1, 16), (2, 16)]
        assert transport.opened >= 2 and tunnel.refused == 0
        # Another process of the same user, once the load generator is gone: closed, nothing forwarded.
        opened = transport.opened
        with socket.socket(socket.AF_UNIX) as other:
            other.connect(tunnel.path)
            try:
                other.sendall(b"GET /v1/models HTTP/1.0\r\n\r\n")
                assert other.recv(100) == b""
            except (ConnectionResetError, BrokenPipeError):  # closed before or with the request unread
                pass
        time.sleep(0.2)
        assert tunnel.refused == 1 and transport.opened == opened
    finally:
        tunnel.close()
    assert not os.path.exists(tunnel.directory)


def test_the_load_goes_over_tls_through_the_tunnel_verifying_the_heads_certificate_with_the_bundle(launch, tmp_path):
    """The receipt as a deploy takes it with TLS on: the stand-in pair behind the real HAProxy with the
    rendered config and roles/tls's certificate (for 127.0.0.1, the head's address here), the load through
    the tunnel to the proxy's port, TLS end to end inside it, the certificate verified against the trust
    bundle alone: the load is measured; with another CA's bundle, or the API named by an address its
    certificate does not carry, it fails on the certificate and nothing is measured."""
    (tmp_path / "tokenizer.json").write_bytes(make_models().tokenizer_json())
    ports, key = {"http": standin.free_port(), "master": standin.free_port()}, "k" * 32
    run = lambda *args, **extra: launch([sys.executable, str(standin.VLLM), *args], standin.env(**extra))  # noqa: E731
    standin.start_pair(run, ports, head_env={"VLLM_API_KEY": key})
    head = build_cluster(pair(**{n: {"api_proxy_engine_port": ports["http"]} for n in ("spark-a", "spark-b")})).head
    with running_proxy(head, key) as proxy:
        bundle = Path(proxy.ca).read_text()
        job = {"base_url": f"https://127.0.0.1:{node_profile(head).port}/v1", "api_key": key, "model": "lab",
               "tokenizer": str(tmp_path), "prompt_tokens": 64, "decode_tokens": 16, "concurrency": [1, 2],
               "runs": 1, "timeout_s": 30, "ca_pem": bundle}

        def through_tunnel(**changes):
            transport = LoopbackTransport()
            tunnel = Tunnel(transport, proxy.port)
            try:
                return run_load({**job, "unix_socket": tunnel.path, **changes}, tunnel, 120), transport
            finally:
                tunnel.close()

        done, transport = through_tunnel()
        assert done.returncode == 0, done.stderr
        got = figures(json.loads(done.stdout)["report"])
        assert [(f["concurrency"], f["decode_tokens"]) for f in got] == [(1, 16), (2, 16)]
        assert transport.opened >= 2
        with tempfile.TemporaryDirectory() as other:  # another fleet's CA
            stranger = fleet_tls(head, other)
            done, _ = through_tunnel(ca_pem=Path(ca_bundle_path(stranger)).read_text())
        assert done.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in done.stderr, done.stderr
        done, _ = through_tunnel(base_url=f"https://127.0.0.2:{node_profile(head).port}/v1")
        assert done.returncode != 0 and "IP address mismatch" in done.stderr, done.stderr
        done, _ = through_tunnel(ca_pem=None)
        assert done.returncode != 0 and "no trust bundle" in done.stderr, done.stderr


def test_the_tunnels_socket_is_reachable_by_no_other_user_and_serves_only_the_allowed_process(tmp_path):
    """The head's API through the tunnel: another uid cannot even connect (the socket's directory is
    0700); a process of the deploy's own user that is not the load generator is closed unserved; the
    allowed process is served."""
    api = socket.create_server(("127.0.0.1", 0))

    def answer():  # the head's API, as far as the tunnel can tell: one line back per connection
        while True:
            try:
                conn, _ = api.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"served " + conn.recv(100))

    threading.Thread(target=answer, daemon=True).start()
    transport = LoopbackTransport()
    tunnel = Tunnel(transport, api.getsockname()[1])
    client = ("import socket, sys\nsys.stdin.readline(); s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
              "try:\n    s.sendall(b'ping'); print(s.recv(100).decode() or 'closed')\n"
              "except (ConnectionResetError, BrokenPipeError):\n    print('closed')")
    try:
        directory = os.stat(tunnel.directory)
        assert stat.S_IMODE(directory.st_mode) == 0o700 and directory.st_uid == os.getuid()
        assert stat.S_ISSOCK(os.stat(tunnel.path).st_mode)
        with pytest.raises(OSError):  # nothing listens on TCP for it: the only way in is the socket
            socket.create_connection(("127.0.0.1", 0), timeout=1)
        nobody = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
                                 "-c", client, tunnel.path], input="go\n", capture_output=True, text=True, timeout=30)
        assert nobody.returncode != 0 and "PermissionError" in nobody.stderr, nobody
        for allowed in (False, True):
            proc = subprocess.Popen([sys.executable, "-c", client, tunnel.path], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
            if allowed:
                tunnel.allow(proc.pid)
            out, _ = proc.communicate("go\n", timeout=30)
            assert out.strip() == ("served ping" if allowed else "closed"), (allowed, out)
        assert tunnel.refused == 1 and transport.opened == 1
    finally:
        tunnel.close()
        api.close()


def test_the_load_generators_output_never_shows_the_key():
    """Whatever the load generator prints (here Python's own error, which quotes the header value it
    refuses), the key is replaced before the caller sees it."""
    key = "sfl-secret-0123456789\nabcdef"  # a newline: http.client refuses the header, quoting it
    job = {"base_url": "http://127.0.0.1:9/v1", "unix_socket": None, "api_key": key, "model": "lab",
           "tokenizer": "/nonexistent", "prompt_tokens": 16, "decode_tokens": 8, "concurrency": [1], "runs": 1,
           "timeout_s": 5}
    done = run_load(job, None, 60)
    assert done.returncode != 0 and "Invalid header value" in done.stderr, done.stderr
    assert "sfl-secret-0123456789" not in done.stderr and "<the API key>" in scrub(f"x{key}y", key)
