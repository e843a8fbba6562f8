"""roles/tls and the config model's TLS keys: TLS on the API by default, off only with a reason; the fleet
CA and each head's certificate made by roles/tls's own commands, run for real with this machine's
openssl in a temporary directory standing for the node's serving_dir; the facts those commands leave
read by roles/tls's own fact command and judged by its verdict (what a deploy creates, issues again and
writes, and nothing on a second look); and the certificate served by the real HAProxy with the
rendered config: curl and Python's ssl verify it against the trust bundle, and fail without it or for
another address."""
import os
import re
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from roles.api_proxy.checks import config_text
from roles.tls import checks as tls
from sparkfleet.config import ConfigError, build_cluster
from sparkfleet.model.tls import SITE_KEYS, ca_bundle_path, ca_key_dir, ca_key_path, proxy_pem_path
from tests.programs import os_program
from tests.proxy_run import fleet_tls, issue, running_proxy, sh
from tests.unit.helpers import pair

OFF = {"tls_enabled": False, "tls_disabled_reason": "a closed test bench"}


def both(**data):
    return pair(**{"spark-a": data, "spark-b": data})


def problems(hosts) -> list:
    with pytest.raises(ConfigError) as err:
        build_cluster(hosts)
    return err.value.problems


@pytest.fixture(autouse=True)
def openssl():
    return os_program("openssl")


# --- the config model --------------------------------------------------------------------------------

def test_tls_is_on_by_default_with_the_fleet_ca_on_the_first_head():
    cluster = build_cluster(pair())
    assert all(n.tls_enabled for n in cluster.nodes)
    from sparkfleet.model.tls import ca_node_name
    assert ca_node_name(cluster.nodes) == "spark-a"
    assert ca_node_name(build_cluster(both(tls_ca_node="spark-b")).nodes) == "spark-b"


def test_tls_off_without_a_reason_is_refused_naming_the_hosts_the_key_and_what_is_allowed():
    [p] = problems(both(tls_enabled=False))
    assert p.hosts == ("spark-a", "spark-b") and p.key == "tls_disabled_reason"
    assert "tls_enabled = True, or False with a reason" in p and "plain HTTP" in p
    assert problems(both(tls_enabled=False, tls_disabled_reason="  "))[0].key == "tls_disabled_reason"


def test_tls_off_with_a_reason_is_plain_http_and_the_plan_says_why():
    cluster = build_cluster(both(**OFF))
    text = config_text(cluster.head)
    assert "bind 0.0.0.0:8000\n" in text and " ssl " not in text
    plan = tls.decide(cluster, {})
    assert not plan.enabled and not plan.changes and plan.problems == ()
    assert tls.plan_lines(cluster, plan) == ["--> sparkfleet TLS: off (a closed test bench): the API speaks plain HTTP"]


def test_a_reason_while_tls_is_on_is_refused():
    [p] = problems(both(tls_disabled_reason="why not"))
    assert p.key == "tls_disabled_reason" and "while tls_enabled is true" in p


def test_tls_is_one_setting_for_the_fleet():
    enabled, reason = problems(pair(**{"spark-b": OFF}))
    assert enabled.key == "tls_enabled" and "differs between nodes" in enabled and "spark-a=True" in enabled
    assert reason.key == "tls_disabled_reason" and "the fleet has one TLS setting and one CA" in reason


def test_a_renewal_window_as_long_as_a_certificate_is_refused_with_the_allowed_range():
    [p] = problems(both(tls_cert_days=30, tls_renew_before_days=30))
    assert p.key == "tls_renew_before_days" and "allowed: 1 to 29" in p


def test_a_ca_node_outside_the_inventory_is_refused_naming_the_nodes():
    [p] = problems(both(tls_ca_node="spark-z"))
    assert p.key == "tls_ca_node" and "allowed: spark-a, spark-b" in p


def test_a_site_certificate_needs_its_key_and_ca_file_on_a_head():
    [p] = problems(pair(**{"spark-a": {"tls_cert_file": "/etc/ssl/api.pem"}}))
    assert p.hosts == ("spark-a",) and p.key == "tls_key_file"
    assert "'tls_key_file', 'tls_cert_ca_file'" in p and "allowed: all of tls_cert_file, tls_key_file, tls_cert_ca_file" in p
    site = {"tls_cert_file": "/etc/ssl/api.pem", "tls_key_file": "/etc/ssl/api.key", "tls_cert_ca_file": "/etc/ssl/ca.pem"}
    # a worker serves TLS only with monitoring on (its node exporter): without it, it has no listener on the LAN
    [worker] = problems(pair(**{"spark-a": {"monitoring_enabled": False},
                                "spark-b": {**site, "monitoring_enabled": False}}))
    assert worker.hosts == ("spark-b",) and "no listener on the LAN" in worker and worker.key == "tls_cert_file"
    assert build_cluster(pair(**{"spark-b": site})).workers[0].tls_key_file == "/etc/ssl/api.key"
    assert build_cluster(pair(**{"spark-a": site})).head.tls_key_file == "/etc/ssl/api.key"
    [relative] = problems(pair(**{"spark-a": {**site, "tls_key_file": "api.key"}}))
    assert relative.key == "tls_key_file"


