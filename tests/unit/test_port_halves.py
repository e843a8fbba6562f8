"""Both halves of the CX7 port (a DGX Spark's one cable is two PCIe x4 endpoints: enp1s0f0np0 /
rocep1s0f0 and enP2p1s0f0np0 / roceP2p1s0f0): the data that names them, the refusals, the netplan,
the GIDs resolved per HCA from recorded sysfs layouts of both devices, the check the unit runs at
every start, preflight's port health, and every NCCL_* name against NCCL's own source."""
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from pyinfra.api.exceptions import DeployError

from roles.fabric.checks import link_drift, link_failure, netplan_text
from sparkfleet.fabric_others import other_configs
from roles.preflight.checks import port_failures, requirement_failures
from roles.preflight.facts import parse_node_facts
from roles.serving.checks import rendered_files
from sparkfleet.roce_gid import half_gid_index, resolve_gid_index
from sparkfleet.model.engine import rank_env
from sparkfleet.model.env_readers import LIBRARY_ENV, nccl_known
from sparkfleet.roce_gid import ipv4_mapped_gid, nccl_auto_gid_index, parse_gids, pick_gid_index
from sparkfleet.model.serving import load_profile, profile_names
from sparkfleet.config import ConfigError, build_cluster
from tests.unit.helpers import ONE_HALF, pair
from tests.unit.test_fabric_others import recorded

FIXTURES = Path(__file__).parent / "fixtures"
GIDS = json.loads((FIXTURES / "roce-gids-dgx-spark.json").read_text())
SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "serving" / "sfl_gid.sh"
TWIN, TWIN_HCA = "enP2p1s0f0np0", "roceP2p1s0f0"


def spark():
    return build_cluster(pair())


class RecordedHost:
    """A node whose RoceGids fact answers from the recorded layouts (or `tables`)."""

    def __init__(self, name, tables=None):
        self.name, self.tables = name, tables or GIDS[name]

    def get_fact(self, cls, hca):
        assert cls.__name__ == "RoceGids"
        return self.tables[hca]


def problems(hosts) -> list[str]:
    with pytest.raises(ConfigError) as err:
        build_cluster(hosts)
    return [str(p) for p in err.value.problems]


# --- data -------------------------------------------------------------------------------------

def test_a_spark_configures_both_halves_each_with_its_address_and_hca():
    node = spark().node("spark-b")
    assert [(h.netdev, str(h.address), h.hca) for h in node.fabric_halves] == [
        ("enp1s0f0np0", "10.77.77.2/30", "rocep1s0f0"), (TWIN, "10.77.78.2/30", TWIN_HCA)]
    assert node.rdma_hcas == ("rocep1s0f0", TWIN_HCA)
    one = build_cluster(pair(**{"spark-a": ONE_HALF, "spark-b": ONE_HALF})).node("spark-b")
    assert [h.netdev for h in one.fabric_halves] == ["enp1s0f0np0"] and one.rdma_hcas == ("rocep1s0f0",)


def test_a_twin_without_its_address_is_refused_naming_host_key_and_the_way_out():
    [msg] = [m for m in problems(pair(**{"spark-b": {"fabric_twin_address": None}})) if "spark-b" in m][:1]
    assert msg.startswith("spark-b: key 'fabric_twin_address' missing: fabric_twin_netdev = 'enP2p1s0f0np0' needs")
    assert "10.77.77.6/30" in msg  # an example in a subnet of its own


def test_a_twin_in_the_first_halfs_subnet_is_refused_saying_why():
    msgs = problems(pair(**{"spark-a": {"fabric_twin_address": "10.77.77.1/29"}}))
    assert any(m.startswith("spark-a: key 'fabric_twin_address' = 10.77.77.1/29: its subnet overlaps 10.77.77.0/30")
               and "share one route and answer each other's ARP" in m for m in msgs), msgs


def test_the_twin_address_is_unique_and_on_one_subnet_per_link():
    msgs = problems(pair(**{"spark-b": {"fabric_twin_address": "10.77.78.1/30"}}))
    assert any("key 'fabric_twin_address' = 10.77.78.1 used 2 times" in m for m in msgs), msgs
    msgs = problems(pair(**{"spark-b": {"fabric_twin_address": "10.77.79.2/30"}}))
    assert any("key 'fabric_twin_address': the nodes of a link must be in one subnet" in m for m in msgs), msgs


