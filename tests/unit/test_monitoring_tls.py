"""The monitoring listeners reached over the LAN speak TLS, and Prometheus verifies them (issue 43 item 1):
each node's node exporter (the OS's, 1.5.0 as in the lab: exporter-toolkit's --web.config.file) and the
head's engine /metrics (the API proxy's second frontend) serve the node's one certificate for its
management address, and Prometheus (the OS's, 2.42.0) scrapes them over https with the fleet's trust
bundle. Run for real in a namespace (tests/unit/netns_monitoring_tls.py), with the rendered files and
roles/tls's own commands and verdict; the rendered texts with TLS on and off; the verdict on the
exporters' copy of the certificate as a function of the facts."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from roles.api_proxy.checks import config_text
from roles.monitoring.checks import exporter_defaults_text, prometheus_config_text, web_config_text
from roles.tls import checks as tls
from sparkfleet.config import build_cluster
from sparkfleet.model.tls import EXPORTER_PEM, EXPORTER_WEB_CONFIG, SCRAPE_CA, exporter_tls, proxy_pem_path
from tests.programs import os_program
from tests.unit.helpers import pair

OFF = {"tls_enabled": False, "tls_disabled_reason": "a closed test bench"}


def both(**data):
    return build_cluster(pair(**{"spark-a": data, "spark-b": data}))


# --- what the deploy renders ----------------------------------------------------------------------------

def test_with_tls_on_every_exporter_and_the_metrics_frontend_serve_the_nodes_certificate():
    fleet = both()
    head, worker = fleet.head, fleet.workers[0]
    assert exporter_tls(head) and exporter_tls(worker)
    for node in (head, worker):
        assert f"--web.config.file={EXPORTER_WEB_CONFIG}" in exporter_defaults_text(node)
        web = yaml.safe_load(web_config_text(node))
        # exporter-toolkit's keys (0.8.2 to 0.11.0: web/tls_config.go), its certificate and key the one copy
        assert web == {"tls_server_config": {"cert_file": EXPORTER_PEM, "key_file": EXPORTER_PEM, "min_version": "TLS12"}}
    assert f"bind 0.0.0.0:9400 ssl crt {proxy_pem_path(head)} ssl-min-ver TLSv1.2\n" in config_text(head)
    config = yaml.safe_load(prometheus_config_text(fleet))
    for job in config["scrape_configs"]:
        # https, the fleet's bundle, and no server_name: Go checks each target's own address (its IP SAN)
        assert job["scheme"] == "https" and job["tls_config"] == {"ca_file": SCRAPE_CA}, job


def test_with_tls_off_the_exporters_and_prometheus_stay_plain_http():
    fleet = both(**OFF)
    head = fleet.head
    assert not exporter_tls(head) and web_config_text(head) is None
    assert "--web.config.file" not in exporter_defaults_text(head)
    assert "bind 0.0.0.0:9400\n" in config_text(head)
    assert all("scheme" not in job and "tls_config" not in job
               for job in yaml.safe_load(prometheus_config_text(fleet))["scrape_configs"])
    assert tls.scope(fleet) == []


def test_with_monitoring_on_every_node_holds_a_certificate_and_without_it_the_heads_alone():
    assert [n.name for n in tls.certified(both())] == ["spark-a", "spark-b"]
    assert [n.name for n in tls.certified(both(monitoring_enabled=False))] == ["spark-a"]


def test_the_exporters_copy_is_written_after_a_new_certificate_and_when_it_differs_or_is_not_root_prometheus_0640():
    good = {"exporter_pem": "current", "exporter_pem_mode": "root:prometheus 640"}
    assert tls.exporter_pem_reason(good, renewed=False) is None
    assert tls.exporter_pem_reason(good, renewed=True) == "the node's certificate is new in this run"
    assert tls.exporter_pem_reason({"exporter_pem": "missing"}, False) == "no copy yet"
    assert tls.exporter_pem_reason({**good, "exporter_pem": "differs"}, False) == "it is not the node's certificate"
    assert tls.exporter_pem_reason({**good, "exporter_pem_mode": "prometheus:prometheus 600"}, False) == (
        "it is prometheus:prometheus 600 (owner:group mode), not root:prometheus 640")


def test_the_facts_of_a_node_without_monitoring_are_read_as_before():
    """With monitoring off (the stand-in lab), the head's fact command is the one captured bundles hold."""
    head = both(monitoring_enabled=False).head
    assert "exporter_pem" not in tls.state_command(head, ca=True) and "scrape_ca" not in tls.state_command(head, ca=True)
    assert "exporter_pem" in tls.state_command(both().head, ca=True)


