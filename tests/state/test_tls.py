"""TLS on the API (roles/tls), checked on the machines: the fleet CA's key root-only on its node and never
anywhere else, each head's certificate root-only, issued by that CA for the head's management address and
the one its API proxy serves, and every head's trust bundle holding that CA."""
import pytest

from roles.tls.checks import ca_cert_path
from sparkfleet.model.serving import node_profile
from sparkfleet.model.tls import ca_bundle_path, ca_key_dir, ca_key_path, ca_node_name, proxy_pem_path, site_certs, tls_dir

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


def test_the_heads_certificate_is_root_only_for_its_address_from_the_fleet_ca_and_served(host, tls_on):
    if not tls_on.is_head:
        pytest.skip("the API is on the head")
    pem, bundle, port = proxy_pem_path(tls_on), ca_bundle_path(tls_on), node_profile(tls_on).port
    assert mode(host, tls_dir(tls_on)) == "root 700" and mode(host, pem) == "root 600"
    sans = host.check_output(f"openssl x509 -in {pem} -noout -ext subjectAltName")
    assert f"IP Address:{tls_on.management_address}" in sans, f"{tls_on.name}: {sans}"
    verified = host.run(f"openssl verify -purpose sslserver -CAfile {bundle} -verify_ip {tls_on.management_address} "
                        f"{pem}")
    assert verified.rc == 0 and verified.stdout.strip().endswith("OK"), f"{tls_on.name}: {verified.stdout}{verified.stderr}"
    served = host.check_output(f"openssl s_client -connect 127.0.0.1:{port} </dev/null 2>/dev/null | {FINGERPRINT} /dev/stdin")
    assert served == host.check_output(f"{FINGERPRINT} {pem}"), f"{tls_on.name}: the proxy serves another certificate"
    left = host.run(f"openssl x509 -in {pem} -noout -checkend {tls_on.tls_renew_before_days * 86400}")
    if not site_certs(tls_on):  # the deploy renews the fleet CA's (a site's is the site's to renew)
        assert left.rc == 0, f"{tls_on.name}: its certificate ends within tls_renew_before_days after a deploy"


def test_every_heads_bundle_holds_the_fleet_ca(host, tls_on, cluster, node_hosts):
    if not tls_on.is_head or site_certs(tls_on):
        pytest.skip("a head with the fleet CA's certificate")
    ca = ca_node_name(cluster.nodes)
    if ca not in node_hosts:
        pytest.skip(f"the CA node {ca} is not among --hosts")
    want = node_hosts[ca].check_output(f"{FINGERPRINT} {ca_cert_path(cluster.node(ca))}")
    assert host.check_output(f"{FINGERPRINT} {ca_bundle_path(tls_on)}") == want
    assert mode(host, ca_bundle_path(tls_on)) == "root 644"