def test_the_api_frontend_binds_with_ssl_and_the_heads_certificate():
    head = build_cluster(pair()).head
    text = config_text(head)
    assert f"bind 0.0.0.0:8000 ssl crt {proxy_pem_path(head)} ssl-min-ver TLSv1.2\n" in text
    assert proxy_pem_path(head) == "/etc/sparkfleet/tls/api.pem"
    # the engine's /metrics for Prometheus: the same certificate, the node's one
    assert f"bind 0.0.0.0:9400 ssl crt {proxy_pem_path(head)} ssl-min-ver TLSv1.2\n" in text


def test_the_router_node_is_one_more_server_like_any_node_and_holds_the_router_hops_certificate_besides():
    from sparkfleet.model.tls import HOP_CN, ca_node_name, client_cert_path, hop_pem_path, serves_tls
    from tests.unit.test_router_render import fleet_hosts

    def unmonitored(router="spark-b", **changes):
        """fleet_hosts with monitoring off on every node: the heads and the router node alone serve TLS."""
        return fleet_hosts(router, **{n: {"monitoring_enabled": False, **changes.get(n, {})}
                                      for n in ("spark-a", "spark-b", "spark-c", "spark-d")})

    fleet = build_cluster(unmonitored())  # the router on spark-b, a worker
    assert [n.name for n in fleet.nodes if serves_tls(n)] == ["spark-a", "spark-b", "spark-c"]
    assert [n.name for n in tls.scope(fleet)] == ["spark-a", "spark-b", "spark-c"]
    # with monitoring on, every node holds one (its exporters), each for serverAuth alone, the router node's too
    monitored = build_cluster(fleet_hosts())
    assert [n.name for n in tls.certified(monitored)] == ["spark-a", "spark-b", "spark-c", "spark-d"]
    assert {tls.node_cert(n).usage for n in monitored.nodes} == {("serverAuth",)}
    assert [tls.node_cert(n).cn for n in monitored.nodes] == ["spark-a", "spark-b", "spark-c", "spark-d"]
    # the router hop's certificate: the router node's alone, its own file, clientAuth only, no node's name
    router = fleet.node("spark-b")
    hop = tls.hop_cert(router)
    assert (hop.pem, hop.cn, hop.usage, hop.sans, hop.purpose) == (
        "/etc/sparkfleet/tls/router-hop.pem", HOP_CN, ("clientAuth",), frozenset(), "sslclient")
    assert client_cert_path(router) == hop_pem_path(router) != proxy_pem_path(router)
    assert [n.name for n in fleet.nodes if tls.hop_cert(n)] == ["spark-b"] and client_cert_path(fleet.node("spark-a")) is None
    assert HOP_CN not in {n.name for n in fleet.nodes}
    plain = build_cluster(unmonitored(**{n: OFF for n in ("spark-a", "spark-b", "spark-c", "spark-d")}))
    assert tls.hop_cert(plain.node("spark-b")) is None and client_cert_path(plain.node("spark-b")) is None
    # a site's certificate on the router node, as on any node with a listener: its own gate serves it
    site = {"tls_cert_file": "/etc/ssl/api.pem", "tls_key_file": "/etc/ssl/api.key", "tls_cert_ca_file": "/etc/ssl/ca.pem"}
    site_router = build_cluster(fleet_hosts(router="spark-a", **{"spark-a": site})).node("spark-a")
    assert site_router.tls_cert_file == site["tls_cert_file"]
    # the facts pass reads the site's files there, and the router hop's certificate from the fleet CA besides
    script = tls.state_command(site_router, ca=True)
    assert "site_cert=" in script and "pem_end=" not in script and "hop_mode=" in script and "-purpose sslclient" in script
    # every certified node with a site's certificate: with a router the fleet CA is still made (the hop's), without none
    sites = build_cluster(unmonitored(**{"spark-a": site, "spark-b": site, "spark-c": site}))
    assert ca_node_name(sites.nodes) == "spark-a"
    assert ca_node_name(build_cluster(unmonitored(router=None, **{"spark-a": site, "spark-c": site})).nodes) is None


# --- the commands, for real ----------------------------------------------------------------------------

def pem_text(path) -> str:
    return subprocess.run(["openssl", "x509", "-in", str(path), "-noout", "-text"], capture_output=True, text=True,
                          check=True).stdout