# --- for real -------------------------------------------------------------------------------------------

NEEDED = ("unshare", "setpriv", "adduser", "ip", "openssl")


@pytest.fixture(scope="module")
def served(prometheus_program, node_exporter_program, tmp_path_factory):
    """tests/unit/netns_monitoring_tls.py's account of the pair's monitoring listeners, run as root."""
    haproxy = os_program("haproxy", "/usr/sbin/haproxy")
    missing = [t for t in NEEDED if not shutil.which(t)]
    if missing:
        pytest.skip(f"not on this machine: {', '.join(missing)}")
    if os.geteuid() != 0:
        pytest.skip("namespaces, an overlay of /etc and other users need root")
    work = tmp_path_factory.mktemp("monitoring-tls")
    spec = {"work": str(work), "haproxy": haproxy, "prometheus": prometheus_program,
            "node_exporter": node_exporter_program}
    driver = Path(__file__).with_name("netns_monitoring_tls.py")
    run = subprocess.run(["unshare", "-n", "-m", sys.executable, str(driver)], input=json.dumps(spec),
                         capture_output=True, text=True, timeout=240)
    if run.returncode != 0 and "Operation not permitted" in run.stderr:
        pytest.skip(f"no namespace here: {run.stderr.strip()}")
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((work / "logs").glob("*.log"))) \
        if (work / "logs").is_dir() else ""
    assert run.returncode == 0, run.stderr[-3000:] + logs
    return json.loads(run.stdout)


def test_a_first_deploy_issues_both_nodes_certificates_and_copies_them_for_the_exporters(served):
    first = served["first"]
    assert first["create_ca"] and first["issue"] == ["spark-a", "spark-b"] and first["problems"] == []
    assert first["exporter_pem"] == {"spark-a": "the node's certificate is new in this run",
                                     "spark-b": "the node's certificate is new in this run"}
    assert first["bundle"] == {"spark-a": "the fleet CA is new", "spark-b": "the fleet CA is new"}
    assert served["second"] is False  # the facts read again: nothing left to do


def test_the_exporter_reads_its_copy_through_its_group_and_nothing_else_of_the_nodes_keys(served):
    assert served["modes"] == {EXPORTER_PEM: "root:prometheus 640", EXPORTER_WEB_CONFIG: "root:prometheus 640",
                               SCRAPE_CA: "root:root 644", EXPORTER_PEM.rsplit("/", 1)[0]: "root:prometheus 750"}
    assert served["reads"] == {"prometheus exporter copy": True, "prometheus node PEM": False,
                               "nobody exporter copy": False, "prometheus scrape CA": True}


def test_the_exporters_and_the_metrics_frontend_speak_tls_only_verified_with_the_bundle(served):
    got = served["fetch"]
    assert got["https://10.0.0.11:9100/metrics"].startswith("200 ")
    assert got["https://10.0.0.12:9100/metrics"].startswith("200 ")
    assert got["http://10.0.0.11:9100/metrics"] == "400"  # Go's answer to plain HTTP on a TLS port
    assert got["https://10.0.0.11:9400/metrics"] == "200 vllm:num_requests_running 0"
    assert got["https://10.0.0.11:9400/v1/models"] == "404"  # /metrics alone, as before
    assert not got["http://10.0.0.11:9400/metrics"].startswith("200"), got


def test_prometheus_scrapes_every_target_over_https_verified_with_the_fleets_bundle(served):
    assert [(t["job"], t["node"], t["url"], t["health"]) for t in served["up"]] == [
        ("engine", "spark-a", "https://10.0.0.11:9400/metrics", "up"),
        ("node", "spark-a", "https://10.0.0.11:9100/metrics", "up"),
        ("node", "spark-b", "https://10.0.0.12:9100/metrics", "up")], served["up"]


def test_a_certificate_for_another_address_or_from_another_ca_is_refused_and_the_next_deploy_copies_the_nodes_back(served):
    """The worker's exporter serving spark-a's certificate, then one for its own address from another CA
    (restarted, as a deploy restarts it after a new certificate: Prometheus keeps its connections, and
    exporter-toolkit reads the certificate again only on a new one): Prometheus refuses each, naming
    why; the next verdict copies the node's own back, and the target is up again."""
    wrong = served["wrong"]
    assert wrong["another address"]["health"] == "down", wrong
    assert "x509: certificate is valid for 10.0.0.11, not 10.0.0.12" in wrong["another address"]["error"], wrong
    assert wrong["another CA"]["health"] == "down", wrong
    assert "x509: certificate signed by unknown authority" in wrong["another CA"]["error"], wrong
    for why in ("another address", "another CA"):
        assert served["repair"][why] == {"exporter_pem": {"spark-b": "it is not the node's certificate"}, "issue": [],
                                         "bundle": {}}, why
    assert all(t["health"] == "up" and t["error"] == "" for t in served["repaired"]), served["repaired"]
    assert served["last"] is False


