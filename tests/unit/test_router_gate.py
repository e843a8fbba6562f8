"""The router behind the same gate (issue 43 item 3), with the real smg (the pinned wheel, tests/unit/test_router.py's
router_python) and the real HAProxy (the controller's, tests/proxy_run.py) on this machine's loopback:

- smg's route table is the real 1.13.0's (tests/smg_routes.py: its compiled router's path literals, each
  confirmed by the running binary), held to the committed table tests/unit/fixtures/smg-<version>-routes.txt,
  each route's plane (public, data, control) as smg's own middleware decides it;
- smg itself answers its public routes without any key, /engine_metrics and /loads among them, fetching
  the heads' /metrics and loads with its own credential: the finding the gate closes;
- through the router's gate (roles/router/gate.py's rendered config) every route of that table answers 401
  without the key, or with another, but GET and HEAD /health; with the key, never the gate's refusal;
- the router hop: the gate removes the key once checked and smg, given none, presents the router hop's
  client certificate (the fleet CA's, clientAuth only, CN sparkfleet-router-hop) to the head's API proxy,
  which admits it from the router node's address alone: the fleet key never crosses the hop; the hop's
  certificate from another address, another CA's, and every certificate without clientAuth (the router
  node's own, which its exporters' copy holds; a head's; one bearing the hop's CN) are refused, the last
  ones by OpenSSL's check of a client's certificate in the handshake (`unsupported certificate`), and a
  client's certificate of the fleet CA with another CN (the router node's of the first design) gets 401.
Every process a test starts is killed at teardown.
"""
import http.server
import json
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from roles.router import sfl_router
from sparkfleet.config import build_cluster
from sparkfleet.model.api_proxy import OPEN_PATHS
from sparkfleet.model.router import ROUTER_VERSIONS
from roles.tls import checks as tls
from sparkfleet.model.tls import HOP_CN, client_cert_path, proxy_pem_path
from tests.proxy_run import ask, fleet_tls, free_port, issue, running_gate, running_proxy
from tests.smg_routes import Prober, binary_candidates, canonical, concrete, discover, read_table
from tests.unit.test_lab_standin import wait_for
from tests.unit.test_router import CONTROL_KEY, KEY, PROGRAM, router_python  # noqa: F401 (a fixture)
from tests.unit.test_router_render import fleet_hosts

VERSION = ROUTER_VERSIONS[-1]
GATE_401 = b'{"error":"Unauthorized"}'  # the gate's own refusal (templates/haproxy_gate.j2)


class Engine(http.server.BaseHTTPRequestHandler):
    """A head's engine as the router's requests reach it: answers /health, /v1/models (served name `lab`), a
    chat completion and anything else (200), and records (method, path, Authorization) of each request."""
    protocol_version = "HTTP/1.1"
    seen: list = []

    def answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Engine.seen.append((self.command, self.path, self.headers.get("Authorization")))
        if self.path.startswith("/v1/models"):
            body = {"object": "list", "data": [{"id": "lab", "object": "model"}]}
        elif self.path.startswith("/v1/chat/completions"):
            body = {"id": "c", "object": "chat.completion", "created": 0, "model": "lab",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "behind the hop"},
                                 "finish_reason": "stop"}]}
        elif self.path.startswith("/metrics"):
            body = None
        else:
            body = {}
        raw = b"vllm:num_requests_running 0\n" if body is None else json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain" if body is None else "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = answer

    def log_message(self, *args):
        pass


def nodes(engine_port: int):
    """(the head spark-a, the router node spark-b) of tests/unit/test_router_render.py's fleet, the head's
    engine on `engine_port`, the router node's management address 127.0.0.1 (where its smg connects from)."""
    fleet = build_cluster(fleet_hosts(**{"spark-a": {"api_proxy_engine_port": engine_port}}))
    return fleet.node("spark-a"), fleet.node("spark-b").model_copy(update={"management_address": "127.0.0.1"})


