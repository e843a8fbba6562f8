"""roles/fabric_speed: the verdict (due or not), the bars, the buffer from the memory budget, and the
parsers of what iperf3, ib_write_bw and the collective's runner print."""
import json
from pathlib import Path

import pytest

from roles.fabric_speed.checks import (
    buffer_mib, decide, gather_args, gather_docker_args, gather_failures, gather_figure, ib_client_command,
    ib_reports, ib_server_command, ib_write_bw_gbits, iperf3_client_command, iperf3_gbits, proof_key, rdma_failures,
    record_text, speed_links, tcp_failures, why_due,
)
from sparkfleet.model.serving import node_profile
from sparkfleet.config import ConfigError, build_cluster
from tests.unit.helpers import ONE_HALF, pair

FIXTURES = Path(__file__).parent / "fixtures"


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
    assert proof_key(spark(fabric_speed_min_rdma_gbits=100.0), "img:1") != key
    assert proof_key(build_cluster(pair(**{h: {**ONE_HALF, "fabric_speed_link_test": "ib_write_bw"}
                                           for h in ("spark-a", "spark-b")})), "img:1") != key
    # a failed or foreign record is no record
    assert why_due(c, key, {"spark-a": passed, "spark-b": json.dumps({"key": key, "passed": False})}) \
        == "no passed proof on spark-b"
    assert why_due(c, key, {"spark-a": passed, "spark-b": "garbage"}) == "no passed proof on spark-b"


def test_nothing_is_due_when_every_test_is_off():
    c = spark(fabric_speed_link_test="off", fabric_speed_collective=False)
    assert decide(c, "img", {}, {}).why is None


def test_ib_write_bw_of_both_halves_parsed_from_a_sparks_report_and_held_to_the_links_bar():
    reports = ib_reports((FIXTURES / "fabric-speed-ib-write-bw-dgx-spark.txt").read_text())
    gbits = {i: ib_write_bw_gbits(r) for i, r in reports.items()}
    assert gbits == {0: 92.41, 1: 91.87}
    (link,) = speed_links(spark())
    assert rdma_failures(link, gbits, 160.0) == []
    # the twin left out: one half's figure alone is below the bar, named with each HCA's figure
    (failure,) = rdma_failures(link, {0: 92.41, 1: 0.0}, 160.0)
    assert failure.startswith("fabric speed: spark-b -> spark-a: ib_write_bw 92.4 Gbit/s over 2 HCA(s) "
                              "(rocep1s0f0 92.4, roceP2p1s0f0 0.0), below the bar of 160 Gbit/s")
    assert "one HCA of the port's two left out" in failure
    with pytest.raises(ValueError, match="reported no bandwidth"):
        ib_write_bw_gbits("Couldn't connect to 10.77.77.1:29510")


def test_ib_write_bw_connects_each_half_by_its_address_on_its_own_port():
    (link,) = speed_links(spark())
    server, client = ib_server_command(link, 29510, 5), ib_client_command(link, 29510, 5)
    assert "ib_write_bw -d rocep1s0f0 -R -F --report_gbits -D 5 -p 29510 >" in server
    assert "ib_write_bw -d roceP2p1s0f0 -R -F --report_gbits -D 5 -p 29511 >" in server
    assert "ib_write_bw -d rocep1s0f0 -R -F --report_gbits -D 5 -p 29510 10.77.77.1 >" in client
    assert "ib_write_bw -d roceP2p1s0f0 -R -F --report_gbits -D 5 -p 29511 10.77.78.1 >" in client


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
    assert failure.startswith("fabric speed: spark-b enP2p1s0f0np0/roceP2p1s0f0 -> spark-a enP2p1s0f0np0 "
                              "(10.77.78.1): iperf3 0.20 Gbit/s, below the bar of 1 Gbit/s (fabric_speed_min_tcp_gbits)")
    with pytest.raises(ValueError, match="iperf3: unable to connect"):
        iperf3_gbits(json.dumps({"error": "unable to connect to server"}))


