"""The real HAProxy (the controller's, from the distribution) run with the head's rendered API-proxy
config, on a free port of the controller's loopback, in front of a backend there: for the unit and
parity tiers (tests/unit/test_api_proxy.py, tests/parity/test_routes.py)."""
import contextlib
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from roles.api_proxy.checks import config_text, key_pattern_file
from tests.programs import os_program
from sparkfleet.model.serving import node_profile


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
def running_proxy(head, key: str):
    """HAProxy with `head`'s rendered config (its backend: 127.0.0.1:api_proxy_engine_port), bound to a
    free loopback port instead of the profile's, the key's pattern file in a temporary directory.
    Yields the port."""
    haproxy = os_program("haproxy", "/usr/sbin/haproxy")  # skipped without it, outside make unit / make test
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        keys = Path(d) / "api-key.haproxy"
        keys.write_text(f"Bearer {key}\n")
        keys.chmod(0o600)
        text = (config_text(head).replace(f"bind 0.0.0.0:{node_profile(head).port}", f"bind 127.0.0.1:{port}")
                .replace(key_pattern_file(head), str(keys)))
        assert f"127.0.0.1:{port}" in text and str(keys) in text
        config = Path(d) / "api-proxy.cfg"
        config.write_text(text)
        subprocess.run([haproxy, "-c", "-q", "-f", str(config)], check=True)
        process = subprocess.Popen([haproxy, "-W", "-f", str(config)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            wait_listening(port)
            yield port
        finally:
            process.terminate()
            process.wait(10)


def ask(port: int, method: str, path: str, key: str | None = None, timeout: float = 20) -> int:
    """The status code of one request to 127.0.0.1:port (a JSON body for methods that carry one)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     data=b"{}" if method in ("POST", "PUT", "PATCH") else None)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
