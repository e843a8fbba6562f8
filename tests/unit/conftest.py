"""Fixtures shared by the unit tests."""
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def launch():
    """launch(argv, env, cwd=None) starts a process with stdout and stderr in one pipe; every process
    started is killed at teardown (the lab stand-in tests start ranks that never exit on their own)."""
    procs = []

    def start(command, env, cwd=None):
        p = subprocess.Popen(command, env=env, cwd=cwd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=5)


@pytest.fixture
def listener():
    """Two TCP listeners on loopback, one per node of a test inventory, that count connections:
    a refusal before connecting must come with none, a valid inventory must reach them. They are
    no SSH servers: they close every connection at once, so a run that connects fails right after."""
    import select
    import socket
    import threading

    socks = []
    for _ in range(2):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        socks.append(sock)
    accepted = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            ready, _, _ = select.select(socks, [], [], 0.1)
            for sock in ready:
                conn, _ = sock.accept()
                accepted.append(sock.getsockname()[1])
                conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield [s.getsockname()[1] for s in socks], accepted
    stop.set()
    thread.join()
    for sock in socks:
        sock.close()


def _prometheus_tool(name: str) -> str:
    script = Path(__file__).with_name("promtool.sh")
    run = subprocess.run(["bash", str(script), name], capture_output=True, text=True)
    assert run.returncode == 0, f"no {name} ({run.stderr.strip()}): run `make promtool`"
    return run.stdout.strip()


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool's path (`make promtool` puts it in the cache; the unit tier's make targets run it first)."""
    return _prometheus_tool("promtool")


@pytest.fixture(scope="module")
def amtool() -> str:
    """amtool's path, from the OS's Alertmanager package (`make promtool` caches it beside promtool)."""
    return _prometheus_tool("amtool")


@pytest.fixture(scope="module")
def prometheus_program() -> str:
    """Prometheus itself, from the OS's package at the lab's version (`make promtool` caches it)."""
    return _prometheus_tool("prometheus")


@pytest.fixture(scope="module")
def node_exporter_program() -> str:
    """The OS's node exporter at the lab's version (`make promtool` caches it)."""
    return _prometheus_tool("prometheus-node-exporter")


@pytest.fixture(scope="module")
def registry_program() -> str:
    """The OS's image registry (docker-registry, what roles/image installs on the head; `make promtool`
    caches it)."""
    return _prometheus_tool("docker-registry")


@pytest.fixture(autouse=True)
def _addresses_resolved_afresh(monkeypatch):
    """sparkfleet/addresses.py resolves a name once per process: each test starts with nothing pinned."""
    from sparkfleet import addresses

    monkeypatch.setattr(addresses, "_RESOLVED", {})


@pytest.fixture
def resolver(monkeypatch):
    """resolver({name: [IPv4 addresses]}) makes the controller's resolver (socket.getaddrinfo, as
    sparkfleet/addresses.py calls it) answer from that table, any other name unknown, with no /etc/hosts
    or DNS involved; returns the list of names asked, in order. It answers IPv4 queries only: any
    other family asked fails the test."""
    import socket

    asked = []

    def install(answers):
        def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
            assert family == socket.AF_INET, f"the management address is IPv4: asked family {family!r}"
            asked.append(host)
            if host not in answers:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            # One entry per socket type, as a real resolver gives without `type`: duplicates to fold.
            return [(socket.AF_INET, kind, 6, "", (address, 0))
                    for address in answers[host] for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM)]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        return asked

    return install
