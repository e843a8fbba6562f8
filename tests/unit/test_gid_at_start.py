"""roles/serving/sfl_gid.sh, run by an RDMA rank's unit before every start: it reads the RoCE v2 GID
index again (it moves after a reboot or a link event) the way the deploy does, and fixes the env file
in place, so the next deploy, which renders from the same sysfs, finds nothing to change.

The lab has no RDMA: the script runs here against sysfs trees laid out as a Spark's, with GID tables
as recorded on real machines (tests/unit/test_serving_config.py keeps the deploy's side)."""
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from roles.monitoring.checks import gid_metrics_files, rules_text
from roles.serving.checks import rendered_files, unit_path
from sparkfleet.model.engine import env_file_path
from sparkfleet.roce_gid import ipv4_mapped_gid, pick_gid_index
from tests.unit.test_serving_config import LINK_LOCAL, gid_table
from sparkfleet.model.monitoring import TEXTFILE_DIR
from sparkfleet.model.serving import SFL_GID
from tests.unit.test_monitoring import fleet as monitoring_fleet
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


# --- the GID index as metrics: what the start wrote against what the timer reads now (SparkfleetGidMoved)

def metrics_run(root, *args, textfile_dir):
    return subprocess.run(["sh", str(SCRIPT), *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "SFL_SYSFS": str(root), "SFL_GID_TEXTFILE_DIR": str(textfile_dir)})


def sample(path: Path) -> tuple[str, str]:
    """(series, value) of the one sample a textfile sfl_gid.sh wrote holds."""
    [line] = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    series, value = line.rsplit(" ", 1)
    return series, value


def test_the_index_a_start_found_and_the_index_now_are_textfile_metrics_the_gid_alert_reads(tmp_path, promtool):
    """The start writes the index it found (3); the GID moves to 4 under the running engine and the
    timer's --now writes 4; then the address loses its GID and --now writes -1, exiting 0. The files
    are valid textfile metrics, and their series, fed to the rendered rules, fire SparkfleetGidMoved
    for the moved index and again for the lost one."""
    metrics, env = tmp_path / "textfile", tmp_path / "rank.env"
    env.write_text(env_text(3))
    started = metrics_run(sysfs(tmp_path / "sys3", table(3)), HCA, IP, NETDEV, str(env), textfile_dir=metrics)
    assert started.returncode == 0, started.stderr
    moved = metrics_run(sysfs(tmp_path / "sys4", table(4)), "--now", HCA, IP, NETDEV, textfile_dir=metrics)
    assert moved.returncode == 0, moved.stderr
    at_start, now = sample(metrics / f"sparkfleet-gid-start-{HCA}.prom"), sample(metrics / f"sparkfleet-gid-{HCA}.prom")
    assert at_start == (f'sparkfleet_rdma_gid_index_at_start{{hca="{HCA}",device="{NETDEV}"}}', "3")
    assert now == (f'sparkfleet_rdma_gid_index{{hca="{HCA}",device="{NETDEV}"}}', "4")
    for path in metrics.iterdir():
        check = subprocess.run([promtool, "check", "metrics"], input=path.read_text(), capture_output=True, text=True)
        assert check.returncode == 0, f"{path.name}: {check.stdout}{check.stderr}"
    rows = [(0, "IB/RoCE v1", NETDEV, LINK_LOCAL), (1, "RoCE v2", NETDEV, LINK_LOCAL)]
    lost = metrics_run(sysfs(tmp_path / "sys-none", rows), "--now", HCA, IP, NETDEV, textfile_dir=metrics)
    assert lost.returncode == 0, lost.stderr
    gone = sample(metrics / f"sparkfleet-gid-{HCA}.prom")
    assert gone == (now[0], "-1")
    assert sorted(p.name for p in metrics.iterdir()) == sorted([f"sparkfleet-gid-start-{HCA}.prom", f"sparkfleet-gid-{HCA}.prom"])  # no temporaries left

    # The scraped series as Prometheus keeps them (the scrape config adds these labels), into the rules.
    scrape = {"node": "spark-b", "group": "pair", "rank": "1", "job": "node", "instance": "10.0.0.12:9100"}

    def scraped(series: str) -> str:
        return series[:-1] + "".join(f', {k}="{v}"' for k, v in scrape.items()) + "}"

    def fired(value: str) -> list[dict]:
        return [{"exp_labels": {"severity": "warning", "hca": HCA, "device": NETDEV, **scrape},
                 "exp_annotations": {"summary": f"spark-b: the RoCE v2 GID index of {HCA} ({NETDEV}) is {value} now, "
                                                "not the one its engine started with; restart the pair"}}]
    case = {"rule_files": ["sparkfleet.rules.yml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [{"series": scraped(at_start[0]), "values": f"{at_start[1]}x40"},
                         {"series": scraped(now[0]), "values": f"{at_start[1]}x3 {now[1]}x15 {gone[1]}x20"}],
        "alert_rule_test": [
            {"eval_time": "30s", "alertname": "SparkfleetGidMoved", "exp_alerts": []},
            {"eval_time": "3m", "alertname": "SparkfleetGidMoved", "exp_alerts": fired(now[1])},
            {"eval_time": "8m", "alertname": "SparkfleetGidMoved", "exp_alerts": fired(gone[1])},
        ]}]}
    (tmp_path / "sparkfleet.rules.yml").write_text(rules_text(monitoring_fleet()))
    (tmp_path / "gid.test.yml").write_text(yaml.safe_dump(case))
    run = subprocess.run([promtool, "test", "rules", "gid.test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_metric_that_cannot_be_written_never_fails_the_start(tmp_path):
    env = tmp_path / "rank.env"
    env.write_text(env_text(3))
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    r = metrics_run(sysfs(tmp_path / "sys", table(3)), HCA, IP, NETDEV, str(env), textfile_dir=blocked)
    assert r.returncode == 0, r.stderr
    assert f"could not write {blocked}/sparkfleet-gid-start-{HCA}.prom (the metric only; the start goes on)" in r.stderr
    assert env.read_text() == env_text(3)


def test_an_rdma_node_gets_the_gid_timer_at_the_scrape_interval_and_the_lab_none():
    """Each RDMA half's --now line in the timer's service, its interval from data; the unit's start
    lines write the index they found; a node without RDMA (the lab) gets neither."""
    node = cluster("spark1").node("spark-b")
    files = gid_metrics_files(node)
    service = files["/etc/systemd/system/sparkfleet-gid-metrics.service"]
    timer = files["/etc/systemd/system/sparkfleet-gid-metrics.timer"]
    halves = [h for h in node.fabric_halves if h.hca]
    assert halves and [line for line in service.splitlines() if line.startswith("ExecStart=")] == [
        f"ExecStart={SFL_GID} --now {h.hca} {h.ip} {h.netdev}" for h in halves]
    assert f"Environment=SFL_GID_TEXTFILE_DIR={TEXTFILE_DIR}" in service
    assert f"OnUnitActiveSec={node.monitoring_scrape_interval_s}s" in timer
    unit = rendered_files(cluster("spark1"), node, 3)[unit_path(node)][0]
    assert f"ExecStartPre=/usr/bin/env SFL_GID_TEXTFILE_DIR={TEXTFILE_DIR} {SFL_GID} " in unit
    lab = cluster("lab").node("spark-b")
    assert not lab.rdma_hca and gid_metrics_files(lab) == {}