def node_in(tmp_path, address="10.0.0.11", **data):
    """The pair with `data` (a site's certificate keys on the head only), its head's serving_dir `tmp_path`;
    monitoring off unless `data` turns it on, so that the head alone serves TLS (the exporters' TLS, with
    its paths outside serving_dir: tests/unit/test_monitoring_tls.py)."""
    data = {"monitoring_enabled": False, **data}
    shared = {k: v for k, v in data.items() if k not in SITE_KEYS}
    cluster = build_cluster(pair(**{"spark-a": data, "spark-b": shared}))
    head = cluster.head.model_copy(update={"serving_dir": str(tmp_path), "management_address": address})
    fleet = cluster.model_copy(update={"nodes": (head, *cluster.nodes[1:])})
    return fleet, head


def facts_of(node, ca=True) -> dict:
    return tls.TlsState().process(sh(tls.state_command(node, ca=ca)).splitlines())


def run_plan(fleet, plan, head) -> None:
    """What roles/tls/tasks.py runs for `plan` on a pair whose head keeps the CA (here, as the node would)."""
    if plan.create_ca:
        sh(tls.create_ca_command(head, head.tls_ca_days, tls.ca_subject(head)))
    if head.name in plan.issue:
        issue(head, head, head.tls_cert_days)
    if head.name in plan.bundle:
        Path(ca_bundle_path(head)).write_bytes(tls.bundle_text(Path(tls.ca_cert_path(head)).read_bytes(), plan.site_cas))


def test_the_ca_is_made_once_root_only_and_issues_a_certificate_for_the_management_address_only(tmp_path):
    _, head = node_in(tmp_path)
    first = sh(tls.create_ca_command(head, 3650, tls.ca_subject(head))).strip()
    assert re.fullmatch(r"([0-9A-F]{2}:){31}[0-9A-F]{2}", first)
    assert sh(tls.create_ca_command(head, 3650, tls.ca_subject(head))).strip() == first  # made once
    assert oct(os.stat(ca_key_path(head)).st_mode & 0o777) == "0o600"
    assert oct(os.stat(ca_key_dir(head)).st_mode & 0o777) == "0o700"
    ca = pem_text(tls.ca_cert_path(head))
    assert "CA:TRUE, pathlen:0" in ca and "Certificate Sign, CRL Sign" in ca and "prime256v1" in ca
    csr = sh(tls.csr_command(head))
    assert csr.startswith("-----BEGIN CERTIFICATE REQUEST-----") and "PRIVATE" not in csr
    cert = sh(tls.sign_command(head, head, 30), csr)
    assert cert.startswith("-----BEGIN CERTIFICATE-----") and "PRIVATE" not in cert
    sh(tls.install_command(head), cert)
    pem = Path(proxy_pem_path(head))
    assert oct(pem.stat().st_mode & 0o777) == "0o600" and "PRIVATE KEY" in pem.read_text()
    assert not list(pem.parent.glob("*.new"))  # the new key went into the PEM, nothing left beside it
    text = pem_text(pem)
    assert re.search(r"Subject Alternative Name: \n\s+IP Address:10\.0\.0\.11\n", text), text
    assert "TLS Web Server Authentication" in text and "CA:FALSE" in text and "CN = spark-a" in text
    verified = subprocess.run(["openssl", "verify", "-purpose", "sslserver", "-CAfile", tls.ca_cert_path(head), str(pem)],
                              capture_output=True, text=True)
    assert verified.returncode == 0 and verified.stdout.strip().endswith("OK"), verified
    # a certificate signed for another key is never installed
    other = sh(tls.sign_command(head, head, 30), sh(tls.csr_command(head)))
    sh(tls.csr_command(head))  # the head's pending key is now a third one
    refused = subprocess.run(["sh", "-c", tls.install_command(head)], input=other, capture_output=True, text=True)
    assert refused.returncode == 3 and "not for the new key" in refused.stderr
    assert pem.read_text().startswith(cert.strip()[:60])  # the served PEM untouched


def test_a_first_deploy_makes_the_ca_issues_and_writes_the_bundle_and_a_second_does_nothing(tmp_path):
    fleet, head = node_in(tmp_path)
    found = facts_of(head)
    assert found["ca_pem"] == "missing" and found["pem_mode"] == "missing" and found["bundle_sha"] == "missing"
    plan = tls.decide(fleet, {"spark-a": found})
    assert plan.create_ca and plan.issue == {"spark-a": ("no certificate yet",)}
    assert plan.bundle == {"spark-a": "the fleet CA is new"} and plan.problems == ()
    assert tls.plan_lines(fleet, plan)[:3] == [
        "--> sparkfleet TLS: the fleet CA is created on spark-a in this run (its SHA-256 fingerprint is printed "
        f"then); clients verify with it: ssh root@10.0.0.11 cat {ca_bundle_path(head)} > sparkfleet-ca.crt",
        "    fleet CA created on: spark-a", "    certificate issued for spark-a: no certificate yet"]
    run_plan(fleet, plan, head)
    again = tls.decide(fleet, {"spark-a": facts_of(head)})
    assert not again.changes and again.problems == () and again.warnings == (), again
    assert re.fullmatch(r"([0-9A-F]{2}:){31}[0-9A-F]{2}", again.ca_fingerprint)
    assert again.days_left["spark-a"] in (364, 365)  # 365 days issued, seconds ago
    assert f"SHA-256 {again.ca_fingerprint}, valid until " in tls.plan_lines(fleet, again)[0]