def test_the_router_node_keeps_a_server_certificate_for_its_exporters_and_the_hops_apart(served):
    """spark-b, left by this branch's first design with one certificate carrying clientAuth besides serverAuth
    (then smg's) and the exporters' copy of it, made the router node: its certificate is issued again for
    serverAuth alone and the exporters' copy follows it in the same run; the router hop's client certificate
    (clientAuth only) is issued into its own file, root:root 0600 in the 0700 TLS directory, which user
    prometheus cannot read, while it reads the exporters' copy: the copy is no client's certificate (openssl
    refuses it for a client), the exporter serves it and Prometheus scrapes it, up."""
    assert served["router"] == {"issue": {"spark-b": ["it is for clientAuth, serverAuth, not serverAuth"]},
                                "hop": {"spark-b": ["no certificate yet"]},
                                "exporter_pem": {"spark-b": "the node's certificate is new in this run"},
                                "bundle": {}}, served["router"]
    assert served["router_eku"] == {"exporter copy": "TLS Web Server Authentication",
                                    "hop": "TLS Web Client Authentication"}
    assert served["router_verify"]["sslserver"] == 0 and served["router_verify"]["sslclient"] != 0
    assert served["router_copy_is_node_pem"] is True
    assert served["router_modes"] == {"hop": "root:root 600", "exporter copy": "root:prometheus 640",
                                      "tls dir": "root:root 700"}, served["router_modes"]
    assert served["router_reads"] == {"exporter copy": True, "hop": False, "node PEM": False}, served["router_reads"]
    assert served["router_served"] is True  # spark-b's exporter serves the copy it was given
    assert [(t["node"], t["url"], t["health"], t["error"]) for t in served["router_up"]] == [
        ("spark-a", "https://10.0.0.11:9400/metrics", "up", ""),
        ("spark-a", "https://10.0.0.11:9100/metrics", "up", ""),
        ("spark-b", "https://10.0.0.12:9100/metrics", "up", "")], served["router_up"]
    assert served["last"] is False


# --- the deploy's steps (roles/tls, then roles/monitoring), without any host ---------------------------

def steps(monkeypatch, fleet, plan, changed=(), installed=None,
          files=("roles/tls/tasks.py", "roles/monitoring/tasks.py")) -> list[tuple[str, str]]:
    """The operations roles/tls/tasks.py and roles/monitoring/tasks.py (or `files`) run, in pyinfra's order,
    for the TLS verdict `plan` (tests/unit/test_watchdog_deploy.py's recorder: files named in `changed`
    change), on nodes whose packages are at the pinned versions (or as `installed` says) and whose
    textfile directory is in place."""
    from roles.monitoring.checks import InstalledVersions, UserPresent
    from sparkfleet import decided
    from sparkfleet.root_paths import RootOnlyChain
    from tests.unit.test_watchdog_deploy import Deploy, FakeHost

    first = fleet.nodes[0]
    pinned = {"prometheus-node-exporter": f"{first.monitoring_node_exporter_version}-1",
              "prometheus": f"{first.monitoring_prometheus_version}+ds-1"}
    facts = {InstalledVersions: pinned if installed is None else installed,
             UserPresent: True, RootOnlyChain: [("dir", 0, "755", "/var"), ("dir", 0, "755", "/var/lib")]}
    monkeypatch.setattr(FakeHost, "get_fact", lambda self, cls, **kwargs: facts.get(cls))
    deploy = Deploy(monkeypatch, fleet, None, changed=changed)
    decided.install(deploy.state, decided.fleet_decisions(deploy.state),
                    decided.FleetDecision(summary=None, key=None, tls=plan))
    return deploy.run(files)


