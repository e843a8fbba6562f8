"""The head's API behind the key on every route (roles/api_proxy), checked on the machines: HAProxy
alone on the profile's port, the engine on loopback only, no request without the key answered but
GET /health, and no local user but root and the proxy reaching the engine's own port."""
import json
import shlex

import pytest

from roles.api_proxy.checks import UNIT, UNIT_PATH, config_path, config_text, unit_text
from roles.serving.api_key import authed_curl
from sparkfleet.listeners import parse_ss
from tests.state.limits import request_bound_s

# Inference and other routes the real engines answer without a key of their own (vLLM 0.33.0:
# /invocations, /tokenize, /ping, /metrics, /docs ...; SGLang 0.5.23: /health_generate, /metrics), and
# the key check's own route: each must be 401 without the key.
KEYLESS = [("POST", "/invocations"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
           ("GET", "/v1/models"), ("POST", "/tokenize"), ("GET", "/ping"), ("GET", "/metrics"), ("GET", "/docs"),
           ("GET", "/health_generate"), ("POST", "/health")]


@pytest.fixture
def head(node):
    if not node.is_head:
        pytest.skip("the API proxy runs on the head")
    return node


def code(host, method: str, url: str, curl: str = "curl") -> str:
    return host.run(f"{curl} -sS -m 20 -o /dev/null -w '%{{http_code}}' -X {method} -H 'Content-Type: application/json' "
                    f"{'-d {} ' if method == 'POST' else ''}{shlex.quote(url)}").stdout.strip()


def test_the_proxy_runs_with_the_rendered_config_and_unit(host, head):
    service = host.service(UNIT)
    assert service.is_running and service.is_enabled, f"{head.name}: {UNIT} not running and enabled"
    cfg = host.file(config_path(head))
    assert cfg.user == "root" and cfg.mode == 0o600, f"{head.name}: {cfg.path} not root-only"
    assert cfg.content_string == config_text(head), f"{head.name}: {cfg.path} differs from what data renders"
    assert host.file(UNIT_PATH).content_string == unit_text(head)


def listeners(host) -> dict[int, set[tuple[str, str]]]:
    """port -> {(address, program)} of every listening TCP socket on the node."""
    out: dict[int, set] = {}
    for s in parse_ss(host.check_output("ss -Hltnp")):  # the doctor's parser (sparkfleet/listeners.py)
        out.setdefault(s.port, set()).add((s.address, s.process))
    return out


def test_only_the_proxy_listens_on_the_api_port_and_the_engine_on_loopback(host, head, profile):
    found = listeners(host)
    assert found.get(profile.port) == {("0.0.0.0", "haproxy")}, f"{head.name}: port {profile.port}: {found.get(profile.port)}"
    engine = found.get(head.api_proxy_engine_port, set())
    assert engine and {a for a, _ in engine} == {"127.0.0.1"}, f"{head.name}: engine port: {engine}"


@pytest.mark.parametrize("method,path", KEYLESS)
def test_no_route_answers_without_the_key(host, head, profile, method, path):
    assert code(host, method, f"http://127.0.0.1:{profile.port}{path}") == "401"


def test_health_answers_without_the_key_and_a_chat_with_it(host, head, profile):
    assert code(host, "GET", f"http://127.0.0.1:{profile.port}/health") == "200"
    body = json.dumps({"model": profile.api_model_name, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Say hello in one word."}]})
    out = host.run(f"printf '%s' {shlex.quote(body)} | {authed_curl(head)} -sS -m {request_bound_s(head)} -H 'Content-Type: application/json' "
                   f"--data-binary @- http://127.0.0.1:{profile.port}/v1/chat/completions")
    assert out.rc == 0 and json.loads(out.stdout)["choices"], f"{head.name}: {out.stdout} {out.stderr}"


def test_a_local_user_other_than_root_cannot_go_around_the_proxy(host, head, profile):
    if not head.firewall_enabled:
        pytest.skip("the firewall's output chain keeps local users off the engine port")
    url = f"http://127.0.0.1:{head.api_proxy_engine_port}/health"
    as_root = code(host, "GET", url)
    as_nobody = host.run(f"setpriv --reuid=nobody --regid=nogroup --clear-groups curl -sS -m 5 -o /dev/null "
                         f"-w '%{{http_code}}' {url}")
    assert as_root == "200", f"{head.name}: root gets {as_root} from the engine port"
    assert as_nobody.stdout.strip() == "000" and as_nobody.rc != 0, (
        f"{head.name}: user nobody reached the engine port: {as_nobody.stdout} {as_nobody.stderr}")
    via_proxy = host.run(f"setpriv --reuid=nobody --regid=nogroup --clear-groups curl -sS -m 5 -o /dev/null "
                         f"-w '%{{http_code}}' -X POST -d {{}} http://127.0.0.1:{profile.port}/invocations")
    assert via_proxy.stdout.strip() == "401", f"{head.name}: nobody through the proxy: {via_proxy.stdout}"