def test_a_certificate_is_issued_again_near_its_end_for_a_new_address_from_a_new_ca_or_broken(tmp_path):
    fleet, head = node_in(tmp_path)
    run_plan(fleet, tls.decide(fleet, {"spark-a": facts_of(head)}), head)

    issue(head, head, days=10)  # fewer days left than tls_renew_before_days (30)
    [why] = tls.decide(fleet, {"spark-a": facts_of(head)}).issue["spark-a"]
    assert re.fullmatch(r"(9|10) day\(s\) left, fewer than tls_renew_before_days = 30", why)

    issue(head, head, days=365)
    moved, moved_head = node_in(tmp_path, address="10.0.0.99")  # the head's management address changed
    assert tls.decide(moved, {"spark-a": facts_of(moved_head)}).issue["spark-a"] == (
        "it names IP:10.0.0.11, not IP:10.0.0.99",)

    pem = Path(proxy_pem_path(head))
    pem.chmod(0o644)
    assert tls.decide(fleet, {"spark-a": facts_of(head)}).issue["spark-a"] == (
        "its file is root 644 (owner, mode), not root 600",)
    pem.chmod(0o600)

    stranger = tmp_path / "stranger.key"  # the PEM's key replaced by another one
    sh(f"openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out {stranger}")
    cert_part = pem.read_text().split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n"
    pem.write_text(cert_part + stranger.read_text())
    assert tls.decide(fleet, {"spark-a": facts_of(head)}).issue["spark-a"] == ("its key does not match its certificate",)
    issue(head, head, days=365)

    shutil.move(ca_key_dir(head), tmp_path / "old-ca")  # another CA: the old one moved away, a new one made
    sh(tls.create_ca_command(head, 3650, tls.ca_subject(head)))
    plan = tls.decide(fleet, {"spark-a": facts_of(head)})
    assert plan.issue["spark-a"] == ("another CA issued it",) and plan.bundle == {"spark-a": "the trust bundle changed"}


def verify(purpose: str, ca: str, pem: str) -> subprocess.CompletedProcess:
    return subprocess.run(["openssl", "verify", "-purpose", purpose, "-CAfile", ca, pem], capture_output=True, text=True)


def router_fleet(tmp_path, **changes):
    """tests/unit/test_router_render.py's fleet, the router on spark-b (a worker), g2 serving another model,
    monitoring off (the exporters' copy and Prometheus' bundle live outside serving_dir: with them,
    tests/unit/test_monitoring_tls.py), each node's serving_dir under tmp_path. Returns (fleet, nodes by name)."""
    from tests.unit.test_router_render import fleet_hosts

    built = build_cluster(fleet_hosts(**{n: {"monitoring_enabled": False, **changes,
                                             **({"serving_profile": "qwen3.8-flash-next"}
                                                if n in ("spark-c", "spark-d") else {})}
                                         for n in ("spark-a", "spark-b", "spark-c", "spark-d")}))
    nodes = {n.name: n.model_copy(update={"serving_dir": str(tmp_path / n.name)}) for n in built.nodes}
    return built.model_copy(update={"nodes": tuple(nodes.values())}), nodes