def test_a_cable_joins_the_same_halves_at_both_ends():
    msgs = problems(pair(**{"spark-b": ONE_HALF}))
    assert any(m.startswith("spark-a, spark-b: key 'fabric_twin_netdev': a cable joins the same halves at both ends")
               for m in msgs), msgs


def test_rdma_on_one_half_only_is_refused():
    msgs = problems(pair(**{n: {"rdma_twin_hca": None} for n in ("spark-a", "spark-b")}))
    assert any(m.startswith("spark-a: key 'rdma_twin_hca' missing") and "leave that half idle" in m for m in msgs)
    msgs = problems(pair(**{n: {"rdma_hca": None} for n in ("spark-a", "spark-b")}))
    assert any("key 'rdma_twin_hca' = 'roceP2p1s0f0' without 'rdma_hca'" in m for m in msgs)


# --- the fabric -------------------------------------------------------------------------------

def test_the_netplan_drop_in_configures_both_halves_at_jumbo_mtu():
    doc = yaml.safe_load(netplan_text(spark().node("spark-a")))
    ethernets = doc["network"]["ethernets"]
    assert list(ethernets) == ["enp1s0f0np0", TWIN]
    assert ethernets[TWIN]["addresses"] == ["10.77.78.1/30"] and ethernets[TWIN]["mtu"] == 9000
    assert ethernets[TWIN]["dhcp4"] is False and ethernets[TWIN]["link-local"] == []


def test_the_twins_drift_is_named_with_its_netdev_and_a_dead_twin_with_its_cost():
    node, peer = spark().node("spark-a"), spark().node("spark-b")
    twin = node.fabric_halves[1]
    link = {"mtu": 1500, "up": True, "ipv4": ["10.77.78.1/30"]}
    assert link_drift(node, link, twin) == [f"{TWIN} mtu 1500 (want 9000)"]
    assert link_drift(node, None, twin) == [f"{TWIN} missing"]
    msg = link_failure(node, 9000, peer, 1500, 1)
    assert msg.startswith(f"fabric: spark-a ({TWIN} mtu 9000) cannot reach spark-b at 10.77.78.2 ({TWIN} mtu 1500)")
    assert "about half of what the cable carries" in msg
    assert "half of what" not in link_failure(node, 9000, peer, 1500, 0)


def test_nvidias_netplan_file_for_both_halves_is_named_once_and_disabled_whole():
    """The recorded host's /etc/netplan/40-cx7.yaml configures both halves (NVIDIA's guide): with
    both ours, it is renamed aside (before, it was rewritten to keep the twin's stanza)."""
    found = {c.where.split(" (")[0]: c for c in other_configs(recorded(), ("enp1s0f0np0", TWIN))}
    cx7 = found["/etc/netplan/40-cx7.yaml"]
    assert cx7.netdevs == ("enp1s0f0np0", TWIN)
    assert cx7.takeover.startswith("mv --backup=numbered /etc/netplan/40-cx7.yaml ") and "renamed" in cx7.action
    assert sum(c.where.startswith("/etc/netplan/40-cx7.yaml") for c in found.values()) == 1


# --- GIDs: recorded layouts of both devices -----------------------------------------------------

@pytest.mark.parametrize("name", ["spark-a", "spark-b"])
def test_each_half_resolves_its_own_gid_and_ncclls_choice_is_it(name):
    node = spark().node(name)
    host = RecordedHost(name)
    assert [half_gid_index(host, node, h) for h in node.fabric_halves] == [3, 3]
    assert all(nccl_auto_gid_index(parse_gids_rows(GIDS[name][h.hca])) == 3 for h in node.fabric_halves)
    assert resolve_gid_index(host, node) is None  # NCCL_IB_GID_INDEX=-1: NCCL chooses per HCA


def parse_gids_rows(entries):
    return parse_gids([f"{e['index']}\t{e['type']}\t{e['ndev']}\t{e['gid']}" for e in entries])


@pytest.mark.parametrize("name", ["spark-a", "spark-b"])
def test_the_rendered_head_and_worker_carry_both_hcas_and_check_both_at_start(name):
    c = spark()
    node = c.node(name)
    files = rendered_files(c, node, resolve_gid_index(RecordedHost(name), node))
    [env_text] = [t for p, (t, _) in files.items() if p.endswith(".env")]
    [unit] = [t for p, (t, _) in files.items() if p.endswith(".service")]
    env = dict(line.split("=", 1) for line in env_text.splitlines() if line and not line.startswith("#"))
    assert env["NCCL_IB_HCA"] == "=rocep1s0f0,roceP2p1s0f0" and env["NCCL_IB_GID_INDEX"] == "-1"
    ip1, ip2 = (h.ip for h in node.fabric_halves)
    assert f"--check rocep1s0f0 {ip1} enp1s0f0np0\n" in unit and f"--check roceP2p1s0f0 {ip2} {TWIN}\n" in unit


