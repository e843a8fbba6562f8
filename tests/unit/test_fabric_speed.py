"""roles/fabric_speed: the verdict (due or not), the bars, the buffer from the memory budget, and the
parsers of what iperf3, ib_write_bw, nccl-tests' all_gather_perf and the collective's runner print.

The bars are held to real Sparks' figures (tests/unit/fixtures/captures/, README.md there names each
source): healthy pairs pass, degraded ones are refused naming the half (ib_write_bw) or the size and
its bar (the collective)."""
import json
import os
import re
import runpy
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roles.fabric_speed.checks import (
    MIB, all_gather_perf_figures, buffer_mib, decide, gather_args, gather_docker_args, gather_failures, gather_figure,
    ib_client_command, ib_reports, ib_server_command, ib_write_bw_gbits, ib_write_bw_rows, iperf3_client_command,
    iperf3_gbits, proof_key, rdma_failures, record_text, speed_links, tcp_failures, why_due,
    LISTENER_DIR, LISTENER_GRACE_S, LISTENER_KILL_AFTER_S, RDMA_CM_LISTENING, TCP_LISTENING, bounded_listeners,
    iperf3_server_command, listener_limit, listening_wait, stop_listeners_command, tcp_figures,
)
from sparkfleet.model.fabric_speed import (
    HEALTHY_ALL_GATHER_CURVE, NVIDIA_BUSBW_BAR_GBYTES, NVIDIA_BUSBW_BAR_MIB, curve_bars,
)
from sparkfleet.model.serving import node_profile
from sparkfleet.config import ConfigError, build_cluster
from tests.unit.helpers import ONE_HALF, capture, pair

REPO = Path(__file__).resolve().parents[2]
# ib_write_bw on real Sparks (captures/README.md): NVIDIA's guide runs one client per half of one pair at
# once (plain mode, one QP each); eugr's and gb10-training's run -R -q 4 on one device, the other idle;
# the 13 Gb/s report's rows are both rails of a link whose cable was plugged in after boot.
GUIDE_HALF_0, GUIDE_HALF_1 = "ibwb_nvidia_guide_client1_rocep1s0f0.txt", "ibwb_nvidia_guide_client2_roceP2p1s0f0.txt"
RDMA_CM_4QP = ("ibwb_eugr_networking_rdma_cm_4qp.txt", "ibwb_gb10_training_promaxgb10_rdma_cm.txt")
RAILS_13_GBITS = "ibwb_13gbps_two_rails_hotplug.txt"
# all_gather_perf on real Spark pairs: two at 16 GiB (healthy; MTU 1500), the one published curve that
# reaches 16 GiB (the bars' source), and one pair through a switch after a reboot and after a recabling.
HEALTHY_16G, MTU1500_16G = "nccl_allgather_promaxgb10_16g.txt", "nccl_allgather_playbooks_issue25_mtu1500.txt"
CURVE = "nccl_allgather_route179_512m_16g.txt"
SWITCH_HEALTHY, RECABLED = ("nccl_allgather_switch_after_reboot_1g_4g.txt",
                            "nccl_allgather_recabled_until_reboot_1g_4g.txt")


def spark(**data):
    return build_cluster(pair(**{h: {"fabric_speed_link_test": "ib_write_bw", **data} for h in ("spark-a", "spark-b")}))


def test_a_pair_is_one_link_over_both_halves_the_lower_rank_serving():
    (link,) = speed_links(spark())
    assert (link.server.name, link.client.name) == ("spark-a", "spark-b")
    assert [(s.netdev, s.ip, c.ip, c.hca) for s, c in link.halves] == [
        ("enp1s0f0np0", "10.77.77.1", "10.77.77.2", "rocep1s0f0"),
        ("enP2p1s0f0np0", "10.77.78.1", "10.77.78.2", "roceP2p1s0f0"),
    ]


def test_the_proof_is_due_without_a_record_and_not_with_a_passed_one_of_this_key():
    c = spark()
    key = proof_key(c, "img:1")
    assert why_due(c, key, {}) == "no passed proof on spark-a, spark-b"
    passed = record_text(key, [])
    assert why_due(c, key, {"spark-a": passed, "spark-b": passed}) is None
    # a run that (re)configures the fabric proves it again, whatever the records say
    assert why_due(c, key, {"spark-a": passed, "spark-b": passed}, reconfigured=True) \
        == "this run (re)configures the fabric"
    # a record of another fabric, bar or image proves nothing now
    assert "changed since spark-b" in why_due(c, key, {"spark-a": passed, "spark-b": record_text("other", [])})
    assert proof_key(c, "img:2") != key
    assert proof_key(spark(fabric_speed_min_rdma_half_gbits=80.0), "img:1") != key
    assert proof_key(spark(fabric_speed_rdma_qps=1), "img:1") != key
    assert proof_key(spark(fabric_speed_busbw_bars_gbytes={2048: 19.0}), "img:1") != key
    assert proof_key(build_cluster(pair(**{h: {**ONE_HALF, "fabric_speed_link_test": "ib_write_bw"}
                                           for h in ("spark-a", "spark-b")})), "img:1") != key
    # a failed or foreign record is no record
    assert why_due(c, key, {"spark-a": passed, "spark-b": json.dumps({"key": key, "passed": False})}) \
        == "no passed proof on spark-b"
    assert why_due(c, key, {"spark-a": passed, "spark-b": "garbage"}) == "no passed proof on spark-b"


