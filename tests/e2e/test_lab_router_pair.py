"""The lab's pair behind the router (router_node: spark-a): a fleet of one routed group. A change
that restarts the pair would drain the last group the router routes for its model: the run is
refused before any change, naming the group (roles/rolling/routes.py), and the router keeps
routing to it; the doctor and status each have a router row, and the router's gate's. The router
stands behind its gate (issue 43 item 3): spark-a's certificate stays a server's (serverAuth only; one
left with clientAuth by an earlier design is issued again) and the gate answers over TLS with it, wants
the key on every route of smg's but /health; the router hop's own client certificate (clientAuth only,
root-only, its own file) is issued on spark-a when it becomes the router node and removed when it stops
being one, and smg reaches the pair's head by it, holding no key, while the node's certificate (which the
exporters' copy holds) is refused there. The router is removed at the end (a deploy without
router_node), so the other modules find the pair as they expect it."""
import re

import pytest

from tests.e2e.lab import BIN, CA_BUNDLE, HOP_PEM, INVENTORY, NODE_PEM, api_curl, deploy, on, router_api, run

pytestmark = pytest.mark.lab

ROUTED = ("--data", "router_node=spark-a")
URL = "https://198.18.0.11:8000"  # the pair's head as the router names it (TLS: smg verifies it with the fleet CA)


def routing() -> str:
    return on("spark-a", "python3 /usr/local/libexec/sparkfleet/sfl_router.py routing /etc/sparkfleet/router.json")


def usages(pem: str = NODE_PEM) -> str:
    return on("spark-a", f"openssl x509 -in {pem} -noout -ext extendedKeyUsage | tail -n 1").strip()


@pytest.fixture(scope="module", autouse=True)
def pair_behind_the_router():
    first = deploy(*ROUTED)
    assert first.returncode == 0, first.output[-4000:]
    assert f'"state": "routed", "status": "ready", "url": "{URL}"' in routing()
    yield first
    removed = deploy()
    assert removed.returncode == 0, removed.output[-4000:]
    for unit in ("sparkfleet-router", "sparkfleet-router-proxy"):
        assert on("spark-a", f"systemctl is-active {unit}", check=False).strip() != "active", unit
    # no longer the router node: the router hop's certificate and key are removed, its own stays a server's
    assert ("Remove the router hop's client certificate and key (/etc/sparkfleet/tls/router-hop.pem; router_node is "
            "none)") in removed.output, removed.output[-4000:]
    assert on("spark-a", f"ls {HOP_PEM}*", check=False).strip() == ""
    assert usages() == "TLS Web Server Authentication"


def test_the_router_hop_has_its_own_client_certificate_and_the_gate_serves_the_nodes_wanting_the_key(
        pair_behind_the_router):
    output = pair_behind_the_router.output
    if "certificate issued for spark-a" in output:  # only a node certificate of the earlier design, with clientAuth
        assert "certificate issued for spark-a: it is for clientAuth, serverAuth, not serverAuth" in output, output[-4000:]
    # the hop's certificate is new (the router node's was removed when the last module left it)
    assert "router hop's client certificate issued on spark-a: no certificate yet" in output, output[-4000:]
    assert usages() == "TLS Web Server Authentication" and usages(HOP_PEM) == "TLS Web Client Authentication"
    assert on("spark-a", f"stat -c '%U:%G %a' {HOP_PEM}").strip() == "root:root 600"
    assert "CN=sparkfleet-router-hop" in on("spark-a", f"openssl x509 -in {HOP_PEM} -noout -subject -nameopt RFC2253")
    gate = router_api("spark-a")
    out = "-sS -m 10 -o /dev/null -w '%{http_code}'"
    code = f"{out} --cacert {CA_BUNDLE}"
    # as a client on spark-a's address reaches it: the key's curl config and the node's bundle (api_curl)
    assert on("spark-a", f"curl {code} {gate}/v1/models").strip() == "401"
    assert on("spark-a", f"{api_curl(out)} {gate}/v1/models").strip() == "200"
    for path in ("/engine_metrics", "/loads", "/get_model_info", "/v1/models", "/workers"):
        assert on("spark-a", f"curl {code} {gate}{path}").strip() == "401", path
    assert on("spark-a", f"curl {code} {gate}/health").strip() == "200"
    # smg on loopback only, reached by root and the gate; the gate holds router_port
    listening = on("spark-a", "ss -Hltnp '( sport = :8100 or sport = :18100 )'")
    assert re.search(r"0\.0\.0\.0:8100\s.*\"haproxy\"", listening) and re.search(r"127\.0\.0\.1:18100\s", listening), listening
    assert "0.0.0.0:18100" not in listening
    # smg holds no key: it reaches the head by the router hop's certificate, which the head takes from spark-a; the
    # node's own certificate (the exporters' copy is its bytes) ends the handshake there: no client's certificate
    assert on("spark-a", f"curl {code} --cert {HOP_PEM} {URL}/v1/models").strip() == "200"
    assert on("spark-a", f"curl {code} {URL}/v1/models").strip() == "401"
    refused = on("spark-a", f"curl {code} --cert {NODE_PEM} {URL}/v1/models 2>&1", check=False)
    assert "alert unsupported certificate" in refused, refused
    assert f'"client_cert_file": "{HOP_PEM}"' in on("spark-a", "cat /etc/sparkfleet/router.json")


def test_the_last_routed_group_is_not_drained_for_a_restart_and_the_run_changes_nothing():
    change = ("--data", 'serving_env_pins={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1799"}')  # restarts the pair
    refused = deploy(*ROUTED, *change)
    assert refused.returncode != 0, refused.output[-4000:]
    assert "--> sparkfleet router on spark-a: pair routed" in refused.output, refused.output[-4000:]
    assert "a turn would take the last routed group of a model out of the router; nothing was changed" in refused.output
    assert ("spark-a: serving group pair is the last group the router routes for model 'glm-5.3-flash' (the only "
            "group serving it)") in refused.output
    assert "router_outage_accepted: true (allowed: true, false)" in refused.output
    assert refused.results() == [] and "Traceback" not in refused.output, refused.output[-4000:]
    assert f'"state": "routed", "status": "ready", "url": "{URL}"' in routing()
    assert "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1799" not in on("spark-a", "cat /etc/sparkfleet/sparkfleet-head.env")


def test_the_doctor_and_status_show_the_router_row():
    doctor = run([str(BIN / "pyinfra"), "-y", INVENTORY, "doctor.py", *ROUTED])
    assert doctor.returncode == 0, doctor.output[-4000:]
    assert "--> sparkfleet doctor router on spark-a (read-only):" in doctor.output
    assert re.search(rf"^router\s+pair\s+ok \({re.escape(URL)} routed\)$", doctor.output, re.M), doctor.output[-3000:]
    assert re.search(r"^listeners\s+gate\s+ok$", doctor.output, re.M) and re.search(r"^tls\s+gate\s+ok$", doctor.output, re.M)
    status = run([str(BIN / "pyinfra"), "-y", INVENTORY, "status.py", *ROUTED])
    assert status.returncode == 0, status.output[-4000:]
    assert re.search(rf"^  pair\s+{re.escape(URL)}\s+routed$", status.output, re.M), status.output[-3000:]
    assert re.search(rf"^  gate\s+{re.escape(router_api('spark-a'))}: /health 200, its certificate verified with "
                     rf"{CA_BUNDLE}", status.output, re.M), status.output[-3000:]
