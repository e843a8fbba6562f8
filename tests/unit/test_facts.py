"""Fact parsing and the preflight verdict, on recorded node facts."""
from pathlib import Path

import pytest

from roles.fabric.checks import link_drift, link_failure
from roles.fabric.facts import FabricPing, parse_link, ping_command
from roles.preflight.checks import facts_table, requirement_failures
from roles.preflight.facts import parse_node_facts
from sparkfleet.config import build_cluster
from tests.unit.helpers import pair

FIXTURES = Path(__file__).parent / "fixtures"


def spark_facts():
    return parse_node_facts((FIXTURES / "nodefacts-dgx-spark.txt").read_text().splitlines())


@pytest.fixture
def head():
    return build_cluster(pair()).head


def test_dgx_spark_facts_parse_to_gib(head):
    facts = spark_facts()
    assert facts["arch"] == "aarch64" and facts["gpu"] == "NVIDIA GB10"
    assert facts["mem_total_gib"] == pytest.approx(121.69, abs=0.01)
    assert facts["disk_free_gib"] == pytest.approx(3358.6, abs=0.1)
    assert (facts["netdev_mtu"], facts["netdev_state"]) == (9000, "up")


def test_a_dgx_spark_passes_preflight(head):
    assert requirement_failures(head, spark_facts()) == []


def test_missing_gpu_fails_when_expected(head):
    facts = {**spark_facts(), "gpu": ""}
    [msg] = requirement_failures(head, facts)
    assert msg.startswith("spark-a: no GPU visible") and "gpu_expected" in msg


def test_missing_gpu_is_fine_when_not_expected():
    node = build_cluster(pair(**{"spark-a": {"gpu_expected": False}})).head
    assert requirement_failures(node, {**spark_facts(), "gpu": ""}) == []


def test_low_memory_fails_with_the_numbers(head):
    facts = {**spark_facts(), "mem_total_gib": 62.5}
    [msg] = requirement_failures(head, facts)
    assert "MemTotal 62.50 GiB" in msg and ">= 100.00 GiB" in msg


def test_low_disk_fails_with_the_numbers(head):
    facts = {**spark_facts(), "disk_free_gib": 150.0}
    [msg] = requirement_failures(head, facts)
    assert msg.startswith("spark-a: 150.0 GiB free on /var/lib") and ">= 200.0 GiB" in msg


def test_wrong_arch_fails(head):
    [msg] = requirement_failures(head, {**spark_facts(), "arch": "x86_64"})
    assert "architecture x86_64" in msg and "aarch64" in msg


def test_missing_fabric_netdev_fails(head):
    facts = {k: v for k, v in spark_facts().items() if not k.startswith("netdev_")}
    [msg] = requirement_failures(head, facts)
    assert "fabric netdev enp1s0f0np0 does not exist" in msg


def test_missing_netplan_and_inactive_renderer_fail(head):
    msgs = requirement_failures(head, {**spark_facts(), "netplan": "", "renderer_state": "inactive"})
    assert any("netplan is not installed" in m for m in msgs)
    assert any("NetworkManager is inactive" in m for m in msgs)


def test_no_facts_at_all_fail_every_requirement(head):
    failures = requirement_failures(head, parse_node_facts([]))
    assert len(failures) == 8 and any("the port's twin enP2p1s0f0np0 does not exist" in f for f in failures)


def test_facts_table_has_a_row_per_node_in_rank_order():
    cluster = build_cluster(pair())
    rows = [(n, spark_facts(), []) for n in reversed(cluster.nodes)]
    lines = facts_table(rows).splitlines()
    assert lines[0].split()[:2] == ["host", "rank"]
    assert [l.split()[0] for l in lines[1:]] == ["spark-a", "spark-b"]
    assert "121.7/112.7" in lines[1] and lines[1].endswith("ok")


# Assembled: the fields of `ip -j addr show dev` parse_link reads, at the unit tests' own address (no
# `ip -j` output of a Spark is public; tests/unit/test_network_captures.py reads a Spark's `ip addr`).
IP_UP = (
    '[{"ifname":"enp1s0f0np0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":9000,'
    '"operstate":"UP","addr_info":[{"family":"inet","local":"10.77.77.1","prefixlen":30}]}]'
)


def test_parse_link_reads_ip_json():
    assert parse_link(IP_UP) == {
        "mtu": 9000, "up": True, "operstate": "UP", "ipv4": ["10.77.77.1/30"], "ipv6": []}
    assert parse_link("[]") is None and parse_link("") is None and parse_link("garbage") is None


def test_link_matching_the_data_has_no_drift(head):
    assert link_drift(head, parse_link(IP_UP)) == []


def test_link_drift_names_each_difference(head):
    link = {"mtu": 1500, "up": False, "operstate": "DOWN", "ipv4": [], "ipv6": []}
    assert link_drift(head, link) == ["mtu 1500 (want 9000)", "link down", "address none (want 10.77.77.1/30)"]
    assert link_drift(head, None) == ["enp1s0f0np0 missing"]
    second = {"mtu": 9000, "up": True, "operstate": "UP", "ipv4": ["10.77.77.1/30", "192.168.100.12/24"], "ipv6": []}
    assert link_drift(head, second) == ["address 10.77.77.1/30, 192.168.100.12/24 (want 10.77.77.1/30)"]


def test_link_failure_names_both_hosts_and_mtus():
    cluster = build_cluster(pair())
    msg = link_failure(cluster.head, 9000, cluster.workers[0], "1500")
    assert msg.startswith("fabric: spark-a (enp1s0f0np0 mtu 9000) cannot reach spark-b at 10.77.77.2")
    assert "(enp1s0f0np0 mtu 1500)" in msg and "-s 8972" in msg


def test_ping_is_unfragmented_at_full_payload():
    assert ping_command("10.77.77.2", 8972).startswith("ping -M do -s 8972 ")
    assert "for _ in $(seq 20)" in ping_command("10.77.77.2", 8972, settle_seconds=10)
    fact = FabricPing()
    assert fact.process(["ok"]) is True and fact.process(["fail"]) is False
