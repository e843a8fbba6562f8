"""The four-host lab end to end (issue 15): spark-a..spark-d on a switched fabric (`SFL_LAB_HOSTS=4`).

In order, on fresh hosts (`make test` resets the lab to four hosts before this module):
(d) two TP=2 groups behind the router deploy, and an unchanged re-deploy of the fleet changes nothing;
(a) a chat completion through the router's gate (TLS, the router node's certificate) is served (the
    key required), and stopping one group's worker takes that group out of routing while every request
    through the endpoint is answered;
(a2) every route of smg's table through the gate answers 401 without the key but /health, and each head
    admits the router hop (its own client certificate, no key) from the router node only, and no node's
    certificate (the router node's, which its exporters' copy holds);
(e) a turn that fails after its drain leaves the group drained, and the next run routes it again;
(b) a rolling recipe bump across the two groups while a bounded client loop sends requests through
    the router: no request fails, and the order of the group upgrades is printed;
(c) the same four hosts as one group, TP=2 x PP=2, serve a completion.
"""
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.e2e.lab import BIN, CA_BUNDLE, FLEET_HOSTS, FLEET_INVENTORY, FLEET_ONE_INVENTORY, HOP_PEM, NODE_PEM, REPO, \
    SSH_CONFIG, ca_file, ca_on, deploy, on, pause_watchdogs, plan, router_api, tls_context
from tests.e2e.lab import run as run_

pytestmark = pytest.mark.lab

COMMITS = dict(line.split() for line in (REPO / "lab/recipe/COMMITS").read_text().splitlines() if line.strip())
# router_node spark-a, router_port 8100 (lab/inventory_fleet.py): its gate, over TLS with spark-a's certificate.
ROUTER = "https://198.18.0.11:8100/v1"
# The groups' heads as the router names them: TLS, their certificates from the fleet CA on spark-a (g1's head).
G1, G2 = "https://198.18.0.11:8000", "https://198.18.0.13:8000"
MODEL = "glm-5.3-flash"
# v2's start.sh flips KV_SLOTMAP_PIN, pinned nowhere (tests/e2e/test_lab_serving.py): pinned here, so
# the bump proceeds; the fleet's own pin (lab/inventory_fleet.py) stays.
V2 = ("--data", f"serving_recipe_commit={COMMITS['v2']}")
V2_PINS = '{"KV_SLOTMAP_PIN": "1", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "10"}'


def fleet_deploy(*extra: str):
    return deploy(*extra, inventory=FLEET_INVENTORY)


def key() -> str:
    return on("spark-a", "cat /etc/sparkfleet/api-key").strip()


def chat(base: str, api_key: str | None, timeout: float = 60, content: str = "ping") -> tuple[int, dict]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    request = urllib.request.Request(f"{base}/chat/completions", data=json.dumps(body).encode(), headers=headers)
    context = tls_context() if base.startswith("https://") else None  # a head, the router: the fleet's CA alone
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, {"error": e.read().decode(errors="replace")[:300]}
    except OSError as e:  # refused, reset, timed out: the endpoint did not answer
        return 0, {"error": repr(e)}


def started_at(head: str) -> str:
    return on(head, "docker inspect --format '{{.State.StartedAt}}' sparkfleet-head").strip()


def routing() -> dict[str, str]:
    """backend URL -> the router's state of it (routed, unhealthy, draining, drained)."""
    out = on("spark-a", "python3 /usr/local/libexec/sparkfleet/sfl_router.py routing /etc/sparkfleet/router.json")
    return {b["url"]: b["state"] for b in json.loads(out.strip().splitlines()[-1])}


class Client:
    """A bounded client loop through the router: one request after another until stopped."""

    def __init__(self, api_key: str):
        self.api_key, self.results, self._stop = api_key, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        n = 0
        while not self._stop.is_set():
            started = time.monotonic()
            # A new prompt each time: the router's cache-aware policy sends a prompt it has not seen
            # to the group holding the least, so the requests reach both groups.
            n += 1
            status, body = chat(ROUTER, self.api_key, timeout=120, content=f"request {n} {time.time_ns()}")
            self.results.append((status, round(time.monotonic() - started, 2), body if status != 200 else None))
            time.sleep(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=150)

    def failures(self):
        return [r for r in self.results if r[0] != 200]

    def wait_results(self, count: int, timeout: float = 150) -> None:
        """Until the loop has the outcome of `count` requests (a state, not a time: how many it sent
        depends on the machine's load); AssertionError after `timeout` (a request's own bound, 120 s, and more)."""
        deadline = time.monotonic() + timeout
        while len(self.results) < count:
            assert time.monotonic() < deadline, f"{len(self.results)} of {count} requests done in {timeout} s"
            time.sleep(0.2)


