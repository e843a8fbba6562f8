"""Benchmark: the first bring-up of a fresh pair, its wall time against its critical path (issue 44 item 1).

The lab is reset to two fresh hosts (lab/lab.sh reset, as `make test` starts its lab tiers) and the
lab's real-engine pair (lab/inventory_vllm_cpu.py: the real vLLM's CPU build, so that the image build,
the prewarm and the start are a real engine's) is deployed once, its weights fetched from the lab's
hub stand-in at an uplink's pace (UPLINK_KIB_S). Then the lab is reset again, so the benchmarks after
this one find a fresh pair, as bench/noop.py --fleet leaves it. Printed:

  wall time       the deploy, `pyinfra -y lab/inventory_vllm_cpu.py deploy.py` from start to exit
  each phase      build image, fetch weights, ship image, ship weights (the fan-out), prewarm, start,
                  receipt: the time at least one of its steps ran (two at once counted once), and when
                  it began and ended from the deploy's start. The steps and their times are the
                  deploy's own record (the receipt's deploy_steps: sparkfleet/progress.py records every
                  long step it watches), not stamps of its output; the start runs from the deploy's
                  restart of the units (the receipt's units_started_at) to the head's /health
  critical path   the longest chain of phases that must follow one another (MUST_FOLLOW, a table with
                  why each edge exists), each phase weighing its measured time: what the bring-up
                  would take if everything that may overlap did; and wall / critical path
  in no phase     the wall time no phase covers: prepare, the fabric's proofs, docker, the engine
                  proof, the kernel caches' merge, the watchdog; then the deploy's slowest operations,
                  from pyinfra's output stamped as it printed (tests/e2e/lab.py), for where to look.

Needs the lab (make lab-up), the real engine's wheelhouse (make lab-wheels) and an x86_64 machine with
AVX2, as tests/real does. `make bench` runs it. Nothing here is a test; the pure parts (the graph, the
phases of a record, the critical path) are unit-tested in tests/unit/test_bringup_bench.py.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from roles.receipt.receipt import RECEIPT_STEP  # noqa: E402
from sparkfleet.model.engine import HEAD_UNIT  # noqa: E402
from tests.e2e.lab import DEPLOY_TIMES, deploy, on, reset_lab  # noqa: E402

INVENTORY = "lab/inventory_vllm_cpu.py"
HEAD = "spark-a"
RECEIPTS = "/var/lib/sparkfleet/receipts/lab-vllm-cpu"  # <receipt_dir>/<profile> on the head
MODELS = "http://198.18.0.1:8089"  # the lab's hub stand-in (lab/lab.sh, lab/model/serve.py)

# The hub stand-in's pace for this bring-up: lab/model/serve.py serves every file under
# /uplink/<KiB/s>/ no faster than that. Chosen so that fetching the pair's model takes about as long as
# its image build, as on a Spark, where the build and the hub download both take tens of minutes. From
# recorded figures: the model, sparkfleet-lab/tiny-llama (lab/model/tiny_llama.py), is 4,504,291 bytes
# (4399 KiB: config, generation config, tokenizer files, the 4.3 MiB safetensors); the image's build
# on the head took 81 s in the last recorded run (docs/lab.md, "Where make test's time goes": tests/real
# alone, the v4 image with its shared wheel layer). 4399 KiB / 81 s = 54 KiB/s. The server keeps to its
# rate: at 320 KiB/s the same fetch took 14 s (commit 7783ee8: 4399 / 320 = 13.7 s). The bench prints
# fetch / build, so a machine where the build is much faster or slower shows it.
UPLINK_KIB_S = 54
RECORDED_BUILD_S = 81  # docs/lab.md; the derivation above (tests/unit/test_bringup_bench.py checks it)

# The phases of a first bring-up and the steps of the deploy each is made of, as sparkfleet/progress.py
# records them (fullmatch): roles/image/checks.py record_base_images ("Pull base image <ref>"),
# roles/image/commands.py build_step, push_step and pull_step, roles/weights/checks.py fetch_step and
# pull_step, roles/kernel_cache/checks.py's prewarm, roles/serving/ready.py's start of the head's unit,
# and the receipt's own (roles/receipt/receipt.py RECEIPT_STEP). Only the head's start counts: the
# workers' engines wait for it, and the head's /health answers once every rank has joined.
PHASE_STEPS: dict[str, tuple[str, ...]] = {
    "build image": (r"Pull base image .+", r"Build .+ on the head"),
    "fetch weights": (r"Fetch .+ at .+ on the head \(.+\)",),
    "ship image": (r"Push .+ to the fabric registry", r"Pull .+ from the head"),
    "ship weights": (r"Send .+ to the workers over the fabric",),
    "prewarm": (r"prewarm",),
    "start": (re.escape(f"start of {HEAD_UNIT}"),),
    "receipt": (re.escape(RECEIPT_STEP),),
}

# Which phases must follow which, and why: the data each needs, not the order the deploy runs them in
# today (issue 44 item 2 overlaps what this table allows). phase -> the phases it must follow.
MUST_FOLLOW: dict[str, tuple[str, ...]] = {
    # The recipe's checkout and its base image are all it needs.
    "build image": (),
    # A URL or directory source is fetched by sfl_files.py on the head, which needs no image (the hub's
    # case: graph_for).
    "fetch weights": (),
    # The head pushes the image it built; each worker pulls it by the digest that push printed.
    "ship image": ("build image",),
    # A worker's pull ends with the head's manifest, written once the whole model is fetched and sealed.
    # Since the pull follows the fetch file by file (sfl_files.py pull --follow), only its part after
    # the fetch's end must follow it: the path weighs that part (for_path).
    "ship weights": ("fetch weights",),
    # The prewarm runs the pair: every rank needs the image and the weights.
    "prewarm": ("ship image", "ship weights"),
    # Production starts on the caches the prewarm filled (and merged), in the memory the prewarm's
    # engines held until they stopped.
    "start": ("prewarm",),
    # The receipt's load goes through the served pair.
    "receipt": ("start",),
}
# With weights_source "hub", the fetch runs the hub client inside the serving image
# (roles/weights/checks.py _fetch), so it must follow the build too.
HUB_FETCH_FOLLOWS = ("build image",)

Interval = tuple[float, float]


def graph_for(weights_source: str) -> dict[str, tuple[str, ...]]:
    """MUST_FOLLOW for a deploy fetching from `weights_source`."""
    if weights_source != "hub":
        return dict(MUST_FOLLOW)
    return {**MUST_FOLLOW, "fetch weights": (*MUST_FOLLOW["fetch weights"], *HUB_FETCH_FOLLOWS)}


def phase_of(step: str) -> str | None:
    """The phase a recorded step belongs to (PHASE_STEPS), or None: a step of no phase."""
    for phase, patterns in PHASE_STEPS.items():
        if any(re.fullmatch(pattern, step) for pattern in patterns):
            return phase
    return None


def phase_intervals(record: Mapping) -> dict[str, list[Interval]]:
    """phase -> its steps' (start, end), from a receipt (its deploy_steps and units_started_at). The
    start runs from the units' restart to the end of the head's /health wait. A failed step is refused:
    a bring-up that failed has no critical path to compare with."""
    out: dict[str, list[Interval]] = {}
    for step in record.get("deploy_steps") or []:
        if not step.get("ok", True):
            raise ValueError(f"{step['host']}: {step['step']!r} failed; this is not a bring-up to measure")
        phase = phase_of(step["step"])
        if phase is not None:
            out.setdefault(phase, []).append((float(step["start"]), float(step["end"])))
    started = record.get("units_started_at")
    if started is not None and out.get("start"):
        out["start"] = [(min(float(started), *(a for a, _ in out["start"])), max(b for _, b in out["start"]))]
    return out


def busy(intervals: Iterable[Interval]) -> float:
    """The time at least one of `intervals` covers (overlaps counted once)."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if end is None or a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total


