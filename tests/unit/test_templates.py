"""Rendered templates: golden files for real-hardware and lab data, plus what netplan will read."""
import os
from pathlib import Path

import pytest
import yaml

from roles.fabric.checks import netplan_text
from sparkfleet.config import build_cluster
from tests.unit.helpers import pair

GOLDEN = Path(__file__).parent / "golden"
LAB = {"netplan_renderer": "networkd", "rdma_hca": None, "rdma_twin_hca": None, "gpu_expected": False}


def clusters():
    return {
        "spark": build_cluster(pair()),
        "lab": build_cluster(pair(**{"spark-a": LAB, "spark-b": LAB})),
    }


def check_golden(name: str, text: str):
    path = GOLDEN / name
    if os.environ.get("SPARKFLEET_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing; run with SPARKFLEET_UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text(), f"{name} differs from its golden file"


@pytest.mark.parametrize("kind", ["spark", "lab"])
@pytest.mark.parametrize("node_name", ["spark-a", "spark-b"])
def test_netplan_matches_golden(kind, node_name):
    node = clusters()[kind].node(node_name)
    check_golden(f"{kind}-{node_name}-40-sparkfleet-fabric.yaml", netplan_text(node))


@pytest.mark.parametrize("kind", ["spark", "lab"])
def test_netplan_says_what_the_data_says(kind):
    node = clusters()[kind].node("spark-b")
    text = netplan_text(node)
    assert text.startswith("# Managed by sparkfleet (roles/fabric)")
    doc = yaml.safe_load(text)
    assert doc["network"]["renderer"] == node.netplan_renderer
    link = doc["network"]["ethernets"][node.fabric_netdev]
    assert link["addresses"] == [str(node.fabric_address)]
    assert link["mtu"] == node.fabric_mtu == 9000
    assert link["dhcp4"] is False and link["dhcp6"] is False
    assert link["accept-ra"] is False and link["link-local"] == []
    assert "routes" not in link and "gateway4" not in link and "routing-policy" not in link


def test_netplan_follows_a_changed_mtu():
    reason = {"fabric_mtu": 4200, "fabric_mtu_reason": "test"}
    node = build_cluster(pair(**{"spark-a": reason, "spark-b": reason})).node("spark-a")
    assert yaml.safe_load(netplan_text(node))["network"]["ethernets"]["enp1s0f0np0"]["mtu"] == 4200