def test_nothing_is_due_when_every_test_is_off():
    c = spark(fabric_speed_link_test="off", fabric_speed_collective=False)
    assert decide(c, "img", {}, {}).why is None


def test_ib_write_bw_parsed_on_every_capture_plain_and_rdma_cm_one_row_and_run_infinitely():
    # --run_infinitely: one row per interval, the half's figure their mean to perftest's two decimals
    assert ib_write_bw_rows(capture(GUIDE_HALF_0)) == [92.57, 92.57, 92.57, 92.56, 92.57]
    assert ib_write_bw_rows(capture(GUIDE_HALF_1)) == [97.28, 97.28, 97.28, 97.28, 97.29, 97.28]
    assert (ib_write_bw_gbits(capture(GUIDE_HALF_0)), ib_write_bw_gbits(capture(GUIDE_HALF_1))) == (92.57, 97.28)
    # -R -q 4, a timed run: one row
    assert [ib_write_bw_rows(capture(name)) for name in RDMA_CM_4QP] == [[111.71], [111.61]]
    # the rails report: the header and one row per rail
    assert ib_write_bw_rows(capture(RAILS_13_GBITS)) == [13.33, 13.23]
    with pytest.raises(ValueError, match="reported no bandwidth"):
        ib_write_bw_gbits("Couldn't connect to 10.77.77.1:29510")


def guide_pair_output() -> str:
    """NVIDIA's guide's two clients, one per half of one pair at once: what ib_client_command prints."""
    return f"== 0\n{capture(GUIDE_HALF_0)}\n== 1\n{capture(GUIDE_HALF_1)}"


def test_a_healthy_pairs_halves_each_pass_the_bar_per_half():
    (link,) = speed_links(spark())
    bar = link.server.fabric_speed_min_rdma_half_gbits
    gbits = {i: ib_write_bw_gbits(r) for i, r in ib_reports(guide_pair_output()).items()}
    assert gbits == {0: 92.57, 1: 97.28}
    assert rdma_failures(link, gbits, bar) == []
    # NVIDIA's 175 Gbit/s for the port over its two halves; the lowest healthy half clears it
    assert bar == NVIDIA_BUSBW_BAR_GBYTES * 8 / 2 == 87.5
    # one device alone with four QPs (the other idle) passes the bar of a port of one half
    (one,) = speed_links(build_cluster(pair(**{h: {**ONE_HALF, "fabric_speed_link_test": "ib_write_bw"}
                                               for h in ("spark-a", "spark-b")})))
    assert [rdma_failures(one, {0: ib_write_bw_gbits(capture(name))}, bar) for name in RDMA_CM_4QP] == [[], []]


def test_the_13_gbits_link_is_refused_naming_each_half_with_every_halfs_figure():
    (link,) = speed_links(spark())
    gbits = dict(enumerate(ib_write_bw_rows(capture(RAILS_13_GBITS))))
    first, twin = rdma_failures(link, gbits, link.server.fabric_speed_min_rdma_half_gbits)
    assert first.startswith("fabric speed: spark-b enp1s0f0np0/rocep1s0f0 -> spark-a enp1s0f0np0/rocep1s0f0 "
                            "(10.77.77.1): ib_write_bw 13.33 Gbit/s, below the bar of 87.5 Gbit/s per half "
                            "(fabric_speed_min_rdma_half_gbits; the link's halves, all at once: rocep1s0f0 13.33, "
                            "roceP2p1s0f0 13.23)")
    assert twin.startswith("fabric speed: spark-b enP2p1s0f0np0/roceP2p1s0f0 -> spark-a enP2p1s0f0np0/roceP2p1s0f0 "
                           "(10.77.78.1): ib_write_bw 13.23 Gbit/s, below the bar of 87.5 Gbit/s per half")
    assert "a cable plugged in after boot" in first and "a controller at PCIe x2" in twin


