"""Benchmark: a no-op re-deploy against a pyinfra run that only gathers the same facts.

Both run against the lab's two hosts in this one process, interleaved, ROUNDS times each; the
figures printed are medians and their ratio. The ratio says what sparkfleet's converged-deploy
path (table, checks, operations that find nothing to do) costs on top of the SSH fact round trips
any pyinfra run pays. Run with `make bench` (the lab must be up; the fabric is deployed first).
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.lab import INVENTORY, BIN, deploy, run  # noqa: E402

ROUNDS = 5


def timed(fn):
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"benchmark run failed:\n{result.output}")
    return elapsed, result


def main() -> int:
    first = deploy()  # converge first: the benchmark is about the second run
    if first.returncode != 0:
        sys.exit(f"deploy failed:\n{first.output}")
    noop, facts = [], []
    for _ in range(ROUNDS):
        elapsed, result = timed(deploy)
        if result.changed():
            sys.exit(f"not a no-op: {result.changed()}")
        noop.append(elapsed)
        elapsed, _ = timed(lambda: run([str(BIN / "pyinfra"), "-y", INVENTORY, "bench/facts_only.py"]))
        facts.append(elapsed)
    noop_s, facts_s = statistics.median(noop), statistics.median(facts)
    print(f"hosts: 2 (lab), rounds: {ROUNDS}, medians")
    print(f"no-op re-deploy        {noop_s:6.2f} s   (runs: {', '.join(f'{t:.2f}' for t in noop)})")
    print(f"facts-only pyinfra run {facts_s:6.2f} s   (runs: {', '.join(f'{t:.2f}' for t in facts)})")
    print(f"ratio no-op / facts    {noop_s / facts_s:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