def critical_path(graph: Mapping[str, Sequence[str]], measured: Mapping[str, Sequence[Interval]]) -> tuple[float, list[str]]:
    """The longest chain of phases that must follow one another: a path through `graph` (phase -> the
    phases it must follow) whose phases' busy times (measured: phase -> its intervals) sum highest, and
    that sum. A phase without intervals (not needed in this run: the image already on the workers)
    weighs nothing and is left out of the chain, while its edges still order the others (the prewarm
    still follows the build). Refused: a measured phase the graph lacks, an edge to a phase it lacks,
    a cycle."""
    unknown = sorted(set(measured) - set(graph))
    if unknown:
        raise ValueError(f"measured phases the graph does not have: {', '.join(unknown)}")
    for phase, before in graph.items():
        if missing := sorted(set(before) - set(graph)):
            raise ValueError(f"{phase!r} must follow {', '.join(missing)}, which the graph does not have")
    best: dict[str, tuple[float, list[str]]] = {}
    visiting: set[str] = set()

    def ending_with(phase: str) -> tuple[float, list[str]]:
        if phase in best:
            return best[phase]
        if phase in visiting:
            raise ValueError(f"the graph has a cycle through {phase!r}")
        visiting.add(phase)
        seconds, chain = max((ending_with(p) for p in graph[phase]), key=lambda c: c[0], default=(0.0, []))
        visiting.discard(phase)
        weight = busy(measured.get(phase, ()))
        best[phase] = (seconds + weight, chain + [phase] if measured.get(phase) else chain)
        return best[phase]

    return max((ending_with(p) for p in graph), key=lambda c: c[0], default=(0.0, []))


