"""TLS (roles/tls), checked on the machines: the fleet CA's key root-only on its node and never anywhere
else, each certified node's certificate (every head, the router node; with monitoring on, every node)
root-only, issued by that CA for the node's management address, the one a head's API proxy (the router's
gate, on the router node) serves, and every such node's trust bundle holding that CA; the router hop's
client certificate on the router node alone, root-only, clientAuth only, which no other user reads. The
exporters' copy and what they serve: tests/state/test_monitoring.py."""
import pytest

from roles.tls.checks import ca_cert_path
from sparkfleet.model.serving import node_profile
from sparkfleet.model.tls import (
    EXPORTER_PEM, HOP_CN, ca_bundle_path, ca_key_dir, ca_key_path, ca_node_name, client_cert_path, exporter_tls,
    hop_pem_path, is_router_node, proxy_pem_path, serves_tls, site_certs, tls_dir,
)
from sparkfleet.model.monitoring import PROMETHEUS_USER

FINGERPRINT = "openssl x509 -noout -fingerprint -sha256 -in"


@pytest.fixture
def tls_on(node):
    if not node.tls_enabled:
        pytest.skip("tls_enabled is false in data")
    return node


def mode(host, path: str) -> str:
    return host.check_output(f"stat -c '%U %a' {path}")


def test_the_fleet_ca_key_is_root_only_on_its_node_and_nowhere_else(host, tls_on, cluster):
    if ca_node_name(cluster.nodes) != tls_on.name:
        assert not host.file(ca_key_path(tls_on)).exists, f"{tls_on.name}: a CA key outside the CA node"
        pytest.skip(f"the fleet CA is on {ca_node_name(cluster.nodes)}")
    assert mode(host, ca_key_dir(tls_on)) == "root 700" and mode(host, ca_key_path(tls_on)) == "root 600"
    same = host.run(f"[ \"$(openssl pkey -in {ca_key_path(tls_on)} -pubout)\" = "
                    f"\"$(openssl x509 -in {ca_cert_path(tls_on)} -noout -pubkey)\" ]")
    assert same.rc == 0, f"{tls_on.name}: the CA's key does not match its certificate"


def test_the_nodes_certificate_is_root_only_for_its_address_from_the_fleet_ca_and_served(host, tls_on):
    if not serves_tls(tls_on):
        pytest.skip("no listener on the LAN (not a head or the router node, and monitoring off)")
    pem, bundle, port = proxy_pem_path(tls_on), ca_bundle_path(tls_on), node_profile(tls_on).port
    assert mode(host, tls_dir(tls_on)) == "root 700" and mode(host, pem) == "root 600"
    sans = host.check_output(f"openssl x509 -in {pem} -noout -ext subjectAltName")
    assert f"IP Address:{tls_on.management_address}" in sans, f"{tls_on.name}: {sans}"
    verified = host.run(f"openssl verify -purpose sslserver -CAfile {bundle} -verify_ip {tls_on.management_address} "
                        f"{pem}")
    assert verified.rc == 0 and verified.stdout.strip().endswith("OK"), f"{tls_on.name}: {verified.stdout}{verified.stderr}"
    if tls_on.is_head:
        served = host.check_output(f"openssl s_client -connect 127.0.0.1:{port} </dev/null 2>/dev/null | {FINGERPRINT} /dev/stdin")
        assert served == host.check_output(f"{FINGERPRINT} {pem}"), f"{tls_on.name}: the proxy serves another certificate"
    left = host.run(f"openssl x509 -in {pem} -noout -checkend {tls_on.tls_renew_before_days * 86400}")
    if not site_certs(tls_on):  # the deploy renews the fleet CA's (a site's is the site's to renew)
        assert left.rc == 0, f"{tls_on.name}: its certificate ends within tls_renew_before_days after a deploy"


def test_every_certified_nodes_bundle_holds_the_fleet_ca(host, tls_on, cluster, node_hosts):
    if not serves_tls(tls_on) or site_certs(tls_on):
        pytest.skip("a node with the fleet CA's certificate")
    ca = ca_node_name(cluster.nodes)
    if ca not in node_hosts:
        pytest.skip(f"the CA node {ca} is not among --hosts")
    want = node_hosts[ca].check_output(f"{FINGERPRINT} {ca_cert_path(cluster.node(ca))}")
    assert host.check_output(f"{FINGERPRINT} {ca_bundle_path(tls_on)}") == want
    assert mode(host, ca_bundle_path(tls_on)) == "root 644"


