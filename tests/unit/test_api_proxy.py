"""roles/api_proxy rendered: the engine on loopback, HAProxy on the API port with the key on every path
but OPEN_PATHS, and the real HAProxy (the distribution's, on the controller) behind that config: every
request without the key is refused before it reaches the engine, whatever its path or method.

The real engines' route tables through this proxy are proven by the parity tier
(tests/parity/test_routes.py); here the backend is a small HTTP server that records what reached it.
"""
import http.server
import json
import socket
import threading

import pytest

from roles.api_proxy.checks import config_text, unit_text
from sparkfleet.model.api_proxy import OPEN_PATHS
from sparkfleet.firewall_rules import rules_text
from sparkfleet.model.engine import engine_args
from sparkfleet.model.serving import node_profile
from sparkfleet.config import ConfigError, build_cluster
from tests.proxy_run import ask, free_port, running_proxy
from tests.unit.helpers import pair
from tests.unit.test_templates import check_golden, clusters

KEY = "unit-test-key-0123456789abcdef"


def both(**data):
    """pair() with the same data on both nodes."""
    return pair(**{"spark-a": data, "spark-b": data})


def flag(args, name):
    return args[args.index(name) + 1]


@pytest.mark.parametrize("kind", ["spark", "lab"])
def test_proxy_config_and_unit_match_golden(kind):
    head = clusters()[kind].head
    check_golden(f"{kind}-api-proxy.cfg", config_text(head))
    check_golden(f"{kind}-sparkfleet-api-proxy.service", unit_text(head))


@pytest.mark.parametrize("engine_profile", ["glm-5.3-flash-exl3", "qwen3.8-flash-next"])
def test_the_engine_serves_http_on_loopback_only_at_the_engine_port(engine_profile):
    cluster = build_cluster(both(serving_profile=engine_profile, api_proxy_engine_port=18123))
    head = cluster.head
    args = engine_args(node_profile(head), cluster, head)
    assert flag(args, "--host") == "127.0.0.1" and flag(args, "--port") == "18123"
    assert node_profile(head).port != 18123
    assert f"bind 0.0.0.0:{node_profile(head).port}" in config_text(head)
    assert "server engine 127.0.0.1:18123" in config_text(head)


def test_an_engine_port_that_another_service_has_is_refused():
    profile = node_profile(build_cluster(pair()).head)
    with pytest.raises(ConfigError) as err:
        build_cluster(both(api_proxy_engine_port=profile.master_port))
    text = str(err.value)
    assert "api_proxy_engine_port" in text and str(profile.master_port) in text and "spark-a" in text


def test_only_roots_and_the_proxys_sockets_reach_the_engine_port_on_the_head():
    cluster = build_cluster(both(api_proxy_engine_port=18123))
    head_rules = rules_text(cluster, cluster.head, "198.18.0.0/24")
    assert 'oif "lo" tcp dport 18123 meta skuid != { root, haproxy } reject' in head_rules
    assert "18123" not in rules_text(cluster, cluster.node("spark-b"), "198.18.0.0/24")


