"""One deploy at a time: the controller's side of the deploy lock (the node's: node_lock.py).

A run that changes nodes (deploy.py, and rollback.py through it) takes the lock on every node it
may change, at prepare, before reading any fact and so before its first change; the lock is
released when pyinfra disconnects from the node at the end of the run, whether it succeeded or
failed. The doctor and `make status` only read, and take no lock.

Nodes are locked one after the other in name order, the same order whatever the inventory's,
so of two runs started together over the same nodes, the one that gets the first node gets them
all, and the other refuses at the first node, having locked nothing. A run that finds a live
holder refuses before any change and names it: the controller host, user, pid, start time and
command of that run. A lock whose holder's SSH session has ended (the run was killed, or lost its
connection) is taken over, and the run says so: what that run left half done, this one repairs.
"""
from __future__ import annotations

import getpass
import json
import re
import shlex
import socket
import sys
import time
from pathlib import Path

from pyinfra import logger
from pyinfra.api import StringCommand

from sparkfleet.refusal import Problem, Refusal

LOCK_PATH = "/run/sparkfleet/deploy.lock"
NODE_PROGRAM = (Path(__file__).parent / "node_lock.py").read_text()
# Values of --data keys like these are left out of the recorded command: the record is printed on
# another operator's console when it refuses them.
SECRET_WORDS = re.compile(r"token|key|secret|password|extra_args", re.I)


def recorded_command(argv: list[str]) -> str:
    """The run's command line as the lock records it, every --data value of a secret-looking key
    replaced by '***'."""
    out, after_data = [], False
    for word in argv:
        if after_data and "=" in word and SECRET_WORDS.search(word.split("=", 1)[0]):
            word = word.split("=", 1)[0] + "=***"
        elif word.startswith("--data=") and SECRET_WORDS.search(word[7:].split("=", 1)[0]):
            word = word.split("=", 2)[0] + "=" + word[7:].split("=", 1)[0] + "=***"
        after_data = word == "--data"
        out.append(word)
    return " ".join([Path(out[0]).name, *out[1:]]) if out else ""


def holder_record(argv: list[str] | None = None) -> dict:
    """Who this run is, as another run is told when it is refused."""
    import os

    return {"controller": socket.gethostname(), "user": getpass.getuser(), "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(_started())),
            "command": recorded_command(list(sys.argv if argv is None else argv))}


def _started() -> float:
    """This controller process's start time (the run's), from /proc where there is one."""
    import os

    try:
        ticks = int(Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def lock_command(action: str, holder: dict | None = None) -> str:
    args = [action, LOCK_PATH] + ([json.dumps(holder, sort_keys=True)] if holder is not None else [])
    return " ".join(["python3", "-c", shlex.quote(NODE_PROGRAM), *(shlex.quote(a) for a in args)])


def describe(holder) -> str:
    """A lock record as a sentence: who holds it, from where, since when, running what."""
    if not isinstance(holder, dict) or "controller" not in holder:
        return f"an unreadable lock record ({json.dumps(holder)[:120]})"
    session = holder.get("session") or {}
    return (f"{holder.get('user')}@{holder.get('controller')}, pid {holder.get('pid')}, started "
            f"{holder.get('started')}, running `{holder.get('command')}` (its SSH session on the node: "
            f"{session.get('via', 'sshd')} pid {session.get('pid')}, since {holder.get('taken')})")


def _node(host, action: str, holder: dict | None = None) -> dict:
    ok, out = host.run_shell_command(StringCommand(lock_command(action, holder)))
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        answer = None
    if not ok or not isinstance(answer, dict) or "result" not in answer:
        raise Refusal(
            f"{host.name}: the deploy lock could not be {'taken' if action == 'take' else action + 'd'}; nothing "
            f"was changed", [Problem(f"`python3 -c <roles/lock/node_lock.py> {action} {LOCK_PATH}` answered: "
                                     f"{(out.stderr or out.stdout).strip()[-400:] or 'nothing'}", [host.name],
                                     fix="the node needs python3 (DGX OS and Debian have it) and a writable /run")])
    return answer


def hosts_to_lock(state) -> list:
    """Every host of the run (within --limit), in name order: the order every run locks in."""
    return sorted((h for h in state.inventory if state.is_host_in_limit(h)), key=lambda h: h.name)


def take_deploy_locks(state, holder: dict | None = None) -> list[str]:
    """Operation-free, at prepare: the lock on every node of the run, in name order; refuses at the
    first node a live run holds, after giving back the ones this run took. The names locked."""
    holder = holder or holder_record()
    taken = []
    for host in hosts_to_lock(state):
        answer = _node(host, "take", holder)
        result = answer["result"]
        if result == "refused":
            for name in taken:
                _release(state.inventory.get_host(name))
            raise Refusal(
                "another run holds the deploy lock; nothing was changed on any node",
                [Problem(f"held by {describe(answer['holder'])}", [host.name],
                         fix="wait for that run to end (it releases the lock when it disconnects); a run that was "
                             "killed or lost its connection leaves a lock the next run takes over")],
                "The doctor (pyinfra inventory.py doctor.py) and make status only read, and can run now.")
        if result == "took_over":
            logger.warning(f"    [{host.name}] took over the deploy lock of {describe(answer['holder'])}: its SSH "
                           f"session has ended without releasing it (that run was killed or lost its connection); "
                           f"this run repairs whatever it left half done")
        _release_at_disconnect(host)
        taken.append(host.name)
    return taken


def refuse_if_held(state) -> list[str]:
    """For a run that changes nothing (`sparkfleet plan`): the lock of every node read, none taken;
    a live holder refuses, since its nodes are changing under the facts a plan would read. The names read."""
    read = []
    for host in hosts_to_lock(state):
        answer = _node(host, "show")
        if answer["result"] == "alive":
            raise Refusal(
                "a deploy holds the deploy lock: its nodes are changing, and a plan read now would be of a half "
                "changed node; nothing was changed on any node",
                [Problem(f"held by {describe(answer['holder'])}", [host.name],
                         fix="plan again when that run has ended (it releases the lock when it disconnects)")])
        read.append(host.name)
    return read


def _release(host) -> str:
    try:
        return _node(host, "release")["result"]
    except Exception as exc:  # the connection is going away; the lock's session goes with it
        logger.warning(f"    [{host.name}] the deploy lock was not released ({exc}); the next run takes it over")
        return "failed"


def _release_at_disconnect(host) -> None:
    """pyinfra disconnects from every host at the end of a run (pyinfra_cli/cli.py, finally:
    disconnect_all), success or not, while the connection still works: the lock goes first."""
    if getattr(host, "_sparkfleet_releases_lock", False):
        return
    disconnect = host.disconnect

    def release_then_disconnect():
        _release(host)
        disconnect()

    host.disconnect = release_then_disconnect
    host._sparkfleet_releases_lock = True
