"""Benchmark: time to recover, the watchdog's figure of merit, for three drills of issue 13.

On the lab's deployed pair: (a) SIGKILL the worker's engine, (b) SIGSTOP it, (d) reboot spark-b.
Each drill injects the fault into a serving pair and times it until a chat completion through the
head is answered again, with no deploy run (tests/e2e/drills.py); ROUNDS rounds each, medians
printed. The lab's watchdog settings (lab/group_data/all.py) decide most of it: a fault is judged
after watchdog_failures_before_restart probes, then the pair restarts as one. Run with `make bench`.
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.drills import DRILLS, run_drill, wait_serving  # noqa: E402
from tests.e2e.lab import deploy  # noqa: E402

ROUNDS = 3
KEYS = ("a", "b", "d")


def main() -> int:
    first = deploy()  # a converged, serving pair with its watchdogs
    if first.returncode != 0:
        sys.exit(f"deploy failed:\n{first.output}")
    wait_serving(time.monotonic())
    took = {k: [run_drill(k)[0] for _ in range(ROUNDS)] for k in KEYS}
    print(f"time to recover (lab, {ROUNDS} rounds each, medians; fault -> a chat completion answered again)")
    for k in KEYS:
        runs = ", ".join(f"{t:.1f}" for t in took[k])
        print(f"({k}) {DRILLS[k].what:<30} {statistics.median(took[k]):6.1f} s   (runs: {runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