def test_one_degraded_half_is_refused_alone_the_healthy_one_named_beside_it():
    """A healthy half (NVIDIA's guide) beside a half at the 13 Gb/s report's figure: the sum, 105.8,
    would say only that the link is slow; the verdict per half names which."""
    (link,) = speed_links(spark())
    gbits = {0: ib_write_bw_gbits(capture(GUIDE_HALF_0)), 1: ib_write_bw_rows(capture(RAILS_13_GBITS))[1]}
    (failure,) = rdma_failures(link, gbits, link.server.fabric_speed_min_rdma_half_gbits)
    assert failure.startswith("fabric speed: spark-b enP2p1s0f0np0/roceP2p1s0f0 -> spark-a enP2p1s0f0np0/"
                              "roceP2p1s0f0 (10.77.78.1): ib_write_bw 13.23 Gbit/s")
    assert "the link's halves, all at once: rocep1s0f0 92.57, roceP2p1s0f0 13.23" in failure


def test_ib_write_bw_connects_each_half_by_its_address_on_its_own_port_with_the_pinned_qps_and_size():
    (link,) = speed_links(spark())
    server, client = ib_server_command(link, 29510, 5, 4), ib_client_command(link, 29510, 5, 4)
    assert "ib_write_bw -d rocep1s0f0 -R -q 4 -s 65536 -F --report_gbits -D 5 -p 29510'" in server
    assert "ib_write_bw -d roceP2p1s0f0 -R -q 4 -s 65536 -F --report_gbits -D 5 -p 29511'" in server
    assert "ib_write_bw -d rocep1s0f0 -R -q 4 -s 65536 -F --report_gbits -D 5 -p 29510 10.77.77.1 >" in client
    assert "ib_write_bw -d roceP2p1s0f0 -R -q 4 -s 65536 -F --report_gbits -D 5 -p 29511 10.77.78.1 >" in client
    assert spark().head.fabric_speed_rdma_qps == 4


def test_iperf3_per_half_bound_to_its_addresses_and_held_to_the_bar():
    c = build_cluster(pair())
    (link,) = speed_links(c)
    s, cl = link.halves[1]
    assert "iperf3 --client 10.77.78.1 --bind 10.77.78.2 --port 29510 --time 2 --json" in \
        iperf3_client_command(s, cl, 29510, 2)
    report = json.dumps({"end": {"sum_received": {"bits_per_second": 13.4e9}, "sum_sent": {"bits_per_second": 13.5e9}}})
    assert iperf3_gbits(report) == pytest.approx(13.4)
    assert tcp_failures(link, {0: 13.4, 1: 12.0}, 1.0) == []
    (failure,) = tcp_failures(link, {0: 13.4, 1: 0.2}, 1.0)
    assert failure.startswith("fabric speed: spark-b enP2p1s0f0np0/roceP2p1s0f0 -> spark-a enP2p1s0f0np0/roceP2p1s0f0 "
                              "(10.77.78.1): iperf3 0.20 Gbit/s, below the bar of 1 Gbit/s (fabric_speed_min_tcp_gbits)")
    with pytest.raises(ValueError, match="iperf3: unable to connect"):
        iperf3_gbits(json.dumps({"error": "unable to connect to server"}))


def _client_run(tmp_path, refusals: int, status: int) -> tuple[str, int]:
    """The client command in a real shell, `iperf3` on its PATH answering the first `refusals` calls
    with Debian 12's recorded refusal (exit `status`), then with a report: its output, and the calls."""
    tmp_path.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    fake = tmp_path / "iperf3"
    report = json.dumps({"end": {"sum_received": {"bits_per_second": 9.5e9}}})
    fake.write_text(f"#!/bin/sh\necho x >> {calls}\n"
                    f"if [ $(wc -l < {calls}) -le {refusals} ]; then cat {REFUSED}; exit {status}; fi\n"
                    f"echo '{report}'\n")
    fake.chmod(0o755)
    (link,) = speed_links(build_cluster(pair()))
    s, cl = link.halves[0]
    out = subprocess.run(["sh", "-c", iperf3_client_command(s, cl, 29510, 1)], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}, timeout=30)
    return out.stdout, len(calls.read_text().splitlines())


REFUSED = REPO / "tests/unit/fixtures/iperf3-3.12-refused.json"


def test_a_refused_client_is_tried_again_whatever_iperf3s_exit_status_says(tmp_path):
    """iperf3 3.12 --json exits 0 on a refused connection (the recording): the loop goes by the
    report's error, so a server not yet reachable gets its ten tries, under either status."""
    assert '"error":\t"unable to connect to server: Connection refused"' in REFUSED.read_text()
    for status in (0, 1):
        out, calls = _client_run(tmp_path / str(status), refusals=3, status=status)
        assert calls == 4 and iperf3_gbits(out) == pytest.approx(9.5)
    out, calls = _client_run(tmp_path / "never", refusals=99, status=0)
    assert calls == 10
    with pytest.raises(ValueError, match="iperf3: unable to connect to server: Connection refused"):
        iperf3_gbits(out)


