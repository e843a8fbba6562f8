"""Benchmark: the lab's benchmark receipt, as a deploy that restarts the pair takes it.

On the lab (deployed first): the watchdogs are paused and the worker's unit stopped, so the next
deploy restarts the pair as one; that deploy takes the receipt (roles/receipt: llama-benchy through
the API with the key). Printed: the receipt's table and `make status`'s comparison with the previous
receipt. The figures are the lab stand-in engine's (lab/standin: one canned word per engine step over
the fabric), not a model's. Run with `make bench`.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.lab import BIN, INVENTORY, deploy, on, pause_watchdogs, run  # noqa: E402


def main() -> int:
    # receipt=True: tests/e2e/lab.py's deploys of lab/inventory.py take none unless asked (NO_RECEIPT)
    first = deploy(receipt=True)
    if first.returncode != 0:
        sys.exit(f"deploy failed:\n{first.output}")
    pause_watchdogs()
    on("spark-b", "systemctl stop sparkfleet-worker")
    restarted = deploy(receipt=True)  # restarts the pair, takes the receipt, hands the pair back to the watchdogs
    if restarted.returncode != 0 or not [op for op, _ in restarted.changed() if op.startswith("Take the benchmark receipt")]:
        sys.exit(f"the deploy took no receipt:\n{restarted.output}")
    status = run([str(BIN / "pyinfra"), "-y", INVENTORY, "status.py"])  # make status: latest vs previous
    lines = status.output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("  receipt ")), None)
    if status.returncode != 0 or start is None:
        sys.exit(f"make status showed no receipt:\n{status.output}")
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")), len(lines))
    print("benchmark receipt of the lab pair (the stand-in engine's figures), as make status shows it:")
    print("\n".join(lines[start:end]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
