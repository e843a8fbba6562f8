"""Benchmark: a no-op re-deploy against a pyinfra run that only gathers the same facts.

Both run against the lab's two hosts in this one process, interleaved, ROUNDS times each; the
figures printed are medians and their ratio. With --fleet (`make bench`), the same again on four
fresh lab hosts as two serving groups behind the router, with the same breakdown, and the ratios
printed beside the two-host figure. The ratio says what sparkfleet's converged-deploy
path (table, checks, operations that find nothing to do) costs on top of the SSH fact round trips
any pyinfra run pays. Run with `make bench` (the lab must be up; the fabric is deployed first).

Where the time goes: each run's output is timestamped line by line as it streams, and split at
pyinfra's phase lines (`--> Loading config...`, `--> Preparing operation files...`, `--> Beginning
operation run...`); the no-op's prepare is split further at the lines sparkfleet's steps print
(`--> sparkfleet preflight:`, ...), and its operation run by role file. Every figure is the median
over the rounds (so a column's figures need not add up to its total exactly).
"""
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.lab import BIN, FLEET_INVENTORY, INVENTORY, REPO, Run, deploy, reset_lab  # noqa: E402

ROUNDS = int(os.environ.get("SFL_BENCH_ROUNDS", "5"))

# pyinfra's phase lines, in the order it prints them; "start" is the interpreter and pyinfra's imports.
PHASES = (
    ("start", None),
    ("config", "--> Loading config"),
    ("inventory", "--> Loading inventory"),
    ("connect", "--> Connecting to hosts"),
    ("prepare", "--> Preparing operation files"),
    ("operations", "--> Beginning operation run"),
    ("disconnect", "--> Disconnecting from hosts"),
)
_STEP = re.compile(r"^--> sparkfleet (?P<name>[^:(]+?)\s*[:(]")  # "--> sparkfleet kernel caches (...)", "... guards:"
_OP = re.compile(r"^--> Starting operation: (?P<file>\S+) \|")