def test_the_collectives_buffer_is_the_largest_size_with_a_bar_the_memory_budget_allows():
    c = spark()
    # a Spark with the engine stopped: ~118 GiB available -> the 2 GiB cap, held to that size's bar
    mib, why = buffer_mib(c, {"spark-a": 118.0, "spark-b": 117.0})
    assert mib == 2048 and why.startswith("2048 MiB, held to 20.419 GB/s busbw (budget: 117.0 GiB available on spark-b")
    # the engine up: ~12 GiB left on one node -> (12 - 8) / 2 GiB
    mib, why = buffer_mib(c, {"spark-a": 118.0, "spark-b": 12.0})
    assert mib == 2048 and "12.0 GiB available on spark-b" in why
    assert buffer_mib(c, {"spark-a": 118.0, "spark-b": 10.5})[0] == 1024
    assert buffer_mib(c, {"spark-a": 118.0, "spark-b": 9.0})[0] == 512
    # too little for the smallest size with a bar: refused, naming the node and the keys, before anything changes
    mib, why = buffer_mib(c, {"spark-a": 118.0, "spark-b": 8.9})
    assert mib is None
    assert why.startswith("fabric speed: spark-b: MemAvailable 8.9 GiB leaves no room for the collective's smallest "
                          "buffer with a bar, 512 MiB (fabric_speed_busbw_bars_gbytes)")
    assert "fabric_speed_collective = false" in why
    # the cap raised to NVIDIA's own size: measured there where memory allows, against NVIDIA's own bar
    mib, why = buffer_mib(spark(fabric_speed_max_buffer_mib=16384), {"spark-a": 118.0, "spark-b": 117.0})
    assert mib == 16384 and why.startswith("16384 MiB, held to 21.875 GB/s busbw")
    # the lab's one bar, a floor at 64 MiB (lab/inventory_vllm_cpu.py)
    lab = spark(fabric_speed_busbw_bars_gbytes={64: 0.05}, fabric_speed_max_buffer_mib=64)
    assert buffer_mib(lab, {"spark-a": 20.0, "spark-b": 20.0})[0] == 64


def test_a_cap_below_every_size_with_a_bar_is_refused_naming_the_key():
    with pytest.raises(ConfigError) as err:
        spark(fabric_speed_max_buffer_mib=256)
    assert "key 'fabric_speed_max_buffer_mib' = 256 is below every size the collective has a bar for" in str(err.value)
    assert "512" in str(err.value)
    with pytest.raises(ConfigError, match="fabric_speed_busbw_bars_gbytes"):
        spark(fabric_speed_busbw_bars_gbytes={2048: 0.0})


def test_the_collective_runs_in_the_serving_image_with_the_ranks_env_and_no_weights_caches_or_key():
    c = spark()
    head = c.head
    words = gather_docker_args(node_profile(head), head, "/etc/sparkfleet/fabric-speed.env")
    assert "--gpus=all" in words and "--device=/dev/infiniband" in words and "--network=host" in words
    assert "--env-file=/etc/sparkfleet/fabric-speed.env" in words and "--entrypoint=python3" in words
    assert not [w for w in words if "weights" in w or "kernel-cache" in w or "api-key" in w]
    assert gather_args(c, c.node("spark-b"), 1024) == [
        "--rank", "1", "--world", "2", "--addr", "10.77.77.1", "--port", "29510", "--mib", "1024", "--backend", "nccl"]