def test_fresh_packages_are_installed_at_step_4c_held_and_started_at_12b_once_their_files_are_written(monkeypatch):
    """A node without the packages: step 4c installs the node's packages in one operation (the monitoring node's
    three, a worker's exporter); step 12b starts each after its files and checks, and restarts or reloads
    nothing else. Installed at the pins: neither step does anything (the no-op)."""
    from sparkfleet.verdicts import TlsPlan

    fleet = both(gpu_expected=False)
    plan = TlsPlan(enabled=True, ca_node="spark-a")
    files = ("roles/monitoring/install_tasks.py", "roles/tls/tasks.py", "roles/monitoring/tasks.py")
    head = fleet.node("spark-a")
    written = ("/etc/default/prometheus-node-exporter", "/etc/default/prometheus", "/etc/prometheus/prometheus.yml",
               "/etc/prometheus/sparkfleet.rules.yml")
    done = [(op, h) for op, h in steps(monkeypatch, fleet, plan, changed=written, installed={}, files=files)
            if not op.startswith(("Write", "Reload systemd"))]
    exporter = f"prometheus-node-exporter {head.monitoring_node_exporter_version}"
    assert done == [
        (f"Install {exporter}, prometheus {head.monitoring_prometheus_version} (the OS's builds; held from starting "
         "until step 12b)", "spark-a"),
        (f"Install {exporter} (the OS's build; held from starting until step 12b)", "spark-b"),
        ("Start prometheus-node-exporter (installed at step 4c)", "spark-a"),
        ("Start prometheus-node-exporter (installed at step 4c)", "spark-b"),
        ("Check /etc/prometheus/prometheus.yml and /etc/prometheus/sparkfleet.rules.yml with promtool", "spark-a"),
        ("Start prometheus (installed at step 4c)", "spark-a"),
    ], done
    assert steps(monkeypatch, fleet, plan, files=files) == []


RESTART = "Restart prometheus-node-exporter (its arguments, its TLS or its certificate changed)"
RELOAD = "Reload prometheus (its targets, rules, secrets or trust bundle changed)"


def test_a_deploy_that_changes_nothing_restarts_no_exporter(monkeypatch):
    from sparkfleet.verdicts import TlsPlan

    fleet = both(gpu_expected=False)
    assert steps(monkeypatch, fleet, TlsPlan(enabled=True, ca_node="spark-a")) == []


def test_a_new_certificate_is_copied_for_the_exporters_and_restarts_them_there_only(monkeypatch):
    from sparkfleet.verdicts import TlsPlan

    fleet = both()
    plan = TlsPlan(enabled=True, ca_node="spark-a", issue={"spark-b": ("3 day(s) left",)},
                   exporter_pem={"spark-b": "the node's certificate is new in this run"})
    done = steps(monkeypatch, fleet, plan)
    copy = f"Copy the certificate of spark-b for its exporters into {EXPORTER_PEM} (the node's certificate is new in this run)"
    gpu = "Restart sparkfleet-gpu-exporter (its unit, its fields, its TLS or its certificate changed)"
    assert done == [("Issue the certificate of spark-b from the fleet CA on spark-a", "spark-b"), (copy, "spark-b"),
                    (RESTART, "spark-b"), (gpu, "spark-b")], done
    # a new bundle on the monitoring node: Prometheus reloaded, no exporter restarted
    bundle = TlsPlan(enabled=True, ca_node="spark-a", bundle={"spark-a": "Prometheus' copy of the trust bundle differs"})
    done = steps(monkeypatch, both(gpu_expected=False), bundle)
    assert [d for d in done if not d[0].startswith("Write the trust bundle")] == [(RELOAD, "spark-a")], done


def test_a_new_router_hop_certificate_is_issued_alone_never_copied_and_restarts_no_exporter(monkeypatch):
    from sparkfleet.verdicts import TlsPlan

    fleet = both(router_node="spark-b", monitoring_node="spark-a")
    plan = TlsPlan(enabled=True, ca_node="spark-a", hop={"spark-b": ("no certificate yet",)})
    assert steps(monkeypatch, fleet, plan) == [
        ("Issue the router hop's client certificate on spark-b (/etc/sparkfleet/tls/router-hop.pem) from the fleet CA "
         "on spark-a", "spark-b")]


def test_a_changed_web_configuration_restarts_the_exporter_on_every_node(monkeypatch):
    from sparkfleet.verdicts import TlsPlan

    written = f"Write {EXPORTER_WEB_CONFIG} (the exporters' TLS)"
    done = steps(monkeypatch, both(gpu_expected=False), TlsPlan(enabled=True, ca_node="spark-a"), changed={written})
    assert done == [(written, "spark-a"), (written, "spark-b"), (RESTART, "spark-a"), (RESTART, "spark-b")], done
    # TLS off: no web configuration is written at all
    off = both(gpu_expected=False, **OFF)
    assert steps(monkeypatch, off, TlsPlan(enabled=False), changed={written}) == []
