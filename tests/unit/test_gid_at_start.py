"""roles/serving/sfl_gid.sh, run by an RDMA rank's unit before every start: it reads the RoCE v2 GID
index again (it moves after a reboot or a link event) the way the deploy does, and fixes the env file
in place, so the next deploy, which renders from the same sysfs, finds nothing to change.

The lab has no RDMA: the script runs here against sysfs trees laid out as a Spark's, with GID tables
as recorded on real machines (tests/unit/test_serving_config.py keeps the deploy's side)."""
import os
import subprocess
from pathlib import Path

import pytest

from roles.serving.checks import rendered_files
from sparkfleet.model.engine import env_file_path
from roles.serving.facts import ipv4_mapped_gid, pick_gid_index
from tests.unit.test_serving_config import LINK_LOCAL, gid_table
from tests.unit.test_serving_render import cluster

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "serving" / "sfl_gid.sh"
HCA, NETDEV = "rocep1s0f0", "enp1s0f0np0"
NODE = cluster("spark1").node("spark-b")  # a port of one half: the script fixes the one index
IP = NODE.fabric_ip


def table(index, ip=IP):
    """A Spark's port-1 GID table: link-local and RoCE v1 entries first, a second port's RoCE v2 GIDs,
    then this rank's RoCE v2 GID at `index` (as recorded: 3 on one Spark, 5 on the other)."""
    mapped = ipv4_mapped_gid(ip)
    rows = [(0, "IB/RoCE v1", NETDEV, LINK_LOCAL), (1, "RoCE v2", NETDEV, LINK_LOCAL), (2, "IB/RoCE v1", NETDEV, mapped)]
    rows += [(i, "RoCE v2", "enP2p1s0f0np0", ipv4_mapped_gid("10.99.0.2")) for i in range(3, index)]
    return rows + [(index, "RoCE v2", NETDEV, mapped)]


def sysfs(root: Path, rows) -> Path:
    port = root / "class" / "infiniband" / HCA / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True, exist_ok=True)
    for i in range(8):  # unpopulated entries read as zeros, as in sysfs
        (port / "gids" / str(i)).write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
    for i, kind, ndev, gid in rows:
        (port / "gids" / str(i)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(i)).write_text(kind + "\n")
        (port / "gid_attrs" / "ndevs" / str(i)).write_text(ndev + "\n")
    return root


def env_text(index) -> str:
    """The env file the deploy renders for spark-b with GID index `index`."""
    return rendered_files(cluster("spark1"), NODE, index)[env_file_path(NODE, NODE.serving_dir)][0]


def run(root, env_file):
    return subprocess.run(["sh", str(SCRIPT), HCA, IP, NETDEV, str(env_file)], capture_output=True, text=True,
                          env={**os.environ, "SFL_SYSFS": str(root)}, timeout=30)


@pytest.mark.parametrize("index", [3, 4, 5])
def test_it_picks_what_the_deploy_picks(tmp_path, index):
    root = sysfs(tmp_path / "sys", table(index))
    env = tmp_path / "rank.env"
    env.write_text(env_text(index))
    r = run(root, env)
    assert r.returncode == 0, r.stderr
    assert pick_gid_index(gid_table(table(index)), IP, NETDEV) == index
    assert f"RoCE v2 GID index {index} for {IP} on {HCA}/{NETDEV}, as {env} has it" in r.stdout


def test_a_moved_index_is_fixed_in_place_to_what_a_deploy_would_render(tmp_path):
    env = tmp_path / "rank.env"
    env.write_text(env_text(3))  # the deploy saw index 3
    env.chmod(0o600)
    root = sysfs(tmp_path / "sys", table(4))  # after a reboot the fabric GID is at 4
    r = run(root, env)
    assert r.returncode == 0, r.stderr
    assert f"moved from 3 to 4; {env} updated" in r.stdout
    assert env.read_text() == env_text(4)  # byte for byte: the next deploy changes nothing
    assert env.stat().st_mode & 0o777 == 0o600
    assert not list(tmp_path.glob("rank.env.gid.*"))


def test_an_unchanged_index_leaves_the_file_alone(tmp_path):
    env = tmp_path / "rank.env"
    env.write_text(env_text(5))
    before = env.stat()
    r = run(sysfs(tmp_path / "sys", table(5)), env)
    assert r.returncode == 0 and env.stat().st_ino == before.st_ino and env.stat().st_mtime_ns == before.st_mtime_ns


def test_no_gid_for_the_fabric_address_yet_fails_the_start_saying_what_it_saw(tmp_path):
    """A boot before the fabric address is up: only link-local GIDs. The start fails (systemd tries
    again after RestartSec); the env file is not touched."""
    env = tmp_path / "rank.env"
    env.write_text(env_text(3))
    rows = [(0, "IB/RoCE v1", NETDEV, LINK_LOCAL), (1, "RoCE v2", NETDEV, LINK_LOCAL)]
    r = run(sysfs(tmp_path / "sys", rows), env)
    assert r.returncode == 1
    assert f"no RoCE v2 GID for {IP} on {HCA}/{NETDEV} yet" in r.stderr and "1:fe80:" in r.stderr, r.stderr
    assert env.read_text() == env_text(3)


def test_a_roce_v1_gid_of_the_address_is_not_taken(tmp_path):
    env = tmp_path / "rank.env"
    env.write_text(env_text(3))
    rows = [(0, "IB/RoCE v1", NETDEV, LINK_LOCAL), (2, "IB/RoCE v1", NETDEV, ipv4_mapped_gid(IP))]
    assert run(sysfs(tmp_path / "sys", rows), env).returncode == 1
    assert pick_gid_index(gid_table(rows), IP, NETDEV) is None