@pytest.fixture(scope="module", autouse=True)
def fleet():
    run = fleet_deploy()
    assert run.returncode == 0, run.output[-6000:]
    # The plan prints once, a row per group, and both groups take their turn one after the other.
    assert run.output.count("--> sparkfleet plan: 2 serving group(s)") == 1
    assert re.search(r"^\s+g1\s+glm-5\.3-flash-exl3\s+spark-a, spark-b\s", run.output, re.M), run.output[-4000:]
    assert re.search(r"^\s+g2\s+glm-5\.3-flash-exl3\s+spark-c, spark-d\s", run.output, re.M)
    yield


def test_d_an_unchanged_redeploy_of_the_fleet_changes_nothing():
    run = fleet_deploy()
    assert run.returncode == 0, run.output[-4000:]
    assert run.changed() == [], run.changed()
    assert "--> sparkfleet plan: 2 serving group(s), 0 with changes" in run.output
    planned = plan(inventory=FLEET_INVENTORY)  # and `sparkfleet plan` finds nothing to do on any of the four
    assert planned.returncode == 0, planned.output[-4000:]
    # each group's line, then its engine line (the version, and which proof judges: roles/engine_proof)
    assert re.search(r"^  g1: nothing to do \(serving\)\n  g1 engine: .*\n  g2: nothing to do \(serving\)\n  g2 engine: ",
                     planned.output, re.M), planned.output[-3000:]
    assert [h for h in FLEET_HOSTS if f"  {h}: none would run\n" in planned.output] == list(FLEET_HOSTS)
    # The doctor checks every group, a table each, and one verdict for the fleet; status shows the router.
    doctor = run_([str(BIN / "pyinfra"), "-y", FLEET_INVENTORY, "doctor.py"])
    assert doctor.returncode == 0, doctor.output[-4000:]
    assert "--> sparkfleet doctor serving group g1 (read-only):" in doctor.output
    assert "--> sparkfleet doctor serving group g2 (read-only):" in doctor.output
    assert re.search(r"--> sparkfleet doctor: all \d+ checks passed", doctor.output)
    status = run_([str(BIN / "pyinfra"), "-y", FLEET_INVENTORY, "status.py"])
    assert status.returncode == 0, status.output[-4000:]
    assert re.search(rf"^  g1\s+{G1}\s+routed$", status.output, re.M), status.output[-3000:]
    assert re.search(rf"^  g2\s+{G2}\s+routed$", status.output, re.M)
    # the router's gate as a client reaches it: /health through TLS, verified with spark-a's bundle
    assert re.search(rf"^  gate\s+{router_api('spark-a')}: /health 200, its certificate verified with {CA_BUNDLE}",
                     status.output, re.M), status.output[-3000:]
    assert re.search(r"^listeners\s+gate\s+ok$", doctor.output, re.M), doctor.output[-3000:]
    assert re.search(r"^tls\s+gate\s+ok$", doctor.output, re.M)
    assert re.search(rf"^router\s+g1\s+ok \({G1} routed\)$", doctor.output, re.M), doctor.output[-3000:]
    assert re.search(rf"^router\s+g2\s+ok \({G2} routed\)$", doctor.output, re.M)
    assert re.search(r"^plan\s+g1\s+ok$", doctor.output, re.M) and re.search(r"^plan\s+g2\s+ok$", doctor.output, re.M)


