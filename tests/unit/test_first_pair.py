"""docs/first-pair.md (issue 45 item 3): its OpenAI-client example is Python that takes the key from a
file, never a literal, and sends it as the bearer to the URL and model the environment names; every
`make` target and `sparkfleet` subcommand the page and the README give exists; and each command the
docs and refusals give for putting a secret into a root-only file works where its directory does not
exist yet (a fresh Spark has no /etc/sparkfleet). The example against the lab's real pair:
tests/real/test_real_pair.py."""
import ast
import json
import os
import re
import secrets
import shlex
import shutil
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from roles.monitoring.secrets import controller_file_problem
from roles.serving.api_key import problem as api_key_problem
from sparkfleet.model.api_key import KEY_PATTERN
from sparkfleet.model.tls import ca_bundle_path, proxy_pem_path
from tests.doc_examples import CLIENT_ENV, FIRST_PAIR, ROOT, client_example

README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]


# --- The client example --------------------------------------------------------------------------

def literal_keys(code: str) -> list[str]:
    """String literals of `code` that could be a pasted API key: any value given to `api_key=` as a
    literal, and any literal a key could be (sparkfleet/model/api_key.py KEY_PATTERN) but the names of
    the environment variables the example reads."""
    found = {}  # in the order found, each once
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.keyword) and node.arg == "api_key" and isinstance(node.value, ast.Constant):
            found[str(node.value.value)] = True
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and re.fullmatch(KEY_PATTERN, node.value) and node.value not in CLIENT_ENV):
            found[node.value] = True
    return list(found)


def environment_reads(code: str) -> set[str]:
    """The names `code` reads as os.environ["NAME"], os.environ.get("NAME") or os.getenv("NAME")."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            names.add(ast.literal_eval(node.slice))
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
            names.add(ast.literal_eval(node.args[0]))
    return names


def test_the_client_example_is_python_that_names_no_key_and_reads_what_the_page_says_to_set():
    code = client_example()
    compile(code, str(FIRST_PAIR), "exec")  # a SyntaxError names the doc's line
    assert literal_keys(code) == []
    assert environment_reads(code) == set(CLIENT_ENV)
    page = FIRST_PAIR.read_text()
    for name in CLIENT_ENV:  # the page tells the user to set each one
        assert re.search(rf"^export {name}=\S", page, re.M), f"docs/first-pair.md never exports {name}"
    # The key comes from the file named by SPARKFLEET_API_KEY_FILE.
    (api_key,) = [k.value for k in ast.walk(ast.parse(code)) if isinstance(k, ast.keyword) and k.arg == "api_key"]
    assert "SPARKFLEET_API_KEY_FILE" in ast.unparse(api_key) and "read_text" in ast.unparse(api_key)


def test_the_literal_key_rule_catches_a_pasted_key():
    code = client_example()
    pasted = re.sub(r"api_key=.*\n", f"api_key={secrets.token_hex(32)!r},\n", code, count=1)
    assert pasted != code and len(literal_keys(pasted)) == 1
    assert literal_keys(pasted.replace("api_key=", "api_key='short'  # ", 1)) == ["short"]  # any literal given as the key
    in_a_variable = "KEY = 'sk-proj-0123456789abcdefABCDEF'\n" + code
    assert literal_keys(in_a_variable) == ["sk-proj-0123456789abcdefABCDEF"]


class FakeOpenAIServer:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1, answering as the API proxy does: over TLS
    with `pem` (a head's certificate and key, roles/tls's: tests/proxy_run.py fleet_tls), 401 unless the
    bearer is `key`; otherwise a completion of the model the request named. Keeps every request's path,
    Authorization header and body."""

    def __init__(self, key: str, pem: str):
        self.key, self.requests = key, []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append((self.path, self.headers.get("Authorization"), body))
                if self.headers.get("Authorization") != f"Bearer {owner.key}":
                    reply, status = {"error": {"message": "unauthorized"}}, 401
                else:
                    reply, status = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                                     "model": body["model"],
                                     "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant", "content": "Hello from the pair."}}],
                                     "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}}, 200
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pem)  # the certificate, then its key, in one file (HAProxy's `crt`)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def run_example(tmp_path: Path, url: str, model: str, key_file: str, home: Path,
                ca_file: str) -> subprocess.CompletedProcess:
    """The example as a user runs it: `python client.py` with the page's four variables set (no proxy:
    the URL is reached directly, as the head is from the management network)."""
    script = tmp_path / "client.py"
    script.write_text(client_example())
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(HOME=str(home), SPARKFLEET_API_URL=url, SPARKFLEET_MODEL=model, SPARKFLEET_API_KEY_FILE=key_file,
               SPARKFLEET_CA_FILE=ca_file)
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)


