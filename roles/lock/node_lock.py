"""The deploy lock, on a node (run there as `python3 -c <this file's text> ACTION PATH [HOLDER]`).

Standalone on purpose (standard library only, no sparkfleet import): the controller sends this
file's text on the command line before its first change, so taking the lock writes nothing but
the lock itself. roles/lock/lock.py is the controller's side.

The lock is one JSON record at PATH (/run/sparkfleet/deploy.lock: /run is cleared at boot, as
every SSH session is). It names the run that holds it (controller host, user, pid, start time,
command, from the controller) and the SSH session it came in by, as this node sees it: the
nearest ancestor of this process that is sshd's per-connection process, by pid and start time
(/proc/PID/stat field 22, so a reused pid is not taken for it), and the boot it ran in. pyinfra
runs every command of a run over one connection per host, so that process lives exactly as long
as the run's connection: a run that was killed, or lost its network, leaves a lock whose session
is gone, and the next run takes it over. Every read-modify-write of PATH happens under flock(2)
on its directory, so two runs asking at the same instant get one answer each.

Actions, each printing one JSON line {"result": ..., "holder": the record found or null}:
  take HOLDER  took (no lock), held (this session holds it already), took_over (its session is
               gone; the record it replaced is printed), refused (a live session holds it)
  release      released (it was this session's), absent, not_ours (left alone)
  show         the record (or null), and whether its session is alive
  break        `sparkfleet unlock`: broken (its session is gone, by the one rule a take uses to
               take over: decide()), refused (a live session holds it: left alone), absent
"""
import fcntl
import json
import os
import sys
import time

SSHD = ("sshd", "sshd-session")  # OpenSSH's per-connection process, before and after 9.8


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def stat(pid: int):
    """(comm, ppid, start time in clock ticks since boot) of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()  # fields[0] is field 3 (state)
    return comm, int(fields[1]), int(fields[19])


def session() -> dict:
    """This command's SSH session: the nearest sshd ancestor; without one (a local connector), the
    process session's leader, which outlives the run (safe: its lock is refused, not taken over).
    A session's leader can have exited while the session goes on (a shell that started a job in the
    background and ended; seen in CI): then the oldest living ancestor below init, which outlives
    the run too. A dead pid would make the lock look abandoned at once."""
    pid, oldest = os.getppid(), None
    while pid > 1:
        found = stat(pid)
        if found is None:
            break
        comm, ppid, start = found
        if comm in SSHD:
            return {"pid": pid, "start": start, "boot": boot_id(), "via": comm}
        oldest = (pid, start)
        pid = ppid
    leader = os.getsid(0)
    found = stat(leader)
    if found is not None or oldest is None:
        return {"pid": leader, "start": found[2] if found else 0, "boot": boot_id(), "via": "session leader"}
    return {"pid": oldest[0], "start": oldest[1], "boot": boot_id(), "via": "oldest ancestor"}


def alive(recorded) -> bool:
    """Whether the session a record names still exists: same boot, same pid, same start time."""
    if not isinstance(recorded, dict):
        return False
    if recorded.get("boot") != boot_id():
        return False
    found = stat(recorded.get("pid")) if isinstance(recorded.get("pid"), int) else None
    return found is not None and found[2] == recorded.get("start")


def same(a, b) -> bool:
    return isinstance(a, dict) and isinstance(b, dict) and all(a.get(k) == b.get(k) for k in ("pid", "start", "boot"))


def decide(current, mine: dict, is_alive) -> str:
    """took | held | took_over | refused, from the record found (None when there is none; anything
    that is not a record with a session is a broken lock, taken over) and this session."""
    if current is None:
        return "took"
    session_of = current.get("session") if isinstance(current, dict) else None
    if same(session_of, mine):
        return "held"
    if session_of is not None and is_alive(session_of):
        return "refused"
    return "took_over"


def _read(path: str):
    try:
        with open(path) as f:
            text = f.read(65536)
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {"broken": text[:200]}


def _write(path: str, record: dict) -> None:
    tmp = f"{path}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def main(argv) -> int:
    action, path = argv[0], argv[1]
    directory = os.path.dirname(path)
    if action in ("show", "break") and not os.path.isdir(directory):  # creates nothing (plan, unlock)
        print(json.dumps({"result": "absent", "holder": None}, sort_keys=True))
        return 0
    os.makedirs(directory, mode=0o700, exist_ok=True)
    dir_fd = os.open(directory, os.O_RDONLY)
    fcntl.flock(dir_fd, fcntl.LOCK_EX)  # held until exit: one read-modify-write at a time
    current, mine = _read(path), session()
    if action == "take":
        result = decide(current, mine, alive)
        if result in ("took", "took_over"):
            record = dict(json.loads(argv[2]), session=mine,
                          taken=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
            _write(path, record)
    elif action == "release":
        if current is None:
            result = "absent"
        elif same(current.get("session") if isinstance(current, dict) else None, mine):
            os.unlink(path)
            result = "released"
        else:
            result = "not_ours"
    elif action == "break":
        if current is None:
            result = "absent"
        elif decide(current, mine, alive) == "refused":
            result = "refused"
        else:
            os.unlink(path)
            result = "broken"
    elif action == "show":
        session_of = current.get("session") if isinstance(current, dict) else None
        result = "alive" if session_of is not None and alive(session_of) else ("absent" if current is None else "gone")
    else:
        print(json.dumps({"result": "usage", "holder": None}))
        return 2
    print(json.dumps({"result": result, "holder": current}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
