"""TLS on the lab pair's API (roles/tls): the certificate spark-a serves is the fleet CA's for its
management address; a certificate inside its renewal window is issued again by the next deploy and
served after the proxy's reload, the pair not restarted, and the deploy after it changes nothing; a CA
the deploy must not use stops it at its plan, naming the file, before any change; TLS turned off with a
reason serves plain HTTP, and on again TLS.

Runs on any deployed lab, or alone after `make lab-reset` (the module's first deploy brings the pair up).
"""
import re

import pytest

from tests.e2e.lab import CA_BUNDLE, deploy, head_api, management_address, on

pytestmark = pytest.mark.lab

CA_KEY = "/etc/sparkfleet/tls/ca/ca.key"
PEM = "/etc/sparkfleet/tls/api.pem"


def served(field: str) -> str:
    """A field of the certificate spark-a's API serves (openssl x509 -noout -<field>), asked on spark-a."""
    return on("spark-a", f"openssl s_client -connect 127.0.0.1:8000 </dev/null 2>/dev/null | "
                         f"openssl x509 -noout -{field}").strip()


def health(scheme_and_verify: str) -> str:
    return on("spark-a", f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}' {scheme_and_verify}/health",
              check=False).strip()


@pytest.fixture(scope="module", autouse=True)
def serving_pair():
    run = deploy()
    assert run.returncode == 0, run.output[-4000:]
    yield
    back = deploy()
    assert back.returncode == 0, back.output[-4000:]


def test_the_api_serves_the_fleet_cas_certificate_for_the_heads_address():
    address = management_address("spark-a")
    assert f"IP Address:{address}" in served("ext subjectAltName")
    verified = on("spark-a", f"openssl verify -purpose sslserver -CAfile {CA_BUNDLE} -verify_ip {address} {PEM}")
    assert verified.strip().endswith("OK"), verified
    assert health(f"--cacert {CA_BUNDLE} {head_api()}") == "200"


def test_a_certificate_in_its_renewal_window_is_issued_again_and_served_without_a_restart():
    before = served("serial")
    started = on("spark-a", "docker inspect --format '{{.State.StartedAt}}' sparkfleet-head").strip()
    # 364-365 days left of the lab's certificate are within 399: issued again (for 400 days)
    renew = ("--data", "tls_cert_days=400", "--data", "tls_renew_before_days=399")
    run = deploy(*renew)
    assert run.returncode == 0, run.output[-4000:]
    assert re.search(r"certificate issued for spark-a: 3\d\d day\(s\) left, fewer than tls_renew_before_days = 399",
                     run.output), run.output[-4000:]
    changed = run.changed()
    assert ("Issue the certificate of spark-a from the fleet CA on spark-a", "spark-a") in changed, changed
    assert ("Reload sparkfleet-api-proxy (its config, the API key or its certificate changed)", "spark-a") in changed
    assert ("Start the head (every worker is up)", "spark-a") not in changed  # the pair keeps serving
    assert served("serial") != before
    assert on("spark-a", "docker inspect --format '{{.State.StartedAt}}' sparkfleet-head").strip() == started
    assert health(f"--cacert {CA_BUNDLE} {head_api()}") == "200"
    again = deploy()
    assert again.returncode == 0 and again.changed() == [], again.changed()


def test_a_ca_key_anyone_may_read_stops_the_deploy_at_its_plan_naming_it():
    on("spark-a", f"chmod 0644 {CA_KEY}")
    try:
        refused = deploy()
        assert refused.returncode != 0
        assert "spark-a: the fleet CA (/etc/sparkfleet/tls/ca): its key is root 644" in refused.output, \
            refused.output[-4000:]
        assert refused.changed() == []
    finally:
        on("spark-a", f"chmod 0600 {CA_KEY}")


def test_tls_off_with_a_reason_serves_plain_http_and_on_again_tls():
    off = ("--data", "tls_enabled=False", "--data", "tls_disabled_reason=the lab for a moment")
    run = deploy(*off)
    assert run.returncode == 0, run.output[-4000:]
    assert "--> sparkfleet TLS: off (the lab for a moment): the API speaks plain HTTP" in run.output
    address = management_address("spark-a")
    assert health(f"http://{address}:8000") == "200"
    assert health(f"--cacert {CA_BUNDLE} {head_api()}") != "200"
    back = deploy()
    assert back.returncode == 0, back.output[-4000:]
    assert health(f"--cacert {CA_BUNDLE} {head_api()}") == "200"
    assert health(f"http://{address}:8000") != "200"