def test_d2_every_listening_socket_of_the_four_hosts_is_a_row_of_the_listener_table():
    """docs/security.md's listener table against `ss -ltnup` on each of the four hosts while the fleet
    serves (tests/listeners.py): spark-a is g1's head and the router node (no monitoring node: the lab's
    fleet runs without monitoring), spark-c g2's head, spark-b and spark-d workers."""
    from sparkfleet.inventory import load_cluster
    from tests.listeners import check_host, host_context

    cluster = load_cluster(REPO / FLEET_INVENTORY, cwd=str(REPO))
    assert "router node" in host_context(cluster, "spark-a").roles
    found = {host: check_host(on(host, "ss -ltnup"), cluster, host) for host in FLEET_HOSTS}
    assert not any(found.values()), "\n".join(f"{h}:\n{d}" for h, d in found.items() if d)


def test_a_the_router_serves_with_the_key_and_a_group_whose_worker_stops_leaves_routing():
    fleet_key = key()
    control_key = on("spark-a", "cat /etc/sparkfleet/router-control-key").strip()
    assert chat(ROUTER, None)[0] == 401  # refused by the router's gate
    status, body = chat(ROUTER, fleet_key)
    assert status == 200 and body["choices"][0]["message"]["content"], body
    assert routing() == {G1: "routed", G2: "routed"}  # sfl_router.py on the node, with the control-plane key
    # The key every client has opens no control plane (the gate removes it, smg's control plane wants its
    # own key), and the control-plane key does not pass the gate: no backend added, removed or listed.
    base = ROUTER.removesuffix("/v1")
    for presented in (fleet_key, control_key):
        for method, path, body in (("POST", "/workers", {"url": "http://198.18.0.12:9"}),
                                   ("GET", "/workers", None), ("DELETE", "/workers/any", None)):
            data = json.dumps(body).encode() if body else None
            headers = {"Authorization": f"Bearer {presented}", "Content-Type": "application/json"}
            request = urllib.request.Request(f"{base}{path}", method=method, data=data, headers=headers)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10, context=tls_context())
            assert refused.value.code == 401, (method, path)
    assert routing() == {G1: "routed", G2: "routed"}
    assert on("spark-a", "stat -c '%U %a' /etc/sparkfleet/router-control-key").strip() == "root 600"
    assert control_key != fleet_key

    pause_watchdogs(FLEET_HOSTS)  # they would repair the group under the test
    with Client(fleet_key) as client:
        client.wait_results(1)  # the loop runs before the fault
        on("spark-d", "systemctl stop sparkfleet-worker")
        # g2's head finds its worker gone at the next request's step timeout (10 s here), its engine
        # dies, /health fails, and the router takes g2 out: within a minute.
        deadline = time.monotonic() + 90
        while routing().get(G2) == "routed" and time.monotonic() < deadline:
            time.sleep(2)
        gone = routing()
        client.wait_results(max(10, len(client.results) + 5))  # the endpoint keeps answering from g1: 5 more
    assert gone == {G1: "routed", G2: "unhealthy"} or gone.get(G2) != "routed", gone
    assert gone[G1] == "routed"
    assert len(client.results) >= 10 and client.failures() == [], client.results
    # The next deploy repairs g2 (its turn: drained, restarted, proven, routed again) and leaves g1
    # alone: groups are independent.
    g1_started = started_at("spark-a")
    run = fleet_deploy()
    assert run.returncode == 0, run.output[-4000:]
    assert re.search(r"^\s+g1\s.*\sno, serving$", run.output, re.M), run.output[-4000:]
    assert re.search(r"^\s+g2\s.*\syes$", run.output, re.M)
    assert started_at("spark-a") == g1_started
    assert routing() == {G1: "routed", G2: "routed"}


def curl_on(host: str, extra: str) -> str:
    """The HTTP code of curl on `host` (000 when TLS or the connection failed)."""
    return on(host, f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}' {extra} 2>/dev/null", check=False).strip()