@pytest.fixture
def smg(router_python):
    """start(directory, backends, client_cert=None, ca_file=None, smg_port=None): smg as sfl_router.py runs it
    on the router node, from a router.json like roles/router's: on 127.0.0.1:smg_port, the fleet key and the
    control-plane key in root-only files; with `client_cert` (TLS on) it is given no key and presents that
    certificate. Returns its config once it routes to every backend; its output goes to router.log there.
    Every smg started is killed at teardown."""
    started = []

    def start(directory: Path, backends, client_cert=None, ca_file=None, smg_port=None) -> dict:
        key_file, control = directory / "api-key", directory / "router-control-key"
        for path, value in ((key_file, KEY), (control, CONTROL_KEY)):
            path.write_text(value + "\n")
            path.chmod(0o600)
        config = {"listen_host": "127.0.0.1", "port": smg_port or free_port(), "backends": list(backends),
                  "key_file": str(key_file), "control_key_file": str(control), "client_cert_file": client_cert,
                  "ca_file": ca_file, "health_check_endpoint": "/health", "health_check_interval_s": 1,
                  "health_check_timeout_s": 1, "health_failure_threshold": 2, "health_success_threshold": 1,
                  "policy": "round_robin", "request_timeout_s": 60, "log_level": "info", "metrics_host": "127.0.0.1",
                  "metrics_port": free_port()}
        path = directory / "router.json"
        path.write_text(json.dumps(config))
        with open(directory / "router.log", "w") as log:
            started.append(subprocess.Popen([router_python, str(PROGRAM), "run", str(path)], stdout=log,
                                            stderr=subprocess.STDOUT))

        def routed():
            try:
                return all(b["state"] == "routed" for b in sfl_router.routing(config))
            except (SystemExit, OSError):
                return False

        wait_for(routed, timeout=40, what="smg routing to every backend")
        return config

    yield start
    for process in started:
        process.kill()
        process.wait(10)


class Chain:
    """The router as deployed, on loopback: the gate (HAProxy, the router node's certificate) -> smg (no key,
    presenting the router hop's client certificate) -> the head's API proxy (the key, or the router hop) ->
    Engine."""

    def __init__(self, gate, head_proxy, smg_config, engine_port):
        self.gate, self.head_proxy, self.smg, self.engine_port = gate, head_proxy, smg_config, engine_port

    @property
    def hop_pem(self) -> str:
        """The router hop's certificate and key (smg presents it)."""
        return client_cert_path(self.gate.head)

    @property
    def node_pem(self) -> str:
        """The router node's own certificate and key (its gate serves it; with monitoring on, the exporters'
        copy, which group prometheus reads, is these bytes: roles/tls exporter_pem_command, `cmp`-checked)."""
        return proxy_pem_path(self.gate.head)