def test_the_router_node_gets_a_server_certificate_and_the_router_hops_client_certificate_and_keeps_them(tmp_path):
    """A fleet whose router is a worker (spark-b): the plan issues it its node's certificate (serverAuth, for its
    address) and the router hop's client certificate (clientAuth only, CN sparkfleet-router-hop, no address, in
    its own root-only file), both from the fleet CA made on spark-a, and writes its bundle; each verifies for its
    one use and not the other; the next look changes nothing and prints the days each has left."""
    fleet, nodes = router_fleet(tmp_path)
    head, router = nodes["spark-a"], nodes["spark-b"]

    def facts():
        return {name: facts_of(nodes[name], ca=name == "spark-a") for name in ("spark-a", "spark-b", "spark-c")}

    plan = tls.decide(fleet, facts())
    assert plan.create_ca and plan.issue["spark-b"] == ("no certificate yet",) and "spark-b" in plan.bundle
    assert plan.hop == {"spark-b": ("no certificate yet",)}  # the router node's alone
    assert "    router hop's client certificate issued on spark-b: no certificate yet" in tls.plan_lines(fleet, plan)
    sh(tls.create_ca_command(head, 3650, tls.ca_subject(head)))
    for name in plan.issue:
        issue(nodes[name], head, 365)
    for name in plan.hop:
        issue(nodes[name], head, 365, kind=tls.hop_cert(nodes[name]))
    for name in plan.bundle:
        Path(ca_bundle_path(nodes[name])).write_bytes(tls.bundle_text(Path(tls.ca_cert_path(head)).read_bytes(), ()))
    node_pem, hop_pem = proxy_pem_path(router), tls.hop_cert(router).pem
    text = pem_text(node_pem)
    assert "TLS Web Server Authentication\n" in text and "Client Authentication" not in text and "CN = spark-b" in text
    assert re.search(r"IP Address:10\.0\.0\.12\n", text)
    hop_text = pem_text(hop_pem)
    assert "X509v3 Extended Key Usage: \n                TLS Web Client Authentication\n" in hop_text, hop_text
    assert "Server Authentication" not in hop_text and "Subject Alternative Name" not in hop_text
    assert "Subject: O = sparkfleet, CN = sparkfleet-router-hop\n" in hop_text and "CA:FALSE" in hop_text
    assert Path(hop_pem).stat().st_uid == os.geteuid() and oct(Path(hop_pem).stat().st_mode & 0o777) == "0o600"
    assert "PRIVATE KEY" in Path(hop_pem).read_text() and not list(Path(hop_pem).parent.glob("*.new"))
    assert oct(Path(hop_pem).parent.stat().st_mode & 0o777) == "0o700"
    # the hop's key is its own, not the node's
    pub = {p: sh(f"openssl pkey -in {p} -pubout") for p in (node_pem, hop_pem)}
    assert pub[node_pem] != pub[hop_pem]
    bundle = ca_bundle_path(router)
    assert verify("sslserver", bundle, node_pem).returncode == 0 and verify("sslclient", bundle, hop_pem).returncode == 0
    # neither passes for the other use: the node's certificate (and the exporters' copy of it) is no client's
    for purpose, pem in (("sslclient", node_pem), ("sslserver", hop_pem)):
        wrong = verify(purpose, bundle, pem)
        assert wrong.returncode != 0 and "error 26 at 0 depth lookup: unsuitable certificate purpose" in wrong.stderr, wrong
    again = tls.decide(fleet, facts())
    assert not again.changes and again.problems == (), again
    lines = "\n".join(tls.plan_lines(fleet, again))
    assert "issued" not in lines and again.hop_days_left["spark-b"] in (364, 365)
    assert re.search(r"    spark-b: the router hop's client certificate has 36[45] day\(s\) left", lines), lines


def test_a_node_certificate_with_client_auth_is_issued_again_and_the_hops_by_the_same_rules(tmp_path):
    """The router node's certificate as this branch's first design issued it (clientAuth besides serverAuth),
    or a head's that was the router node's: issued again, serverAuth only. The router hop's certificate is
    issued again when it is missing, near its end, for another use or subject, not root-only, not its key's or
    from another CA, and a due one while the CA node is left out is refused."""
    import dataclasses

    fleet, nodes = router_fleet(tmp_path)
    head, router = nodes["spark-a"], nodes["spark-b"]

    def facts():
        return {name: facts_of(nodes[name], ca=name == "spark-a") for name in ("spark-a", "spark-b", "spark-c")}

    sh(tls.create_ca_command(head, 3650, tls.ca_subject(head)))
    for name in ("spark-a", "spark-b", "spark-c"):
        issue(nodes[name], head, 365)
        Path(ca_bundle_path(nodes[name])).write_bytes(tls.bundle_text(Path(tls.ca_cert_path(head)).read_bytes(), ()))
    hop = tls.hop_cert(router)
    issue(router, head, 365, kind=hop)
    assert not tls.decide(fleet, facts()).changes
    both_usages = {n: dataclasses.replace(tls.node_cert(nodes[n]), usage=("serverAuth", "clientAuth"))
                   for n in ("spark-a", "spark-b")}
    for name, kind in both_usages.items():
        issue(nodes[name], head, 365, kind=kind)
    plan = tls.decide(fleet, facts())
    assert plan.issue == {n: ("it is for clientAuth, serverAuth, not serverAuth",) for n in ("spark-a", "spark-b")}
    assert plan.hop == {} and plan.exporter_pem == {}  # monitoring off here (with it: test_monitoring_tls.py)
    for name in plan.issue:
        issue(nodes[name], head, 365)

    def hop_reasons():
        return tls.decide(fleet, facts()).hop.get("spark-b")

    issue(router, head, 10, kind=hop)
    [why] = hop_reasons()
    assert re.fullmatch(r"(9|10) day\(s\) left, fewer than tls_renew_before_days = 30", why)
    issue(router, head, 365, kind=dataclasses.replace(hop, usage=("serverAuth", "clientAuth")))
    assert hop_reasons() == ("it is for clientAuth, serverAuth, not clientAuth",)
    issue(router, head, 365, kind=dataclasses.replace(hop, cn="spark-b"))
    assert hop_reasons() == ("its subject is CN=spark-b,O=sparkfleet, not CN=sparkfleet-router-hop,O=sparkfleet",)
    issue(router, head, 365, kind=dataclasses.replace(hop, sans=frozenset({"IP:10.0.0.12"})))
    assert hop_reasons() == ("it names IP:10.0.0.12, not none",)
    issue(router, head, 365, kind=hop)
    Path(hop.pem).chmod(0o640)
    assert hop_reasons() == ("its file is root 640 (owner, mode), not root 600",)
    Path(hop.pem).chmod(0o600)
    Path(hop.pem).unlink()
    assert hop_reasons() == ("no certificate yet",)
    # from another CA with the same name and use: issued again; the node's certificates with it
    stranger = router.model_copy(update={"serving_dir": str(tmp_path / "stranger")})
    sh(tls.create_ca_command(stranger, 3650, tls.ca_subject(stranger)))
    issue(router, stranger, 365, kind=hop)
    assert hop_reasons() == ("another CA issued it",)
    # due while the CA node is left out of the run (--limit): refused, naming it
    limited = {"spark-b": facts()["spark-b"]}
    [p] = [p for p in tls.decide(fleet, limited).problems if "router hop" in p]
    assert p.startswith("spark-b: its router hop's client certificate is due (it does not verify against the fleet CA")
    assert p.endswith("and the fleet CA is on spark-a, which this run leaves out (--limit): run with spark-a too")


