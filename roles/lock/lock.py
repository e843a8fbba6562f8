"""One deploy at a time: the controller's side of the deploy lock (the node's: node_lock.py).

A run that changes nodes (deploy.py, and rollback.py through it) takes the lock on every node it
may change: every host of its --limit, and the router node of a fleet with a router when the limit
leaves it out (the run drains and routes groups again there: roles/rolling). At prepare, before
reading any fact and so before its first change; the lock is released when pyinfra disconnects
from the node at the end of the run, whether it succeeded or failed. `sparkfleet unlock` breaks
a lock whose holder's SSH session has ended (break_dead_locks), never a live one. The doctor and
`make status` only read, and take no lock.

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


def router_outside_limit(state):
    """The router node's Host when this run may change routing there without it being a host of the
    run: a fleet with a router (router_node, the same on every node: sparkfleet/model/router.py)
    whose --limit leaves that node out. A run drains and routes groups again at the router
    (roles/rolling) whatever its --limit, so that node is changed too. None otherwise: no router,
    or the router node is in the limit (and locked as a host of the run)."""
    in_limit = [h for h in state.inventory if state.is_host_in_limit(h)]
    names = {h.data.get("router_node") for h in in_limit} - {None}
    if len(names) != 1:  # no router; or nodes disagree, which validation refused before any connection
        return None
    name = names.pop()
    if any(h.name == name for h in in_limit):
        return None
    return state.inventory.get_host(name)


def hosts_to_lock(state) -> list:
    """Every host of the run (within --limit), and the router node whenever the run may change
    routing there from outside the limit (router_outside_limit), in name order: the order every run
    locks in, so the same refusal and take-over rules hold for the router as for any node."""
    hosts = [h for h in state.inventory if state.is_host_in_limit(h)]
    router = router_outside_limit(state)
    return sorted(hosts + ([router] if router is not None else []), key=lambda h: h.name)


def _connected(state, host):
    """A host outside the limit (the router node) is not connected by pyinfra's connect_all
    (pyinfra/api/connect.py: only hosts in the limit): connected here, before its lock is asked."""
    if not getattr(host, "connected", True):
        try:
            host.connect(reason="the router node: this run may change its routing", raise_exceptions=True)
        except Exception as exc:
            raise Refusal(f"{host.name}: the router node could not be reached to take its deploy lock; nothing "
                          f"was changed", [Problem(f"{exc}", [host.name], fix="this run may drain and route groups "
                          "again there: check that the router node is up and reachable (ssh_hostname, ssh_port, "
                          "ssh_user in the inventory)")]) from exc
    return host


def take_deploy_locks(state, holder: dict | None = None) -> list[str]:
    """Operation-free, at prepare: the lock on every node of the run, in name order; refuses at the
    first node a live run holds, after giving back the ones this run took. The names locked."""
    holder = holder or holder_record()
    # Released when pyinfra disconnects (_release_at_disconnect): a host of the run at its own
    # disconnect; the router node outside the limit, which pyinfra never disconnects (disconnect_all:
    # only the hosts it activated), at the disconnect of the run's first host, before that host's own
    # (`outside` is read then, so a router locked after that host is in it too).
    taken, outside, first = [], [], None
    try:
        for host in hosts_to_lock(state):
            in_limit = state.is_host_in_limit(host)
            answer = _node(host if in_limit else _connected(state, host), "take", holder)
            result = answer["result"]
            if result == "refused":
                raise Refusal(
                    "another run holds the deploy lock; nothing was changed on any node",
                    [Problem(f"held by {describe(answer['holder'])}", [host.name],
                             fix="wait for that run to end (it releases the lock when it disconnects); a run that was "
                                 "killed or lost its connection leaves a lock the next run takes over (or `sparkfleet "
                                 "unlock` breaks)")],
                    "The doctor (pyinfra inventory.py doctor.py) and make status only read, and can run now.")
            if result == "took_over":
                logger.warning(f"    [{host.name}] took over the deploy lock of {describe(answer['holder'])}: its SSH "
                               f"session has ended without releasing it (that run was killed or lost its connection); "
                               f"this run repairs whatever it left half done")
            taken.append(host.name)
            if not in_limit:
                outside.append(host)
            else:
                _release_at_disconnect(host, outside if first is None else ())
                first = first or host
    except Exception:  # refused, or a node that could not answer: give back what this run took
        for name in taken:
            _release(state.inventory.get_host(name))
        raise
    return taken


def refuse_if_held(state) -> list[str]:
    """For a run that changes nothing (`sparkfleet plan`): the lock of every node read, none taken;
    a live holder refuses, since its nodes are changing under the facts a plan would read. The names read."""
    read = []
    for host in hosts_to_lock(state):
        answer = _node(host if state.is_host_in_limit(host) else _connected(state, host), "show")
        if answer["result"] == "alive":
            raise Refusal(
                "a deploy holds the deploy lock: its nodes are changing, and a plan read now would be of a half "
                "changed node; nothing was changed on any node",
                [Problem(f"held by {describe(answer['holder'])}", [host.name],
                         fix="plan again when that run has ended (it releases the lock when it disconnects)")])
        read.append(host.name)
    return read


def break_dead_locks(state) -> dict[str, dict]:
    """`sparkfleet unlock`: on every host of the run (within --limit), in name order, the lock broken
    when its holder's SSH session is gone (the node program's `break`: the take-over rule, one rule
    for both), a live holder named and left alone. Prints a line per node; refuses (after every node
    was asked) when any live holder was found. Host name -> the node's answer."""
    answers = {}
    for host in sorted((h for h in state.inventory if state.is_host_in_limit(h)), key=lambda h: h.name):
        answers[host.name] = answer = _node(host, "break")
        if answer["result"] == "broken":
            logger.warning(f"    [{host.name}] broke the deploy lock of {describe(answer['holder'])}: its SSH session "
                           f"had ended; the next deploy repairs whatever that run left half done")
        elif answer["result"] == "absent":
            logger.info(f"    [{host.name}] no deploy lock")
    live = {name: a["holder"] for name, a in answers.items() if a["result"] == "refused"}
    if live:
        raise Refusal(
            "a live run holds the deploy lock: it was left alone" + (
                f"; broken elsewhere: {', '.join(n for n, a in answers.items() if a['result'] == 'broken')}"
                if any(a["result"] == "broken" for a in answers.values()) else ""),
            [Problem(f"held by {describe(holder)}", [name],
                     fix=f"its SSH session on the node is alive, so that run may still be changing the node: wait for "
                         f"it to end. A controller that vanished leaves that session until the node's sshd drops the "
                         f"connection (TCP keepalive: about two hours); once you know that run is gone, end its session "
                         f"on {name} (as root: kill {(holder.get('session') or {}).get('pid')}, the sshd pid above) and "
                         f"unlock again")
             for name, holder in live.items()])
    return answers


def _release(host) -> str:
    try:
        return _node(host, "release")["result"]
    except Exception as exc:  # the connection is going away; the lock's session goes with it
        logger.warning(f"    [{host.name}] the deploy lock was not released ({exc}); the next run takes it over")
        return "failed"


def _release_at_disconnect(host, others=()) -> None:
    """pyinfra disconnects from every host at the end of a run (pyinfra_cli/cli.py, finally:
    disconnect_all), success or not, while the connection still works: the lock goes first, and
    the locks of `others` (hosts pyinfra does not disconnect) with it, each then disconnected."""
    if getattr(host, "_sparkfleet_releases_lock", False):
        return
    disconnect = host.disconnect

    def release_then_disconnect():
        for other in others:
            _release(other)
            try:
                other.disconnect()
            except Exception as exc:  # the run is ending; its connection goes with the process
                logger.warning(f"    [{other.name}] disconnect: {exc}")
        _release(host)
        disconnect()

    host.disconnect = release_then_disconnect
    host._sparkfleet_releases_lock = True
