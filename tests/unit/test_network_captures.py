"""Readers of a node's network state on what real DGX Sparks print (tests/unit/fixtures/captures/):
the fabric link (roles/fabric/facts.py parse_link), the management subnet (sparkfleet/firewall_facts.py
ManagementSubnet, its own command with a stand-in `ip`), and the link speed the fabric alert holds a
half to (roles/monitoring). No `ip -j` or `ip -o` output of a Spark is public: each is derived from a
Spark's `ip addr` text by tests/unit/capture_views.py, by iproute2's own rules for those forms."""
import json
import re
import subprocess

import pytest

from roles.fabric.checks import link_drift
from roles.fabric.facts import parse_link
from roles.monitoring.checks import textfile_text
from sparkfleet.config import build_cluster
from sparkfleet.firewall_facts import ManagementSubnet
from tests.unit.capture_views import ip_json_link, ip_oneline_ipv4, path_with, stand_in
from tests.unit.helpers import capture, pair

IP_ADDR = capture("ip_addr_spark_4cbb47_mtu9216.txt")  # networkd, 172.31.5.3/28, MTU 9216 on both halves


def link(netdev):
    return parse_link(json.dumps(ip_json_link(IP_ADDR, netdev)))


def test_the_fabric_link_reads_a_spark_s_halves_and_its_idle_port():
    assert link("enp1s0f0np0") == {"mtu": 9216, "up": True, "operstate": "UP", "ipv4": ["172.31.5.3/28"], "ipv6": []}
    assert link("enP2p1s0f0np0") == {"mtu": 9216, "up": True, "operstate": "UP", "ipv4": [], "ipv6": []}
    assert link("enp1s0f1np1") == {"mtu": 1500, "up": False, "operstate": "DOWN", "ipv4": [], "ipv6": []}
    assert link("enp9s0f0np0") is None  # no such netdev: ip prints []


def test_that_spark_s_port_is_named_as_drift_from_the_data_mtu_and_the_twin_s_missing_address():
    """Data for that Spark (its own address, the unit tests' 9000 MTU and twin subnet): the drift the
    deploy then fixes, each half named, as roles/fabric reports it."""
    hosts = pair(**{"spark-a": {"fabric_address": "172.31.5.3/28", "fabric_twin_address": "172.31.6.3/28"},
                    "spark-b": {"fabric_address": "172.31.5.4/28", "fabric_twin_address": "172.31.6.4/28"}})
    node = build_cluster(hosts).node("spark-a")
    first, twin = node.fabric_halves
    assert link_drift(node, link("enp1s0f0np0"), first) == ["mtu 9216 (want 9000)"]
    assert link_drift(node, link("enP2p1s0f0np0"), twin) == [
        "enP2p1s0f0np0 mtu 9216 (want 9000)", "enP2p1s0f0np0 address none (want 172.31.6.3/28)"]


@pytest.mark.parametrize("arrived_at, subnet", [("172.31.0.100", "172.31.0.0/23"), ("172.31.5.3", "172.31.5.0/28")])
def test_the_management_subnet_is_the_prefix_of_the_address_the_ssh_session_arrived_at(tmp_path, arrived_at, subnet):
    """ManagementSubnet's command (its awk over `ip -o -4 addr show`) on that Spark's addresses: the 10GbE
    management port's DHCP /23, or the fabric's /28 had SSH come in there."""
    stand_in(tmp_path, "ip", "\n".join(ip_oneline_ipv4(IP_ADDR)), first_arg="-o")
    env = {**path_with(tmp_path), "SSH_CONNECTION": f"198.18.0.1 40000 {arrived_at} 22"}
    out = subprocess.run(["sh", "-c", ManagementSubnet().command("10.0.0.11")], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert ManagementSubnet().process(out.stdout.splitlines()) == subnet


def test_the_fabric_speed_bar_by_default_is_what_a_cabled_spark_half_links_at():
    """spark1's cabled half (captures/ethtool_speed_spark1_jp.txt: ethtool's Speed, the kernel's
    /sys/class/net/<netdev>/speed that node_network_speed_bytes reads) links at the default
    monitoring_alert_fabric_link_mbits: SparkfleetFabricSlow stays quiet on a healthy Spark."""
    text = capture("ethtool_speed_spark1_jp.txt")
    assert "Link detected: yes" in text and "rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)" in text
    mbits = int(re.search(r"Speed: (\d+)Mb/s", text)[1])
    cluster = build_cluster(pair())
    node = cluster.node("spark-a")
    assert node.monitoring_alert_fabric_link_mbits == mbits
    assert f'sparkfleet_fabric_link_speed_wanted_bytes{{device="enp1s0f0np0"}} {mbits * 125000}' in textfile_text(
        cluster, node)
