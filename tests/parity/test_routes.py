"""Every route of the real engines' HTTP apps, at every version with a snapshot (SNAPSHOT_VERSIONS), asked
through the real HAProxy
with the head's rendered API-proxy config: without the key each answers 401, but OPEN_PATHS.

vLLM: its own app, built by `vllm serve`'s own code for the head's rendered command line and
environment (tests/parity/routes_vllm.py: the parser, then build_app with every task vLLM knows),
served on the controller's loopback with no engine behind it. The head's engine is given no key
(the proxy checks it), so the test first asks every route directly and finds none refused; it reads
what vLLM's own check would have guarded, had it been given the key (GUARDED_PREFIX: POST
/invocations not among them, the reason the proxy exists); then it asks every route through the
proxy, without the key (401 but OPEN_PATHS) and with it (the app's own answer, never the proxy's 401).

SGLang: its parity virtualenv holds what resolving its arguments needs, not its HTTP server's
packages (tests/parity/sglang-<version>.txt), so its route table is read from its own source,
sglang/srt/entrypoints/http_server.py (every @app.<method>(path) and @app.api_route(path, methods=...)
decorator); its own key check's verdict on each is its real decision function (sglang/srt/utils/auth.py),
and each route is asked through the proxy in front of a backend that answers 200.
"""
import ast
import http.server
import json
import re
import subprocess
import threading
from pathlib import Path

import pytest

from sparkfleet.model.api_proxy import OPEN_PATHS
from sparkfleet.model.serving import load_profile
from sparkfleet.config import build_cluster
from sparkfleet.model.env_readers import SNAPSHOT_VERSIONS
from tests.parity.test_engine_parity import HERE, PARITY_KEY, engine_python, render
from tests.proxy_run import ask, free_port, running_proxy, wait_listening
from tests.unit.helpers import pair

pytestmark = pytest.mark.parity

VLLM_PROFILE = "glm-5.3-flash-exl3"
SGLANG_PROFILE = "qwen3.8-flash-next"


def head_of(profile: str, engine_port: int):
    data = {"serving_profile": profile, "api_proxy_engine_port": engine_port}
    return build_cluster(pair(**{"spark-a": data, "spark-b": data}))


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def is_open(method: str, path: str) -> bool:
    return method in OPEN_PATHS.get(path, ())