def for_path(measured: Mapping[str, Sequence[Interval]]) -> dict[str, list[Interval]]:
    """The phases as the critical path weighs them: the weights' ship only after the fetch's end. A
    pull that follows the fetch runs beside it, mostly waiting for the next file to land; what must
    follow the fetch is what it still does once the fetch has ended (its last files and the manifest)."""
    out = {phase: list(spans) for phase, spans in measured.items()}
    fetched = [b for _, b in measured.get("fetch weights", ())]
    if fetched and out.get("ship weights"):
        end = max(fetched)
        out["ship weights"] = [(max(a, end), b) for a, b in out["ship weights"] if b > max(a, end)]
    return out


def outside(start: float, end: float, measured: Mapping[str, Sequence[Interval]]) -> float:
    """The time in [start, end] that no phase covers."""
    inside = [(max(a, start), min(b, end)) for spans in measured.values() for a, b in spans]
    return (end - start) - busy(inside)


def latest_receipt() -> dict:
    """The newest receipt on the head (this bring-up's: the hosts were fresh)."""
    name = on(HEAD, f"ls -1 {RECEIPTS}/*.json | sort | tail -n 1").strip()
    return json.loads(on(HEAD, f"cat {name}"))


def report(wall: float, began: float, measured: dict[str, list[Interval]], graph: dict, steps: dict[str, float]) -> None:
    weighed = for_path(measured)
    seconds, chain = critical_path(graph, weighed)
    print(f"bring-up of a fresh pair: {INVENTORY} (the real vLLM's CPU build), its weights at {UPLINK_KIB_S} KiB/s "
          f"({MODELS}/uplink/{UPLINK_KIB_S})")
    print(f"wall time (the deploy, start to exit)   {wall:7.1f} s")
    print(f"{'phase':<16} {'busy s':>8} {'from s':>8} {'to s':>8}   steps (the deploy's record)")
    for phase in MUST_FOLLOW:
        spans = measured.get(phase)
        if not spans:
            print(f"  {phase:<14} {'-':>8} {'-':>8} {'-':>8}   not run (not needed)")
            continue
        first, last = min(a for a, _ in spans) - began, max(b for _, b in spans) - began
        print(f"  {phase:<14} {busy(spans):8.1f} {first:8.1f} {last:8.1f}   {len(spans)}")
    print(f"  {'(in no phase)':<14} {outside(began, began + wall, measured):8.1f}   "
          f"prepare, the fabric's proofs, docker, the engine proof, the caches' merge, the watchdog, ...")
    if measured.get("ship weights") and measured.get("fetch weights"):
        print(f"  the weights' ship after the fetch's end: {busy(weighed.get('ship weights', ())):.1f} s "
              f"(what the path weighs: the pull followed the fetch file by file)")
    print(f"critical path {seconds:7.1f} s: {' -> '.join(chain)}")
    print(f"ratio wall / critical path  {wall / seconds:5.2f}")
    build, fetch = busy(measured.get("build image", ())), busy(measured.get("fetch weights", ()))
    if build and fetch:
        print(f"fetch / build               {fetch / build:5.2f}   (UPLINK_KIB_S was chosen for about 1: "
              f"{RECORDED_BUILD_S} s of build recorded in docs/lab.md)")
    print("the deploy's slowest operations (s, pyinfra's output stamped as it printed; tests/e2e/lab.py):")
    for name, took in sorted(steps.items(), key=lambda item: -item[1])[:12]:
        print(f"  {took:7.1f}  {name}")


def main() -> int:
    reset_lab(2)
    try:
        began = time.time()
        run = deploy("--data", f"weights_source={MODELS}/uplink/{UPLINK_KIB_S}", inventory=INVENTORY, timeout=3600)
        if run.returncode != 0:
            sys.exit(f"the bring-up failed:\n{run.output[-8000:]}")
        timed = DEPLOY_TIMES[-1]
        receipt = latest_receipt()
        if not receipt.get("deploy_steps") or not began <= (receipt.get("units_started_at") or 0) <= began + timed.seconds:
            sys.exit(f"the head's newest receipt is not this bring-up's (no deploy_steps, or units started outside "
                     f"the deploy): {RECEIPTS}, taken {receipt.get('taken_at')}")
        report(timed.seconds, began, phase_intervals(receipt), graph_for(MODELS), timed.steps)
    finally:
        reset_lab(2)  # a fresh pair for the benchmarks after this one
    return 0


if __name__ == "__main__":
    sys.exit(main())
