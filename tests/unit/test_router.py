"""The real router (smg, pinned in roles/router/wheels.py) as a router node runs it, on 127.0.0.1: smg on
loopback behind its gate (the real HAProxy with roles/router/gate.py's config, TLS with the router node's
certificate from the fleet CA), in front of two lab stand-in vLLM pairs, each behind its head's API proxy
(the real HAProxy with roles/api_proxy's config: the key, or the router hop) and holding no key itself. The
gate refuses a request without the key, serves chat completions (streamed too); smg, given no key, reaches
the heads by the router hop's client certificate; its control plane, on loopback, refuses the API key (adding or
removing a backend, listing them) and takes the control-plane key; it stops routing to a group whose head
dies or whose worker dies within its health-check bounds while every request still succeeds, routes to it
again once it is back, and drains and undrains a group through sfl_router.py, the program the router node
runs. With TLS off (a reason in data), smg is given the key and presents it to the heads.

The router runs from a virtualenv made once from the cached pinned wheel (`make router-wheels`, or
fetched here when absent), outside the checkout. Every process a test starts is killed at teardown.
"""
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from roles.router import sfl_router
from roles.router.node_config import SFL_ROUTER
from sparkfleet.model.router import ROUTER_VERSIONS
from roles.router.wheels import cache_dir, fetch
from tests.unit.test_lab_standin import env, free_port, head_args, wait_for, worker_args, VLLM
from sparkfleet.config import build_cluster
from sparkfleet.model.tls import ca_bundle_path, client_cert_path
from tests.proxy_run import fleet_tls, running_gate, running_proxy

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "roles" / "router" / "sfl_router.py"
KEY = "fleet-key-0123456789abcdef-ABCDEF"
CONTROL_KEY = "control-key-0123456789abcdef-XYZ"
VERSION = ROUTER_VERSIONS[-1]
# Health checks as a test can wait for them: a group leaves within FAILURES x (INTERVAL + TIMEOUT).
INTERVAL_S, TIMEOUT_S, FAILURES, SUCCESSES = 1, 1, 2, 1
LEAVE_BOUND_S = FAILURES * (INTERVAL_S + TIMEOUT_S) + 2  # + one check in flight
STEP_TIMEOUT_S = 2  # the stand-in's VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: a dead worker is found by a request
OFF = {"tls_enabled": False, "tls_disabled_reason": "a closed test bench"}


@pytest.fixture(scope="session")
def router_python():
    """bin/python of a virtualenv holding only the pinned smg wheel, as the router node's (made once)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    venv = cache_dir() / f"venv-smg-{VERSION}-py{version}"
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import smg.router, smg.router_args"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(python)
    wheel = fetch(VERSION, os.uname().machine)
    tmp = venv.with_name(f"{venv.name}.tmp-{os.getpid()}")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(tmp)], check=True)
    subprocess.run([str(tmp / "bin" / "pip"), "install", "-q", "--no-index", "--no-deps",
                    "--disable-pip-version-check", str(wheel)], check=True)
    subprocess.run(["rm", "-rf", str(venv)], check=True)
    tmp.rename(venv)  # only bin/python is used: a moved virtualenv still runs its interpreter
    assert subprocess.run(check, capture_output=True).returncode == 0
    return str(python)


def fleet_nodes(tls: bool = True) -> dict:
    """tests/unit/test_router_render.py's fleet (g1: spark-a head; g2: spark-c head; the router on spark-b),
    each node as the tests run it on this machine's loopback (its management address 127.0.0.1)."""
    from tests.unit.test_router_render import fleet_hosts

    data = {} if tls else {n: OFF for n in ("spark-a", "spark-b", "spark-c", "spark-d")}
    fleet = build_cluster(fleet_hosts(**data))
    return {n.name: n.model_copy(update={"management_address": "127.0.0.1"}) for n in fleet.nodes}