def head_tls(directory: Path):
    """A head's certificate for 127.0.0.1 and the fleet's bundle, made by roles/tls's commands (openssl)."""
    from sparkfleet.config import build_cluster
    from tests.proxy_run import fleet_tls
    from tests.unit.helpers import pair

    return fleet_tls(build_cluster(pair()).head, directory)


def test_the_client_example_sends_the_key_from_its_file_to_the_url_and_model_named_and_prints_the_reply(tmp_path):
    key = secrets.token_hex(32)  # as the deploy generates it: 32 bytes, hex
    home = tmp_path / "home"
    home.mkdir()
    (home / ".sparkfleet-api-key").write_text(key + "\n")  # as `cat` on the head writes it: one line
    head = head_tls(tmp_path / "head")
    shutil.copy(ca_bundle_path(head), home / ".sparkfleet-ca.crt")  # as the page fetches it
    server = FakeOpenAIServer(key, proxy_pem_path(head))
    try:
        # "~/..." as the page exports it (a shell expands it; the example does too, for a quoted one)
        run = run_example(tmp_path, server.url, "glm-5.3-flash", "~/.sparkfleet-api-key", home,
                          "~/.sparkfleet-ca.crt")
    finally:
        server.close()
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == ["glm-5.3-flash", "Hello from the pair."]
    [(path, auth, body)] = server.requests
    assert path == "/v1/chat/completions" and auth == f"Bearer {key}", (path, auth)
    assert body["model"] == "glm-5.3-flash" and body["messages"][0]["content"], body


@pytest.mark.parametrize("wrong", ["key", "ca"])
def test_the_client_example_fails_loudly_with_another_key_or_another_cas_file(tmp_path, wrong):
    """The fake server's checks are real: with a wrong key the example gets 401; with another fleet's CA
    file it stops at the certificate, and nothing (no key) reaches the server. Either way it exits non-zero."""
    key = secrets.token_hex(32)
    (tmp_path / "key").write_text(key)
    head, stranger = head_tls(tmp_path / "head"), head_tls(tmp_path / "stranger")
    server = FakeOpenAIServer(secrets.token_hex(32) if wrong == "key" else key, proxy_pem_path(head))
    try:
        run = run_example(tmp_path, server.url, "glm-5.3-flash", str(tmp_path / "key"), tmp_path,
                          ca_bundle_path(stranger if wrong == "ca" else head))
    finally:
        server.close()
    assert run.returncode != 0
    if wrong == "key":
        assert "401" in run.stderr, run.stderr[-2000:]
    else:
        assert "CERTIFICATE_VERIFY_FAILED" in run.stderr and server.requests == [], run.stderr[-2000:]


# --- Every command the page gives exists ---------------------------------------------------------