def test_another_ipv4_gid_before_the_twins_own_stops_the_deploy_naming_ncclls_choice():
    node = spark().node("spark-b")
    tables = json.loads(json.dumps(GIDS["spark-b"]))
    twin = tables[TWIN_HCA]
    twin.insert(2, {"index": 2, "type": "RoCE v2", "ndev": TWIN, "gid": ipv4_mapped_gid("192.168.101.12")})
    for i, e in enumerate(twin):
        e["index"] = i
    with pytest.raises(DeployError, match=r"spark-b: NCCL would choose GID index 2 on roceP2p1s0f0, not 4"):
        half_gid_index(RecordedHost("spark-b", tables), node, node.fabric_halves[1])
    assert pick_gid_index(parse_gids_rows(twin), "10.77.78.2", TWIN) == 4


def test_nccls_choice_skips_zero_link_local_and_roce_v1():
    rows = [(0, "IB/RoCE v1", "x", "fe80:0000:0000:0000:0000:0000:0000:0001"),
            (1, "RoCE v2", "x", "fe80:0000:0000:0000:0000:0000:0000:0001"),
            (2, "IB/RoCE v1", "x", ipv4_mapped_gid("10.0.0.1")), (3, "RoCE v2", "x", ipv4_mapped_gid("10.0.0.1"))]
    assert nccl_auto_gid_index(parse_gids([f"{i}\t{t}\t{n}\t{g}" for i, t, n, g in rows])) == 3
    assert nccl_auto_gid_index(parse_gids([f"{i}\t{t}\t{n}\t{g}" for i, t, n, g in rows[:3]])) is None


def sysfs_of(root: Path, tables: dict) -> Path:
    for hca, entries in tables.items():
        port = root / "class" / "infiniband" / hca / "ports" / "1"
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (port / sub).mkdir(parents=True, exist_ok=True)
        for i in range(12):  # unpopulated entries read as zeros; 10 and 11 sort after 2 as text
            (port / "gids" / str(i)).write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
        for e in entries:
            (port / "gids" / str(e["index"])).write_text(e["gid"] + "\n")
            (port / "gid_attrs" / "types" / str(e["index"])).write_text(e["type"] + "\n")
            (port / "gid_attrs" / "ndevs" / str(e["index"])).write_text(e["ndev"] + "\n")
    return root


def check(root, hca, ip, netdev):
    return subprocess.run(["sh", str(SCRIPT), "--check", hca, ip, netdev], capture_output=True, text=True,
                          env={**os.environ, "SFL_SYSFS": str(root)}, timeout=30)


@pytest.mark.parametrize("name", ["spark-a", "spark-b"])
def test_the_start_check_passes_on_both_recorded_devices(tmp_path, name):
    root = sysfs_of(tmp_path / "sys", GIDS[name])
    for half in spark().node(name).fabric_halves:
        r = check(root, half.hca, half.ip, half.netdev)
        assert r.returncode == 0, r.stderr
        assert f"RoCE v2 GID index 3 for {half.ip} on {half.hca}/{half.netdev}, the one NCCL chooses" in r.stdout


def test_the_start_check_fails_when_ncclls_choice_is_another_address_or_none_is_up(tmp_path):
    tables = json.loads(json.dumps(GIDS["spark-b"]))
    twin = tables[TWIN_HCA]
    twin[2] = {"index": 2, "type": "RoCE v2", "ndev": TWIN, "gid": ipv4_mapped_gid("192.168.101.12")}
    twin.append({"index": 10, "type": "RoCE v2", "ndev": TWIN, "gid": ipv4_mapped_gid("10.77.78.2")})
    twin[3] = {"index": 3, "type": "IB/RoCE v1", "ndev": TWIN, "gid": ipv4_mapped_gid("10.77.78.2")}
    r = check(sysfs_of(tmp_path / "a", tables), TWIN_HCA, "10.77.78.2", TWIN)
    assert r.returncode == 1 and "NCCL would choose GID index 2 on roceP2p1s0f0, not 10" in r.stderr, r.stderr
    tables[TWIN_HCA] = GIDS["spark-b"][TWIN_HCA][:2]  # link-local only: the address is not up yet
    r = check(sysfs_of(tmp_path / "b", tables), TWIN_HCA, "10.77.78.2", TWIN)
    assert r.returncode == 1 and "no RoCE v2 GID for 10.77.78.2 on roceP2p1s0f0" in r.stderr