def streamed(cmd: list[str], check=True) -> tuple[float, Run, list[tuple[float, str]]]:
    """Run `cmd`; (seconds from start to exit, its Run, (seconds since start, line) per output line).
    With check, a run that fails ends the benchmark."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = [(time.perf_counter() - start, line.rstrip("\n")) for line in proc.stdout]
    returncode = proc.wait()
    elapsed = time.perf_counter() - start
    run = Run(returncode, "\n".join(line for _, line in lines) + "\n")
    if check and returncode != 0:
        sys.exit(f"benchmark run failed:\n{run.output}")
    return elapsed, run, lines


def segments(marks: list[tuple[str, float]], end: float) -> dict[str, float]:
    """[(name, start time), ...] in order -> name -> seconds until the next mark (the last: until end)."""
    out: dict[str, float] = defaultdict(float)
    for (name, at), (_, until) in zip(marks, marks[1:] + [("", end)]):
        out[name] += until - at
    return dict(out)


def breakdown(lines: list[tuple[float, str]], elapsed: float) -> dict[str, dict[str, float]]:
    """{"phases": pyinfra's phases, "prepare": up to each sparkfleet step line, "operations": by role file}."""
    marks, at = [("start", 0.0)], {}
    for t, line in lines:
        for name, prefix in PHASES[1:]:
            if prefix and line.startswith(prefix) and name not in at:
                at[name] = t
                marks.append((name, t))
    phases = segments(marks, elapsed)
    prepare_end = at.get("operations", elapsed)
    steps, last = [], at.get("prepare", 0.0)
    for t, line in lines:
        if at.get("prepare", elapsed) <= t <= prepare_end and (m := _STEP.match(line)):
            steps.append((m["name"], last))  # the time up to a step's line is that step's
            last = t
    prepare = segments(steps, last) if steps else {}
    if steps:
        prepare["(after the last step's line)"] = prepare_end - last
    ops = [(m["file"], t) for t, line in lines if (m := _OP.match(line))]
    operations = segments(ops, at.get("disconnect", elapsed)) if ops else {}
    counts = defaultdict(int)
    for name, _ in ops:
        counts[name] += 1
    return {"phases": phases, "prepare": prepare, "operations": operations, "op_counts": dict(counts)}


def medians(runs: list[dict[str, dict[str, float]]], part: str) -> dict[str, float]:
    names = list(dict.fromkeys(name for run in runs for name in run[part]))
    return {name: statistics.median(run[part].get(name, 0.0) for run in runs) for name in names}


def measure(inventory: str) -> tuple[float, float, list[float], list[float], list, list, list[float]]:
    """Converge `inventory`, then ROUNDS interleaved rounds of a no-op re-deploy, a facts-only run and
    `sparkfleet plan` (which must find nothing to do: exit 0)."""
    first = deploy(inventory=inventory)  # converge first: the benchmark is about the second run
    if first.returncode != 0:
        sys.exit(f"deploy failed:\n{first.output}")
    noop, facts, noop_parts, facts_parts, plans = [], [], [], [], []
    for _ in range(ROUNDS):
        elapsed, run, lines = streamed([str(BIN / "pyinfra"), "-y", inventory, "deploy.py"])
        if run.changed():
            sys.exit(f"not a no-op: {run.changed()}")
        noop.append(elapsed)
        noop_parts.append(breakdown(lines, elapsed))
        elapsed, _, lines = streamed([str(BIN / "pyinfra"), "-y", inventory, "bench/facts_only.py"])
        facts.append(elapsed)
        facts_parts.append(breakdown(lines, elapsed))
        elapsed, run, _ = streamed([str(BIN / "python"), "-m", "sparkfleet", "plan", inventory], check=False)
        if run.returncode != 0:
            sys.exit(f"sparkfleet plan did not find nothing to do (exit {run.returncode}):\n{run.output}")
        plans.append(elapsed)
    return statistics.median(noop), statistics.median(facts), noop, facts, noop_parts, facts_parts, plans


def print_breakdown(noop_parts: list, facts_parts: list) -> None:
    """Where the time goes (medians over the rounds): pyinfra's phases of the no-op and of the floor,
    the no-op's prepare up to each sparkfleet step's line, and its operation run by role file."""
    phase_noop, phase_facts = medians(noop_parts, "phases"), medians(facts_parts, "phases")
    print(f"{'phase (s)':<40} {'no-op':>7} {'facts':>7}")
    for name, _ in PHASES:
        print(f"  {name:<38} {phase_noop.get(name, 0.0):7.2f} {phase_facts.get(name, 0.0):7.2f}")
    print("the no-op's prepare, up to each sparkfleet step's line (s):")
    for name, seconds in medians(noop_parts, "prepare").items():
        print(f"  {name:<38} {seconds:7.2f}")
    counts = noop_parts[0]["op_counts"]
    print("the no-op's operation run, by file (s):")
    for name, seconds in medians(noop_parts, "operations").items():
        print(f"  {name:<38} {seconds:7.2f}   ({counts.get(name, 0)} operations)")


def main() -> int:
    fleet = "--fleet" in sys.argv[1:]
    noop_s, facts_s, noop, facts, noop_parts, facts_parts, plans = measure(INVENTORY)
    plan_s = statistics.median(plans)
    print(f"hosts: 2 (lab), rounds: {ROUNDS}, medians")
    print(f"no-op re-deploy        {noop_s:6.2f} s   (runs: {', '.join(f'{t:.2f}' for t in noop)})")
    print(f"facts-only pyinfra run {facts_s:6.2f} s   (runs: {', '.join(f'{t:.2f}' for t in facts)})")
    print(f"sparkfleet plan        {plan_s:6.2f} s   (runs: {', '.join(f'{t:.2f}' for t in plans)})")
    print(f"ratio no-op / facts    {noop_s / facts_s:6.2f}")
    print(f"ratio plan / facts     {plan_s / facts_s:6.2f}   (the plan: the deploy's prepare under pyinfra --dry)")
    print()
    print_breakdown(noop_parts, facts_parts)
    if not fleet:
        return 0
    # The four-host fleet (two TP=2 groups behind the router, a switched fabric), measured the same
    # way in this run, on fresh hosts; the lab is the pair again afterwards.
    reset_lab(4)
    try:
        fleet_noop, fleet_facts, fleet_runs, fleet_fact_runs, fleet_parts, fleet_facts_parts, fleet_plans = \
            measure(FLEET_INVENTORY)
    finally:
        reset_lab(2)
    print()
    print("hosts: 4 (lab/inventory_fleet.py: two groups behind the router), the same rounds, medians")
    print_breakdown(fleet_parts, fleet_facts_parts)
    print()
    print(f"{'no-op re-deploy (medians)':<28} {'no-op s':>8} {'facts s':>8} {'ratio':>6}")
    print(f"  {'2 hosts, 1 group':<26} {noop_s:8.2f} {facts_s:8.2f} {noop_s / facts_s:6.2f}")
    print(f"  {'4 hosts, 2 groups':<26} {fleet_noop:8.2f} {fleet_facts:8.2f} {fleet_noop / fleet_facts:6.2f}"
          f"   (runs: {', '.join(f'{t:.2f}' for t in fleet_runs)} / {', '.join(f'{t:.2f}' for t in fleet_fact_runs)})")
    fleet_plan = statistics.median(fleet_plans)
    print(f"  {'4 hosts, sparkfleet plan':<26} {fleet_plan:8.2f} {fleet_facts:8.2f} {fleet_plan / fleet_facts:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