class Quiet(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a proxy closing a kept-alive connection is no error here


@pytest.fixture
def engine():
    port = free_port()
    server = Quiet(("127.0.0.1", port), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Engine.seen.clear()
    yield port
    server.shutdown()


@pytest.fixture
def chain(smg, tmp_path, engine):
    head, router = nodes(engine)
    smg_port = free_port()
    with running_proxy(head, KEY, router=router) as head_proxy, \
            running_gate(router, KEY, smg_port, ca=head_proxy.head) as gate:
        config = smg(tmp_path, [f"https://127.0.0.1:{head_proxy.port}"], client_cert=client_cert_path(gate.head),
                     ca_file=head_proxy.ca, smg_port=smg_port)
        yield Chain(gate, head_proxy, config, engine)


def smg_module(python: str) -> Path:
    site = subprocess.run([python, "-c", "import smg, os; print(os.path.dirname(smg.__file__))"], capture_output=True,
                          text=True, check=True).stdout.strip()
    [module] = Path(site).glob("smg_rs*.so")
    return module


def routes_table() -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in read_table(VERSION)]


CHAT = {"model": "lab", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def gate_answer(gate, method: str, path: str, key: str | None = None, body: dict | None = None) -> tuple[int, bytes]:
    """(status, body) of one request through the gate over TLS, verified with its bundle; a raw request line
    (http.client), so a path is sent as written. A method that carries a body sends `body` ({})."""
    import http.client

    conn = http.client.HTTPSConnection("127.0.0.1", gate.port, timeout=30, context=gate.context())
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body or {}).encode() if method in ("POST", "PUT", "PATCH") else None
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_smgs_route_table_is_the_real_one_and_each_routes_plane_is_smgs_own(smg, router_python, tmp_path, engine):
    """smg given the fleet key (as with TLS off) and the control-plane key: the routes it routes, of every
    route-shaped string of its compiled router and every route of the committed table, are exactly the
    committed table's, with its methods; each route's plane as smg's own middleware decides it: public
    (answered without any key), control (401 with the API key, answered with the control-plane key), data."""
    config = smg(tmp_path, [f"http://127.0.0.1:{engine}"])
    committed = read_table(VERSION)
    candidates = binary_candidates(smg_module(router_python))
    assert len(candidates) > 1000  # the module's strings, not a stub
    found = canonical(discover(config["port"], candidates | {p for _, p, _ in committed}))
    table = sorted((m, p) for p, methods in found.items() for m in methods)
    assert table == sorted((m, p) for m, p, _ in committed), (
        f"smg {VERSION} routes, and the committed table differs: missing from it "
        f"{sorted(set(table) - {(m, p) for m, p, _ in committed})}, not routed "
        f"{sorted({(m, p) for m, p, _ in committed} - set(table))}")
    assert len(table) > 50 and ("GET", "/engine_metrics") in table and ("GET", "/loads") in table
    prober, planes = Prober(config["port"]), {}
    for method, path, plane in committed:
        without = prober.ask(method, concrete(path))[0]
        with_key = prober.ask(method, concrete(path), {"Authorization": f"Bearer {KEY}"})[0]
        with_control = prober.ask(method, concrete(path), {"Authorization": f"Bearer {CONTROL_KEY}"})[0]
        planes[(method, path)] = ("public" if without != 401 else "control" if with_key == 401 and with_control != 401
                                  else "data" if with_key != 401 else "?")
    assert planes == {(m, p): plane for m, p, plane in committed}


def test_smg_itself_answers_its_public_routes_without_any_key_fetching_the_heads_metrics_with_its_own(
        smg, tmp_path, engine):
    """The finding (issue 43): smg 1.13.0 as configured answers GET /engine_metrics and /loads without a key,
    fetching every head's /metrics and loads with the credential it presents to the heads (here the fleet
    key): anyone allowed to its port reads every group's metrics. So smg listens where only root and the
    gate reach it, and the gate is the check."""
    config = smg(tmp_path, [f"http://127.0.0.1:{engine}"])
    prober = Prober(config["port"])
    open_at_smg = sorted((m, p) for m, p, _ in read_table(VERSION) if prober.ask(m, concrete(p))[0] != 401)
    print(f"\nsmg {VERSION} answers without any key:", ", ".join(f"{m} {p}" for m, p in open_at_smg))
    assert open_at_smg == sorted((m, p) for m, p, plane in read_table(VERSION) if plane == "public")
    Engine.seen.clear()
    status, body = prober.ask("GET", "/engine_metrics")
    assert status == 200 and b"vllm:num_requests_running" in body, (status, body[:200])
    assert ("GET", "/metrics", f"Bearer {KEY}") in Engine.seen  # the head's metrics, fetched with the fleet key
    status, body = prober.ask("GET", "/loads")
    assert status == 200 and json.loads(body)["version"] == f"smg-{VERSION}"


def test_through_the_gate_every_route_of_smg_but_health_needs_the_key(chain):
    routes = routes_table()
    leaks, refused_with_key = [], []
    for method, path in routes:
        for key in (None, "not-the-key-0123456789", CONTROL_KEY):
            status, body = gate_answer(chain.gate, method, concrete(path), key)
            if (method, path) == ("GET", "/health"):
                continue
            if (status, body) != (401, GATE_401):
                leaks.append(f"{method} {path} with {key and key[:8]}: {status} {body[:80]!r}")
        status, body = gate_answer(chain.gate, method, concrete(path), KEY)
        if body == GATE_401:
            refused_with_key.append(f"{method} {path}")
    assert leaks == [], "answered through the gate without the key: " + "; ".join(leaks)
    assert refused_with_key == [], "refused by the gate with the key: " + "; ".join(refused_with_key)
    for method in OPEN_PATHS["/health"]:
        assert gate_answer(chain.gate, method, "/health")[0] == 200
    # Spellings of the open path that are not it, and a second Authorization header, need the key.
    for method, path in (("POST", "/health"), ("GET", "/health/"), ("GET", "//health"), ("GET", "/%68ealth"),
                         ("GET", "/health_generate"), ("GET", "/health/../engine_metrics"), ("OPTIONS", "/health")):
        assert gate_answer(chain.gate, method, path) == (401, GATE_401), (method, path)
    assert ask(chain.gate, "GET", "/engine_metrics") == 401 and ask(chain.gate, "GET", "/loads") == 401
    with socket.create_connection(("127.0.0.1", chain.gate.port), timeout=10) as raw, \
            chain.gate.context().wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(f"GET /loads HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\nAuthorization: Bearer {KEY}\r\n"
                  "Connection: close\r\n\r\n".encode())
        assert b" 400 " in s.recv(1024).split(b"\r\n", 1)[0]


def test_smgs_control_plane_is_reached_on_its_loopback_port_only(chain):
    """Through the gate the control plane answers nothing: the control-plane key is not the fleet key (the
    gate's 401), and the fleet key is removed once checked (smg's own 401). sfl_router.py, on the router
    node, reaches it on loopback with the control-plane key."""
    assert gate_answer(chain.gate, "GET", "/workers", CONTROL_KEY) == (401, GATE_401)
    status, body = gate_answer(chain.gate, "GET", "/workers", KEY)
    assert status == 401 and body != GATE_401
    assert [b["state"] for b in sfl_router.routing(chain.smg)] == ["routed"]


def test_the_fleet_key_never_crosses_the_router_hop(chain):
    """A chat completion through the gate with the key is served by the head's engine through the head's API
    proxy, which admitted the router hop by its certificate: neither it nor any of smg's own requests
    (health checks, its polls, /engine_metrics's fetch of /metrics) carried a key."""
    status, body = gate_answer(chain.gate, "POST", "/v1/chat/completions", KEY, CHAT)
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "behind the hop", body
    assert gate_answer(chain.gate, "GET", "/engine_metrics", KEY)[0] == 200
    time.sleep(2)  # a few of smg's health checks
    paths = {path.split("?")[0] for _, path, _ in Engine.seen}
    assert {"/v1/chat/completions", "/health", "/metrics"} <= paths, paths
    assert {auth for _, _, auth in Engine.seen} == {None}, {a for _, _, a in Engine.seen}


def hop_request(chain, cert: str | None, source: str = "127.0.0.1", key: str | None = None) -> int | str:
    """The status of GET /v1/models asked of the head's API proxy over TLS (its bundle), from `source`,
    presenting `cert` (a PEM: certificate, then key); when the proxy ends the handshake, 'handshake refused:'
    and the TLS alert it sent (OpenSSL's reason), as Python's ssl names it."""
    context = ssl.create_default_context(cafile=chain.head_proxy.ca)
    if cert:
        context.load_cert_chain(cert)
    headers = f"Authorization: Bearer {key}\r\n" if key else ""
    try:
        with socket.create_connection(("127.0.0.1", chain.head_proxy.port), timeout=10, source_address=(source, 0)) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n".encode())
            line = s.recv(1024).split(b"\r\n", 1)[0]
    except ssl.SSLError as e:
        return f"handshake refused: {e.reason}"
    except (ConnectionResetError, BrokenPipeError):
        return "handshake refused: reset"
    if not line:  # TLS 1.3: the client certificate is judged after the client's first flight
        return "handshake refused: closed"
    return int(line.split()[1])


NOT_A_CLIENTS = "handshake refused: SSLV3_ALERT_UNSUPPORTED_CERTIFICATE"  # X509_V_ERR_INVALID_PURPOSE's alert
UNKNOWN_CA = "handshake refused: TLSV1_ALERT_UNKNOWN_CA"


def test_the_router_hop_is_admitted_from_the_router_node_by_its_own_certificate_only(chain, tmp_path):
    import dataclasses

    assert hop_request(chain, chain.hop_pem) == 200  # the router hop's certificate, from the router node's address
    assert hop_request(chain, chain.hop_pem, source="127.0.0.2") == 401  # the same, from another address
    assert hop_request(chain, None) == 401 and hop_request(chain, None, source="127.0.0.2", key=KEY) == 200
    # The router node's own certificate (serverAuth only; its exporters' copy is these bytes, readable by group
    # prometheus there): no client's certificate, from the router node's own address. The head's own likewise.
    assert hop_request(chain, chain.node_pem) == NOT_A_CLIENTS
    assert hop_request(chain, proxy_pem_path(chain.head_proxy.head)) == NOT_A_CLIENTS
    head, router = nodes(chain.engine_port)
    ca, gate = chain.head_proxy.head, chain.gate.head
    hop = tls.hop_cert(gate)

    def made(name: str, kind) -> str:
        """A certificate and key of `kind` for the router node, from the fleet CA, in its own directory."""
        (tmp_path / name).mkdir()
        node = gate.model_copy(update={"serving_dir": str(tmp_path / name)})
        issue(node, ca, kind=dataclasses.replace(kind, pem=str(tmp_path / name / "x.pem")))
        return str(tmp_path / name / "x.pem")

    # What refuses the two above is the usage, not the name: the hop's own CN, from the fleet CA, for serverAuth
    assert hop_request(chain, made("hop-cn-server", dataclasses.replace(hop, usage=("serverAuth",)))) == NOT_A_CLIENTS
    # and with clientAuth it passes: the same CN and usage as the hop's, a key of its own (so the gate checks no key
    # of the certificate: it is the fleet CA that issues that CN, on the router node alone)
    assert hop_request(chain, made("hop-again", hop)) == 200
    # The router node's certificate as the first design issued it (clientAuth besides, CN the node's name): a
    # client's certificate of the fleet CA, but not the hop's CN
    first = dataclasses.replace(tls.node_cert(gate), usage=("serverAuth", "clientAuth"))
    assert hop_request(chain, made("first-design", first)) == 401
    # The hop's name and usage, from another CA: it does not verify against the bundle.
    (tmp_path / "stranger").mkdir()
    stranger = fleet_tls(router.model_copy(update={"router_node": router.name}), tmp_path / "stranger")
    issue(stranger, stranger, kind=tls.hop_cert(stranger))
    assert hop_request(chain, client_cert_path(stranger)) == UNKNOWN_CA
    assert tls.hop_cert(stranger).cn == HOP_CN
    # curl, as an operator would try it: the hop's certificate opens the API, the router node's own does not
    url = f"https://127.0.0.1:{chain.head_proxy.port}/v1/models"
    admitted = curl("--cacert", chain.head_proxy.ca, "--cert", chain.hop_pem, url)
    assert admitted.returncode == 0 and admitted.stdout == "200", admitted
    refused = curl("--cacert", chain.head_proxy.ca, "--cert", chain.node_pem, url)
    assert refused.returncode != 0 and "alert unsupported certificate" in refused.stderr, refused


def curl(*args) -> subprocess.CompletedProcess:
    from tests.programs import os_program

    return subprocess.run([os_program("curl"), "-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", *args],
                          capture_output=True, text=True)


def test_smg_forwards_a_clients_own_header_and_presents_its_key_only_on_its_own_requests(router_python, engine, tmp_path):
    """Why the hop's credential is not a second key (docs/security.md#the-router-hop): smg 1.13.0 given one key
    for the heads (`api_key`) and another for its clients (a tenant key, `tenant_api_keys`) forwards a chat
    completion with the client's own Authorization header, and presents its key only on its own requests (its
    fetch of /metrics for /engine_metrics): a key of the hop's own would have to replace the client's header."""
    import textwrap

    port, head_key, client_key = free_port(), "hop-key-0123456789abcdef", "client-key-0123456789abcdef"
    script = tmp_path / "smg_two_keys.py"
    script.write_text(textwrap.dedent(f"""
        from smg.router import Router
        from smg.router_args import RouterArgs
        args = RouterArgs(worker_urls=["http://127.0.0.1:{engine}"], host="127.0.0.1", port={port},
                          api_key="{head_key}", tenant_api_keys=[("clients", "{client_key}")],
                          control_plane_api_keys=[("c", "c", "{CONTROL_KEY}", "admin")], policy="round_robin",
                          health_check_interval_secs=1, health_check_timeout_secs=1, health_check_endpoint="/health",
                          history_backend="none", prometheus_host="127.0.0.1", prometheus_port={free_port()})
        args._validate_router_args()
        Router.from_args(args).start()
    """))
    with open(tmp_path / "smg.log", "w") as log:
        process = subprocess.Popen([router_python, str(script)], stdout=log, stderr=subprocess.STDOUT)
    try:
        config = {"port": port, "control_key_file": str(tmp_path / "c"), "key_file": str(tmp_path / "k"),
                  "backends": [f"http://127.0.0.1:{engine}"]}
        (tmp_path / "c").write_text(CONTROL_KEY)
        (tmp_path / "k").write_text(client_key)
        wait_for(lambda: _routed(config), timeout=40, what="smg routing to the engine")
        prober = Prober(port)
        Engine.seen.clear()
        status, answer = prober.ask("POST", "/v1/chat/completions", {"Authorization": f"Bearer {client_key}"},
                                    json.dumps(CHAT).encode())
        assert status == 200, answer
        assert prober.ask("GET", "/engine_metrics")[0] == 200
        seen = {(path.split("?")[0], auth) for _, path, auth in Engine.seen if not path.startswith("/health")}
        assert ("/v1/chat/completions", f"Bearer {client_key}") in seen, seen
        assert ("/metrics", f"Bearer {head_key}") in seen, seen
        assert ("/v1/chat/completions", f"Bearer {head_key}") not in seen
    finally:
        process.kill()
        process.wait(10)


def _routed(config) -> bool:
    try:
        return [b["state"] for b in sfl_router.routing(config)] == ["routed"]
    except (SystemExit, OSError):
        return False
