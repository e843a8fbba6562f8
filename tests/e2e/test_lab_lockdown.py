"""The locked-down pair seen from outside, in the lab: a third machine on the management network
(a network namespace on the lab's bridge, not a node) reaches the API over TLS only, with a certificate
the fleet's CA signed for the head's address, and gets 401 without the key and 200 with it (the CA file
fetched from the head); so does the router's gate, with the router on spark-a, on every route of smg's
but /health;
and cannot reach the fabric's services even through a route to a fabric address via a node, while
the peer node reaches them and a re-deploy still ships images and weights over the fabric. A
weights source whose manifest names '../' is refused with nothing written outside the model
directory, and an abbreviated recipe commit is refused naming the full SHA the head resolved.

Runs on any deployed lab, or alone after `make lab-reset` (the module's first deploy brings the pair up).
"""
import hashlib
import http.server
import json
import shlex
import socketserver
import subprocess
import threading
import time

import pytest

from sparkfleet.model.serving import load_profile
from tests.e2e.lab import REPO, ca_file, deploy, models_command, on
from tests.state.test_firewall import tcp_open

pytestmark = pytest.mark.lab

PROFILE = load_profile("glm-5.3-flash-exl3")
COMMITS = dict(line.split() for line in (REPO / "lab/recipe/COMMITS").read_text().splitlines() if line.strip())
IMAGE = f"sparkfleet/glm-5.3-flash-exl3:{COMMITS['v1']}"
NETNS, OUTSIDE_IP = "sfl-lan", "198.18.0.50"
HEAD_MGMT, HEAD_FABRIC, PEER_FABRIC_NET = "198.18.0.11", "198.19.77.1", "198.19.77.0/24"
# The fabric's services on the head: the image registry, the rsync daemon, the engine's rendezvous.
FABRIC_PORTS = {"registry": 5000, "rsync": 873, "rendezvous": PROFILE.master_port}
APPLY = "Apply the nftables table inet sparkfleet (one transaction)"
CA_OWN = "/etc/sparkfleet/tls/ca/ca.crt"  # the fleet CA's own certificate on spark-a, the CA node (roles/tls)
ROUTER_PORT, ROUTER_SMG_PORT = 8100, 18100  # router_port (the gate) and router_smg_port (smg, loopback): defaults


def sh(command: str, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"`{command}` failed ({result.returncode}): {result.stdout}{result.stderr}")
    return result


def outside(command: str, check=False) -> subprocess.CompletedProcess:
    """A command on the third machine (the namespace on the management bridge)."""
    return sh(f"ip netns exec {NETNS} {command}", check=check)


class _Outside:
    """The third machine as a testinfra host: its command run by bash in the namespace (run: the whole
    result; check_output, as tcp_open calls it: stdout, or an error when the command fails)."""
    @staticmethod
    def run(command: str) -> subprocess.CompletedProcess:
        return outside(f"bash -c {shlex.quote(command)}")

    @classmethod
    def check_output(cls, command: str) -> str:
        result = cls.run(command)
        assert result.returncode == 0, f"the third machine: `{command}` failed ({result.returncode}): {result.stderr}"
        return result.stdout.rstrip("\r\n")


def reached(ip: str, ports) -> set[int]:
    """The ports of `ports` at `ip` the third machine opens a TCP connection to, every one tried at once
    (tests/state/test_firewall.py's tcp_open): a dropped port costs its 4 s timeout once, not once per port."""
    return set(tcp_open(_Outside, ip, list(ports)))


def reaches(ip: str, port: int) -> bool:
    """Whether the third machine opens a TCP connection to ip:port."""
    return port in reached(ip, [port])


def peer_reaches(ip: str, port: int) -> bool:
    return on("spark-b", f"timeout 4 bash -c 'exec 3<>/dev/tcp/{ip}/{port}' && echo open || echo closed",
              check=False).strip() == "open"


def http_code(extra: str = "", ca: str | None = None) -> str:
    """The third machine's curl of the API over TLS, the certificate verified with the fleet's CA file as a
    client fetched it from the head (ca_file), or with `ca`."""
    out = outside(f"curl -sS -m 8 -o /dev/null -w '%{{http_code}}' --cacert {ca or ca_file()} {extra} "
                  f"https://{HEAD_MGMT}:{PROFILE.port}/v1/models")
    return out.stdout.strip()


@pytest.fixture(scope="module", autouse=True)
def serving_pair():
    run = deploy()
    assert run.returncode == 0, run.output
    yield