@pytest.fixture(scope="module", params=SNAPSHOT_VERSIONS["vllm"])
def vllm_app(request):
    """(cluster, routes, port): the real vLLM app at each version for the head's command line, serving on
    127.0.0.1:port."""
    port = free_port()
    cluster = head_of(VLLM_PROFILE, port)
    case = render(load_profile(VLLM_PROFILE), "spark", "spark-a", cluster)
    assert case["argv"][case["argv"].index("--port") + 1] == str(port)
    process = subprocess.Popen([engine_python("vllm", request.param), str(HERE / "routes_vllm.py"), str(port)], cwd=HERE,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdin.write(json.dumps({"argv": case["argv"], "env": case["env"]}))
    process.stdin.close()
    try:
        line = process.stdout.readline()
        assert line, f"routes_vllm.py printed nothing:\n{process.stderr.read()[-5000:]}"
        table = json.loads(line)
        assert table["version"] == request.param
        wait_listening(port, 120)
        yield cluster, table, port
    finally:
        process.kill()
        process.wait(30)


def test_vllm_as_rendered_holds_no_key_and_its_own_check_would_leave_inference_open(vllm_app):
    """The head's engine, as its unit runs it, refuses no route (it holds no key: the API proxy checks
    it). And what vLLM's own check guards, were it given the key (its GUARDED_PREFIX, read from the
    release), leaves POST /invocations open: the proxy's reason to exist. If vLLM starts guarding
    /invocations itself, this fails and docs/security.md's list must be read again."""
    _, table, port = vllm_app
    refused = sorted({(m, p) for m, p in table["routes"] if ask(port, m, concrete(p)) == 401})
    assert refused == [], f"vLLM {table['version']} as rendered refuses without a key: {refused}"
    prefix = subprocess.run([engine_python("vllm", table["version"]), "-c",
                             "import json; from vllm.entrypoints.serve.middleware.authenticate import GUARDED_PREFIX; "
                             "print(json.dumps(GUARDED_PREFIX))"], capture_output=True, text=True, check=True)
    guarded = tuple(json.loads(prefix.stdout))
    unguarded = sorted({(m, p) for m, p in table["routes"] if not p.startswith(guarded)})
    print(f"\nvLLM {table['version']}'s own key check would leave open:", ", ".join(f"{m} {p}" for m, p in unguarded))
    assert ("POST", "/invocations") in unguarded
    assert "/v1/chat/completions".startswith(guarded)  # its GUARDED_PREFIX does cover /v1


def test_every_vllm_route_needs_the_key_through_the_proxy(vllm_app):
    cluster, table, port = vllm_app
    routes = sorted({(m, p) for m, p in table["routes"]})
    assert len(routes) > 30, routes  # the whole table, not a stub
    leaks, refused_with_key = [], []
    with running_proxy(cluster.head, PARITY_KEY) as proxy:
        for method, path in routes:
            without = ask(proxy, method, concrete(path))
            if without != 401 and not is_open(method, path):
                leaks.append(f"{method} {path}: {without}")
            if is_open(method, path):
                continue
            with_key = ask(proxy, method, concrete(path), key=PARITY_KEY)
            if with_key == 401:
                refused_with_key.append(f"{method} {path}")
        assert ask(proxy, "GET", "/health") != 401
    assert leaks == [], "answered through the proxy without the key: " + "; ".join(leaks)
    assert refused_with_key == [], "refused with the key: " + "; ".join(refused_with_key)


def sglang_routes(version: str) -> list[tuple[str, str]]:
    """Every route SGLang's HTTP server declares, from its own source at `version`."""
    python = engine_python("sglang", version)
    site = subprocess.run([python, "-c", "import sglang, os; print(os.path.dirname(sglang.__file__))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    source = Path(site, "srt", "entrypoints", "http_server.py").read_text()
    routes = []
    for node in ast.walk(ast.parse(source)):
        for deco in getattr(node, "decorator_list", []):
            if not (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute)
                    and isinstance(deco.func.value, ast.Name) and deco.func.value.id == "app"):
                continue
            kind = deco.func.attr
            if not deco.args or not isinstance(deco.args[0], ast.Constant):
                continue
            path = deco.args[0].value
            if kind in ("get", "post", "put", "delete", "patch"):
                routes.append((kind.upper(), path))
            elif kind == "api_route":
                methods = next((k.value for k in deco.keywords if k.arg == "methods"), None)
                for m in (ast.literal_eval(methods) if methods is not None else ["GET"]):
                    routes.append((m.upper(), path))
    return sorted(set(routes))


class Answers200(http.server.BaseHTTPRequestHandler):
    def answer(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = answer

    def log_message(self, *args):
        pass


def sglang_answers_without_the_key(version: str, routes) -> list[tuple[str, str]]:
    """The routes SGLang's own key check lets through without the key, by its own pure decision
    function (sglang/srt/utils/auth.py decide_request_auth, at the NORMAL level every route without
    an @auth_level has)."""
    program = ("import json, sys\n"
               "from sglang.srt.utils.auth import AuthLevel, decide_request_auth\n"
               "routes = json.load(sys.stdin)\n"
               "print(json.dumps([[m, p] for m, p in routes if decide_request_auth(method=m, path=p, "
               "authorization_header=None, api_key='k' * 16, admin_api_key=None, auth_level=AuthLevel.NORMAL).allowed]))")
    out = subprocess.run([engine_python("sglang", version), "-c", program], input=json.dumps(routes), capture_output=True,
                         text=True, check=True)
    return [tuple(r) for r in json.loads(out.stdout)]


@pytest.mark.parametrize("version", SNAPSHOT_VERSIONS["sglang"])
def test_sglang_itself_answers_a_generation_without_the_key(version):
    open_at_engine = sglang_answers_without_the_key(version, sglang_routes(version))
    print(f"\nSGLang {version} answers without the key:", ", ".join(f"{m} {p}" for m, p in open_at_engine))
    assert ("GET", "/health_generate") in open_at_engine
    assert ("POST", "/v1/chat/completions") not in open_at_engine


@pytest.mark.parametrize("version", SNAPSHOT_VERSIONS["sglang"])
def test_every_sglang_route_needs_the_key_through_the_proxy(version):
    routes = sglang_routes(version)
    paths = {p for _, p in routes}
    assert len(routes) > 30 and {"/generate", "/v1/chat/completions", "/health_generate"} <= paths
    port = free_port()
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", port), Answers200)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    try:
        leaks = []
        with running_proxy(head_of(SGLANG_PROFILE, port).head, PARITY_KEY) as proxy:
            for method, path in routes + [("GET", "/metrics")]:
                without, with_key = ask(proxy, method, concrete(path)), ask(proxy, method, concrete(path), key=PARITY_KEY)
                if (without != 401 and not is_open(method, path)) or with_key != 200:
                    leaks.append(f"{method} {path}: {without} without the key, {with_key} with it")
        assert leaks == [], "; ".join(leaks)
    finally:
        backend.shutdown()