def test_a_ca_the_deploy_must_not_use_stops_the_run_naming_it(tmp_path):
    fleet, head = node_in(tmp_path)
    run_plan(fleet, tls.decide(fleet, {"spark-a": facts_of(head)}), head)
    key = Path(ca_key_path(head))
    key.chmod(0o640)
    [p] = tls.decide(fleet, {"spark-a": facts_of(head)}).problems
    assert p.startswith("spark-a: the fleet CA") and "root 640" in p and "chmod 0600" in p
    assert tls.refusal(tls.decide(fleet, {"spark-a": facts_of(head)})) is not None
    key.chmod(0o600)
    saved = key.read_bytes()
    sh(f"openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out {key}")
    [p] = tls.decide(fleet, {"spark-a": facts_of(head)}).problems
    assert "does not match its certificate" in p
    key.unlink()
    [p] = tls.decide(fleet, {"spark-a": facts_of(head)}).problems
    assert "is there but its key" in p and f"move {ca_key_dir(head)} away" in p
    key.write_bytes(saved)
    key.chmod(0o600)
    assert tls.decide(fleet, {"spark-a": facts_of(head)}).problems == ()


def test_a_head_due_a_certificate_while_the_ca_node_is_left_out_is_refused(tmp_path):
    fleet, head = node_in(tmp_path, tls_ca_node="spark-b")
    plan = tls.decide(fleet, {"spark-a": facts_of(head, ca=False)})  # spark-b not in the run (--limit)
    [p] = plan.problems
    assert p.startswith("spark-a: its certificate is due (no certificate yet)") and "run with spark-b too" in p