def test_all_gather_perf_parsed_on_every_capture_its_mean_nccl_tests_own_average():
    averaged = []
    for name, sizes in [(HEALTHY_16G, [16384]), (MTU1500_16G, [16384]), (CURVE, [512, 1024, 2048, 4096, 8192, 16384]),
                        (SWITCH_HEALTHY, [1024, 2048, 4096]), (RECABLED, [1024, 2048, 4096])]:
        text = capture(name)
        figures = all_gather_perf_figures(text)
        assert [f["bytes"] // MIB for f in figures] == sizes, name
        assert all(f["wrong"] == 0 for f in figures), name
        # the figure held to a bar is the mean of both runs, as nccl-tests' own 'Avg bus bandwidth' (the
        # issue's paste ends before that line)
        for avg in re.findall(r"# Avg bus bandwidth\s*:\s*([0-9.]+)", text):
            assert sum(f["busbw_gbytes"] for f in figures) / len(figures) == pytest.approx(float(avg), abs=0.005), name
            averaged.append(name)
    assert averaged == [HEALTHY_16G, CURVE, SWITCH_HEALTHY, RECABLED]
    (healthy,) = all_gather_perf_figures(capture(HEALTHY_16G))
    assert (healthy["busbw_out_of_place_gbytes"], healthy["busbw_in_place_gbytes"]) == (22.94, 22.98)
    assert all_gather_perf_figures("NCCL WARN ...\n# Out of bounds values : 0 OK\n") == []


def test_the_bars_are_nvidias_scaled_by_the_captured_healthy_curve_and_shipped_as_derived():
    curve = {f["bytes"] // MIB: (f["busbw_out_of_place_gbytes"], f["busbw_in_place_gbytes"])
             for f in all_gather_perf_figures(capture(CURVE))}
    assert curve == HEALTHY_ALL_GATHER_CURVE
    bars = curve_bars(curve, NVIDIA_BUSBW_BAR_GBYTES, NVIDIA_BUSBW_BAR_MIB)
    assert bars[16384] == NVIDIA_BUSBW_BAR_GBYTES
    assert list(bars.values()) == sorted(bars.values())  # busbw climbs with size, so do the bars
    assert spark().head.fabric_speed_busbw_bars_gbytes == bars
    shipped = runpy.run_path(str(REPO / "group_data" / "all.py"))
    assert shipped["fabric_speed_busbw_bars_gbytes"] == bars
    assert shipped["fabric_speed_min_rdma_half_gbits"] == NVIDIA_BUSBW_BAR_GBYTES * 8 / 2


def test_healthy_pairs_captured_figures_pass_at_their_sizes_bar():
    c = spark()
    (healthy_16g,) = all_gather_perf_figures(capture(HEALTHY_16G))
    assert gather_failures(c, healthy_16g) == []
    for figure in all_gather_perf_figures(capture(CURVE)) + all_gather_perf_figures(capture(SWITCH_HEALTHY)):
        assert gather_failures(c, figure) == [], figure
    # what the issue met: a healthy pair's 2 GiB gather is below NVIDIA's 16 GiB bar, out of place
    # (what the runner measured alone) and even in the mean (the pair through a switch), and passes
    # the bar for 2 GiB
    curve_2g = next(f for f in all_gather_perf_figures(capture(CURVE)) if f["bytes"] == 2048 * MIB)
    switch_2g = next(f for f in all_gather_perf_figures(capture(SWITCH_HEALTHY)) if f["bytes"] == 2048 * MIB)
    assert curve_2g["busbw_out_of_place_gbytes"] < NVIDIA_BUSBW_BAR_GBYTES
    assert switch_2g["busbw_gbytes"] < NVIDIA_BUSBW_BAR_GBYTES
    assert gather_failures(c, curve_2g) == gather_failures(c, switch_2g) == []


def test_degraded_pairs_captured_figures_are_refused_naming_the_size_and_its_bar():
    c = spark()
    (mtu_1500,) = all_gather_perf_figures(capture(MTU1500_16G))
    (failure,) = gather_failures(c, mtu_1500)
    assert failure.startswith("fabric speed: all_gather (nccl, 16384 MiB) across spark-a, spark-b: busbw 19.945 GB/s "
                              "(out-of-place 18.94, in-place 20.95), below the bar of 21.875 GB/s for 16384 MiB "
                              "(fabric_speed_busbw_bars_gbytes); usual causes: an MTU below 9000 on either end")
    recabled = all_gather_perf_figures(capture(RECABLED))
    failures = [gather_failures(c, f) for f in recabled]
    assert [len(f) for f in failures] == [1, 1, 1]
    assert "busbw 2.810 GB/s (out-of-place 2.80, in-place 2.82), below the bar of 18.676 GB/s for 1024 MiB" in failures[0][0]
    assert "below the bar of 20.419 GB/s for 2048 MiB" in failures[1][0]
    assert "a cable plugged in after boot" in failures[2][0]


def test_the_runners_figure_is_held_to_the_bar_of_the_size_it_gathered():
    c = spark()
    line = "sfl_gather " + json.dumps({
        "backend": "nccl", "world": 2, "bytes": 2**31, "busbw_gbytes": 21.375, "busbw_out_of_place_gbytes": 20.9,
        "busbw_in_place_gbytes": 21.85, "algbw_gbytes": 42.75, "wrong": 0})
    figure = gather_figure("NCCL INFO ...\n" + line + "\n")
    assert gather_failures(c, figure) == []
    (failure,) = gather_failures(c, {**figure, "busbw_gbytes": 3.04})
    assert failure.startswith("fabric speed: all_gather (nccl, 2048 MiB) across spark-a, spark-b: busbw 3.040 GB/s "
                              "(out-of-place 20.90, in-place 21.85), below the bar of 20.419 GB/s for 2048 MiB")
    # a size no bar holds for is never passed
    (failure,) = gather_failures(c, {**figure, "bytes": 1000 * MIB})
    assert "no bar for 1000 MiB" in failure
    assert "wrong element" in gather_failures(c, {**figure, "wrong": 5})[0]
    with pytest.raises(ValueError, match="printed no result: Traceback"):
        gather_figure("Traceback (most recent call last): ...")


def test_ib_write_bw_without_rdma_is_refused_naming_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**{h: {"rdma_hca": None, "rdma_twin_hca": None, "fabric_speed_link_test": "ib_write_bw"}
                              for h in ("spark-a", "spark-b")}))
    assert "key 'fabric_speed_link_test' = 'ib_write_bw' needs RDMA" in str(err.value)
    assert "'iperf3'" in str(err.value)