def test_the_router_nodes_certificate_is_a_servers_only_and_its_gate_serves_it(host, tls_on):
    """The router node (issue 43 item 3): its certificate from the fleet CA (or the site's), root-only, names its
    address and verifies for a TLS server (the gate serves it on router_port), not for a client (with
    monitoring on, the exporters' copy of it is readable by group prometheus: it must be no credential to a
    head), and smg listens on loopback only, behind the gate."""
    if not is_router_node(tls_on):
        pytest.skip("not the router node")
    pem, bundle = proxy_pem_path(tls_on), ca_bundle_path(tls_on)
    assert mode(host, pem) == "root 600"
    server = host.run(f"openssl verify -purpose sslserver -CAfile {bundle} -verify_ip {tls_on.management_address} {pem}")
    assert server.rc == 0, f"{tls_on.name}: sslserver: {server.stdout}{server.stderr}"
    client = host.run(f"openssl verify -purpose sslclient -CAfile {bundle} {pem}")
    assert client.rc != 0 and "unsuitable certificate purpose" in client.stdout + client.stderr, (
        f"{tls_on.name}: the node's certificate is a client's: {client.stdout}{client.stderr}")
    served = host.check_output(f"openssl s_client -connect 127.0.0.1:{tls_on.router_port} </dev/null 2>/dev/null | "
                               f"{FINGERPRINT} /dev/stdin")
    assert served == host.check_output(f"{FINGERPRINT} {pem}"), f"{tls_on.name}: the router's gate serves another certificate"
    smg = host.check_output(f"ss -Hltn 'sport = :{tls_on.router_smg_port}' | awk '{{print $4}}'").split()
    assert smg == [f"127.0.0.1:{tls_on.router_smg_port}"], f"{tls_on.name}: smg listens on {smg}"


def test_the_router_hops_certificate_is_the_router_nodes_alone_root_only_for_a_client_and_never_copied(host, tls_on):
    """The router hop's client certificate (smg presents it to the heads): on the router node only, root 600 in
    the 0700 TLS directory, from the fleet CA, clientAuth only (not a server's), its CN the hop's, its key
    not the node's, and neither user prometheus reads it nor the exporters' copy holds it. On every other
    node, none."""
    if not is_router_node(tls_on):
        assert not host.file(hop_pem_path(tls_on)).exists, f"{tls_on.name}: a router hop's certificate off the router node"
        pytest.skip("not the router node")
    hop, bundle = client_cert_path(tls_on), ca_bundle_path(tls_on)
    assert mode(host, tls_dir(tls_on)) == "root 700" and mode(host, hop) == "root 600"
    client = host.run(f"openssl verify -purpose sslclient -CAfile {bundle} {hop}")
    assert client.rc == 0 and client.stdout.strip().endswith("OK"), f"{tls_on.name}: {client.stdout}{client.stderr}"
    assert host.run(f"openssl verify -purpose sslserver -CAfile {bundle} {hop}").rc != 0, f"{tls_on.name}: a server's too"
    eku = host.check_output(f"openssl x509 -in {hop} -noout -ext extendedKeyUsage")
    assert eku.splitlines()[1:] == ["    TLS Web Client Authentication"], f"{tls_on.name}: {eku}"
    subject = host.check_output(f"openssl x509 -in {hop} -noout -subject -nameopt RFC2253")
    assert subject == f"subject=CN={HOP_CN},O=sparkfleet", subject
    keys = {p: host.check_output(f"openssl pkey -in {p} -pubout") for p in (hop, proxy_pem_path(tls_on))}
    assert len(set(keys.values())) == 2, f"{tls_on.name}: the hop's key is the node's"
    if exporter_tls(tls_on):
        copy = host.check_output(f"openssl pkey -in {EXPORTER_PEM} -pubout")
        assert copy != keys[hop], f"{tls_on.name}: the exporters' copy holds the hop's key"
        assert host.run(f"setpriv --reuid={PROMETHEUS_USER} --regid={PROMETHEUS_USER} --init-groups cat {hop}").rc != 0