def test_a2_every_route_of_smg_needs_the_key_through_the_gate_and_the_heads_take_the_hop_from_the_router_only():
    """Issue 43 item 3 in the four-host lab. From the controller, a client of the management network: the
    router's gate speaks TLS with a certificate the fleet CA signed for spark-a's address (serverAuth only),
    and every route of smg's real table (tests/unit/fixtures/smg-<version>-routes.txt, held to the binary
    by the unit tier) answers 401 without the key but GET /health; with the key, smg's public routes are
    served. The router hop: from spark-a, the router node, the hop's own client certificate opens g2's head
    without the key; the same certificate from spark-b does not; spark-a's node certificate and g2's
    head's own (servers') end the handshake."""
    from sparkfleet.model.router import ROUTER_VERSIONS
    from tests.smg_routes import concrete, read_table

    bundle, gate = ca_file(), router_api("spark-a")
    served = run_(["openssl", "s_client", "-connect", gate.removeprefix("https://"), "-CAfile", str(bundle),
                   "-verify_return_error", "-verify_ip", "198.18.0.11"], timeout=30, input="")
    assert "Verify return code: 0 (ok)" in served.output, served.output[-2000:]
    text = on("spark-a", f"openssl x509 -in {NODE_PEM} -noout -text")
    assert "TLS Web Server Authentication\n" in text and "Client Authentication" not in text and "CN = spark-a" in text

    def answer(method: str, path: str, key: str | None = None) -> tuple[int, str]:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        data = b"{}" if method in ("POST", "PUT", "PATCH") else None
        request = urllib.request.Request(f"{gate}{path}", method=method, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30, context=tls_context()) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def code(method: str, path: str, key: str | None = None) -> int:
        return answer(method, path, key)[0]

    routes = [(m, p) for m, p, _ in read_table(ROUTER_VERSIONS[-1])]
    assert len(routes) > 50
    answered = {f"{m} {p}": c for m, p in routes if (c := code(m, concrete(p))) != 401 and (m, p) != ("GET", "/health")}
    assert answered == {}, f"answered through the router's gate without the key: {answered}"
    assert code("GET", "/health") == 200 and code("HEAD", "/health") == 200
    fleet_key = key()
    assert code("GET", "/loads", fleet_key) == 200
    # /engine_metrics with the key passes the gate and is smg's own answer: it fetched each head's /metrics
    # over the hop, and the lab's vLLM stand-ins serve none (404 "no route /metrics"), which smg 1.13.0 sums
    # up as 500 "All backend requests failed" (seen on this lab); the gate's refusal would be 401
    status, body = answer("GET", "/engine_metrics", fleet_key)
    assert (status, body.strip()) == (500, "All backend requests failed"), (status, body[:300])
    assert code("GET", "/engine_metrics", "not-the-key-0123456789") == 401

    g2_models = f"--cacert {CA_BUNDLE} {G2}/v1/models"
    assert curl_on("spark-a", f"--cert {HOP_PEM} {g2_models}") == "200"  # the hop: no key, its own certificate
    assert curl_on("spark-a", g2_models) == "401"
    # the router node's own certificate (with monitoring on, the exporters' copy group prometheus reads is its
    # bytes) is no client's certificate: the handshake fails; the hop's is root's alone
    assert curl_on("spark-a", f"--cert {NODE_PEM} {g2_models}") == "000"
    assert on("spark-a", f"stat -c '%U:%G %a' {HOP_PEM}").strip() == "root:root 600"
    pem = on("spark-a", f"cat {HOP_PEM}")
    copy = subprocess.run(["ssh", "-F", str(SSH_CONFIG), "spark-b", "umask 077; cat > /tmp/router.pem"], input=pem,
                          text=True, timeout=60)
    try:  # the hop's certificate and key on another node: the head takes them from the router node only
        assert copy.returncode == 0
        assert curl_on("spark-b", f"--cert /tmp/router.pem --cacert {ca_on('spark-b')} {G2}/v1/models") == "401"
    finally:
        on("spark-b", "rm -f /tmp/router.pem", check=False)
    # g2's head's own certificate (serverAuth only) is no client certificate: the handshake fails.
    assert curl_on("spark-c", f"--cert {NODE_PEM} --cacert {CA_BUNDLE} {G1}/v1/models") == "000"