def code_of(text: str) -> str:
    """The code in a Markdown text: its fenced blocks and its inline `code` spans, where commands are."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return "\n".join(blocks + re.findall(r"`([^`\n]+)`", prose))


def make_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if m := re.match(r"^([a-z][\w -]*):(?!=)", line):
            targets |= set(m[1].split())
    return targets


def cli_subcommands() -> set[str]:
    return set(re.findall(r'add_parser\(\s*"(\w+)"', (ROOT / "sparkfleet" / "__main__.py").read_text()))


def test_the_rules_read_the_makefile_and_the_cli():
    assert {"install", "deploy", "plan", "config", "capture", "doctor", "status", "unlock", "rollback"} <= make_targets()
    assert cli_subcommands() == {"deploy", "plan", "config", "capture", "unlock", "docs"}


def test_every_make_target_and_sparkfleet_subcommand_the_first_pair_page_and_the_readme_give_exists():
    targets, subcommands = make_targets(), cli_subcommands()
    for doc in (FIRST_PAIR, README):
        code = code_of(doc.read_text())
        made = set(re.findall(r"\bmake ([a-z][\w-]*)", code))
        run = set(re.findall(r"(?<![/\w-])(?:\.venv/bin/)?sparkfleet ([a-z]\w*)", code))
        assert made and made <= targets, f"{doc.name}: no Makefile target {sorted(made - targets)}"
        assert run <= subcommands, f"{doc.name}: no sparkfleet subcommand {sorted(run - subcommands)}"
    page = code_of(FIRST_PAIR.read_text())
    assert {"config", "plan", "deploy"} <= set(re.findall(r"sparkfleet ([a-z]\w*)", page))
    for path in re.findall(r"\.venv/bin/pytest (tests/\w+)", page):
        assert (ROOT / path).is_dir(), path


# --- Secrets into root-only files, on a fresh node -----------------------------------------------

# `ssh root@<node> '<command>' < <file>`: a secret read from stdin into a file on the node.
SSH_STDIN = re.compile(r"ssh root@[\w.-]+ '([^']*)' < \S+")


def run_fresh(command: str, secret: str, home: Path | None = None) -> subprocess.CompletedProcess:
    """`command` under a permissive umask (022, a login shell's), `secret` on its stdin."""
    env = {**os.environ, **({"HOME": str(home)} if home else {})}
    return subprocess.run(["sh", "-c", f"umask 022; {command}"], input=secret, capture_output=True, text=True,
                          env=env, timeout=30)


def test_each_documented_secret_command_works_where_etc_sparkfleet_does_not_exist(tmp_path):
    """README step 3's hub token, security.md's own API key, first-pair.md's hub token: each run with
    /etc/sparkfleet moved under a fresh directory where it does not exist: the secret lands in a 0600
    file in a 0700 directory."""
    found = [(doc.name, m[1]) for doc in DOCUMENTS for m in SSH_STDIN.finditer(doc.read_text())]
    docs_with = {name for name, _ in found}
    assert {"README.md", "security.md", "first-pair.md"} <= docs_with, found
    for i, (name, command) in enumerate(found):
        root = tmp_path / str(i)
        (root / "etc").mkdir(parents=True)
        moved = command.replace("/etc/sparkfleet", f"{root}/etc/sparkfleet")
        assert moved != command, (name, command)
        secret = secrets.token_hex(16) + "\n"
        run = run_fresh(moved, secret)
        assert run.returncode == 0, (name, command, run.stderr)
        target = Path(shlex.split(moved)[-1])
        assert target.read_text() == secret, (name, command)
        assert oct(target.stat().st_mode & 0o777) == "0o600", (name, command)
        assert oct(target.parent.stat().st_mode & 0o777) == "0o700", (name, command)


def test_without_making_the_directory_first_the_copy_fails_on_a_fresh_node(tmp_path):
    """What the commands above guard against: install alone does not make the directory."""
    run = run_fresh(f"install -m 0600 /dev/stdin {tmp_path}/etc/sparkfleet/hf-token", "token\n")
    assert run.returncode != 0 and "No such file or directory" in run.stderr, run.stderr


def test_the_page_s_key_copy_lands_in_a_file_only_you_can_read_and_is_the_file_the_example_reads(tmp_path):
    page = FIRST_PAIR.read_text()
    (source, install) = re.search(r"ssh root@[\w.-]+ cat (/etc/sparkfleet/api-key) \| (install [^\n`]+)", page).groups()
    (exported,) = re.findall(r"^export SPARKFLEET_API_KEY_FILE=(\S+)", page, re.M)
    assert shlex.split(install)[-1] == exported, (install, exported)
    home = tmp_path / "home"
    home.mkdir()
    key = secrets.token_hex(32) + "\n"
    run = run_fresh(install, key, home)  # ssh's output is the key file's content
    assert run.returncode == 0, run.stderr
    copied = home / exported.removeprefix("~/")
    assert copied.read_text() == key and oct(copied.stat().st_mode & 0o777) == "0o600"
    assert source == "/etc/sparkfleet/api-key"


def test_the_refusals_own_create_commands_work_where_the_directory_does_not_exist(tmp_path):
    """The named API key file (roles/serving/api_key.py) and a monitoring secret on the controller
    (roles/monitoring/secrets.py): each refusal's `install ... < file` makes the file root-only (0600)
    where its directory is missing."""
    key_path = tmp_path / "node" / "etc" / "sparkfleet" / "my-api-key"
    node = SimpleNamespace(name="spark-a", serving_api_key_file=str(key_path), serving_dir="/etc/sparkfleet")
    secret_path = tmp_path / "controller" / "secrets" / "slack-url"
    refusals = [api_key_problem(node, "missing"),
                controller_file_problem("spark-a", "monitoring_x_file", str(secret_path), None, os.getuid())]
    for refusal, path in zip(refusals, (key_path, secret_path)):
        (command,) = re.findall(r"\((install [^)]*) < \S+\)", refusal)
        secret = secrets.token_hex(20) + "\n"
        run = run_fresh(command, secret)
        assert run.returncode == 0, (refusal, run.stderr)
        assert path.read_text() == secret and oct(path.stat().st_mode & 0o777) == "0o600", refusal
