"""Which QSFP port is cabled: a Spark has two, each two PCIe halves (netdev + RDMA device). Preflight
reads both ports from sysfs as ibdev2netdev does; parsers of `ibdev2netdev` and `rdma link` output
give the same neutral structure, so real captures drive the same verdict: the data's port down and
the other one up is refused naming the data keys to set (both halves of the cabled port)."""
import os
import subprocess
from pathlib import Path

import pytest

from roles.preflight.checks import cabled_port_failures, port_note, requirement_failures
from roles.preflight.facts import NodeFacts, PortHalf, parse_ibdev2netdev, parse_node_facts, parse_rdma_link
from sparkfleet.config import build_cluster
from tests.unit.helpers import ONE_HALF, capture, pair
from tools.doctor import preflight_doctor_rows

FIXTURES = Path(__file__).parent / "fixtures"
EUGR = "ibdev2netdev_eugr_port1_cabled.txt"  # the cable in port 1
GUIDE = "ibdev2netdev_nvidia_guide_spark1.txt"  # the cable in port 0
PORT_1 = {"fabric_netdev": "enp1s0f1np1", "fabric_twin_netdev": "enP2p1s0f1np1", "rdma_hca": "rocep1s0f1",
          "rdma_twin_hca": "roceP2p1s0f1"}
NAMING_PORT_1 = ("set fabric_netdev = 'enp1s0f1np1', fabric_twin_netdev = 'enP2p1s0f1np1', rdma_hca = 'rocep1s0f1', "
                 "rdma_twin_hca = 'roceP2p1s0f1', or move the cable to port 0")


def recorded() -> dict:
    return parse_node_facts((FIXTURES / "nodefacts-dgx-spark.txt").read_text().splitlines())


def node(**data):
    return build_cluster(pair(**{"spark-a": data, "spark-b": data})).head


def with_ports(halves) -> dict:
    return {**recorded(), "ports": halves}


# --- the parsers, on real captures ---------------------------------------------------------------

def test_ibdev2netdev_on_eugrs_pair_shows_port_1_up_on_both_controllers():
    halves = parse_ibdev2netdev(capture(EUGR).splitlines())  # its first line is the prompt: skipped
    assert [(h.port, h.netdev, h.hca, h.up) for h in halves] == [
        ("0", "enp1s0f0np0", "rocep1s0f0", False), ("1", "enp1s0f1np1", "rocep1s0f1", True),
        ("0", "enP2p1s0f0np0", "roceP2p1s0f0", False), ("1", "enP2p1s0f1np1", "roceP2p1s0f1", True)]
    assert {h.controller for h in halves if h.port == "1"} == {"enp1s0", "enP2p1s0"}


def test_rdma_link_on_gb10_1_shows_port_0_active():
    halves = parse_rdma_link(capture("rdma_link_gb10_1.txt").splitlines())
    assert [(h.port, h.netdev, h.hca, h.up, h.state) for h in halves][:2] == [
        ("0", "enp1s0f0np0", "rocep1s0f0", True, "ACTIVE LINK_UP"), ("1", "enp1s0f1np1", "rocep1s0f1", False, "DOWN DISABLED")]
    assert len(halves) == 4


# --- the verdict ------------------------------------------------------------------------------------

def test_eugrs_cabling_is_refused_naming_both_halves_of_the_cabled_port():
    [msg] = cabled_port_failures(node(), with_ports(parse_ibdev2netdev(capture(EUGR).splitlines())))
    assert msg.startswith("spark-a: the cable is in CX7 port 1 (enp1s0f1np1/rocep1s0f1 up, enP2p1s0f1np1/roceP2p1s0f1 "
                          "up), not in port 0, which data names (enp1s0f0np0/rocep1s0f0 down, enP2p1s0f0np0/roceP2p1s0f0 "
                          "down); "), msg
    assert msg.endswith(NAMING_PORT_1)


def test_the_refusal_is_preflights_one_word_on_the_port():
    """The data's halves are down because the cable is elsewhere: that refusal, not also each half's state."""
    facts = with_ports(parse_ibdev2netdev(capture(EUGR).splitlines()))
    for hca in facts["hcas"].values():
        hca["state"] = "1: DOWN"
    failures = requirement_failures(node(), facts)
    assert len(failures) == 1 and failures[0].endswith(NAMING_PORT_1)


@pytest.mark.parametrize("name, parse", [(GUIDE, parse_ibdev2netdev), ("rdma_link_gb10_1.txt", parse_rdma_link)])
def test_a_pair_cabled_in_the_port_data_names_passes(name, parse):
    facts = with_ports(parse(capture(name).splitlines()))
    assert cabled_port_failures(node(), facts) == [] and requirement_failures(node(), facts) == []


def test_the_recorded_spark_reads_both_ports_and_passes():
    facts = recorded()
    assert port_note(facts) == ("port 0: enp1s0f0np0/rocep1s0f0 up, enP2p1s0f0np0/roceP2p1s0f0 up; "
                                "port 1: enp1s0f1np1/rocep1s0f1 down, enP2p1s0f1np1/roceP2p1s0f1 down")
    assert cabled_port_failures(node(), facts) == []


def test_data_naming_port_1_with_the_cable_in_port_0_is_refused_naming_port_0():
    [msg] = cabled_port_failures(node(**PORT_1), with_ports(parse_ibdev2netdev(capture(GUIDE).splitlines())))
    assert "the cable is in CX7 port 0" in msg and msg.endswith(
        "set fabric_netdev = 'enp1s0f0np0', fabric_twin_netdev = 'enP2p1s0f0np0', rdma_hca = 'rocep1s0f0', "
        "rdma_twin_hca = 'roceP2p1s0f0', or move the cable to port 1")


