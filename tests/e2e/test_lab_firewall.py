"""roles/firewall in the lab: the table is applied once and left alone, a flushed table is caught and
put back, the fabric's services are not reached through a management address, the API follows the
allowed networks, a table the operator owns is never touched, and a local user or a container on the
host's network reaches no internal service (tests/e2e/local_users.py).

Runs after test_lab_fabric.py (same lab, pair deployed by it or by this module's first deploy).
"""
import pytest

from sparkfleet.inventory import load_cluster
from tests.e2e import local_users
from tests.e2e.lab import INVENTORY, ca_on, deploy, head_api, on, state_checks

pytestmark = pytest.mark.lab

APPLY = "Apply the nftables table inet sparkfleet (one transaction)"


@pytest.fixture(scope="module", autouse=True)
def deployed_pair():
    run = deploy()
    assert run.returncode == 0, run.output
    yield run


def firewall_checks(*extra):
    return state_checks("-k", "firewall or api", *extra)


def test_the_firewall_checks_pass_and_a_second_deploy_changes_nothing(deployed_pair):
    checks = firewall_checks()
    assert checks.returncode == 0, checks.output
    assert "passed" in checks.output
    # The module's own deploy is that second deploy when it changed nothing (the modules before this
    # one left the pair deployed, as in `make test`): another would prove the same again. Alone after a
    # lab reset, it brought the pair up, and a second deploy runs here.
    run = deployed_pair if deployed_pair.changed() == [] else deploy()
    assert run.returncode == 0, run.output
    assert [op for op, _ in run.changed() if "nftables" in op or "firewall" in op] == []
    assert "--> sparkfleet firewall: the API on spark-a from 198.18.0.0/24" in run.output


def test_a_flushed_table_is_caught_and_put_back_and_an_operator_table_is_never_touched():
    on("spark-a", "nft add table inet operator && nft add chain inet operator mine "
                  "'{ type filter hook input priority 10; policy accept; }' && "
                  "nft add rule inet operator mine tcp dport 9999 counter")
    on("spark-a", "nft delete table inet sparkfleet")
    try:
        checks = firewall_checks()
        assert checks.returncode != 0
        assert "test_the_live_table_is_the_one_data_renders[ssh://spark-a]" in checks.output
        assert "ports" in checks.output and "answer through 198.18.0.11" in checks.output
        run = deploy()
        assert run.returncode == 0, run.output
        assert (APPLY, "spark-a") in run.changed() and (APPLY, "spark-b") not in run.changed()
        assert firewall_checks().returncode == 0
        assert "tcp dport 9999 counter" in on("spark-a", "nft list table inet operator")
    finally:
        on("spark-a", "nft delete table inet operator", check=False)


def test_the_api_follows_the_allowed_networks_and_ssh_is_never_filtered():
    narrow = ("--data", 'firewall_api_allowed_networks=["198.18.0.1/32"]')
    try:
        run = deploy(*narrow)
        assert run.returncode == 0, run.output  # the deploy's SSH is not filtered either way
        assert "the API on spark-a from 198.18.0.1/32" in run.output
        assert (APPLY, "spark-a") in run.changed()
        # spark-b (198.18.0.12) is outside the allowed networks now: no answer at all.
        checks = firewall_checks(*narrow)
        assert checks.returncode == 0, checks.output
        code = on("spark-b", f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}' --cacert {ca_on('spark-b')} "
                  f"{head_api()}/v1/models", check=False).strip()
        assert code == "000"
        # SSH is never filtered: spark-b still reaches spark-a's sshd on the management address.
        on("spark-b", "timeout 4 bash -c 'exec 3<>/dev/tcp/198.18.0.11/22'")
    finally:
        run = deploy()
        assert run.returncode == 0, run.output
    code = on("spark-b", f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}' --cacert {ca_on('spark-b')} "
              f"{head_api()}/v1/models", check=False).strip()
    assert code == "401"


def test_a_local_user_and_a_host_network_container_are_refused_every_internal_service_and_root_is_not():
    """Issue 43 item 4 on the stand-in pair (monitoring off here; tests/real/test_real_monitoring.py tries
    Prometheus and Alertmanager): on both nodes, a user created for the test and a container of the
    served image run as uid 65534 on the host's network are refused the rendezvous, the registry, both
    rsync daemons, the speed-proof ports, the fabric addresses and the engine's port; root's connections
    answer there, and its requests get their answers."""
    cluster = load_cluster(INVENTORY)
    tried = local_users.check_every_node(cluster, monitoring=False)
    assert len(tried) == 2, tried
    answers = local_users.root_requests(cluster, monitoring=False)
    assert answers == {"registry /v2/": "200", "rsync weights module": "ok", "weights HTTP server": "404"}, answers
    # and the pair still serves: nothing the probes did disturbed it
    checks = firewall_checks()
    assert checks.returncode == 0, checks.output