def test_the_renewal_verdict_is_a_function_of_the_facts():
    want = frozenset({"IP:10.0.0.11"})
    now = 1_800_000_000
    good = {"now": str(now), "pem_mode": "root 600", "pem_match": "yes", "pem_end": str(now + 200 * 86400),
            "pem_sans": "IPAddress:10.0.0.11", "pem_aki": "AB12", "pem_verify": "/x/api.pem: OK",
            "pem_eku": "TLSWebServerAuthentication"}
    assert tls.renewal_reasons(good, want, "ab12", True, 30) == []
    # the extended key usages: serverAuth alone on every node's (a router node's of the first design had clientAuth)
    both_usages = {**good, "pem_eku": "TLSWebServerAuthentication,TLSWebClientAuthentication"}
    assert tls.renewal_reasons(both_usages, want, "AB12", True, 30) == ["it is for clientAuth, serverAuth, not serverAuth"]
    # the subject, when asked for
    named = {**good, "pem_subject": "CN=spark-a,O=sparkfleet"}
    assert tls.renewal_reasons(named, want, "AB12", True, 30, subject="CN=spark-a,O=sparkfleet") == []
    assert tls.renewal_reasons(named, want, "AB12", True, 30, subject="CN=spark-z,O=sparkfleet") == [
        "its subject is CN=spark-a,O=sparkfleet, not CN=spark-z,O=sparkfleet"]
    # the router hop's, from its own lines (hop_*): clientAuth alone, no address
    hop = {"now": str(now), "hop_mode": "root 600", "hop_match": "yes", "hop_end": str(now + 200 * 86400),
           "hop_sans": "", "hop_aki": "AB12", "hop_verify": "/x/router-hop.pem: OK", "hop_eku": "TLSWebClientAuthentication",
           "hop_subject": "CN=sparkfleet-router-hop,O=sparkfleet"}
    assert tls.renewal_reasons(hop, frozenset(), "AB12", True, 30, ("clientAuth",),
                               "CN=sparkfleet-router-hop,O=sparkfleet", prefix="hop") == []
    assert tls.renewal_reasons({**hop, **good}, frozenset(), "AB12", True, 30, ("clientAuth",), prefix="hop") == []
    assert tls.renewal_reasons({**hop, "hop_eku": both_usages["pem_eku"]}, frozenset(), "AB12", True, 30,
                               ("clientAuth",), prefix="hop") == ["it is for clientAuth, serverAuth, not clientAuth"]
    assert tls.renewal_reasons(good, frozenset(), "AB12", True, 30, ("clientAuth",), prefix="hop") == [
        "no certificate yet"]
    assert tls.renewal_reasons({**good, "pem_end": str(now - 2 * 86400)}, want, "AB12", True, 30) == [
        "it expired 2 day(s) ago"]
    assert tls.renewal_reasons({**good, "pem_sans": "IPAddress:10.0.0.11,DNS:spark-a"}, want, "AB12", True, 30) == [
        "it names DNS:spark-a, IP:10.0.0.11, not IP:10.0.0.11"]
    assert tls.renewal_reasons(good, want, None, False, 30) == ["the fleet CA is new"]
    assert tls.renewal_reasons({**good, "pem_verify": "error 10 at 0 depth lookup: certificate has expired"},
                               want, "AB12", True, 30)[0].startswith("it does not verify against the fleet CA")
    assert tls.renewal_reasons({"pem_mode": "missing"}, want, "AB12", True, 30) == ["no certificate yet"]
    v6 = tls.parse_sans("IPAddress:FE80:0:0:0:0:0:0:1,DNS:x")
    assert v6 == frozenset({"IP:fe80::1", "DNS:x"})


def test_a_sites_certificate_is_installed_as_it_is_and_refused_when_it_cannot_serve(tmp_path):
    _, site_ca = node_in(tmp_path / "site-ca")  # a site's own CA, made here with the same commands
    sh(tls.create_ca_command(site_ca, 3650, "a site's CA"))
    site = {"tls_cert_file": str(tmp_path / "api.crt"), "tls_key_file": str(tmp_path / "api.key"),
            "tls_cert_ca_file": tls.ca_cert_path(site_ca)}
    fleet, head = node_in(tmp_path / "node", **site)
    issuing = head.model_copy(update={"serving_dir": str(tmp_path / "issue")})
    issue(issuing, site_ca, days=300)
    pem = Path(proxy_pem_path(issuing)).read_text()
    cert, key = pem.split("-----END CERTIFICATE-----\n")
    (tmp_path / "api.crt").write_text(cert + "-----END CERTIFICATE-----\n")
    (tmp_path / "api.key").write_text(key)
    (tmp_path / "api.key").chmod(0o600)
    plan = tls.decide(fleet, {"spark-a": facts_of(head, ca=False)})
    assert plan.ca_node is None and plan.problems == (), plan.problems
    assert plan.assemble == {"spark-a": "no proxy PEM yet"} and plan.bundle == {"spark-a": "no trust bundle yet"}
    sh(tls.assemble_command(head))
    Path(ca_bundle_path(head)).write_bytes(tls.bundle_text(None, plan.site_cas))
    assert not tls.decide(fleet, {"spark-a": facts_of(head, ca=False)}).changes
    (tmp_path / "api.key").chmod(0o644)
    [p] = tls.decide(fleet, {"spark-a": facts_of(head, ca=False)}).problems
    assert p.startswith("spark-a: key 'tls_key_file'") and "root-only" in p
    (tmp_path / "api.key").chmod(0o600)
    moved, moved_head = node_in(tmp_path / "node", address="10.0.0.99", **site)
    [p] = tls.decide(moved, {"spark-a": facts_of(moved_head, ca=False)}).problems
    assert "names IP:10.0.0.11" in p and "must name IP:10.0.0.99" in p


# --- the real TLS server --------------------------------------------------------------------------------

