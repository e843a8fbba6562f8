"""The real HAProxy (the controller's, from the distribution) run with a rendered gate config, on a free port
of the controller's loopback, in front of a backend there: the head's API proxy (running_proxy; with the
router hop when a router is named) and the router's gate in front of smg (running_gate), for the unit and
parity tiers (tests/unit/test_api_proxy.py, test_router.py, test_router_gate.py, tests/parity/test_routes.py).
With TLS on (the default), its certificate is the one roles/tls's own commands make, run for real with this
machine's openssl in the proxy's temporary directory: a fleet CA, then the node's key, CSR and certificate
for 127.0.0.1 (serverAuth), and on the router node the router hop's client certificate (clientAuth only,
roles/tls hop_cert), the one smg presents to the heads."""
import contextlib
import dataclasses
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from roles.api_proxy.checks import config_text, key_pattern_file
from roles.tls import checks as tls
from tests.programs import os_program
from sparkfleet.model.serving import node_profile
from sparkfleet.model.tls import ca_bundle_path


def sh(command: str, stdin: str | None = None) -> str:
    """A roles/tls command run here as the node runs it (sh -c), its stdout; a failure raises with stderr."""
    done = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"
    return done.stdout


def fleet_tls(head, directory, address: str = "127.0.0.1", days: int = 30, ca=None):
    """`head` with its serving_dir in `directory` and its management address `address`, holding what roles/tls
    makes on a head: the head's certificate for `address` in the proxy's PEM and the trust bundle, issued by
    the fleet CA on `ca` (a node fleet_tls made before: two heads of one fleet), else by a CA made here (its
    key root-only), as on the head that keeps it. Every command is roles/tls's own, run with openssl."""
    node = head.model_copy(update={"serving_dir": str(directory), "management_address": address})
    ca = ca or node
    if ca is node:
        sh(tls.create_ca_command(node, 3650, tls.ca_subject(node)))
    issue(node, ca, days)
    Path(ca_bundle_path(node)).write_bytes(tls.bundle_text(Path(tls.ca_cert_path(ca)).read_bytes(), ()))
    return node


def issue(node, ca, days: int = 30, kind=None) -> None:
    """A certificate as issue_certificate makes it: CSR on the node, signed by the CA, installed; `kind`
    (roles/tls CertKind) the node's certificate by default, hop_cert(node) the router hop's."""
    sh(tls.install_command(node, kind), sh(tls.sign_command(ca, node, days, kind), sh(tls.csr_command(node, kind))))


@dataclasses.dataclass(frozen=True)
class RunningProxy:
    port: int
    ca: str | None  # the trust bundle that verifies its certificate; None: plain HTTP (tls_enabled false)
    head: object  # the head as the proxy runs it (its serving_dir the temporary directory)

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


@contextlib.contextmanager
def _running_haproxy(node, key: str, directory: str, name: str, render, listen: int):
    """HAProxy with `render(node)`'s config, its bind on every address at `listen` moved to a free loopback
    port, the key's pattern file in the node's serving_dir (`directory`). Yields a RunningProxy."""
    haproxy = os_program("haproxy", "/usr/sbin/haproxy")  # skipped without it, outside make unit / make test
    port = free_port()
    keys = Path(key_pattern_file(node))
    keys.write_text(f"Bearer {key}\n")
    keys.chmod(0o600)
    text = render(node).replace(f"bind 0.0.0.0:{listen}", f"bind 127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in text and str(keys) in text
    config = Path(directory) / name
    config.write_text(text)
    subprocess.run([haproxy, "-c", "-q", "-f", str(config)], check=True)
    process = subprocess.Popen([haproxy, "-W", "-f", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait_listening(port)
        yield RunningProxy(port, ca_bundle_path(node) if node.tls_enabled else None, node)
    finally:
        process.terminate()
        process.wait(10)


def _node_in(node, directory: str, ca):
    """`node` with its serving_dir in `directory`, holding roles/tls's certificate for 127.0.0.1 with TLS on."""
    return fleet_tls(node, directory, ca=ca) if node.tls_enabled else node.model_copy(update={"serving_dir": directory})


@contextlib.contextmanager
def running_proxy(head, key: str, ca=None, router=None):
    """HAProxy with `head`'s rendered config (its backend: 127.0.0.1:api_proxy_engine_port), bound to a
    free loopback port instead of the profile's; its serving_dir a temporary directory holding the key's
    pattern file and, with TLS on, roles/tls's certificate for 127.0.0.1 (fleet_tls: from the CA of `ca`,
    another RunningProxy's head, else its own). `router`: the router node the head admits the router hop
    from (its name and management address: roles/api_proxy router_hop). Yields a RunningProxy."""
    with tempfile.TemporaryDirectory() as d:
        node = _node_in(head, d, ca)
        with _running_haproxy(node, key, d, "api-proxy.cfg", lambda n: config_text(n, router),
                              node_profile(node).port) as running:
            yield running


@contextlib.contextmanager
def running_gate(router, key: str, smg_port: int, ca=None):
    """The router's gate (roles/router/gate.py's rendered config) in front of smg on 127.0.0.1:smg_port,
    bound to a free loopback port instead of router_port; `router` the router node (router_node its own
    name), its serving_dir a temporary directory holding the key's pattern file and, with TLS on, its
    certificate for 127.0.0.1 and the router hop's client certificate, the one smg presents to the heads
    (client_cert_path of the yielded RunningProxy's head), both from the CA of `ca` (another RunningProxy's
    head, else its own). Yields a RunningProxy."""
    from roles.router.gate import gate_config_text

    with tempfile.TemporaryDirectory() as d:
        node = _node_in(router.model_copy(update={"router_node": router.name, "router_smg_port": smg_port}), d, ca)
        if node.tls_enabled:
            issue(node, ca or node, kind=tls.hop_cert(node))
        with _running_haproxy(node, key, d, "router-proxy.cfg", gate_config_text, node.router_port) as running:
            yield running


def ask(target, method: str, path: str, key: str | None = None, timeout: float = 20) -> int:
    """The status code of one request (a JSON body for methods that carry one): to a RunningProxy over TLS,
    its certificate verified against its trust bundle (plain HTTP when its TLS is off); to a port (an
    engine's own), in plain HTTP on 127.0.0.1."""
    port = target.port if isinstance(target, RunningProxy) else target
    tls = isinstance(target, RunningProxy) and target.ca is not None
    request = urllib.request.Request(f"{'https' if tls else 'http'}://127.0.0.1:{port}{path}", method=method,
                                     data=b"{}" if method in ("POST", "PUT", "PATCH") else None)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=target.context() if tls else None) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