# --- preflight: the port's health ---------------------------------------------------------------

def spark_facts(**changes):
    facts = parse_node_facts((FIXTURES / "nodefacts-dgx-spark.txt").read_text().splitlines())
    for hca, values in changes.items():
        facts["hcas"][hca].update(values)
    return facts


def test_a_healthy_spark_port_passes():
    facts = spark_facts()
    assert set(facts["hcas"]) == {"rocep1s0f0", TWIN_HCA} and facts["hcas"][TWIN_HCA]["width"] == 4
    assert requirement_failures(spark().node("spark-a"), facts) == []


def test_a_controller_at_x2_is_refused_naming_the_bios_and_the_fix():
    [msg] = port_failures(spark().node("spark-a"), spark_facts(**{TWIN_HCA: {"width": 2}}))
    assert msg.startswith("spark-a: RDMA device roceP2p1s0f0 (rdma_twin_hca) links at PCIe x2 of x4 (32.0 GT/s PCIe), "
                          "needs x4 (preflight_min_pcie_link_width); BIOS 5.36_0ACUM018 04/21/2026")
    assert "fwupdmgr" in msg


def test_a_twin_that_is_down_or_absent_is_named_with_its_cost():
    [msg] = port_failures(spark().node("spark-a"), spark_facts(**{TWIN_HCA: {"state": "1: DOWN"}}))
    assert "roceP2p1s0f0 (rdma_twin_hca) port 1 is '1: DOWN'" in msg and "about half of what the cable carries" in msg
    [msg] = port_failures(spark().node("spark-a"), spark_facts(**{TWIN_HCA: {"present": False}}))
    assert "RDMA device roceP2p1s0f0 (rdma_twin_hca) does not exist" in msg
    facts = spark_facts()
    del facts["twin_mtu"]
    [msg] = port_failures(spark().node("spark-a"), facts)
    assert msg.startswith("spark-a: the port's twin enP2p1s0f0np0 does not exist (fabric_twin_netdev)")


def test_node_facts_read_each_hca_from_sysfs(tmp_path):
    """The fact's own command, against a sysfs tree laid out as a Spark's."""
    from roles.preflight.facts import NodeFacts

    base = tmp_path / "class" / "infiniband" / "rocep1s0f0"
    (base / "ports" / "1").mkdir(parents=True)
    (base / "device").mkdir()
    (base / "ports" / "1" / "state").write_text("4: ACTIVE\n")
    (base / "device" / "current_link_width").write_text("2\n")
    (base / "device" / "max_link_width").write_text("4\n")
    (base / "fw_ver").write_text("28.45.1020\n")
    command = NodeFacts().command("/tmp", "lo", "", f"rocep1s0f0 {TWIN_HCA}").replace("/sys/class/infiniband",
                                                                                    str(tmp_path / "class/infiniband"))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30).stdout
    hcas = parse_node_facts(out.splitlines())["hcas"]
    assert hcas["rocep1s0f0"] == {"present": True, "state": "4: ACTIVE", "width": 2, "max_width": 4, "speed": "",
                                  "fw": "28.45.1020"}
    assert hcas[TWIN_HCA]["present"] is False


# --- every NCCL_* name exists in NCCL's source --------------------------------------------------

def test_every_nccl_name_a_rank_carries_is_read_by_nccl():
    known = nccl_known()
    assert "NCCL_IB_MERGE_NICS" in known and "NCCL_IB_MERGE_NIC" not in known  # the snapshot can refuse
    names = {k for k in LIBRARY_ENV if k.startswith("NCCL_")}
    for name in profile_names():
        profile = load_profile(name)
        for data in ({}, ONE_HALF, {"rdma_hca": None, "rdma_twin_hca": None}):
            c = build_cluster(pair(**{n: {"serving_profile": name, **data} for n in ("spark-a", "spark-b")}))
            for node in c.nodes:
                env = rank_env(profile, c, node, 3)
                names |= {k for k in env if k.startswith("NCCL_")}
    unknown = sorted(names - known)
    assert not unknown, f"not read by NCCL 2.28.9-1: {unknown}"