@pytest.fixture
def served(tmp_path):
    """The real HAProxy with the rendered config and roles/tls's certificate for 127.0.0.1, in front of a
    backend that answers /health 200."""
    import http.server
    import threading

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    from tests.proxy_run import free_port
    engine_port = free_port()
    engine = http.server.ThreadingHTTPServer(("127.0.0.1", engine_port), Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    head = build_cluster(both(api_proxy_engine_port=engine_port)).head
    with running_proxy(head, "unit-test-key-0123456789abcdef") as proxy:
        yield proxy
    engine.shutdown()


def curl(*args) -> subprocess.CompletedProcess:
    return subprocess.run([os_program("curl"), "-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", *args],
                          capture_output=True, text=True)


def test_curl_verifies_the_certificate_with_the_bundle_and_fails_without_it_or_for_another_address(served):
    url = f"https://127.0.0.1:{served.port}/health"
    ok = curl("--cacert", served.ca, url)
    assert ok.returncode == 0 and ok.stdout == "200", ok
    unknown = curl(url)  # the system's CAs only: the fleet CA is no public CA
    assert unknown.returncode == 60 and "certificate" in unknown.stderr, unknown
    # the same server reached as another address: its certificate names 127.0.0.1 only
    other = curl("--cacert", served.ca, "--connect-to", f"127.0.0.2:{served.port}:127.0.0.1:{served.port}",
                 f"https://127.0.0.2:{served.port}/health")
    assert other.returncode == 60 and "127.0.0.2" in other.stderr, other
    plain = curl(f"http://127.0.0.1:{served.port}/health")
    assert plain.stdout != "200", plain  # no plain HTTP on the API port


def test_pythons_ssl_checks_the_ip_san_and_the_issuer(served):
    context = served.context()
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            assert s.version() in ("TLSv1.2", "TLSv1.3")
            assert ("IP Address", "127.0.0.1") in s.getpeercert()["subjectAltName"]
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
            context.wrap_socket(raw, server_hostname="127.0.0.3")
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
            ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1")


@pytest.mark.skipif(os.geteuid() != 0, reason="HAProxy drops to its user only when started as root")
def test_haproxy_reads_the_root_only_pem_as_root_and_its_workers_run_as_haproxy(served):
    pem = Path(proxy_pem_path(served.head))
    assert pem.stat().st_uid == 0 and oct(pem.stat().st_mode & 0o777) == "0o600"
    listeners = subprocess.run(["ss", "-Hltnp", f"sport = :{served.port}"], capture_output=True, text=True).stdout
    pids = set(re.findall(r"pid=(\d+)", listeners))
    assert pids
    users = {subprocess.run(["ps", "-o", "user=", "-p", pid], capture_output=True, text=True).stdout.strip()
             for pid in pids}
    assert users == {"haproxy"}, users  # the worker that serves cannot read the PEM: the master read it as root


def test_a_renewed_certificate_is_served_after_the_proxys_reload(served):
    def serial() -> str:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as raw:
            with served.context().wrap_socket(raw, server_hostname="127.0.0.1") as s:
                return s.getpeercert()["serialNumber"]

    before = serial()
    issue(served.head, served.head, days=60)
    assert serial() == before  # read at start only
    master = subprocess.run(["pgrep", "-o", "-f", f"haproxy -W -f {served.head.serving_dir}/api-proxy.cfg"],
                            capture_output=True, text=True).stdout.split()
    assert master, "the proxy's master"
    os.kill(int(master[0]), 12)  # SIGUSR2: HAProxy's master-worker reload, as the unit's ExecReload
    deadline = time.monotonic() + 10
    while serial() == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert serial() != before


def test_make_status_and_the_doctor_say_whether_the_api_verifies_with_the_bundle_and_for_how_long(served, tmp_path):
    api = f"https://127.0.0.1:{served.port}"
    found = tls.ServedTls().process(sh(tls.ServedTls().command(api, served.ca, served.port)).splitlines())
    line = tls.status_line(served.head, api, found)
    assert line.startswith(f"{api}: /health 200, its certificate verified with {served.ca} (first certificate SHA-256 ")
    assert re.search(r", the certificate valid (29|30) more day\(s\)$", line), line
    # the doctor's tls row: the fixture's certificate (30 days) is inside a 31-day renewal window, not a 10-day one
    [due] = tls.doctor_problems(served.head.model_copy(update={"tls_renew_before_days": 31}), found)
    assert re.match(r"spark-a: the API's certificate ends in (29|30) day\(s\), within tls_renew_before_days = 31", due)
    assert tls.doctor_problems(served.head.model_copy(update={"tls_renew_before_days": 10}), found) == []
    stranger = fleet_tls(served.head, tmp_path / "other")
    found = tls.ServedTls().process(sh(tls.ServedTls().command(api, ca_bundle_path(stranger), served.port)).splitlines())
    assert "NOT verified" in tls.status_line(served.head, api, found) and found["code"] == "000"
    assert "answered 000: the API's certificate is not the fleet's" in tls.doctor_problems(served.head, found)[0]
    off = build_cluster(both(**OFF)).head
    assert tls.status_line(off, "http://10.0.0.11:8000", None) == (
        "off (tls_enabled = False: a closed test bench): http://10.0.0.11:8000 is plain HTTP")
