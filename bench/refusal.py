"""Benchmark: time to refusal. A bring-up that cannot fit in memory, refused by the guards' memory
admission, timed from the deploy's start to its exit.

In the field report the same failure cost a cold start: vLLM loaded for minutes (a 6-12 minute cold
start on real Sparks) before it found the memory was not free. Here the guards refuse at prepare,
before any operation. On the lab's deployed pair: the engines stopped (a bring-up: memory admission
judges only an engine that is not running) and 64 GiB of headroom asked on top of the lab's
utilization, as tests/e2e/test_lab_guards.py provokes it; then a plain deploy brings the pair back.
The run is checked to be the refusal (nonzero exit, the refusal and its numbers printed, no
operation ran), and its time printed with the phases the deploy's output shows (bench/noop.py's
breakdown). Run with `make bench` (the lab must be up).
"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.noop import PHASES, breakdown, streamed  # noqa: E402
from tests.e2e.lab import BIN, INVENTORY, deploy, on, pause_watchdogs  # noqa: E402

HEADROOM_GIB = 64
REFUSED = "guards refused the deploy, nothing was changed"
_MEMORY = re.compile(r"^\s*memory: .* GiB free on (?P<host>\S+?);")


def main() -> int:
    first = deploy()  # a converged, serving pair
    if first.returncode != 0:
        sys.exit(f"deploy failed:\n{first.output}")
    pause_watchdogs()  # or they would start the engines again under the benchmark
    on("spark-a", "systemctl stop sparkfleet-head")
    on("spark-b", "systemctl stop sparkfleet-worker")
    try:
        elapsed, run, lines = streamed(
            [str(BIN / "pyinfra"), "-y", INVENTORY, "deploy.py", "--data", f"guard_min_headroom_gib={HEADROOM_GIB}"],
            check=False,
        )
    finally:
        back = deploy()  # the pair serves again, its watchdogs back
    refusals = [line.strip() for _, line in lines if _MEMORY.match(line)]
    problems = []
    if run.returncode == 0:
        problems.append("the deploy was not refused (exit 0)")
    if REFUSED not in run.output:
        problems.append(f"no '{REFUSED}' in its output")
    if sorted({_MEMORY.match(r)["host"] for r in refusals}) != ["spark-a", "spark-b"]:
        problems.append("not refused by memory admission on both nodes")
    if run.results():
        problems.append(f"operations ran: {run.results()}")
    if problems:
        sys.exit("benchmark run is not the refusal it times: " + "; ".join(problems) + f"\n{run.output}")
    if back.returncode != 0:
        sys.exit(f"the deploy after the refusal failed:\n{back.output}")
    phases = breakdown(lines, elapsed)
    print(f"time to refusal (lab, memory admission, a bring-up asking {HEADROOM_GIB} GiB of headroom on top): "
          f"{elapsed:.2f} s from start to exit (exit {run.returncode}), no operation run")
    print("  " + "\n  ".join(refusals))
    print("  where the time went (s): " + ", ".join(
        f"{name} {phases['phases'].get(name, 0.0):.2f}" for name, _ in PHASES if name in phases["phases"]))
    print("  the field report's same failure: a cold start (6-12 min on real Sparks) before vLLM found the memory not free")
    return 0


if __name__ == "__main__":
    sys.exit(main())