class Group:
    """One stand-in vLLM pair (head + headless worker) on free ports, holding no key (as deployed: its head's
    API proxy checks it), or requiring `key` (a pair reached without a proxy)."""

    def __init__(self, launch, name, key=None):
        self.launch, self.name, self.key = launch, name, key
        self.http = free_port()
        self.head = self.worker = None
        self.url = f"http://127.0.0.1:{self.http}"  # what the router names it by: its proxy's, once fronted

    def start(self):
        ports = {"http": self.http, "master": free_port()}
        extra = {"VLLM_API_KEY": self.key, "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(STEP_TIMEOUT_S)}
        self.head = self.launch([sys.executable, str(VLLM), *head_args(ports)], env(**extra))
        wait_for(lambda: health(self.http) is not None, what=f"{self.name}'s head")
        self.worker = self.launch([sys.executable, str(VLLM), *worker_args(ports)], env(**extra))
        wait_for(lambda: health(self.http) == 200, timeout=15, what=f"{self.name}: /health 200")
        return self


def health(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def call(target, path, body=None, key=KEY, timeout=30, method=None):
    """(status, parsed JSON body or raw bytes) of a request: to a Fleet, through its gate (over TLS, verified
    with its bundle, unless its TLS is off); to a port, smg's own on loopback (plain HTTP, its control plane)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    if isinstance(target, Fleet):
        url, context = target.url + path, target.context()
    else:
        url, context = f"http://127.0.0.1:{target}{path}", None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def chat(target, content="hi", key=KEY, timeout=30, **extra):
    body = {"model": "lab", "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}
    return call(target, "/v1/chat/completions", body, key=key, timeout=timeout)


class Fleet:
    """The router node on loopback, as deployed: each group behind its head's API proxy (admitting the router
    hop from 127.0.0.1, the router node's address here), the gate on `port` (HAProxy, the router node's
    certificate from the one fleet CA), smg on `smg_port` behind it: given no key, presenting the router hop's
    client certificate from that CA, verifying the heads with `ca_file` (the fleet's bundle by default). `tls` False: plain HTTP everywhere,
    smg given the key. `wait`: until it routes to every group."""

    def __init__(self, launch, python, tmp_path, groups=None, tls=True, ca_file=None, wait=True):
        self.launch, self.python, self.tls = launch, python, tls
        self.groups = groups if groups is not None else [Group(launch, "g1").start(), Group(launch, "g2").start()]
        nodes = fleet_nodes(tls)
        self.stack = contextlib.ExitStack()
        first = None
        for group, head in zip(self.groups, ("spark-a", "spark-c")):
            node = nodes[head].model_copy(update={"api_proxy_engine_port": group.http})
            proxy = self.stack.enter_context(running_proxy(node, KEY, ca=first and first.head, router=nodes["spark-b"]))
            first = first or proxy
            group.url = f"{'https' if tls else 'http'}://127.0.0.1:{proxy.port}"
        self.urls = [g.url for g in self.groups]
        self.smg_port = free_port()
        self.gate = self.stack.enter_context(running_gate(nodes["spark-b"], KEY, self.smg_port,
                                                          ca=first.head if tls else None))
        self.port = self.gate.port
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        key_file = tmp_path / "api-key"
        key_file.write_text(KEY)
        key_file.chmod(0o600)
        control_key_file = tmp_path / "router-control-key"
        control_key_file.write_text(CONTROL_KEY)
        control_key_file.chmod(0o600)
        self.config = {
            "listen_host": "127.0.0.1", "port": self.smg_port, "backends": self.urls,
            "ca_file": (ca_file or first.ca) if tls else None,
            "client_cert_file": client_cert_path(self.gate.head) if tls else None,
            "key_file": str(key_file), "control_key_file": str(control_key_file), "health_check_endpoint": "/health",
            "health_check_interval_s": INTERVAL_S, "health_check_timeout_s": TIMEOUT_S,
            "health_failure_threshold": FAILURES, "health_success_threshold": SUCCESSES, "policy": "round_robin",
            "request_timeout_s": 60, "log_level": "info", "metrics_host": "127.0.0.1", "metrics_port": free_port(),
        }
        self.config_file = tmp_path / "router.json"
        self.config_file.write_text(json.dumps(self.config))
        self.log = tmp_path / "router.log"
        self.router = subprocess.Popen([python, str(PROGRAM), "run", str(self.config_file)], text=True,
                                       stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        if not wait:
            return
        try:
            wait_for(lambda: self.states() == {u: "routed" for u in self.urls}, timeout=40,
                     what="the router routing to every group")
        except AssertionError as e:
            self.stop()
            raise AssertionError(f"{e}; routing {self.states()}; the router's output:\n{self.output()[-3000:]}")

    def context(self) -> ssl.SSLContext | None:
        return self.gate.context() if self.tls else None

    def output(self):
        return self.log.read_text()

    def stop(self):
        if self.router.poll() is None:
            self.router.kill()
        self.router.wait(timeout=10)
        self.stack.close()

    def states(self):
        try:
            return {b["url"]: b["state"] for b in sfl_router.routing(self.config)}
        except (SystemExit, OSError):
            return None

    def admin(self, *args):
        """sfl_router.py as the router node runs it (system python, no smg): its JSON answer."""
        command, *rest = args
        out = subprocess.run([sys.executable, str(PROGRAM), command, str(self.config_file), *rest],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return {b["url"]: b["state"] for b in json.loads(out.stdout)}


@pytest.fixture
def fleet(launch, router_python, tmp_path):
    fleet = Fleet(launch, router_python, tmp_path)
    yield fleet
    fleet.stop()


class Load:
    """Chat completions through the router, one after another, until stopped: (start, status, seconds)."""

    def __init__(self, fleet):
        self.fleet, self.results, self.stop = fleet, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        i = 0
        while not self.stop.is_set():
            i += 1
            started = time.monotonic()
            try:
                status, _ = chat(self.fleet, content=f"request {i}", timeout=30)
            except Exception as e:  # noqa: BLE001 - a failure is a result here
                status = repr(e)
            self.results.append((started, status, time.monotonic() - started))
            time.sleep(0.05)

    def finish(self):
        self.stop.set()
        self.thread.join(timeout=40)
        return self.results


GATE_401 = {"error": "Unauthorized"}  # the gate's own refusal (templates/haproxy_gate.j2)


def test_a_request_without_the_key_is_refused_by_the_gate_and_one_with_it_is_served(fleet):
    for key in (None, "not-the-key-0123456789", CONTROL_KEY):
        status, body = chat(fleet, key=key)
        assert (status, body) == (401, GATE_401), body  # the gate's, before smg is asked
        assert call(fleet, "/workers", key=key) == (401, GATE_401)
    status, body = chat(fleet)
    assert status == 200 and body["choices"][0]["message"]["content"] == "sparkfleet lab stand-in reply", body
    status, body = call(fleet, "/v1/completions", {"model": "lab", "prompt": "ping", "max_tokens": 1})
    assert status == 200 and body["object"] == "text_completion", body


def test_the_api_key_cannot_add_remove_or_list_backends_and_the_control_plane_key_can(fleet, launch):
    """Every client has the API key: with it, smg's control plane answers 401 to adding a backend (a
    client's own server, which would then be sent other clients' prompts) to removing one and to listing
    them, on smg's own port and through the gate (which lets the API key through, and removes it); nothing
    changes. The control-plane key is taken on smg's port on loopback, and refused by the gate."""
    g1, g2 = fleet.groups
    planted = Group(launch, "planted").start()  # a server the client runs, requiring nothing of note
    workers = {w["url"].rstrip("/"): w["id"] for w in call(fleet.smg_port, "/workers", key=CONTROL_KEY)[1]["workers"]}
    assert set(workers) == {g1.url, g2.url}
    for target in (fleet.smg_port, fleet):
        for key in (KEY, None, "not-the-key-0123456789"):
            status, body = call(target, "/workers", {"url": planted.url}, key=key)
            assert status == 401, (status, body)
            status, body = call(target, f"/workers/{workers[g1.url]}", key=key, method="DELETE")
            assert status == 401, (status, body)
            for path in ("/workers", f"/workers/{workers[g1.url]}", "/get_loads"):
                assert call(target, path, key=key)[0] == 401, path
    assert call(fleet, "/workers", key=CONTROL_KEY) == (401, GATE_401)
    time.sleep(2 * INTERVAL_S)  # a change would have shown by now (registration is an asynchronous job)
    assert fleet.states() == {g1.url: "routed", g2.url: "routed"}
    assert all(chat(fleet, content=f"after {i}")[0] == 200 for i in range(4))
    # The control-plane key adds and removes for real (what sfl_router.py's undrain and drain send).
    status, body = call(fleet.smg_port, "/workers", {"url": planted.url}, key=CONTROL_KEY)
    assert status in (200, 201, 202), (status, body)
    wait_for(lambda: (fleet.states() or {}).get(planted.url) == "routed", timeout=20, what="the added backend routed")
    planted_id = {w["url"].rstrip("/"): w["id"] for w in call(fleet.smg_port, "/workers", key=CONTROL_KEY)[1]["workers"]}
    status, body = call(fleet.smg_port, f"/workers/{planted_id[planted.url]}", key=CONTROL_KEY, method="DELETE")
    assert status in (200, 202), (status, body)
    wait_for(lambda: planted.url not in (fleet.states() or {planted.url: None}), timeout=20, what="the backend removed")


def test_a_control_plane_key_that_is_the_api_key_is_refused_before_the_router_starts(tmp_path):
    key_file, control = tmp_path / "api-key", tmp_path / "router-control-key"
    key_file.write_text(KEY)
    control.write_text(KEY + "\n")
    config = tmp_path / "router.json"
    config.write_text(json.dumps({**{k: 1 for k in sfl_router.KEYS}, "backends": [], "key_file": str(key_file),
                                  "control_key_file": str(control)}))
    out = subprocess.run([sys.executable, str(PROGRAM), "check", str(config)], capture_output=True, text=True)
    assert out.returncode != 0 and "holds the API key" in out.stderr and KEY not in out.stderr + out.stdout
    control.write_text(CONTROL_KEY)
    assert subprocess.run([sys.executable, str(PROGRAM), "check", str(config)]).returncode == 0
    control.unlink()
    out = subprocess.run([sys.executable, str(PROGRAM), "check", str(config)], capture_output=True, text=True)
    assert out.returncode != 0 and out.stderr.strip() == f"sfl_router: cannot read {control}: No such file or directory"
    control.write_text(CONTROL_KEY)
    config.write_text(json.dumps({**json.loads(config.read_text()), "client_cert_file": str(tmp_path / "none.pem")}))
    out = subprocess.run([sys.executable, str(PROGRAM), "check", str(config)], capture_output=True, text=True)
    assert out.returncode != 0 and f"cannot read client_cert_file {tmp_path / 'none.pem'}" in out.stderr


def test_the_routers_metrics_and_smg_listen_on_loopback_only(fleet):
    port = fleet.config["metrics_port"]
    bound = {line.split()[3] for line in subprocess.run(["ss", "-Hltn"], capture_output=True, text=True,
                                                         check=True).stdout.splitlines()}
    assert {b for b in bound if b.endswith((f":{port}", f":{fleet.smg_port}"))} == {
        f"127.0.0.1:{port}", f"127.0.0.1:{fleet.smg_port}"}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200 and b"smg_" in response.read()


def test_a_chat_completion_streams_through_the_router(fleet):
    body = {"model": "lab", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 8,
            "stream": True}
    request = urllib.request.Request(f"{fleet.url}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=30, context=fleet.context()) as r:
        assert r.headers.get_content_type() == "text/event-stream"
        lines = [line.decode().strip() for line in r]
    data = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks) and len(chunks) >= 2
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.strip(), chunks


def test_the_keys_are_on_no_command_line_and_in_no_environment_or_log_line(fleet):
    pid = fleet.router.pid
    for secret in (KEY, CONTROL_KEY):
        assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert secret.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    for _ in range(3):
        assert chat(fleet)[0] == 200
    assert chat(fleet, key=None)[0] == 401
    assert fleet.admin("routing")  # the control plane, with its key
    assert call(fleet.smg_port, "/workers", key=KEY)[0] == 401
    fleet.router.send_signal(signal.SIGTERM)
    fleet.router.wait(timeout=30)
    out = fleet.output()
    assert f"sfl_router: smg on 127.0.0.1:{fleet.smg_port}" in out and "presenting " in out
    assert KEY not in out and CONTROL_KEY not in out


def test_a_dead_head_leaves_routing_within_the_bounds_and_comes_back(fleet):
    g1 = fleet.groups[0]
    load = Load(fleet)
    time.sleep(1)
    killed = time.monotonic()
    g1.head.kill()
    wait_for(lambda: fleet.states()[g1.url] == "unhealthy", timeout=LEAVE_BOUND_S + 5, what="g1 out of routing")
    left = time.monotonic() - killed
    time.sleep(1)
    g1.worker.kill()
    g1.start()  # the group back on the same port (its unit restarted by its watchdog, in a real fleet)
    back = time.monotonic()
    wait_for(lambda: fleet.states()[g1.url] == "routed", timeout=SUCCESSES * (INTERVAL_S + TIMEOUT_S) + 10,
             what="g1 routed again")
    returned = time.monotonic() - back
    results = load.finish()
    print(f"dead head: out of routing {left:.1f} s after the kill (bound {LEAVE_BOUND_S} s), back {returned:.1f} s "
          f"after it served again; {len(results)} requests meanwhile")
    assert left <= LEAVE_BOUND_S
    assert len(results) > 10 and all(status == 200 for _, status, _ in results), results


def test_a_group_down_for_longer_than_smgs_connection_attempts_is_routed_again_when_back(fleet):
    """A cold start (6-12 min on Sparks, 36-72 checks at 10 s) outlasts smg's max_connection_attempts
    (20) for a worker: the group is still routed to again once its head answers."""
    g1 = fleet.groups[0]
    g1.head.kill()
    g1.worker.kill()
    wait_for(lambda: fleet.states()[g1.url] == "unhealthy", timeout=LEAVE_BOUND_S + 5, what="g1 out of routing")
    time.sleep(25 * INTERVAL_S)  # 25 failed checks
    assert fleet.states()[g1.url] == "unhealthy" and chat(fleet)[0] == 200
    g1.start()
    wait_for(lambda: fleet.states()[g1.url] == "routed", timeout=15, what="g1 routed again")


def test_a_dead_worker_takes_its_group_out_of_routing_while_every_request_is_served(fleet):
    """vLLM: a head keeps /health 200 with its worker dead until a request waits out the step timeout;
    the router retries that request on the other group, and the engine's death (/health 503, then the
    head's exit) takes the group out of routing."""
    g1 = fleet.groups[0]
    load = Load(fleet)
    time.sleep(1)
    killed = time.monotonic()
    g1.worker.kill()
    wait_for(lambda: fleet.states()[g1.url] == "unhealthy", timeout=STEP_TIMEOUT_S + LEAVE_BOUND_S + 10,
             what="g1 out of routing")
    left = time.monotonic() - killed
    time.sleep(2)
    results = load.finish()
    slow = max(seconds for _, _, seconds in results)
    print(f"dead worker: out of routing {left:.1f} s after the kill (step timeout {STEP_TIMEOUT_S} s + bound "
          f"{LEAVE_BOUND_S} s); slowest request {slow:.1f} s; {len(results)} requests meanwhile")
    assert all(status == 200 for _, status, _ in results), results
    assert left <= STEP_TIMEOUT_S + LEAVE_BOUND_S + 6  # + the stand-in's engine-death watchdog (5 s)


def test_drain_and_undrain_take_a_group_out_of_routing_and_back(fleet):
    g2 = fleet.groups[1]
    assert fleet.admin("drain", g2.url) == {fleet.groups[0].url: "routed", g2.url: "drained"}
    # Drained: a frozen g2 would hold any request routed to it; none is.
    g2.head.send_signal(signal.SIGSTOP)
    try:
        for i in range(6):
            status, _ = chat(fleet, content=f"drained {i}", timeout=10)
            assert status == 200
    finally:
        g2.head.send_signal(signal.SIGCONT)
    assert fleet.admin("routing") == {fleet.groups[0].url: "routed", g2.url: "drained"}
    # undrained with no key (smg presents the router node's certificate to every backend)
    assert fleet.admin("undrain", g2.url) == {fleet.groups[0].url: "routed", g2.url: "routed"}
    assert fleet.admin("drain", g2.url)[g2.url] == "drained"  # idempotent both ways
    assert fleet.admin("drain", g2.url)[g2.url] == "drained"
    assert fleet.admin("undrain", g2.url)[g2.url] == "routed"
    assert fleet.admin("undrain", g2.url)[g2.url] == "routed"
    assert all(chat(fleet, content=f"undrained {i}")[0] == 200 for i in range(4))


def test_smg_given_another_cas_bundle_routes_to_no_head(launch, router_python, tmp_path):
    """smg verifies each head's certificate against router.json's ca_file (smg's ca_cert_paths: it adds it to
    every worker client's roots, model_gateway/src/worker/http_client.rs): given another CA's bundle, it
    routes to none (its log: the certificate failed to verify)."""
    with tempfile.TemporaryDirectory() as other:
        stranger = fleet_tls(fleet_nodes()["spark-a"], other)
        blind = Fleet(launch, router_python, tmp_path, ca_file=ca_bundle_path(stranger), wait=False)
        try:
            time.sleep(4 * (INTERVAL_S + TIMEOUT_S))
            assert set((blind.states() or {}).values()) <= {"drained", "unhealthy"}, blind.states()
            assert chat(blind, timeout=10)[0] != 200
            assert "failed to verify TLS certificate: invalid peer certificate" in blind.output(), blind.output()[-2000:]
        finally:
            blind.stop()


def test_with_tls_off_smg_is_given_the_key_and_presents_it_to_the_heads(launch, router_python, tmp_path):
    """TLS off (a reason in data): no client certificate, so the gate lets the key through (plain HTTP) and smg,
    given the key (it checks it too), presents it to each head's proxy: every hop serves, and without the key
    the gate answers 401."""
    fleet = Fleet(launch, router_python, tmp_path, tls=False)
    try:
        assert fleet.url.startswith("http://") and all(u.startswith("http://") for u in fleet.urls)
        assert fleet.config["client_cert_file"] is None
        assert chat(fleet, key=None) == (401, GATE_401)
        for i in range(4):
            status, body = chat(fleet, content=f"plain {i}")
            assert status == 200 and body["choices"], body
        assert fleet.admin("drain", fleet.urls[1])[fleet.urls[1]] == "drained"
        assert fleet.admin("undrain", fleet.urls[1])[fleet.urls[1]] == "routed"
        assert "presenting the API key" in fleet.output()
    finally:
        fleet.stop()


def test_a_router_config_with_https_backends_and_no_ca_file_is_refused(tmp_path):
    config = tmp_path / "router.json"
    config.write_text(json.dumps({k: None for k in sfl_router.KEYS} | {"backends": ["https://10.0.0.11:8000"]}))
    with pytest.raises(SystemExit, match="https:// backends need ca_file"):
        sfl_router.load(str(config))


class RouterNode:
    """The router node as roles/router/control.py reaches it (a pyinfra Host): commands run here."""

    name = "router-node"

    def run_shell_command(self, command):
        from types import SimpleNamespace

        done = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=120)
        return done.returncode == 0, SimpleNamespace(stdout_lines=done.stdout.splitlines(),
                                                     stderr_lines=done.stderr.splitlines())


def test_the_controllers_routing_drain_and_undrain_run_sfl_router_on_the_router_node(fleet, monkeypatch):
    from roles.router import control

    monkeypatch.setattr(control, "SFL_ROUTER", str(PROGRAM))
    monkeypatch.setattr(control, "ROUTER_CONFIG", str(fleet.config_file))
    node, (g1, g2) = RouterNode(), fleet.groups
    assert {b["url"]: b["state"] for b in control.routing(node)} == {g1.url: "routed", g2.url: "routed"}
    assert {b["url"]: b["state"] for b in control.drain(node, g1.url)} == {g1.url: "drained", g2.url: "routed"}
    assert chat(fleet)[0] == 200
    assert {b["url"]: b["state"] for b in control.undrain(node, g1.url)} == {g1.url: "routed", g2.url: "routed"}
    with pytest.raises(control.RouterError, match="undrain"):
        control.undrain(node, "http://127.0.0.1:1", timeout_s=3)  # nothing listens there: never routed
