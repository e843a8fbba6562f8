"""The head's API behind the key on every route (roles/api_proxy), checked on the machines: HAProxy
alone on the profile's port, the engine on loopback only, no request without the key answered but
GET /health, and no local user but root and the proxy reaching the engine's own port."""
import json
import shlex

import pytest

from roles.api_proxy.checks import UNIT, UNIT_PATH, config_path, config_text, unit_text
from roles.serving.api_key import authed_curl
from sparkfleet.listeners import parse_ss
from sparkfleet.model.tls import api_base, ca_bundle_path, curl_tls
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
    assert code(host, method, f"{api_base(head, profile.port)}{path}", f"curl {curl_tls(head)}") == "401"


def test_health_answers_without_the_key_and_a_chat_with_it(host, head, profile):
    api = api_base(head, profile.port)  # TLS, the certificate verified with the node's bundle (roles/tls)
    assert code(host, "GET", f"{api}/health", f"curl {curl_tls(head)}") == "200"
    body = json.dumps({"model": profile.api_model_name, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Say hello in one word."}]})
    out = host.run(f"printf '%s' {shlex.quote(body)} | {authed_curl(head, curl_tls(head))} -sS -m {request_bound_s(head)} "
                   f"-H 'Content-Type: application/json' --data-binary @- {api}/v1/chat/completions")
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
    # the user nobody cannot read the node's bundle (its directory is root's): a copy it can read, for this probe
    verify = f"--cacert {ca_bundle_path(head)}"
    if head.tls_enabled:
        host.run(f"install -m 0644 {ca_bundle_path(head)} /tmp/sparkfleet-state-ca.crt")
        verify = "--cacert /tmp/sparkfleet-state-ca.crt"
    via_proxy = host.run(f"setpriv --reuid=nobody --regid=nogroup --clear-groups curl {verify if head.tls_enabled else ''} "
                         f"-sS -m 5 -o /dev/null -w '%{{http_code}}' -X POST -d {{}} "
                         f"{api_base(head, profile.port)}/invocations")
    assert via_proxy.stdout.strip() == "401", f"{head.name}: nobody through the proxy: {via_proxy.stdout}"
