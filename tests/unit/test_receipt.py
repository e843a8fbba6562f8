"""The benchmark receipt (roles/receipt): its figures from llama-benchy's report, the comparison
`make status` prints, the fact that reads receipts back, and the load generator run for real against
the lab's vLLM stand-in (a two-rank pair on 127.0.0.1) with a key and a word-level tokenizer."""
import copy
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roles.receipt.receipt import Receipts, drops, figures, status_lines, table
from tests.unit import test_lab_standin as standin

REPO = Path(__file__).resolve().parents[2]
RECORDED = json.loads((REPO / "tests/unit/fixtures/receipt_lab.json").read_text())  # a lab deploy's receipt


def test_figures_are_llama_benchys_means_per_concurrency():
    got = figures(RECORDED["report"])
    assert [f["concurrency"] for f in got] == [1, 4]
    runs = {r["concurrency"]: r for r in RECORDED["report"]["benchmarks"]}
    for f in got:
        run = runs[f["concurrency"]]
        assert f["decode_tps_aggregate"] == round(run["tg_throughput"]["mean"], 2)
        assert f["decode_tps_per_request"] == round(run["tg_req_throughput"]["mean"], 2)
        assert f["ttft_ms"] == round(run["e2e_ttft"]["mean"], 2)
        assert (f["prompt_tokens"], f["decode_tokens"]) == (512, 64)


def scaled(receipt, key, concurrency, factor):
    out = copy.deepcopy(receipt)
    for f in out["figures"]:
        if f["concurrency"] == concurrency:
            f[key] = round(f[key] * factor, 2)
    return out


def test_a_drop_beyond_the_threshold_is_flagged_with_the_numbers_and_a_smaller_one_is_not():
    previous = RECORDED
    assert drops(previous, previous, 10) == []
    slower = scaled(previous, "decode_tps_aggregate", 4, 0.8)
    [line] = drops(slower, previous, 10)
    old = next(f for f in previous["figures"] if f["concurrency"] == 4)["decode_tps_aggregate"]
    assert line.startswith(f"DROP at concurrency 4: decode t/s aggregate {old} -> ") and "(-20.0 %, threshold 10 %)" in line
    assert drops(scaled(previous, "decode_tps_aggregate", 4, 0.95), previous, 10) == []
    assert drops(scaled(previous, "decode_tps_aggregate", 4, 1.5), previous, 10) == []  # faster is no drop
    [ttft] = drops(scaled(previous, "ttft_ms", 1, 1.25), previous, 10)  # for TTFT, higher is worse
    assert ttft.startswith("DROP at concurrency 1: TTFT ms") and "+25.0 %" in ttft


def test_status_shows_the_latest_then_the_previous_then_the_verdict():
    assert status_lines([], 10) == ["no receipt yet (one is taken after every deploy that restarts the pair)"]
    one = status_lines([RECORDED], 10)
    assert one[0].startswith(f"receipt {RECORDED['taken_at']}: profile glm-5.3-flash-exl3") and \
        one[-1] == "no previous receipt to compare with"
    latest = scaled(RECORDED, "decode_tps_per_request", 1, 0.5)
    two = status_lines([latest, RECORDED], 10)
    assert two[:len(table(latest).splitlines())] == table(latest).splitlines()
    assert any(line.startswith("previous receipt ") for line in two)
    assert two[-1].startswith("DROP at concurrency 1: decode t/s per request")
    assert status_lines([RECORDED, RECORDED], 10)[-1] == "no figure dropped by more than 10 %"


def test_the_receipts_fact_reads_the_newest_two_and_skips_a_torn_file():
    fact = Receipts()
    assert "sort -r | head -2" in fact.command("/var/lib/sparkfleet/receipts/p")
    text = json.dumps(RECORDED, indent=1)
    assert fact.process(text.splitlines() + ["#--", "{not json", "#--"]) == [RECORDED]
    assert fact.process([]) == []


def make_models():
    spec = importlib.util.spec_from_file_location("make_models", REPO / "lab/model/make-models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_load_generator_measures_a_real_stand_in_pair_with_the_key_from_stdin(launch, tmp_path):
    """llama-benchy's load through the key-protected API of a two-rank stand-in: a streamed first
    token first, then one pass per concurrency with exactly the asked decode length."""
    (tmp_path / "tokenizer.json").write_bytes(make_models().tokenizer_json())
    ports, key = {"http": standin.free_port(), "master": standin.free_port()}, "k" * 32
    run = lambda *args, **extra: launch([sys.executable, str(standin.VLLM), *args], standin.env(**extra))  # noqa: E731
    standin.start_pair(run, ports, head_env={"VLLM_API_KEY": key})
    base = f"http://127.0.0.1:{ports['http']}/v1"
    job = {"base_url": base, "api_key": key, "model": "lab", "tokenizer": str(tmp_path), "prompt_tokens": 64,
           "decode_tokens": 16, "concurrency": [1, 2], "runs": 1, "timeout_s": 30}
    before = time.time()
    done = subprocess.run([sys.executable, "-m", "roles.receipt.loadgen"], input=json.dumps(job), cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert before < result["first_token_at"] < time.time()
    got = figures(result["report"])
    assert [(f["concurrency"], f["decode_tokens"]) for f in got] == [(1, 16), (2, 16)]
    assert all(f["decode_tps_aggregate"] > 0 and f["ttft_ms"] > 0 for f in got)
    wrong = subprocess.run([sys.executable, "-m", "roles.receipt.loadgen"], input=json.dumps({**job, "api_key": "x" * 32}),
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert wrong.returncode != 0 and "401" in wrong.stderr
