"""bench/bump_outage.py's pure parts (issue 44 item 3): the poller's log read back, the outage measured
from it, the kernel-cache verdict and the receipt's cold start read from a deploy's output. The bench
itself runs on the lab (`make bench`); nothing here reaches it."""
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bump_outage", REPO / "bench" / "bump_outage.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bump_outage"] = bench  # its dataclasses look their module up there
_spec.loader.exec_module(bench)


def poll_text(*polls: tuple[float, str]) -> str:
    """The poller's lines as the head prints them: `date +%s.%N`, then curl's HTTP code."""
    return "".join(f"{1733400000 + t:.9f} {code}\n" for t, code in polls)


def test_the_pollers_lines_are_read_back_and_a_cut_line_is_skipped():
    text = poll_text((0.0, "200"), (0.25, "503"), (0.5, "000")) + "1733400000.7"
    assert bench.parse_poll_log(text) == [(1733400000.0, True), (1733400000.25, False), (1733400000.5, False)]


def test_a_restart_is_one_run_from_the_last_answer_before_to_the_first_after():
    """A bump whose caches are reused (or a warm start alone): the old pair answers until it stops, the
    new pair from its first answer: the outage spans the two answers around the unanswered polls."""
    log = bench.parse_poll_log(poll_text((0.0, "200"), (0.2, "200"), (0.4, "503"), (0.6, "000"), (30.4, "503"),
                                         (30.6, "200"), (30.8, "200")))
    out = bench.outage(log)
    assert out.seconds == pytest.approx(30.4) and out.unanswered == pytest.approx(30.4)
    assert (out.runs, out.failed, out.answered_between) == (1, 3, 0)


def test_a_prewarm_is_two_runs_with_the_prewarm_pair_answering_between_them():
    """The prewarm stops production, its own pair answers on the production port while it warms up,
    stops, and production starts: two runs of unanswered polls, the outage spanning both."""
    log = bench.parse_poll_log(poll_text((0, "200"), (1, "503"), (40, "503"), (41, "200"), (42, "200"), (43, "200"),
                                         (44, "000"), (80, "000"), (81, "200")))
    out = bench.outage(log)
    assert out.seconds == pytest.approx(81) and out.unanswered == pytest.approx(41 + 38)
    assert (out.runs, out.failed, out.answered_between) == (2, 4, 3)


def test_an_outage_is_measured_only_between_answers():
    assert bench.outage(bench.parse_poll_log(poll_text((0, "200"), (1, "200")))) is None
    with pytest.raises(ValueError, match="did not serve when the measure began"):
        bench.outage(bench.parse_poll_log(poll_text((0, "503"), (1, "200"))))
    with pytest.raises(ValueError, match="did not serve again"):
        bench.outage(bench.parse_poll_log(poll_text((0, "200"), (1, "503"))))
    with pytest.raises(ValueError, match="no poll"):
        bench.outage([])


def test_a_poll_that_timed_out_after_the_pair_served_again_is_no_part_of_the_outage():
    log = bench.parse_poll_log(poll_text((0, "200"), (1, "503"), (10, "200"), (11, "000")))
    assert bench.until_answered(log, after=1733400005.0) == log[:3]
    assert bench.outage(bench.until_answered(log, after=1733400005.0)).seconds == pytest.approx(10)
    assert bench.until_answered(log, after=1733400099.0) == log  # no answer after it: the log as it is


DEPLOY_REUSED = """\
--> sparkfleet kernel caches (sparkfleet-lab/vllm-cpu:d10e976f14c3): decided after the build: the image is built in this run; ...
--> Starting operation: roles/kernel_cache/tasks.py | Reuse or prewarm the kernel caches (decided after the build)
    [spark-a] kernel caches, decided after the build (sparkfleet-lab/vllm-cpu:d10e976f14c3): generation e-0123456789ab-89abcdef identical on every rank (41 files); generation e-0123456789ab-89abcdef reused for image 77aa77aa77aa (sealed under 1111aaaa2222): the engine (...)
    [spark-a] Success
receipt 2026-12-06T10:00:00Z: profile lab-vllm-cpu, vllm 0.32.0+cpu, recipe d10e976f14c3, image sha256:77aa77aa77aa, weights main; cold start 38.4 s (units started -> first token); 256 prompt
"""
DEPLOY_PREWARMED = """\
--> sparkfleet kernel caches (sparkfleet-lab/vllm-cpu:167932b6ffeb): prewarm (a compile-relevant setting changed: --max-num-seqs unset -> 128), then merge on every rank
    [spark-a] prewarm of generation e-0123456789ab-01234567 (sparkfleet-lab/vllm-cpu:167932b6ffeb)
"""


def test_the_verdict_is_the_one_taken_after_the_build_where_there_is_one_else_the_plans():
    verdict, prewarmed = bench.cache_verdict(DEPLOY_REUSED)
    assert verdict.startswith("generation e-0123456789ab-89abcdef identical on every rank") and "reused for image" in verdict
    assert not prewarmed
    verdict, prewarmed = bench.cache_verdict(DEPLOY_PREWARMED)
    assert verdict == ("prewarm (a compile-relevant setting changed: --max-num-seqs unset -> 128), then merge on "
                       "every rank") and prewarmed
    assert bench.cache_verdict("nothing") == ("no kernel-cache verdict printed", False)


def test_the_receipts_cold_start_is_read_from_the_deploy():
    assert bench.cold_start(DEPLOY_REUSED) == 38.4 and bench.cold_start(DEPLOY_PREWARMED) is None


def test_the_ratio_line_says_whether_the_goal_is_met():
    bump, warm = bench.Outage(40.0, 40.0, 1, 190, 0), bench.Outage(36.0, 36.0, 1, 170, 0)
    assert bench.ratio_line("x", bump, warm, 1.2).endswith("ratio  1.11 (goal <= 1.2: met)")
    assert bench.ratio_line("x", bench.Outage(90.0, 80.0, 2, 400, 12), warm, 1.2).endswith("(goal <= 1.2: NOT met)")
    assert bench.ratio_line("x", bump, warm).endswith("ratio  1.11")
    assert bench.ratio_line("x", None, warm).endswith("outage none, warm start 36.0 s: no ratio")


def test_the_poller_asks_the_api_as_a_client_does_with_the_key_file_and_the_ca(monkeypatch):
    """A chat completion through the head's API proxy (TLS verified with the fleet's CA, the key read by
    curl from the head's root-only config: never on the command line), every POLL_S until told to stop."""
    monkeypatch.setattr(bench, "head_api", lambda: "https://198.18.0.11:8000")
    command = bench.poll_command()
    assert "curl -K /etc/sparkfleet/api-key.curl --cacert /etc/sparkfleet/tls/ca.crt " in command
    assert " https://198.18.0.11:8000/v1/chat/completions " in command and '"max_tokens": 1' in command
    assert f"sleep {bench.POLL_S}" in command and f"while [ ! -e {bench.STOP} ]" in command
    assert "-k " not in command and "Authorization" not in command