def test_the_collectives_buffer_comes_from_the_memory_budget_never_the_playbooks_16_gb():
    c = spark()
    # a Spark with the engine stopped: ~118 GiB available -> the 2 GiB cap
    assert buffer_mib(c, {"spark-a": 118.0, "spark-b": 117.0})[0] == 2048
    # the engine up: ~12 GiB left on one node -> (12 - 8) / 2 GiB, a power of two
    mib, why = buffer_mib(c, {"spark-a": 118.0, "spark-b": 12.0})
    assert mib == 2048 and "12.0 GiB available on spark-b" in why
    assert buffer_mib(c, {"spark-a": 118.0, "spark-b": 10.5})[0] == 1024
    # too little: refused, naming the node and the keys, before anything changes
    mib, why = buffer_mib(c, {"spark-a": 118.0, "spark-b": 8.05})
    assert mib is None
    assert why.startswith("fabric speed: spark-b: MemAvailable 8.1 GiB leaves no room for the collective's 64 MiB")
    assert "fabric_speed_collective = false" in why


def test_the_collective_runs_in_the_serving_image_with_the_ranks_env_and_no_weights_caches_or_key():
    c = spark()
    head = c.head
    words = gather_docker_args(node_profile(head), head, "/etc/sparkfleet/fabric-speed.env")
    assert "--gpus=all" in words and "--device=/dev/infiniband" in words and "--network=host" in words
    assert "--env-file=/etc/sparkfleet/fabric-speed.env" in words and "--entrypoint=python3" in words
    assert not [w for w in words if "weights" in w or "kernel-cache" in w or "api-key" in w]
    assert gather_args(c, c.node("spark-b"), 1024) == [
        "--rank", "1", "--world", "2", "--addr", "10.77.77.1", "--port", "29510", "--mib", "1024", "--backend", "nccl"]


def test_the_collectives_figure_is_held_to_nvidias_bar():
    c = spark()
    line = "sfl_gather " + json.dumps({"backend": "nccl", "world": 2, "bytes": 2**31, "busbw_gbytes": 23.74,
                                       "algbw_gbytes": 47.48, "wrong": 0})
    figure = gather_figure("NCCL INFO ...\n" + line + "\n")
    assert gather_failures(c, figure) == []
    (failure,) = gather_failures(c, {**figure, "busbw_gbytes": 3.04})
    assert failure.startswith("fabric speed: all_gather (nccl, 2048 MiB) across spark-a, spark-b: busbw 3.040 GB/s, "
                              "below the bar of 21.875 GB/s")
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
    """Each half's Gbit/s (here a Spark's recorded ib_write_bw report) and the collective's busbw, as the
    node exporter's textfile collector reads them (promtool check metrics), labelled by link and test."""
    import subprocess

    from roles.fabric_speed.checks import half_name, speed_metrics_text

    reports = ib_reports((FIXTURES / "fabric-speed-ib-write-bw-dgx-spark.txt").read_text())
    (link,) = speed_links(spark())
    figures = [{"test": "ib_write_bw", "link": half_name(link, i), "gbits": ib_write_bw_gbits(r)}
               for i, r in sorted(reports.items())]
    figures.append({"test": "all_gather", "backend": "nccl", "busbw_gbytes": 23.74, "algbw_gbytes": 11.87})
    text = speed_metrics_text(figures, 1764858000.7)
    run = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["92.41", "91.87", "23.74", "1764858000"]
    assert lines[0].startswith('sparkfleet_fabric_speed_gbits{test="ib_write_bw",link="spark-b enp1s0f0np0/')
    assert 'sparkfleet_fabric_speed_busbw_gbytes{test="all_gather",backend="nccl"} 23.74' in lines


def test_a_receipt_carries_the_figures_of_a_passed_proof_only():
    from sparkfleet.model.fabric_speed import passed_figures

    figures = [{"test": "iperf3", "link": "spark-b enp1s0f0np0 -> spark-a enp1s0f0np0 (198.19.77.1)", "gbits": 9.4}]
    assert passed_figures(record_text("k1", figures).replace("\n", "")) == figures
    assert passed_figures(None) is None and passed_figures("") is None and passed_figures("{not json") is None
    assert passed_figures(json.dumps({"key": "k1", "passed": False, "figures": figures})) is None