def test_a_node_on_one_half_is_told_the_keys_it_has():
    [msg] = cabled_port_failures(node(**ONE_HALF), with_ports(parse_ibdev2netdev(capture(EUGR).splitlines())))
    assert msg.endswith("set fabric_netdev = 'enp1s0f1np1', rdma_hca = 'rocep1s0f1', or move the cable to port 0")


def test_nothing_up_anywhere_is_left_to_the_port_checks():
    halves = [PortHalf(h.port, h.controller, h.netdev, h.hca, False, "Down")
              for h in parse_ibdev2netdev(capture(EUGR).splitlines())]
    assert cabled_port_failures(node(), with_ports(halves)) == []


def test_the_lab_passes_a_veth_without_rdma():
    """Lab hosts: a veth named enp1s0f0np0 and no /sys/class/infiniband, so no port lines at all."""
    facts = {k: v for k, v in recorded().items() if k != "ports"}
    assert cabled_port_failures(node(), facts) == []
    lab = node(rdma_hca=None, rdma_twin_hca=None, fabric_netdev="veth-cx7", fabric_twin_netdev=None,
               fabric_twin_address=None)
    assert cabled_port_failures(lab, with_ports(parse_ibdev2netdev(capture(EUGR).splitlines()))) == []


# --- the fact: both ports from sysfs, as ibdev2netdev reads them --------------------------------------

def sysfs_like(root: Path, halves: list[PortHalf]) -> Path:
    """A sysfs tree laid out as a Spark's: /class/infiniband/<hca>/device -> the PCI function (its net/<netdev>),
    /class/net/<netdev>/{carrier,operstate,phys_port_name}, the RDMA port's state. Each PCI address from
    the half's controller (domain 0000 or 0002, STH's and NVIDIA/daqiri PR #108's) and port."""
    for h in halves:
        pci = f"{'0002' if h.controller.startswith('enP2') else '0000'}:01:00.{h.port}"
        function = root / "devices" / "pci" / pci
        (function / "net" / h.netdev).mkdir(parents=True)
        ib = root / "class" / "infiniband" / h.hca
        (ib / "ports" / "1").mkdir(parents=True)
        (ib / "device").symlink_to(function)
        (ib / "ports" / "1" / "state").write_text("4: ACTIVE\n" if h.up else "1: DOWN\n")
        net = root / "class" / "net" / h.netdev
        net.mkdir(parents=True)
        (net / "phys_port_name").write_text(f"p{h.port}\n")
        (net / "carrier").write_text("1\n" if h.up else "0\n")
        (net / "operstate").write_text("up\n" if h.up else "down\n")
    return root


def read_ports(root: Path) -> list[PortHalf]:
    command = NodeFacts().command("/tmp", "lo").replace("/sys/class/", f"{root}/class/")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30, env=os.environ).stdout
    return parse_node_facts(out.splitlines())["ports"]


def test_the_fact_reads_both_ports_from_sysfs_to_the_same_verdict_as_the_capture(tmp_path):
    captured = parse_ibdev2netdev(capture(EUGR).splitlines())
    read = read_ports(sysfs_like(tmp_path / "sys", captured))
    assert sorted((h.port, h.netdev, h.hca, h.up) for h in read) == sorted((h.port, h.netdev, h.hca, h.up) for h in captured)
    assert {h.controller for h in read} == {"0000:01:00", "0002:01:00"}
    assert [h.state for h in read if h.netdev == "enp1s0f1np1"] == ["carrier 1, up, 4: ACTIVE"]
    assert cabled_port_failures(node(), with_ports(read)) == cabled_port_failures(node(), with_ports(captured))


def test_an_unplugged_half_whose_carrier_cannot_be_read_is_down(tmp_path):
    """An administratively down netdev refuses to show its carrier: read as empty, not up."""
    root = sysfs_like(tmp_path / "sys", parse_ibdev2netdev(capture(EUGR).splitlines()))
    (root / "class" / "net" / "enp1s0f0np0" / "carrier").unlink()
    [half] = [h for h in read_ports(root) if h.netdev == "enp1s0f0np0"]
    assert half.up is False and half.state == "carrier -, down, 1: DOWN"


# --- the doctor --------------------------------------------------------------------------------------

def test_the_doctor_shows_each_port_and_counts_the_refusal_once():
    facts = with_ports(parse_ibdev2netdev(capture(EUGR).splitlines()))
    n = node()
    (pre, name, pre_problems, *_), (port, _, port_problems, note) = preflight_doctor_rows(n, facts, requirement_failures(n, facts))
    assert (pre, port, name) == ("preflight", "port", "spark-a")
    assert pre_problems == [] and len(port_problems) == 1 and port_problems[0].endswith(NAMING_PORT_1)
    assert note == port_note(facts) == ("port 0: enp1s0f0np0/rocep1s0f0 down, enP2p1s0f0np0/roceP2p1s0f0 down; "
                                        "port 1: enp1s0f1np1/rocep1s0f1 up, enP2p1s0f1np1/roceP2p1s0f1 up")
    facts = with_ports(parse_ibdev2netdev(capture(GUIDE).splitlines()))
    assert preflight_doctor_rows(n, facts, [])[1][2] == []
