"""sparkfleet/roce_gid.py on real DGX Sparks' GID tables: the RoceGids fact's own command run against a
sysfs tree holding what two captures show (tests/unit/capture_views.py derives each tree: show_gids
prints the very sysfs files the fact reads), then the deploy's pick, NCCL's own choice and the start
check (roles/serving/sfl_gid.sh) on the same tree.

- gid_gb10_1_rocev2_handson_show_gids.txt: gb10-1, both halves of the port up, each half's IPv4 RoCE
  v2 GID at index 3 (192.168.100.10 on rocep1s0f0, .14 on roceP2p1s0f0), the other port down.
- gid_index4_hole_sysfs_listing.txt: two Sparks whose rocep1s0f0 has index 3 empty and the IPv4 RoCE
  v2 GID at 4 (the table drifted: NCCL pinned to 3 failed with "local GID index 3, local GID ::").
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from sparkfleet.config import build_cluster
from sparkfleet.roce_gid import RoceGids, half_gid_index, nccl_auto_gid_index, pick_gid_index, resolve_gid_index
from tests.unit.capture_views import gids_from_show_gids, gids_from_sysfs_listing, write_gid_sysfs
from tests.unit.helpers import ONE_HALF, capture, pair

SHOW_GIDS = gids_from_show_gids(capture("gid_gb10_1_rocev2_handson_show_gids.txt"))
HOLE = capture("gid_index4_hole_sysfs_listing.txt")
SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "serving" / "sfl_gid.sh"
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "roce-gids-dgx-spark.json").read_text())


class SysfsHost:
    """A node whose RoceGids fact runs its own command against a sysfs tree under `root`."""

    def __init__(self, root: Path):
        self.root = root

    def get_fact(self, cls, hca):
        assert cls is RoceGids
        command = RoceGids().command(hca).replace("/sys/class/infiniband", str(self.root / "class" / "infiniband"))
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return RoceGids().process(out.stdout.splitlines())


def start_check(root, hca, ip, netdev):
    return subprocess.run(["sh", str(SCRIPT), "--check", hca, ip, netdev], capture_output=True, text=True,
                          env={**os.environ, "SFL_SYSFS": str(root)}, timeout=30)


# --- gb10-1's show_gids: both halves at index 3 ------------------------------------------------

HALVES = [("rocep1s0f0", "192.168.100.10", "enp1s0f0np0"), ("roceP2p1s0f0", "192.168.100.14", "enP2p1s0f0np0")]


@pytest.mark.parametrize("hca, ip, netdev", HALVES)
def test_the_fact_reads_gb10_1_s_table_and_the_deploy_and_nccl_both_take_index_3(tmp_path, hca, ip, netdev):
    host = SysfsHost(write_gid_sysfs(tmp_path, SHOW_GIDS))
    entries = host.get_fact(RoceGids, hca=hca)
    assert [(e["index"], e["type"], e["ndev"]) for e in entries] == [
        (e["index"], e["type"], e["ndev"]) for e in SHOW_GIDS[hca]]  # every populated slot, nothing else
    assert pick_gid_index(entries, ip, netdev) == 3
    assert nccl_auto_gid_index(entries) == 3
    r = start_check(tmp_path, hca, ip, netdev)
    assert r.returncode == 0, r.stderr
    assert f"RoCE v2 GID index 3 for {ip} on {hca}/{netdev}, the one NCCL chooses" in r.stdout


@pytest.mark.parametrize("hca, netdev", [("rocep1s0f1", "enp1s0f1np1"), ("roceP2p1s0f1", "enP2p1s0f1np1")])
def test_the_uncabled_port_s_devices_have_link_local_gids_only_and_no_pick(tmp_path, hca, netdev):
    host = SysfsHost(write_gid_sysfs(tmp_path, SHOW_GIDS))
    entries = host.get_fact(RoceGids, hca=hca)
    assert [e["index"] for e in entries] == [0, 1] and all(e["gid"].startswith("fe80:") for e in entries)
    assert pick_gid_index(entries, "192.168.100.10", netdev) is None and nccl_auto_gid_index(entries) is None


def test_a_node_cabled_as_gb10_1_resolves_each_half_and_leaves_nccl_to_choose(tmp_path):
    """The deploy's own resolution (half_gid_index: its pick, then NCCL's choice must be the same) on
    gb10-1's table, for a node given gb10-1's addresses; with both halves NCCL_IB_GID_INDEX is -1."""
    hosts = pair(**{"spark-a": {"fabric_address": "192.168.100.10/30", "fabric_twin_address": "192.168.100.14/30"},
                    "spark-b": {"fabric_address": "192.168.100.9/30", "fabric_twin_address": "192.168.100.13/30"}})
    node = build_cluster(hosts).node("spark-a")
    host = SysfsHost(write_gid_sysfs(tmp_path, SHOW_GIDS))
    assert [half_gid_index(host, node, h) for h in node.fabric_halves] == [3, 3]
    assert resolve_gid_index(host, node) is None


# --- the drifted table: index 3 empty, the IPv4 RoCE v2 GID at 4 ----------------------------------

@pytest.mark.parametrize("node, ip", [(0, "192.168.100.10"), (1, "192.168.100.11")])
def test_a_hole_at_index_3_makes_the_deploy_the_start_check_and_nccl_take_4(tmp_path, node, ip):
    root = write_gid_sysfs(tmp_path, {"rocep1s0f0": gids_from_sysfs_listing(HOLE, node, "enp1s0f0np0")})
    entries = SysfsHost(root).get_fact(RoceGids, hca="rocep1s0f0")
    assert [e["index"] for e in entries] == [0, 1, 2, 4]  # the empty slot 3 is not a GID
    assert pick_gid_index(entries, ip, "enp1s0f0np0") == 4
    assert nccl_auto_gid_index(entries) == 4
    r = start_check(root, "rocep1s0f0", ip, "enp1s0f0np0")
    assert r.returncode == 0 and "RoCE v2 GID index 4 for" in r.stdout, r.stdout + r.stderr


def test_a_one_half_pair_with_the_hole_renders_index_4_for_each_rank(tmp_path):
    """Both Sparks of that note, one half each (rocep1s0f0): the index each rank's env file gets."""
    hosts = pair(**{"spark-a": {**ONE_HALF, "fabric_address": "192.168.100.10/24"},
                    "spark-b": {**ONE_HALF, "fabric_address": "192.168.100.11/24"}})
    cluster = build_cluster(hosts)
    for rank, name in enumerate(("spark-a", "spark-b")):
        root = write_gid_sysfs(tmp_path / name, {"rocep1s0f0": gids_from_sysfs_listing(HOLE, rank, "enp1s0f0np0")})
        assert resolve_gid_index(SysfsHost(root), cluster.node(name)) == 4


# --- the assembled fixture keeps a captured layout --------------------------------------------------

@pytest.mark.parametrize("name", ["spark-a", "spark-b"])
def test_the_assembled_fixture_has_gb10_1_s_layout_with_the_pair_s_addresses(name):
    """roce-gids-dgx-spark.json is assembled (tests/unit/fixtures/README.md): pair()'s addresses, not
    gb10-1's. Its layout (index, type, link-local or IPv4 GID, which half's netdev) is gb10-1's."""
    def layout(entries):
        return [(e["index"], e["type"], e["ndev"], e["gid"].startswith("fe80:")) for e in entries]
    for hca in ("rocep1s0f0", "roceP2p1s0f0"):
        assert layout(FIXTURE[name][hca]) == layout(SHOW_GIDS[hca])