@pytest.fixture(scope="module")
def third_machine():
    """A network namespace with one leg on the lab's management bridge, like a laptop on the office LAN."""
    sh(f"ip netns del {NETNS} 2>/dev/null; ip link del sfl-lan-br 2>/dev/null; true")
    sh(f"ip netns add {NETNS} && ip link add sfl-lan-br type veth peer name sfl-lan0 && "
       f"ip link set sfl-lan0 netns {NETNS} && ip link set sfl-lan-br master sfl-mgmt0 up && "
       f"ip -n {NETNS} addr add {OUTSIDE_IP}/24 dev sfl-lan0 && ip -n {NETNS} link set sfl-lan0 up && "
       f"ip -n {NETNS} link set lo up")
    deadline = time.monotonic() + 20
    while outside(f"ping -c1 -W1 {HEAD_MGMT}").returncode != 0:
        assert time.monotonic() < deadline, "the third machine cannot reach spark-a's management address"
    yield
    sh(f"ip netns del {NETNS}; ip link del sfl-lan-br 2>/dev/null; true", check=False)


def test_from_the_management_network_the_api_wants_the_key(third_machine, tmp_path):
    assert http_code() == "401"
    key = on("spark-a", "cat /etc/sparkfleet/api-key").strip()
    config = tmp_path / "curl.cfg"
    config.touch(mode=0o600)
    config.write_text(f'header = "Authorization: Bearer {key}"\n')
    assert http_code(f"-K {config}") == "200"
    assert http_code("-H 'Authorization: Bearer not-the-key'") == "401"


def test_from_the_management_network_the_api_speaks_tls_with_a_certificate_the_fleets_ca_signed(third_machine):
    """Issue 43 item 1's done-when for the API: from a host on the management network the API port speaks
    TLS only, its certificate chains to the fleet's CA (the file a client fetches from the head, its
    fingerprint the one the head's CA has) and names the head's management address; curl with the CA file
    and the key is served (test_from_the_management_network_the_api_wants_the_key); without the CA file,
    or in plain HTTP, nothing is."""
    bundle = ca_file()
    fingerprint = "openssl x509 -noout -fingerprint -sha256 -in"
    assert sh(f"{fingerprint} {bundle}").stdout.strip() == on("spark-a", f"{fingerprint} {CA_OWN}").strip()
    endpoint = f"{HEAD_MGMT}:{PROFILE.port}"
    verified = _Outside.run(f"openssl s_client -connect {endpoint} -CAfile {bundle} -verify_return_error "
                            f"-verify_ip {HEAD_MGMT} </dev/null 2>&1")
    assert "Verify return code: 0 (ok)" in verified.stdout, verified.stdout[-2000:]
    sans = _Outside.run(f"openssl s_client -connect {endpoint} </dev/null 2>/dev/null | openssl x509 -noout -ext "
                        f"subjectAltName")
    assert f"IP Address:{HEAD_MGMT}" in sans.stdout, sans.stdout
    without = outside(f"curl -sS -m 8 -o /dev/null https://{endpoint}/health")
    assert without.returncode == 60, without  # the fleet's CA is no CA the system trusts
    plain = outside(f"curl -sS -m 8 -o /dev/null -w '%{{http_code}}' http://{endpoint}/health")
    assert plain.stdout.strip() != "200", plain


# The monitoring listeners of every node (roles/monitoring: the node exporter, a head's engine /metrics, a
# GPU node's GPU exporter; the lab's data ports), on the management addresses.
MONITORING_PORTS = (9100, 9400, 9401)
NODE_MGMT = {"spark-a": HEAD_MGMT, "spark-b": "198.18.0.12"}


def test_from_the_management_network_every_monitoring_port_refuses_or_speaks_tls_with_the_fleets_certificate(third_machine):
    """Issue 43 item 1's done-when for the monitoring listeners: from a host on the management network,
    each exporter port of each node either is not reached (the firewall admits the monitoring node alone;
    the stand-in lab runs no monitoring) or speaks TLS with a certificate the fleet's CA signed for that
    node's address, and never plain HTTP. The monitoring node's own view of them, with monitoring on, is
    tests/real/test_real_monitoring.py's."""
    bundle = ca_file()
    seen = {}
    for node, address in NODE_MGMT.items():
        for port in sorted(reached(address, MONITORING_PORTS)):
            verified = _Outside.run(f"openssl s_client -connect {address}:{port} -CAfile {bundle} "
                                    f"-verify_return_error -verify_ip {address} </dev/null 2>&1")
            plain = outside(f"curl -s -o /dev/null -w '%{{http_code}}' -m 5 http://{address}:{port}/metrics")
            seen[f"{node}:{port}"] = ("Verify return code: 0 (ok)" in verified.stdout, plain.stdout.strip())
    assert all(tls_ok and code != "200" for tls_ok, code in seen.values()), seen