def test_e_a_turn_that_failed_after_its_drain_leaves_its_group_drained_and_the_next_run_routes_it_again(tmp_path):
    """g1's head stopped, so its plan restarts it; the run drains g1, restarts it, and stops at the
    receipt, which cannot run (the controller's llama-benchy broken for that run): g1 serves but is
    out of routing. The next run, with nothing changed, routes it again before any turn."""
    pause_watchdogs(("spark-a", "spark-b"))  # g1's: they would restart its head under the test
    on("spark-a", "systemctl stop sparkfleet-head")
    broken = tmp_path / "llama_benchy"
    broken.mkdir()
    (broken / "__init__.py").write_text('raise ImportError("llama-benchy broken on purpose by tests/fleet")\n')
    failed = run_([str(BIN / "pyinfra"), "-y", FLEET_INVENTORY, "deploy.py"],
                  env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tmp_path),
                                                                                os.environ.get("PYTHONPATH"))))})
    assert failed.returncode != 0, failed.output[-4000:]
    assert "serving group g1: out of routing" in failed.output and "receipt: the load failed" in failed.output, \
        failed.output[-4000:]
    assert "serving group g1: routed again" not in failed.output
    assert routing() == {G1: "drained", G2: "routed"}
    assert chat(f"{G1}/v1", key())[0] == 200  # g1 serves, out of routing
    doctor = run_([str(BIN / "pyinfra"), "-y", FLEET_INVENTORY, "doctor.py"])
    assert doctor.returncode != 0
    assert re.search(rf"^router\s+g1\s+FAIL {G1} drained: out of routing although the router's config names it",
                     doctor.output, re.M), doctor.output[-3000:]

    again = fleet_deploy()
    assert again.returncode == 0, again.output[-4000:]
    assert "--> sparkfleet router on spark-a: g1 drained, g2 routed" in again.output, again.output[-4000:]
    assert "routed again before any turn (an earlier run left them drained; they serve): g1" in again.output
    assert again.changed() == [("Route again the serving groups an earlier run left drained (g1)", "spark-a")], \
        again.changed()
    assert routing() == {G1: "routed", G2: "routed"}
    assert fleet_deploy().changed() == []


def test_b_a_rolling_recipe_bump_upgrades_one_group_at_a_time_and_no_request_fails():
    planned = plan(*V2, "--data", f"serving_env_pins={V2_PINS}", inventory=FLEET_INVENTORY)
    assert planned.returncode == 2, planned.output[-4000:]
    for group in ("g1", "g2"):  # each group its own build, ship, warm and restart
        assert re.search(rf"^  {group}: build \S+:{COMMITS['v2']}; ship image -> spark-[bd]; warm the kernel caches "
                         rf"\(prewarm\); restart the group \(", planned.output, re.M), planned.output[-4000:]
    with Client(key()) as client:
        run = fleet_deploy(*V2, "--data", f"serving_env_pins={V2_PINS}")
    assert run.returncode == 0, run.output[-6000:]
    assert "rolling: g1, then g2" in run.output
    assert "serving groups took their turns in this order: g1, g2; restarted one at a time: g1, g2" in run.output
    # g1's turn ended (routed again) before g2 was taken out of routing.
    assert run.output.index("serving group g1: routed again") < run.output.index("serving group g2: out of routing")
    assert len(client.results) >= 20 and client.failures() == [], client.failures()
    for head in ("spark-a", "spark-c"):
        assert COMMITS["v2"][:12] in on(head, "docker ps --format '{{.Image}}'")
    assert routing() == {G1: "routed", G2: "routed"}


def test_c_the_four_hosts_as_one_group_at_tp2_pp2_serve_a_completion():
    run = deploy(*V2, "--data", 'serving_env_pins={"KV_SLOTMAP_PIN": "1"}', inventory=FLEET_ONE_INVENTORY)
    assert run.returncode == 0, run.output[-6000:]
    assert "--> sparkfleet plan: 1 serving group(s), 1 with changes" in run.output
    for rank, host in enumerate(FLEET_HOSTS):
        unit = "sparkfleet-head" if rank == 0 else "sparkfleet-worker"
        text = on(host, f"cat /etc/systemd/system/{unit}.service")
        assert "--pipeline-parallel-size 2" in text and "--tensor-parallel-size 2" in text, text
        assert f"--node-rank {rank}" in text and "--nnodes 4" in text
    # The router's group no longer exists: its unit and its gate are gone from spark-a; the head answers itself.
    for unit in ("sparkfleet-router", "sparkfleet-router-proxy"):
        assert on("spark-a", f"systemctl is-active {unit}", check=False).strip() != "active", unit
    assert on("spark-a", "ss -Hltn '( sport = :8100 or sport = :18100 )'").strip() == ""
    status, body = chat(f"{G1}/v1", key())
    assert status == 200 and body["choices"][0]["message"]["content"], body
