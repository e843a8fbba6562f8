"""`sparkfleet deploy INVENTORY [--yes] [pyinfra args]` (`make deploy INVENTORY=...`): the front door for
real machines.

In order, each step stopping the command when it fails:
1. the inventory is validated as `sparkfleet config` validates it, with the `--data` and `--group-data`
   given (sparkfleet/__main__.py: a refusal is printed as one block, before any connection);
2. the plan is made and printed (`sparkfleet plan`: the deploy's prepare under `pyinfra -y --dry`,
   nothing changed, the lock only read); no plan (a refusal, an unreachable host): exit 1; nothing to
   change: exit 0 and no deploy is run;
3. the deploy is confirmed once: on a terminal, a y/N question; otherwise only `--yes` confirms it
   (with neither, exit 1 and nothing changed: a script never waits on a question nobody sees);
4. `pyinfra -y INVENTORY deploy.py [args]` runs, its output streamed. pyinfra's `-y` leaves no question
   in the run: without it pyinfra asks "continue?" when a node fails and goes on with the others on
   Enter (pyinfra_cli/cli.py `_set_fail_prompts`); with it config.py's FAIL_PERCENT = 0 stops the
   whole run at any failure. Exit 0 when the deploy succeeded, 1 otherwise.

The plan and the deploy are two pyinfra runs: the deploy reads its facts again and decides again at
its own prepare. The plan printed is the plan of that moment; the deploy prints its own plan table
before any operation, and if a node changed in between, that table is what runs.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

from sparkfleet import plan_command
from sparkfleet.exit_codes import CHANGES, FAILED, OK, normalised

REPO = plan_command.REPO
YES_FLAGS = ("--yes", "-y")  # pyinfra's own -y means the same: accepted among the pyinfra args too


def pyinfra_command(inventory: str, extra: list[str]) -> list[str]:
    return [str(Path(sys.executable).parent / "pyinfra"), "-y", inventory, "deploy.py", *extra]


def ask(question: str) -> bool:
    """One y/N question on the terminal; anything but y or yes (an empty line, end of input) is no."""
    try:
        return input(question).strip().lower() in ("y", "yes")
    except (EOFError, KeyboardInterrupt):
        print()
        return False


def confirmed(hosts: list[str], yes: bool, interactive: bool, asker: Callable[[str], bool] = ask) -> bool:
    if yes:
        print(f"--> sparkfleet deploy: --yes given: deploying to {len(hosts)} host(s) ({', '.join(hosts)})")
        return True
    if not interactive:
        print("sparkfleet deploy: no terminal to ask on and no --yes: nothing was changed. Read the plan above "
              "and run again with --yes (or make deploy INVENTORY=... YES=1) to deploy it.", file=sys.stderr)
        return False
    if asker(f"--> deploy these changes to {len(hosts)} host(s) ({', '.join(hosts)})? [y/N] "):
        return True
    print("sparkfleet deploy: not confirmed: nothing was changed", file=sys.stderr)
    return False


def main(inventory: str, extra: list[str], yes: bool = False, interactive: bool | None = None) -> int:
    """The plan, one confirmation, then the deploy (module docstring). Exit 0 deployed or nothing to
    change, 1 not (no plan, not confirmed, the deploy failed)."""
    code, hosts = plan_command.run(inventory, extra)
    if code == OK:
        print("--> sparkfleet deploy: nothing to change: no deploy run")
        return OK
    if code != CHANGES:
        print("sparkfleet deploy: no plan, so no deploy: nothing was changed (the output above says why)",
              file=sys.stderr)
        return FAILED
    if not confirmed(hosts, yes, sys.stdin.isatty() if interactive is None else interactive):
        return FAILED
    command = pyinfra_command(inventory, extra)
    print(f"--> sparkfleet deploy: {' '.join([Path(command[0]).name, *command[1:]])} (it reads the facts and "
          f"decides again: its own plan table, printed before any operation, is what runs)", flush=True)
    status = subprocess.run(command, cwd=REPO).returncode
    if status != 0:
        print(f"sparkfleet deploy: the deploy failed (pyinfra exit {status}); a failed step on any node stops "
              f"the whole run: the output above names the node and the step", file=sys.stderr)
    return normalised(status)