# Routes the real engines answer without a key of their own (vLLM 0.33.0's /invocations, /tokenize,
# /ping, /metrics, /docs; SGLang's /health_generate; tests/parity/test_routes.py lists them all).
KEYLESS = [("POST", "/invocations"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
           ("POST", "/tokenize"), ("GET", "/ping"), ("GET", "/metrics"), ("GET", "/docs"), ("GET", "/openapi.json"),
           ("GET", "/health_generate"), ("POST", "/health"), ("GET", "/health/")]


def test_from_the_management_network_no_route_answers_without_the_key(third_machine):
    bundle = ca_file()

    def code(method, path, port=PROFILE.port):
        data = "-H 'Content-Type: application/json' -d '{}'" if method == "POST" else ""
        return outside(f"curl -sS -m 8 -o /dev/null -w '%{{http_code}}' -X {method} {data} --cacert {bundle} "
                       f"https://{HEAD_MGMT}:{port}{path}").stdout.strip()

    answered = {f"{m} {p}": c for m, p in KEYLESS if (c := code(m, p)) != "401"}
    assert answered == {}, f"answered without the key from the management network: {answered}"
    assert code("GET", "/health") == "200"
    # The engine's own port is on the head's loopback only: not reachable from the LAN at all.
    engine_port = on("spark-a", "ss -Hltn | awk '{print $4}' | grep -c '^127.0.0.1:18000$'").strip()
    assert engine_port == "1", "the engine does not listen on 127.0.0.1:18000"
    assert not reaches(HEAD_MGMT, 18000)


def test_from_the_management_network_the_router_speaks_tls_and_every_route_but_health_wants_the_key(third_machine,
                                                                                                   tmp_path):
    """Issue 43's done-when for the router (item 3): with the router on spark-a, from the third machine the
    router's port speaks TLS only, with a certificate the fleet's CA signed for spark-a's address; every route
    of smg's real table (tests/unit/fixtures/smg-<version>-routes.txt) answers 401 without the key, with
    another, and with the router's control-plane key, but GET /health, /engine_metrics and /loads among them;
    curl with the CA file and the key is served; smg's own port is not reachable at all. The pair is
    deployed without the router again at the end."""
    from sparkfleet.model.router import ROUTER_VERSIONS
    from tests.smg_routes import concrete, read_table

    routed = deploy("--data", "router_node=spark-a")
    try:
        assert routed.returncode == 0, routed.output[-4000:]
        bundle, endpoint = ca_file(), f"{HEAD_MGMT}:{ROUTER_PORT}"
        verified = _Outside.run(f"openssl s_client -connect {endpoint} -CAfile {bundle} -verify_return_error "
                                f"-verify_ip {HEAD_MGMT} </dev/null 2>&1")
        assert "Verify return code: 0 (ok)" in verified.stdout, verified.stdout[-2000:]
        assert outside(f"curl -sS -m 8 -o /dev/null https://{endpoint}/health").returncode == 60  # not a CA the system has
        assert outside(f"curl -sS -m 8 -o /dev/null -w '%{{http_code}}' http://{endpoint}/health").stdout.strip() != "200"
        control = on("spark-a", "cat /etc/sparkfleet/router-control-key").strip()
        routes = [(m, p) for m, p, _ in read_table(ROUTER_VERSIONS[-1])]
        # One bash on the third machine: a line per request, `<method> <path> <key> <code>`.
        lines = []
        for method, path in routes:
            data = "-H 'Content-Type: application/json' -d '{}'" if method in ("POST", "PUT", "PATCH") else ""
            for label, header in (("none", ""), ("other", "-H 'Authorization: Bearer not-the-key-0123456789'"),
                                  ("control", f"-H 'Authorization: Bearer {control}'")):
                lines.append(f"echo \"{method} {path} {label} $(curl -sS -m 8 -o /dev/null -w '%{{http_code}}' -X {method} "
                             f"{data} {header} --cacert {bundle} https://{endpoint}{concrete(path)})\"")
        script = tmp_path / "routes.sh"
        script.touch(mode=0o600)  # it names the control-plane key
        script.write_text("\n".join(lines) + "\n")
        answered = outside(f"bash {script}").stdout.split("\n")
        codes = {tuple(line.split()[:3]): line.split()[3] for line in answered if len(line.split()) == 4}
        assert len(codes) == 3 * len(routes), answered[-10:]
        leaks = {k: c for k, c in codes.items() if c != "401" and k[:2] != ("GET", "/health")}
        assert leaks == {}, f"the router answered without the key from the management network: {leaks}"
        assert codes[("GET", "/health", "none")] == "200"
        key = on("spark-a", "cat /etc/sparkfleet/api-key").strip()
        config = tmp_path / "curl.cfg"
        config.touch(mode=0o600)
        config.write_text(f'header = "Authorization: Bearer {key}"\n')
        served = outside(f"curl -sS -m 8 -o /dev/null -w '%{{http_code}}' -K {config} --cacert {bundle} "
                         f"https://{endpoint}/v1/models")
        assert served.stdout.strip() == "200", served
        assert not reaches(HEAD_MGMT, ROUTER_SMG_PORT)  # smg: on spark-a's loopback only
    finally:
        back = deploy()
        assert back.returncode == 0, back.output[-4000:]


def test_a_route_to_the_fabric_through_a_node_reaches_none_of_the_fabrics_services(third_machine):
    outside(f"ip route replace {PEER_FABRIC_NET} via {HEAD_MGMT}", check=True)
    try:
        # Control: without sparkfleet's table, Linux answers its fabric address on the management
        # interface: the route really leads to the registry (the hole the firewall closes).
        on("spark-a", "nft delete table inet sparkfleet")
        assert reaches(HEAD_FABRIC, FABRIC_PORTS["registry"]), "control: the route does not reach the registry"
        run = deploy()
        assert run.returncode == 0, run.output
        assert (APPLY, "spark-a") in run.changed()
        through = reached(HEAD_FABRIC, FABRIC_PORTS.values())
        open_outside = {name: port for name, port in FABRIC_PORTS.items() if port in through}
        assert open_outside == {}, f"reachable from the management network through spark-a: {open_outside}"
        # The peer node still reaches every one of them over the fabric.
        closed_to_peer = {name: port for name, port in FABRIC_PORTS.items() if not peer_reaches(HEAD_FABRIC, port)}
        assert closed_to_peer == {}, f"spark-b cannot reach over the fabric: {closed_to_peer}"
    finally:
        outside(f"ip route del {PEER_FABRIC_NET}")


def test_a_redeploy_still_ships_images_and_weights_over_the_fabric_and_then_changes_nothing():
    model_dir = f"/var/lib/sparkfleet/models/{PROFILE.model}"
    victim = on("spark-b", f"cd {model_dir} && find . -type f -name '*.safetensors' | sort | head -1").strip()
    assert victim, "no weights file on spark-b"
    on("spark-b", f"docker image rm -f {IMAGE} 198.19.77.1:5000/{IMAGE} >/dev/null; rm -f {model_dir}/{victim}")
    run = deploy()
    assert run.returncode == 0, run.output
    changed = run.changed()
    assert (f"Pull {IMAGE} from the head", "spark-b") in changed, changed
    assert (f"Send {PROFILE.model} to the workers over the fabric", "spark-b") in changed, changed
    assert on("spark-b", f"test -f {model_dir}/{victim} && echo back").strip() == "back"
    again = deploy()
    assert again.returncode == 0 and again.changed() == [], again.output
    assert "--> sparkfleet firewall" in again.output


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def hostile_weights_source(tmp_path):
    """An HTTP weights source on the bridge whose manifest for the profile's model names '../'."""
    root = tmp_path / "source"
    model = root / PROFILE.model
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}\n")
    payload = b"planted\n"
    sha, config_sha = hashlib.sha256(payload).hexdigest(), hashlib.sha256(b"{}\n").hexdigest()
    (root / f"{PROFILE.model}.manifest").write_text(
        "# sparkfleet weights manifest v1\n"
        f"{config_sha}\t3\tconfig.json\n"
        f"{sha}\t{len(payload)}\t../../../../etc/sparkfleet-planted\n"
    )
    handler = lambda *a, **kw: _Quiet(*a, directory=str(root), **kw)  # noqa: E731
    server = socketserver.ThreadingTCPServer(("198.18.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://198.18.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_manifest_line_leaving_the_model_directory_is_refused_and_nothing_is_written(hostile_weights_source):
    model_dir = f"/var/lib/sparkfleet/models/{PROFILE.model}"
    before = on("spark-a", f"cd {model_dir} && find . -type f -printf '%p %s %T@\\n' | sort")
    run = deploy("--data", f"weights_source={hostile_weights_source}")
    assert run.returncode != 0
    assert "manifest line 3: '..' in the path: '../../../../etc/sparkfleet-planted'" in run.output, run.output
    assert "refused, nothing was written" in run.output
    assert on("spark-a", "test -e /etc/sparkfleet-planted && echo planted || echo absent").strip() == "absent"
    assert on("spark-a", f"cd {model_dir} && find . -type f -printf '%p %s %T@\\n' | sort") == before
    assert on("spark-a", models_command())
    back = deploy()
    assert back.returncode == 0 and back.changed() == [], back.output


def test_an_abbreviated_recipe_commit_is_refused_naming_the_full_sha_before_any_change():
    full = COMMITS["v1"]
    run = deploy("--data", f"serving_recipe_commit={full[:7]}")
    assert run.returncode != 0
    assert f"key 'serving_recipe_commit' = '{full[:7]}' is an abbreviated commit" in run.output, run.output
    assert f'serving_recipe_commit = "{full}" (resolved on spark-a)' in run.output
    assert run.changed() == []
    assert json.loads(on("spark-a", models_command()))
