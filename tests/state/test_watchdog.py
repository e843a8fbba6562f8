"""roles/watchdog on the machines: the files the deploy wrote, the unit as data says, the state each
watchdog writes and its peers read over the fabric, and the program's own verdicts."""
import json

import pytest

from sparkfleet.model.serving import node_profile
from roles.watchdog.node_config import UNIT_PATH, unit_text, watch_config_text
from sparkfleet.model.watchdog import RSYNC_MODULE, SFL_WATCH, WATCH_CONFIG, WATCH_UNIT


def test_the_program_config_and_unit_are_the_rendered_ones(host, node, cluster):
    program = host.file(SFL_WATCH)
    assert program.exists and program.user == "root" and program.mode == 0o755, f"{node.name}: {SFL_WATCH}"
    config = host.file(WATCH_CONFIG)
    assert config.exists and config.user == "root" and config.mode == 0o600, \
        f"{node.name}: {WATCH_CONFIG} missing or not root-only"
    assert config.content_string == watch_config_text(cluster, node, node_profile(node), node), \
        f"{node.name}: {WATCH_CONFIG} differs from what the data renders"
    unit = host.file(UNIT_PATH)
    assert unit.exists and unit.mode == 0o644 and unit.content_string == unit_text(node), f"{node.name}: {UNIT_PATH}"


def test_the_unit_runs_and_starts_at_boot_as_data_says(host, node):
    service = host.service(WATCH_UNIT)
    assert service.is_running == node.watchdog_enabled, f"{node.name}: {WATCH_UNIT} running={service.is_running}"
    want = node.watchdog_enabled and node.serving_start_at_boot
    assert service.is_enabled == want, f"{node.name}: {WATCH_UNIT} enabled={service.is_enabled}, want {want}"


def test_the_watchdog_writes_its_state_and_its_verdict_is_ok(host, node):
    if not node.watchdog_enabled:
        pytest.skip("watchdog_enabled is false")
    state = host.file(f"{node.watchdog_state_dir}/state.json")
    assert state.exists and state.mode == 0o644, f"{node.name}: no watchdog state at {state.path}"
    data = json.loads(state.content_string)
    assert data["role"] == ("head" if node.is_head else "worker") and data["node"] == node.name
    out = host.run(f"python3 {SFL_WATCH} status {WATCH_CONFIG}")
    assert out.rc == 0, f"{node.name}: sfl_watch.py status: {out.stdout.splitlines()[-1:]} {out.stderr}"


def test_each_peer_reads_the_state_over_the_fabric_rsync_daemon(node, cluster, node_hosts):
    if not node.watchdog_enabled:
        pytest.skip("watchdog_enabled is false")
    reader = node_hosts[node.name]
    for peer in cluster.peers(node):
        url = f"rsync://{peer.fabric_ip}:{peer.fanout_rsync_port}/{RSYNC_MODULE}/state.json"
        out = reader.run(f"d=$(mktemp -d) && rsync --timeout=10 --contimeout=10 {url} $d/s.json && cat $d/s.json; "
                         f"r=$?; rm -rf $d; exit $r")
        assert out.rc == 0, f"{node.name}: cannot read {peer.name}'s watchdog state ({url}): {out.stderr}"
        assert json.loads(out.stdout)["node"] == peer.name


def test_the_probe_passes_on_every_rank(host, node):
    out = host.run(f"python3 {SFL_WATCH} probe {WATCH_CONFIG}")
    assert out.rc == 0 and out.stdout.startswith("ok: "), f"{node.name}: probe: {out.stdout.strip()} {out.stderr}"