class Engine(http.server.BaseHTTPRequestHandler):
    """Answers 200 to anything, and records what reached it (method, path, Authorization)."""
    seen: list = []

    def handle_one(self):
        Engine.seen.append((self.command, self.path, self.headers.get("Authorization")))
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_DELETE = do_PUT = do_HEAD = do_PATCH = do_OPTIONS = handle_one

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def proxy():
    engine_port = free_port()
    engine = http.server.ThreadingHTTPServer(("127.0.0.1", engine_port), Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    head = build_cluster(both(api_proxy_engine_port=engine_port)).head
    with running_proxy(head, KEY) as running:
        yield running
    engine.shutdown()


# Paths an engine serves (vLLM 0.33.0's unguarded ones among them) and spellings of the open path that
# are not it: each must be refused without the key and never reach the engine.
KEYED = [("POST", "/invocations"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
         ("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/load"),
         ("POST", "/abort_requests"), ("POST", "/health_generate"), ("GET", "/health_generate"), ("POST", "/health"),
         ("DELETE", "/health"), ("GET", "/health/"), ("GET", "//health"), ("GET", "/%68ealth"), ("GET", "/health/../v1/models"),
         ("GET", "/ping"), ("POST", "/ping"), ("GET", "/"), ("OPTIONS", "/v1/chat/completions")]


@pytest.mark.parametrize("method,path", KEYED)
def test_without_the_key_nothing_but_the_open_paths_reaches_the_engine(proxy, method, path):
    Engine.seen.clear()
    assert ask(proxy, method, path) == 401
    assert ask(proxy, method, path, key="not-the-key-0123456789") == 401
    assert Engine.seen == []
    assert ask(proxy, method, path, key=KEY) == 200
    assert [(m, a) for m, _, a in Engine.seen] == [(method, f"Bearer {KEY}")]


@pytest.mark.parametrize("path,methods", OPEN_PATHS.items())
def test_the_open_paths_answer_without_the_key(proxy, path, methods):
    for method in methods:
        Engine.seen.clear()
        assert ask(proxy, method, path) == 200 and Engine.seen[0][:2] == (method, path)
    assert ask(proxy, "GET", f"{path}?probe=1") == 200  # the query is not part of the path


def test_two_authorization_headers_are_refused(proxy):
    Engine.seen.clear()
    # urllib keeps one value per header name; a raw request sends both.
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as raw, \
            proxy.context().wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(f"POST /invocations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\nAuthorization: Bearer {KEY}\r\n"
                  "Content-Length: 2\r\nConnection: close\r\n\r\n{}".encode())
        status = s.recv(1024).split(b"\r\n", 1)[0]
    assert b" 400 " in status and Engine.seen == []


def test_the_doctor_names_a_listener_that_goes_around_the_proxy():
    from roles.api_proxy.checks import Listeners, listener_problems

    cluster = build_cluster(both())
    head, worker = cluster.head, cluster.node("spark-b")
    ss = ['LISTEN 0 4096 0.0.0.0:8000 0.0.0.0:* users:(("haproxy",pid=4021,fd=6))',
          'LISTEN 0 4096 127.0.0.1:18000 0.0.0.0:* users:(("python3",pid=77,fd=3))',
          'LISTEN 0 5 10.77.77.1:873 0.0.0.0:* users:(("rsync",pid=9,fd=4))']
    sockets = Listeners().process(ss)
    assert sockets[0] == ("0.0.0.0", 8000, "haproxy")
    assert listener_problems(head, sockets, True) == []
    assert listener_problems(worker, [], False) == []
    assert "not running" in listener_problems(head, sockets, False)[0]
    # An engine deployed before the proxy: on the API port itself, every address.
    old = Listeners().process(['LISTEN 0 4096 0.0.0.0:8000 0.0.0.0:* users:(("vllm",pid=5,fd=6))'])
    assert listener_problems(head, old, False)[1] == ("spark-a: port 8000 (the API) is held by vllm on 0.0.0.0; "
                                                      "want only haproxy on 0.0.0.0")
    exposed = Listeners().process([ss[0], 'LISTEN 0 4096 *:18000 *:* users:(("python3",pid=77,fd=3))'])
    assert "listens beyond loopback (python3 on *)" in listener_problems(head, exposed, True)[0]


def test_the_heads_proxy_is_declared_through_the_shared_gate_operations_and_an_unchanged_run_changes_nothing(monkeypatch):
    """roles/api_proxy/tasks.py as the deploy declares it (tests/unit/test_watchdog_deploy.py's recorders): nothing
    changes when nothing did; a changed key reloads the proxy; a head whose engine held the API port before the
    proxy (its pair restarts in this run) has its engine stopped before the proxy starts."""
    from types import SimpleNamespace

    from sparkfleet import decided
    from tests.unit.test_watchdog_deploy import Deploy, FakeHost

    c = build_cluster(pair())
    reload = ("Reload sparkfleet-api-proxy (its config, the API key or its certificate changed)", "spark-a")
    stop = "Stop the head's engine before the proxy takes the API port (the pair restarts in this run)"

    def run(key="ok", active=True, restart=False, changed=()):
        monkeypatch.setattr(FakeHost, "get_fact", lambda self, cls, **kw: {"haproxy": True, "unit": self.name == "spark-a",
                                                                          "active": active and self.name == "spark-a"})
        deploy = Deploy(monkeypatch, c, None, changed=changed)
        decided.install(deploy.state, {"pair": decided.Decisions(
            summary=None, fabric=None, key=key, image=None, weights=None, caches=None, speed=None,
            serving=SimpleNamespace(restart=restart), watchdog=None, memory={}, firewall={})},
            decided.FleetDecision(summary=None, key=None))
        return deploy, deploy.run(includes=("roles/api_proxy/tasks.py",))

    assert run()[1] == []
    assert run(key="stale")[1] == [reload]
    deploy, done = run(active=False, restart=True, changed={"Run sparkfleet-api-proxy, at boot too"})
    assert done == [(stop, "spark-a"), ("Run sparkfleet-api-proxy, at boot too", "spark-a")]  # started: no reload on top
    names = [o.name for *_k, h, o in sorted(deploy.ops, key=lambda x: x[:4]) if h == 0]
    assert names.index(stop) < names.index("Run sparkfleet-api-proxy, at boot too")