def test_one_bar_per_group():
    with pytest.raises(ConfigError, match="key 'fabric_speed_min_tcp_gbits' differs between nodes"):
        build_cluster(pair(**{"spark-b": {"fabric_speed_min_tcp_gbits": 2.0}}))


def test_the_passed_proofs_figures_are_valid_textfile_metrics(promtool):
    """Each half's Gbit/s (here NVIDIA's guide's two halves) and the collective's busbw, as the
    node exporter's textfile collector reads them (promtool check metrics), labelled by link and test."""
    import subprocess

    from roles.fabric_speed.checks import half_name, speed_metrics_text

    reports = ib_reports(guide_pair_output())
    (link,) = speed_links(spark())
    figures = [{"test": "ib_write_bw", "link": half_name(link, i), "gbits": ib_write_bw_gbits(r)}
               for i, r in sorted(reports.items())]
    figures.append({"test": "all_gather", "backend": "nccl", "busbw_gbytes": 23.74, "algbw_gbytes": 11.87})
    text = speed_metrics_text(figures, 1764858000.7)
    run = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["92.57", "97.28", "23.74", "1764858000"]
    assert lines[0].startswith('sparkfleet_fabric_speed_gbits{test="ib_write_bw",link="spark-b enp1s0f0np0/')
    assert 'sparkfleet_fabric_speed_busbw_gbytes{test="all_gather",backend="nccl"} 23.74' in lines


def test_a_receipt_carries_the_figures_of_a_passed_proof_only():
    from sparkfleet.model.fabric_speed import passed_figures

    figures = [{"test": "iperf3", "link": "spark-b enp1s0f0np0 -> spark-a enp1s0f0np0 (198.19.77.1)", "gbits": 9.4}]
    assert passed_figures(record_text("k1", figures).replace("\n", "")) == figures
    assert passed_figures(None) is None and passed_figures("") is None and passed_figures("{not json") is None
    assert passed_figures(json.dumps({"key": "k1", "passed": False, "figures": figures})) is None


# ------------------------------------------------------------------ the servers: bounded on the node

def test_every_server_of_the_proof_is_bounded_on_the_node_and_a_start_stops_any_left_first():
    """iperf3 in the foreground (a --daemon would leave timeout at once, unbounded), under timeout
    with its kill-after, in a session of its own, its pid kept per port; ib_write_bw's servers the
    same, one per half; each start stops what an earlier run left on those ports before it, and
    returns once its servers listen: iperf3's TCP socket by ss, ib_write_bw's by rdma_cm's own
    listing (no fixed sleep in either)."""
    (link,) = speed_links(spark())
    iperf = iperf3_server_command(link.halves[0][0], 29510, 5)
    assert "--daemon" not in iperf
    assert ("setsid sh -c 'echo $$ > /run/sparkfleet/fabric-speed/29510.pid; exec timeout --kill-after=5 65 "
            "iperf3 --server --one-off --bind 10.77.77.1 --port 29510' > /run/sparkfleet/fabric-speed/29510.log "
            "2>&1 < /dev/null &") in iperf
    assert iperf.index("for f in /run/sparkfleet/fabric-speed/29510.pid;") < iperf.index("setsid")
    assert iperf.index("setsid") < iperf.index("until ss -Hltn 'sport = :29510' 2>/dev/null | grep -q .;")
    ib = ib_server_command(link, 29510, 5, 4)
    assert ib.count("exec timeout --kill-after=5 65 ib_write_bw") == 2
    assert "/run/sparkfleet/fabric-speed/29510.pid" in ib and "/run/sparkfleet/fabric-speed/29511.pid" in ib
    assert ib.index("for f in /run/sparkfleet/fabric-speed/29510.pid /run/sparkfleet/fabric-speed/29511.pid;") \
        < ib.index("setsid")
    assert ("until rdma resource show cm_id state LISTEN src-port 29510 2>/dev/null | grep -q . && "
            "rdma resource show cm_id state LISTEN src-port 29511 2>/dev/null | grep -q .;") in ib
    assert "sleep 1" not in ib and "ss -H" not in ib
    assert listener_limit(5) == 5 + LISTENER_GRACE_S
    assert "/run/sparkfleet/fabric-speed/*.pid" in stop_listeners_command()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_until(predicate, seconds: float) -> float:
    """Seconds it took predicate() to hold (polled every 0.1 s); fails after `seconds`."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < seconds, f"not within {seconds} s"
        time.sleep(0.1)
    return time.monotonic() - start


def http_server(port: int) -> str:
    """A real listener in a server's place: python's http.server on loopback."""
    return f"{sys.executable} -m http.server {port} --bind 127.0.0.1"


def group_alive(pgid: int) -> bool:
    """A process of group `pgid` runs (a zombie does not: where nothing reaps orphans, one stays)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_all(directory) -> None:
    subprocess.run(["sh", "-c", stop_listeners_command(directory=str(directory))], check=True)


