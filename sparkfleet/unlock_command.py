"""`sparkfleet unlock INVENTORY [--host NAME]` (`make unlock INVENTORY=... [HOST=...]`): break the deploy
lock a dead run left.

It runs `pyinfra -y INVENTORY unlock.py` (with `--limit NAME` for --host): on every node, the lock is
broken only when its holder's SSH session there has ended, by the rule a deploy uses to take such a
lock over (roles/lock/node_lock.py); a live holder is named and left alone. What it broke is printed
per node. Exit 0: no live holder (every dead lock broken, or none there); 1: a live holder left alone,
an unreachable node, an unknown --host or a refused inventory (sparkfleet/exit_codes.py).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sparkfleet.exit_codes import FAILED, normalised

REPO = Path(__file__).resolve().parent.parent


def pyinfra_command(inventory: str, host: str | None) -> list[str]:
    return [str(Path(sys.executable).parent / "pyinfra"), "-y", inventory, "unlock.py",
            *(["--limit", host] if host else [])]


def main(inventory: str, host: str | None, names: list[str]) -> int:
    """`names`: the inventory's hosts (validated); --host must be one of them (pyinfra's --limit
    would take an unknown name for a pattern matching nothing)."""
    if host is not None and host not in names:
        print(f"sparkfleet unlock: no host {host!r} in {inventory} ({', '.join(names)})", file=sys.stderr)
        return FAILED
    status = subprocess.run(pyinfra_command(inventory, host), cwd=REPO).returncode
    if status != 0:
        print(f"sparkfleet unlock: not every lock was broken (pyinfra exit {status}): a live holder is left alone, "
              f"the output above names it", file=sys.stderr)
    return normalised(status)
