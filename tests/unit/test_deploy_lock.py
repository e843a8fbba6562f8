"""roles/lock: the deploy lock's decisions (pure), the recorded command (no secret in it), and the
node's program run for real on this machine: real /proc, real flock, a real live and a dead session."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roles.lock import lock, node_lock

PROGRAM = Path(lock.__file__).parent / "node_lock.py"
BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def node(action, path, holder=None):
    args = [sys.executable, "-c", PROGRAM.read_text(), action, str(path)] + ([json.dumps(holder)] if holder else [])
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def session_of(pid: int) -> dict:
    return {"pid": pid, "start": node_lock.stat(pid)[2], "boot": BOOT, "via": "sshd"}


MINE = {"pid": 10, "start": 5, "boot": "b"}


@pytest.mark.parametrize("current, alive, expected", [
    (None, False, "took"),
    ({"session": dict(MINE)}, True, "held"),
    ({"session": {"pid": 11, "start": 5, "boot": "b"}}, True, "refused"),
    ({"session": {"pid": 11, "start": 5, "boot": "b"}}, False, "took_over"),
    ({"session": {"pid": 10, "start": 6, "boot": "b"}}, False, "took_over"),  # the pid reused
    ({"broken": "{not json"}, True, "took_over"),
    ([1, 2], True, "took_over"),
])
def test_a_lock_is_taken_kept_refused_or_taken_over_by_its_holder_s_session(current, alive, expected):
    assert node_lock.decide(current, MINE, lambda s: alive) == expected


def test_a_session_is_alive_only_in_the_same_boot_with_the_same_pid_and_start_time():
    me = session_of(os.getpid())
    assert node_lock.alive(me)
    assert not node_lock.alive({**me, "start": me["start"] + 1})
    assert not node_lock.alive({**me, "boot": "another boot"})
    assert not node_lock.alive({**me, "pid": "12"}) and not node_lock.alive(None)


def test_the_recorded_command_leaves_out_secret_data_values_and_keeps_the_rest():
    argv = ["/opt/venv/bin/pyinfra", "-y", "inventory.py", "deploy.py", "--data", "serving_api_key=sk-123",
            "--data=hf_token=hf_abc", "--data", "recipe_commit=abc123"]
    text = lock.recorded_command(argv)
    assert "sk-123" not in text and "hf_abc" not in text
    assert text == ("pyinfra -y inventory.py deploy.py --data serving_api_key=*** --data=hf_token=*** "
                    "--data recipe_commit=abc123")


def test_the_node_program_takes_keeps_refuses_takes_over_and_releases(tmp_path):
    path = tmp_path / "run" / "deploy.lock"
    holder = {"controller": "laptop-1", "user": "ops", "pid": 4242, "started": "then", "command": "pyinfra"}

    first = node("take", path, holder)  # every call is a new process under this test: one session
    assert first["result"] == "took" and first["holder"] is None
    record = json.loads(path.read_text())
    assert record["controller"] == "laptop-1" and record["session"]["boot"] == BOOT
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert node("take", path, holder)["result"] == "held"
    assert node("show", path)["result"] == "alive"

    # A live session that is not this one: a process that is running now.
    other = subprocess.Popen(["sleep", "60"])
    try:
        path.write_text(json.dumps({**holder, "pid": 7, "session": session_of(other.pid)}))
        refused = node("take", path, holder)
        assert refused["result"] == "refused" and refused["holder"]["pid"] == 7
        assert node("release", path)["result"] == "not_ours" and path.exists()
    finally:
        other.kill()
        other.wait()
    # The same session once it has ended: taken over, and the record it replaced is returned.
    assert node("show", path)["result"] == "gone"
    took = node("take", path, holder)
    assert took["result"] == "took_over" and took["holder"]["pid"] == 7
    assert node("release", path)["result"] == "released" and not path.exists()
    assert node("release", path)["result"] == "absent"


def test_two_takes_at_the_same_instant_give_one_lock(tmp_path):
    """Each take's read-modify-write is under flock: of many processes asking at once from
    different live sessions, exactly one takes it. Each asks from its own session: a shell that
    stays alive (`sh -c '...; sleep'`) is made the session leader by setsid, and the program is
    told to know no sshd (so it takes the session leader, its fallback, whoever runs this test)."""
    path = tmp_path / "deploy.lock"
    script = f"{sys.executable} -c \"$P\" take {path} '{{}}' > {tmp_path}/$1.out; sleep 30"
    source = PROGRAM.read_text()
    assert 'SSHD = ("sshd", "sshd-session")' in source
    env = {**os.environ, "P": source.replace('SSHD = ("sshd", "sshd-session")', "SSHD = ()")}
    procs = [subprocess.Popen(["setsid", "sh", "-c", script, "sh", str(i)], env=env) for i in range(8)]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len([p for p in tmp_path.glob("*.out") if p.read_text()]) < 8:
            time.sleep(0.1)
        results = sorted(json.loads(p.read_text())["result"] for p in tmp_path.glob("*.out"))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert results == ["refused"] * 7 + ["took"]


def test_a_session_whose_leader_has_exited_is_held_by_a_living_ancestor(tmp_path):
    """Run from a session whose leader has exited (a shell that put the job in the background and
    ended, as CI's runner did): the lock names the oldest living ancestor, so it is kept, not
    taken for abandoned at the next call (it was: the recorded session was the dead leader)."""
    path, out = tmp_path / "deploy.lock", tmp_path / "out"
    take = f"{sys.executable} -c \"$P\" take {path} '{{}}'"
    show = f"{sys.executable} -c \"$P\" show {path}"
    # The job takes the lock once the leader is gone (`$$`, the leader's pid, no longer signalled), a
    # state, not a time: make test of 71eb0f7 ran the take first on its loaded machine, and the lock
    # rightly named the leader still alive ("via": "session leader").
    script = (f"( while kill -0 $$ 2>/dev/null; do sleep 0.05; done; {take} > {out}.take; {show} > {out}.show ) "
              f"& exit 0")
    subprocess.run(["setsid", "--wait", "sh", "-c", script], env={**os.environ, "P": PROGRAM.read_text()},
                   check=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (Path(f"{out}.show").exists() and Path(f"{out}.show").read_text()):
        time.sleep(0.1)
    took = json.loads(Path(f"{out}.take").read_text())
    shown = json.loads(Path(f"{out}.show").read_text())
    assert took["result"] == "took", took
    session = json.loads(path.read_text())["session"]
    assert session["via"] in ("oldest ancestor", "sshd", "sshd-session"), session
    assert shown["result"] == "alive", (shown, session)


class LocalNode:
    """A node of the run whose shell is this machine's: the real node program, run as the controller
    would run it over SSH (roles/lock/lock.py _node)."""

    def __init__(self, name):
        self.name, self.data = name, {}  # data: pyinfra's host.data (no router_node: a pair)

    def run_shell_command(self, command):
        from types import SimpleNamespace

        r = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True)
        return r.returncode == 0, SimpleNamespace(stdout=r.stdout, stderr=r.stderr)


def test_a_plan_reads_the_lock_takes_none_and_is_refused_by_a_live_deploy(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from sparkfleet.refusal import Refusal

    path = tmp_path / "run" / "deploy.lock"
    monkeypatch.setattr(lock, "LOCK_PATH", str(path))
    nodes = [LocalNode("spark-b"), LocalNode("spark-a")]
    state = SimpleNamespace(inventory=nodes, is_host_in_limit=lambda h: True)

    assert lock.refuse_if_held(state) == ["spark-a", "spark-b"]
    assert not path.parent.exists()  # a read creates nothing, not even the lock's directory

    other = subprocess.Popen(["sleep", "60"])  # a deploy running now
    try:
        path.parent.mkdir(mode=0o700)
        record = {"controller": "laptop-1", "user": "ops", "pid": 7, "started": "then", "command": "pyinfra deploy.py",
                  "session": session_of(other.pid)}
        path.write_text(json.dumps(record))
        with pytest.raises(Refusal) as refused:
            lock.refuse_if_held(state)
        text = refused.value.block()
        assert "a deploy holds the deploy lock" in text and "ops@laptop-1, pid 7" in text and "spark-a" in text
        assert json.loads(path.read_text()) == record  # read, not taken
    finally:
        other.kill()
        other.wait()
    assert lock.refuse_if_held(state) == ["spark-a", "spark-b"]  # that run has ended: its lock is no obstacle


# ------------------------------------------------------------------ the router node, and `sparkfleet unlock`

class Node(LocalNode):
    """A node of an inventory whose shell is this machine's, its lock file its own (`path`): the real
    node program, as the controller runs it; `data` as pyinfra's host.data; connected or not."""

    def __init__(self, name, path, data=None, connected=True, log=None):
        super().__init__(name)
        self.path, self.data, self.connected, self.log = str(path), dict(data or {}), connected, log

    def run_shell_command(self, command):
        if self.log is not None:
            self.log.append((self.name, command.get_raw_value().split()[-2 if "take" in command.get_raw_value()
                                                                          else -1]))
        if not self.connected:
            raise AssertionError(f"{self.name}: a command on a host never connected")
        from pyinfra.api import StringCommand

        return super().run_shell_command(StringCommand(command.get_raw_value().replace(lock.LOCK_PATH, self.path)))

    def connect(self, reason=None, raise_exceptions=False):
        self.connected = True

    def disconnect(self):
        self.connected = False


class Inventory:
    def __init__(self, nodes, limit=None):
        self.nodes, self.limit = nodes, limit

    def __iter__(self):
        return iter(self.nodes)

    def get_host(self, name):
        return next(n for n in self.nodes if n.name == name)

    def state(self):
        from types import SimpleNamespace

        return SimpleNamespace(inventory=self, is_host_in_limit=lambda h: self.limit is None or h.name in self.limit)


def fleet(tmp_path, router="spark-r", names=("g1-a", "g1-b", "g2-a", "g2-b", "spark-r"), limit=None, log=None):
    nodes = [Node(n, tmp_path / n / "deploy.lock", {"router_node": router}, connected=limit is None or n in limit,
                  log=log) for n in names]
    return Inventory(nodes, limit)


@pytest.mark.parametrize("router, limit, locked", [
    ("spark-r", None, ["g1-a", "g1-b", "g2-a", "g2-b", "spark-r"]),  # the whole fleet: the router is a host of it
    ("spark-r", ["g2-b", "g2-a"], ["g2-a", "g2-b", "spark-r"]),  # g2 alone: drained and routed again at spark-r
    ("g1-a", ["g2-a", "g2-b"], ["g1-a", "g2-a", "g2-b"]),  # the router on another group's head, in name order
    ("g2-a", ["g2-a", "g2-b"], ["g2-a", "g2-b"]),  # the router node within the limit: locked once
    (None, ["g2-a", "g2-b"], ["g2-a", "g2-b"]),  # no router: the run cannot change routing
])
def test_the_router_node_is_locked_whenever_the_run_may_change_routing(router, limit, locked, tmp_path):
    state = fleet(tmp_path, router, limit=limit).state()
    assert [h.name for h in lock.hosts_to_lock(state)] == locked


def test_the_router_node_outside_the_limit_is_locked_in_name_order_refused_and_released_like_any(tmp_path):
    """g2's run locks g1-a (its router node, outside --limit) between nothing and g2-a: name order,
    connected for it; released, and disconnected, at the run's disconnect. A live run holding the
    router refuses the run before it locks the rest, and what it took is given back."""
    holder = {"controller": "laptop-1", "user": "ops", "pid": 4242, "started": "then", "command": "pyinfra"}
    log = []
    inventory = fleet(tmp_path, "g1-a", limit=["g2-b", "g2-a"], log=log)
    state = inventory.state()
    assert not inventory.get_host("g1-a").connected
    assert lock.take_deploy_locks(state, holder) == ["g1-a", "g2-a", "g2-b"]
    assert [name for name, _ in log] == ["g1-a", "g2-a", "g2-b"]  # one take each, in name order
    router_lock = tmp_path / "g1-a" / "deploy.lock"
    assert json.loads(router_lock.read_text())["controller"] == "laptop-1"
    assert not (tmp_path / "g1-b" / "deploy.lock").exists()  # not a host of the run, not the router
    # pyinfra disconnects the hosts it activated (g2-a, g2-b): the router's lock goes with the first.
    inventory.get_host("g2-a").disconnect()
    assert not router_lock.exists() and not inventory.get_host("g1-a").connected
    assert not (tmp_path / "g2-a" / "deploy.lock").exists()
    inventory.get_host("g2-b").disconnect()
    assert not (tmp_path / "g2-b" / "deploy.lock").exists()

    # Another run holds the router node (g1's run, alive now): g2's run is refused there, first.
    other = subprocess.Popen(["sleep", "60"])
    try:
        router_lock.parent.mkdir(mode=0o700, exist_ok=True)
        router_lock.write_text(json.dumps({**holder, "pid": 7, "session": session_of(other.pid)}))
        second = fleet(tmp_path, "g1-a", limit=["g2-a", "g2-b"])
        from sparkfleet.refusal import Refusal

        with pytest.raises(Refusal) as refused:
            lock.take_deploy_locks(second.state(), holder)
        assert "g1-a: held by ops@laptop-1, pid 7" in refused.value.block()
        assert not (tmp_path / "g2-a" / "deploy.lock").exists()  # refused at the first node: nothing locked
    finally:
        other.kill()
        other.wait()


def test_unlock_breaks_only_a_lock_whose_session_has_ended_by_the_take_over_rule(tmp_path):
    """The node program's `break` on real lock files: none, a live holder's (left alone, byte for
    byte), the same once its session has ended (broken, the record printed), a broken record."""
    path = tmp_path / "run" / "deploy.lock"
    assert node("break", path) == {"result": "absent", "holder": None}
    assert not path.parent.exists()  # asking creates nothing
    holder = {"controller": "laptop-1", "user": "ops", "pid": 4242, "started": "then", "command": "pyinfra"}
    other = subprocess.Popen(["sleep", "60"])
    try:
        path.parent.mkdir(mode=0o700)
        path.write_text(json.dumps({**holder, "session": session_of(other.pid)}) + "\n")
        text = path.read_text()
        answer = node("break", path)
        assert answer["result"] == "refused" and answer["holder"]["pid"] == 4242
        assert path.read_text() == text
    finally:
        other.kill()
        other.wait()
    assert node("show", path)["result"] == "gone"
    answer = node("break", path)
    assert answer["result"] == "broken" and answer["holder"]["controller"] == "laptop-1" and not path.exists()
    path.write_text("{not json")
    assert node("break", path)["result"] == "broken" and not path.exists()
    # A lock this very session holds (a take from this test's process tree) would be taken back by it
    # too: the one rule says only "a live session that is not this one" refuses.
    assert node("take", path, holder)["result"] == "took"
    assert node("break", path)["result"] == "broken"


def test_unlock_names_a_live_holder_leaves_it_and_breaks_the_dead_ones(tmp_path, caplog):
    from sparkfleet.refusal import Refusal

    inventory = fleet(tmp_path, None, names=("spark-a", "spark-b", "spark-c"))
    dead = subprocess.Popen(["sleep", "60"])
    dead_session = session_of(dead.pid)
    dead.kill()
    dead.wait()
    live = subprocess.Popen(["sleep", "60"])
    try:
        for name, session, pid in (("spark-a", dead_session, 11), ("spark-b", session_of(live.pid), 22)):
            path = tmp_path / name / "deploy.lock"
            path.parent.mkdir(mode=0o700)
            path.write_text(json.dumps({"controller": "laptop-1", "user": "ops", "pid": pid, "started": "then",
                                        "command": "pyinfra deploy.py", "session": session}))
        live_text = (tmp_path / "spark-b" / "deploy.lock").read_text()
        with pytest.raises(Refusal) as refused:
            lock.break_dead_locks(inventory.state())
        text = refused.value.block()
        assert "a live run holds the deploy lock: it was left alone; broken elsewhere: spark-a" in text
        assert "spark-b: held by ops@laptop-1, pid 22" in text
        assert not (tmp_path / "spark-a" / "deploy.lock").exists()
        assert (tmp_path / "spark-b" / "deploy.lock").read_text() == live_text
        assert "[spark-a] broke the deploy lock of ops@laptop-1, pid 11" in caplog.text
    finally:
        live.kill()
        live.wait()
    answers = lock.break_dead_locks(inventory.state())  # that run has ended too
    assert {n: a["result"] for n, a in answers.items()} == {"spark-a": "absent", "spark-b": "broken",
                                                             "spark-c": "absent"}


def test_a_run_stopped_by_a_node_that_cannot_answer_gives_back_every_lock_it_took_the_routers_too(tmp_path):
    from sparkfleet.refusal import Refusal

    inventory = fleet(tmp_path, "g1-a", limit=["g2-a", "g2-b"])
    inventory.get_host("g2-b").path = str(tmp_path / "not-a-dir" / "deploy.lock")
    (tmp_path / "not-a-dir").write_text("a file where the lock's directory should be")  # the take fails there
    with pytest.raises(Refusal) as refused:
        lock.take_deploy_locks(inventory.state(), {"controller": "c", "user": "u", "pid": 1, "started": "s",
                                                   "command": "pyinfra"})
    assert "g2-b: the deploy lock could not be taken" in refused.value.block()
    assert not (tmp_path / "g1-a" / "deploy.lock").exists() and not (tmp_path / "g2-a" / "deploy.lock").exists()