def test_a_server_whose_starter_was_killed_is_ended_by_its_bound_on_the_node(tmp_path):
    """The bounded form, run for real: a listener (python's http.server) started as the proof starts
    its servers, from a shell that stays (the SSH session of a run); that session's whole process
    group killed (the controller gone). The listener outlives it, and its bound closes the port."""
    port, limit = free_port(), 3
    command = bounded_listeners([(http_server(port), port)], limit, directory=str(tmp_path))
    session = subprocess.Popen(["sh", "-c", command + "; sleep 600"], start_new_session=True)
    started = time.monotonic()
    try:
        wait_until(lambda: listening(port), 10)
    finally:
        os.killpg(session.pid, signal.SIGKILL)
        session.wait()
    assert listening(port)  # not the session's end: it is in a session of its own
    wait_until(lambda: not listening(port), limit + 10)
    assert time.monotonic() - started >= limit - 0.5  # closed by the bound, not before it


@pytest.mark.parametrize("shell", ["dash", "bash"])
def test_a_start_over_ssh_returns_once_its_server_listens_whatever_the_shell(shell, tmp_path):
    """As pyinfra runs it: `<shell> -c`, its stdout and stderr read to their end. The start returns
    as soon as the server listens, not when the server ends: a background list would hold the
    session's stdout in bash (dash execs its last command), and the start would last the bound."""
    port, limit = free_port(), 20
    try:
        took = time.monotonic()
        done = subprocess.run([shell, "-c", bounded_listeners([(http_server(port), port)], limit,
                                                              directory=str(tmp_path))],
                              capture_output=True, text=True, timeout=60)
        took = time.monotonic() - took
        assert done.returncode == 0 and done.stdout == "", done
        assert listening(port) and took < limit / 2, took
    finally:
        stop_all(tmp_path)


