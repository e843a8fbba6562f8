"""`python -m sparkfleet plan INVENTORY` (`make plan`): what a deploy would do, without doing it.

It runs the deploy itself under pyinfra's `-y --dry` (pyinfra_cli/cli.py: with --dry the run ends
after prepare). So every fact is gathered and every step decided exactly as a deploy decides it,
the plan table of step 1b included, and no operation runs. The deploy lock is only read, never
taken (roles/lock/tasks.py): a deploy that holds it refuses the plan, since its nodes are half
changed. Run as a plan (PLAN_DIR_VAR set), step 1b writes the groups' verdicts and the last step
writes, per host, what each declared operation would do (sparkfleet/plan_ops.py) into that directory.

What it prints after the deploy's own prepare output: per serving group, the plan's verdicts
(fetch, build, ship, warm, restart and why), then the fleet's (the turn order, the router's routing,
what is drained or routed again, where the fleet's key is written; nothing for a pair), then per host every operation that would run, the ones
that run only if an earlier step changes (`_if=` on another operation's result) counted apart.

Exit status, as `terraform plan -detailed-exitcode`: 0 a deploy would change nothing, 2 it would
change something, 1 the plan could not be made (a refusal, an unreachable host, no plan written).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sparkfleet.exit_codes import CHANGES, FAILED as ERROR, OK as NO_CHANGES
from sparkfleet.plan_ops import ONLY_IF, WOULD_RUN
from sparkfleet.plan_types import FleetPlan, GroupPlan

REPO = Path(__file__).resolve().parent.parent
PLAN_DIR_VAR = "SPARKFLEET_PLAN_DIR"  # set by this command only: the deploy runs as a plan, writing here
GROUPS_FILE = "groups.json"  # step 1b: group -> its verdicts (tools/plan.py write_plan)
FLEET_FILE = "fleet.json"  # step 1b: the fleet's verdicts (FleetPlan)
OPS_PREFIX = "operations-"  # the last step: operations-<host>.json, [{"names", "verdict"}] in order


def plan_dir() -> Path | None:
    """Where this run, run as a plan, writes what it decides; None in a deploy."""
    value = os.environ.get(PLAN_DIR_VAR)
    return Path(value) if value else None


def pyinfra_command(inventory: str, extra: list[str]) -> list[str]:
    return [str(Path(sys.executable).parent / "pyinfra"), "-y", "--dry", inventory, "deploy.py", *extra]


def group_lines(groups: dict[str, dict]) -> tuple[list[str], int]:
    """The groups' verdicts (as step 1b wrote them) as lines, and how many groups would change."""
    lines, changing = [], 0
    for name, fields in sorted(groups.items()):
        plan = GroupPlan(**fields)
        what = plan.actions()
        changing += bool(what)
        lines.append(f"  {name}: " + ("; ".join(what) if what else f"nothing to do ({plan.standing})"))
        if plan.engine:  # the engine's version before -> after, and which proof judges it (docs/engines.md)
            lines.append(f"  {name} engine: {plan.engine}")
    return lines, changing


def operation_label(names: list[str]) -> str:
    """An operation as pyinfra names it, the task file it is declared in first. One operation of the
    deploy may carry a name per host (the head's unit and the worker's are one line of roles/serving):
    pyinfra keeps the names on the operation, not which host had which, and hosts are prepared one
    after the other, so a host shows the names known when it was judged: its own, or all of them."""
    parts = [name.rsplit(" | ", 2)[-2:] for name in names]
    where = {p[0] for p in parts if len(p) == 2}
    label = " / ".join(dict.fromkeys(p[-1] for p in parts))
    return f"{where.pop()} | {label}" if len(where) == 1 else label


def operation_lines(per_host: dict[str, list[dict]]) -> tuple[list[str], int]:
    """Per host, the operations that would run (sparkfleet/plan_ops.py verdicts) as lines, and how many
    operation x host pairs would run; the ones that run only if an earlier step changes, counted."""
    lines, running = [], 0
    for host, operations in sorted(per_host.items()):
        sure = [operation_label(op["names"]) for op in operations if op["verdict"] == WOULD_RUN]
        maybe = sum(op["verdict"] == ONLY_IF for op in operations)
        if sure:
            lines.append(f"  {host}: {len(sure)} operation(s) would run:")
            lines += [f"    {label}" for label in sure]
        else:
            lines.append(f"  {host}: none would run")
        if maybe:
            lines.append(f"  {host}: {maybe} more only if an earlier step changes (their _if=)")
        running += len(sure)
    return lines, running


def verdict(groups: dict[str, dict], operations: dict[str, list[dict]],
            fleet: dict | None = None) -> tuple[int, list[str]]:
    """(exit status, the summary's lines) from what the plan's run wrote: the groups' verdicts, the
    fleet's and, per host, the operations'. A fleet-level change (a drain, a route again, a key
    written) is an operation of its own, counted with them."""
    g_lines, changing_groups = group_lines(groups)
    o_lines, changing_ops = operation_lines(operations)
    f_lines = FleetPlan(**fleet).lines() if fleet else []
    lines = ["--> sparkfleet plan, per serving group:", *g_lines,
             *(["--> the fleet:", *f_lines] if f_lines else []),
             "--> operations a deploy would run:", *o_lines]
    if changing_groups or changing_ops:
        lines.append(f"--> a deploy would change something: {changing_groups} serving group(s) by the plan, "
                     f"{changing_ops} operation(s) would run: exit 2")
        return CHANGES, lines
    lines.append("--> a deploy would change nothing: exit 0")
    return NO_CHANGES, lines


def read_plan(directory: Path) -> tuple[dict, dict[str, list[dict]], dict]:
    groups = json.loads((directory / GROUPS_FILE).read_text())
    # A plan recorded before the fleet's verdicts were written (tests/unit/fixtures/lab-*) has none:
    # for a pair that prints the same (a pair has nothing fleet-level to print).
    fleet = json.loads((directory / FLEET_FILE).read_text()) if (directory / FLEET_FILE).exists() else {}
    operations = {path.name[len(OPS_PREFIX):-len(".json")]: json.loads(path.read_text())
                  for path in sorted(directory.glob(f"{OPS_PREFIX}*.json"))}
    if not operations:
        raise ValueError(f"no {OPS_PREFIX}<host>.json written")
    return groups, operations, fleet


def main(inventory: str, extra: list[str] | None = None) -> int:
    return run(inventory, extra)[0]


def run(inventory: str, extra: list[str] | None = None) -> tuple[int, list[str]]:
    """(exit status, the hosts the plan covers): the plan printed, as `main`; `sparkfleet deploy` asks
    about these hosts."""
    with tempfile.TemporaryDirectory(prefix="sparkfleet-plan.") as tmp:
        # The deploy's own output goes to the terminal as it runs; the summary follows it.
        proc = subprocess.run(pyinfra_command(inventory, list(extra or [])), cwd=REPO,
                              env={**os.environ, PLAN_DIR_VAR: tmp})
        if proc.returncode != 0:
            print(f"sparkfleet plan: the deploy's prepare failed (pyinfra exit {proc.returncode}); nothing was "
                  f"changed", file=sys.stderr)
            return ERROR, []
        try:
            groups, operations, fleet = read_plan(Path(tmp))
        except (ValueError, OSError) as err:
            print(f"sparkfleet plan: no plan to read ({err}); nothing was changed", file=sys.stderr)
            return ERROR, []
    code, lines = verdict(groups, operations, fleet)
    sys.stdout.flush()
    print("\n".join(lines))
    return code, sorted(operations)