def test_a_start_returns_once_its_server_listens_even_when_the_server_is_slow_to_start(tmp_path):
    """The bounded form starts its server in the background, so the start waits for the port itself
    (listening_wait, polling): a server that takes 1.5 s to listen (a loaded node) takes its client
    at once when the start returns, not after the client's tries ran out."""
    port, limit = free_port(), 30
    server = tmp_path / "slow.py"
    server.write_text("import socket, time\ntime.sleep(1.5)\n"
                      f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen()\ntime.sleep(600)\n")
    try:
        took = time.monotonic()
        subprocess.run(["sh", "-c", bounded_listeners([(f"{sys.executable} {server}", port)], limit,
                                                      directory=str(tmp_path))], check=True, timeout=60)
        assert listening(port), "the start returned before its server listened"
        assert 1.4 <= time.monotonic() - took < 10
    finally:
        stop_all(tmp_path)


def test_a_server_that_cannot_listen_fails_its_start_at_once_with_its_own_words(tmp_path):
    """The port taken (by another listener here, as a server an old run left outside the bound would
    hold it): the server exits; the start does not wait out its limit for it but fails at once,
    naming the port and printing what the server said."""
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        took = time.monotonic()
        done = subprocess.run(["sh", "-c", bounded_listeners([(http_server(port), port)], 60, directory=str(tmp_path))],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and time.monotonic() - took < 10, done
    assert f"port {port}: the server ended before it listened" in done.stderr
    assert "Address already in use" in done.stderr, done.stderr


def test_the_wait_for_a_port_that_never_listens_fails_at_its_limit_naming_the_port(tmp_path):
    port = free_port()
    took = time.monotonic()
    done = subprocess.run(["sh", "-c", listening_wait([port], TCP_LISTENING, str(tmp_path), seconds=1)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and 0.9 <= time.monotonic() - took < 10, done
    assert f"ports {port}: not listening after 1 s (ss -Hltn 'sport = :<port>' printed nothing)" in done.stderr


FAKE_RDMA = """#!/bin/sh
# iproute2's rdma in the lab's absence of RDMA: a listening rdma_cm id per port ib_write_bw marked, in
# the form rdma/res-cmid.c prints one; anything but the exact query the wait makes is refused.
[ "$*" = "resource show cm_id state LISTEN src-port ${7}" ] || { echo "unexpected: $*" >&2; exit 2; }
[ -e "$MARKS/$7" ] && echo "link rocep1s0f0/1 cm-idn 3 state LISTEN ps TCP pid 1 comm ib_write_bw src-addr 0.0.0.0:$7"
exit 0
"""
FAKE_IB_WRITE_BW = """#!/bin/sh
# ib_write_bw's server, as far as the start sees it: a second of start-up, then listening on -p's port.
while [ "$1" != -p ]; do shift; done
sleep 1; touch "$MARKS/$2"; exec sleep 600
"""


def test_ib_write_bws_start_returns_once_rdma_cm_lists_both_halves_listening(tmp_path):
    """ib_write_bw -R holds no TCP socket, so its start polls rdma_cm's listing instead of sleeping a
    second. No RDMA here (nor in the lab): `rdma` and `ib_write_bw` are stand-ins on PATH (the
    listing's line as iproute2 prints it); what runs for real is the start, the bound and the wait.
    It returns once both halves are listed, about a second after the start, then stops clean."""
    bin_dir, marks = tmp_path / "bin", tmp_path / "marks"
    bin_dir.mkdir(), marks.mkdir()
    for name, text in (("rdma", FAKE_RDMA), ("ib_write_bw", FAKE_IB_WRITE_BW)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (link,) = speed_links(spark())
    command = ib_server_command(link, 29510, 5, 4).replace(LISTENER_DIR, str(tmp_path / "run"))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MARKS": str(marks)}
    try:
        took = time.monotonic()
        done = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and 0.9 <= time.monotonic() - took < 10, done
        assert sorted(p.name for p in marks.iterdir()) == ["29510", "29511"]
        groups = sorted(int(f.read_text()) for f in (tmp_path / "run").glob("*.pid"))
        assert len(groups) == 2
    finally:
        stop_all(tmp_path / "run")
    assert not list((tmp_path / "run").iterdir())
    assert not [g for g in groups if group_alive(g)]  # each server's whole process group ended


def test_a_server_that_ignores_term_is_killed_after_its_bound(tmp_path):
    port, limit = free_port(), 2
    server = tmp_path / "deaf.py"
    server.write_text("import signal, socket, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen()\ntime.sleep(600)\n")
    subprocess.run(["sh", "-c", bounded_listeners([(f"{sys.executable} {server}", port)], limit,
                                                  directory=str(tmp_path))], check=True)
    assert listening(port)
    wait_until(lambda: not listening(port), limit + LISTENER_KILL_AFTER_S + 10)


def test_the_proof_stops_its_servers_at_once_and_a_rerun_finds_none(tmp_path):
    """The explicit stop after a link's test (a passed, failed or broken one alike), on a listener
    started as over SSH (the starting shell exits at once): closed in well under its bound, its pid
    file and log gone; stopped again, nothing to do. A start over a server an earlier run left stops
    it first (else the port would be taken, and the start would fail)."""
    port, limit, directory = free_port(), 300, str(tmp_path)
    start = bounded_listeners([(http_server(port), port)], limit, directory=directory)
    subprocess.run(["sh", "-c", start], check=True)
    assert listening(port)
    first = int((tmp_path / f"{port}.pid").read_text())
    subprocess.run(["sh", "-c", start], check=True)  # a re-run's start, over the first's server
    assert listening(port) and int((tmp_path / f"{port}.pid").read_text()) != first
    assert not Path(f"/proc/{first}").exists() or Path(f"/proc/{first}/stat").read_text().split()[2] == "Z"
    took = time.monotonic()
    stop_all(tmp_path)
    assert not listening(port)
    assert time.monotonic() - took < 10 and not list(tmp_path.iterdir())
    again = subprocess.run(["sh", "-c", stop_listeners_command(directory=directory)], capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout == again.stderr == ""


REPORT = json.dumps({"end": {"sum_received": {"bits_per_second": 13.4e9}}})


@pytest.mark.parametrize("client", ["passes", "fails", "prints no report", "interrupted"])
def test_a_links_test_leaves_nothing_listening_whatever_its_outcome(client, tmp_path):
    """tcp_figures as the proof runs it, its commands run on this machine: the server is the bounded
    form of python's http.server in iperf3's place (it would stay up, where iperf3 --one-off ends
    after one test), the client answers as given. In every outcome the server was up while the
    client ran, and is closed when tcp_figures returns or raises, its pid file gone."""
    from pyinfra.api.exceptions import DeployError

    port = free_port()
    (link,) = speed_links(build_cluster(pair()))
    served = []

    def run(name, command, what):
        if "--client" in command:
            wait_until(lambda: listening(port), 10)
            served.append(name)
            if client == "fails":
                raise DeployError(f"fabric speed: {name}: {what} failed:\niperf3: error - unable to connect")
            if client == "interrupted":
                raise KeyboardInterrupt
            return REPORT if client == "passes" else "iperf3: interrupt - the client has terminated"
        assert name == link.server.name and "iperf3 --server --one-off" in command
        local = re.sub(r"iperf3 --server --one-off --bind \S+ --port \d+", http_server(port), command)
        subprocess.run(["sh", "-c", local.replace(LISTENER_DIR, str(tmp_path))], check=True)
        return ""

    def stop(name):
        stop_all(tmp_path)

    if client == "passes":
        assert tcp_figures(link, port, 1, run, stop) == {0: pytest.approx(13.4), 1: pytest.approx(13.4)}
    else:
        with pytest.raises(KeyboardInterrupt if client == "interrupted" else DeployError):
            tcp_figures(link, port, 1, run, stop)
    assert served and not listening(port) and not list(tmp_path.iterdir())
