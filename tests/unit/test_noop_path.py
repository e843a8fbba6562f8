"""The converged deploy's fast path (issue 14): cluster-wide facts gathered on every host at once,
the engine's memory read from its cgroup, preflight's renderer state taken from the fabric's fact,
and operations skipped, without a round trip of their own, when one fact shows them as declared.
No lab; no wall-clock time is asserted (bench/noop.py prints the figures)."""
import hashlib
import os
from contextlib import nullcontext
import stat
import subprocess
from io import StringIO
from types import SimpleNamespace

import gevent
import gevent.event
import pytest
from pyinfra.api.exceptions import DeployError
from pyinfra.context import ctx_host, ctx_state
from pyinfra.operations import files, systemd

from sparkfleet.fabric_others import FabricConfigs, parse_fabric_configs
from roles.guards.facts import ContainerMemory, container_bytes
from roles.preflight import checks as preflight
from roles.preflight.facts import NodeFacts, parse_node_facts
from sparkfleet import unchanged
from sparkfleet.config import build_cluster
from sparkfleet.once import Slot, at_once, group_slot, per_host
from tests.unit.helpers import pair
from tests.unit.test_facts import FIXTURES


class Host:
    def __init__(self, name, facts=None):
        self.name, self.facts, self.asked = name, facts or {}, []

    def get_fact(self, cls, **kwargs):
        self.asked.append((cls.__name__, kwargs))
        value = self.facts.get(cls.__name__)
        return value(**kwargs) if callable(value) else value


def fake_state(cluster, hosts):
    return SimpleNamespace(_sparkfleet_cluster=cluster, ops={},
                           inventory=SimpleNamespace(get_active_hosts=lambda: hosts, get_host=lambda n: n))


# ------------------------------------------------------------------------------ at once, per host

def test_per_host_runs_every_host_at_once():
    hosts = [Host("spark-a"), Host("spark-b")]
    started = set()
    everyone = gevent.event.Event()

    def compute(h):
        started.add(h.name)
        if len(started) == len(hosts):
            everyone.set()
        return everyone.wait(timeout=5)  # one host after the other would wait here in vain

    assert per_host(SimpleNamespace(), compute, hosts) == {"spark-a": True, "spark-b": True}


def test_at_once_returns_in_order_and_raises_the_first_failure_in_the_caller():
    assert at_once(lambda: 1, lambda: 2) == [1, 2]

    def refuse():
        raise DeployError("spark-b: refused")

    with pytest.raises(DeployError, match="spark-b: refused"):
        at_once(lambda: 1, refuse)


def test_a_group_slot_is_filled_once_and_every_greenlet_gets_its_value_or_its_failure():
    """group_slot (sparkfleet/once.py): the first greenlet of a group that finds the slot empty reads;
    the others wait on the lock and get the same value; a failed read is raised again for every host."""
    cluster = build_cluster(pair())
    hosts = [Host(n.name) for n in cluster.nodes]
    state = fake_state(cluster, hosts)
    reads = []

    def reader(key, fail=False):
        with group_slot(state, key) as slot:
            if slot.done:
                return slot.value
            reads.append(key)
            gevent.sleep(0.01)  # the other hosts' greenlets arrive while this one reads
            if fail:
                raise DeployError(f"{key}: refused")
            return slot.fill(f"{key} read by {ctx_host.get().name}")

    def on_every_host(compute):
        def one(h):
            with ctx_host.use(h):
                try:
                    return compute()
                except DeployError as exc:
                    return f"raised {exc}"
        return [g.value for g in gevent.joinall([gevent.spawn(one, h) for h in hosts])]

    assert on_every_host(lambda: reader("others")) == ["others read by spark-a"] * 2
    assert on_every_host(lambda: reader("rows", fail=True)) == ["raised rows: refused"] * 2
    assert reads == ["others", "rows"]  # one read each, whatever the number of hosts


# ----------------------------------------------------------------------- the engine's memory use

@pytest.mark.parametrize("lines, expected", [
    (["usage=13410304", "inactive_file=0"], 13410304),  # cgroup v1 (the lab), v2 alike
    (["usage=21474836480", "inactive_file=1073741824"], 19 * 1024**3),  # 20 GiB less 1 GiB of page cache
    (["usage=4096", "inactive_file="], 4096),
    (["stats=19.5MiB / 23.5GiB"], int(19.5 * 1024**2)),  # no readable cgroup: docker stats
    (["stats="], None),
    ([], None),  # not running
])
def test_container_memory_counts_as_docker_stats_does(lines, expected):
    assert container_bytes(lines) == expected


def test_container_memory_reads_nothing_of_a_container_that_is_not_running(tmp_path):
    docker = tmp_path / "docker"
    docker.write_text("#!/bin/sh\n[ \"$1\" = inspect ] && echo '' && exit 0\necho never >&2; exit 1\n")
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    out = subprocess.run(["sh", "-c", ContainerMemory().command("sparkfleet-head")], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert out.returncode == 0 and out.stdout == "" and out.stderr == ""
    assert ContainerMemory().process(out.stdout.splitlines()) is None


def test_container_memory_of_a_running_process_is_a_byte_count(tmp_path):
    docker = tmp_path / "docker"  # "the container" is this test's own process, in whatever cgroup it is
    docker.write_text(f"#!/bin/sh\n[ \"$1\" = inspect ] && echo {os.getpid()} && exit 0\necho '1.5MiB / 2GiB'\n")
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    out = subprocess.run(["sh", "-c", ContainerMemory().command("sparkfleet-head")], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    value = ContainerMemory().process(out.stdout.splitlines())
    assert isinstance(value, int) and value > 0, out.stdout


# ------------------------------------------------------------- preflight: the renderer, read once

def test_node_facts_no_longer_ask_systemctl():
    assert "systemctl" not in NodeFacts().command("/var/lib/sparkfleet", "enp1s0f0np0")


@pytest.mark.parametrize("renderer_active, failed", [("active", False), ("inactive", True)])
def test_preflight_judges_the_renderer_from_the_fabric_configs_fact(monkeypatch, renderer_active, failed):
    cluster = build_cluster(pair())
    node_facts = {k: v for k, v in parse_node_facts((FIXTURES / "nodefacts-dgx-spark.txt").read_text().splitlines()).items()
                  if k != "renderer_state"}
    configs = parse_fabric_configs([f"mac=aa:bb:cc:dd:ee:0{i}" for i in (1,)]
                                   + [f"unit NetworkManager {renderer_active} enabled", "unit systemd-networkd inactive disabled"])
    hosts = [Host(n.name, {"NodeFacts": node_facts, "FabricConfigs": configs}) for n in cluster.nodes]
    state = fake_state(cluster, hosts)
    monkeypatch.setattr(preflight, "group_slot", lambda _state, _key: nullcontext(Slot()))
    monkeypatch.setattr(preflight, "fabric_others", lambda _state: {h.name: (configs, []) for h in hosts})
    rows = preflight.preflight_rows(state)
    for node, facts, failures in rows:
        assert facts["renderer_state"] == renderer_active
        assert any("NetworkManager is inactive" in f for f in failures) == failed
    assert all(asked == [("NodeFacts", {"data_dir": "/var/lib/sparkfleet", "netdev": "enp1s0f0np0",
                                        "twin": "enP2p1s0f0np0", "hcas": "rocep1s0f0 roceP2p1s0f0"})]
               for asked in (h.asked for h in hosts))
    assert FabricConfigs  # the fact the units come from (sparkfleet/fabric_others.py)


# ------------------------------------------------------- operations that need no round trip

class Recorder:
    def __init__(self, monkeypatch):
        self.calls = []
        for module, name in ((files, "put"), (files, "directory"), (systemd, "service")):
            monkeypatch.setattr(module, name, self.recording(f"{name}"))

    def recording(self, kind):
        def op(**kwargs):
            self.calls.append((kind, kwargs))
            return SimpleNamespace(kwargs=kwargs)
        return op

    @staticmethod
    def runs(op) -> bool:
        cond = op.kwargs.get("_if")
        if cond is None:
            return True
        return all(c() for c in cond) if isinstance(cond, list) else bool(cond())


def reading(sha1="", user="root", group="root", mode="600", dirs=None, units=None):
    return {"files": {"/etc/sparkfleet/x.conf": {"user": user, "group": group, "mode": mode, "sha1": sha1}},
            "dirs": dirs or {}, "units": units or {}}


TEXT = "a = 1\n"
SHA1 = hashlib.sha1(TEXT.encode()).hexdigest()


@pytest.fixture
def deploy(monkeypatch):
    """(state, host, recorder): a host whose ManagedTargets answer is host.facts["ManagedTargets"]."""
    state, host = SimpleNamespace(ops={}), Host("spark-a")
    recorder = Recorder(monkeypatch)
    with ctx_state.use(state), ctx_host.use(host):
        yield state, host, recorder


def put(**over):
    return unchanged.put(name="Write x", src=StringIO(TEXT), dest="/etc/sparkfleet/x.conf",
                         user="root", group="root", mode="0600", **over)


@pytest.mark.parametrize("found, runs", [
    (reading(SHA1), False),  # as declared: skipped, "No changes", did_change() False
    (reading("0" * 40), True),  # content
    (reading(SHA1, mode="644"), True),  # mode
    (reading(SHA1, user="nobody"), True),  # owner
    (reading(SHA1, group="adm"), True),
    ({"files": {"/etc/sparkfleet/x.conf": None}, "dirs": {}, "units": {}}, True),  # missing, or not a regular file
    ({"files": {}, "dirs": {}, "units": {}}, True),  # not in the reading
    (None, True),  # no reading at all: pyinfra judges
])
def test_a_file_is_left_to_pyinfra_unless_the_reading_shows_it_as_declared(deploy, found, runs):
    state, host, recorder = deploy
    host.facts["ManagedTargets"] = found
    op = put()
    assert Recorder.runs(op) is runs


def test_one_reading_per_host_until_an_operation_changes_something(deploy):
    state, host, recorder = deploy
    host.facts["ManagedTargets"] = reading(SHA1)
    first, second = put(), unchanged.directory(name="Create d", path="/etc/sparkfleet", mode="0700")
    host.facts["ManagedTargets"] = {**reading(SHA1), "dirs": {"/etc/sparkfleet": {"user": "root", "group": "root", "mode": "700"}}}
    assert not Recorder.runs(first) and not Recorder.runs(second)
    assert [name for name, _ in host.asked] == ["ManagedTargets"]
    assert host.asked[0][1] == {"files": ("/etc/sparkfleet/x.conf",), "dirs": ("/etc/sparkfleet",), "units": ()}
    # An operation (on any host) changed something: what was read may be stale, so it is read again.
    meta = SimpleNamespace(is_complete=lambda: True, did_succeed=lambda: True, did_change=lambda: True)
    state.ops = {"spark-b": {"op": SimpleNamespace(operation_meta=meta)}}
    host.facts["ManagedTargets"] = reading("0" * 40)
    assert Recorder.runs(first)
    assert [name for name, _ in host.asked] == ["ManagedTargets", "ManagedTargets"]


def test_the_operations_own_condition_comes_first_and_is_kept(deploy):
    state, host, recorder = deploy
    host.facts["ManagedTargets"] = reading("0" * 40)
    assert not Recorder.runs(put(_if=lambda: False))
    assert host.asked == []  # its own condition said no: nothing read
    assert Recorder.runs(put(_if=[lambda: True]))


def test_arguments_it_does_not_compare_leave_the_operation_to_pyinfra(deploy):
    state, host, recorder = deploy
    op = put(force=True)
    assert "_if" not in op.kwargs
    restart = unchanged.service(name="Restart", service="docker", restarted=True)
    assert "_if" not in restart.kwargs
    assert "_if" not in unchanged.put(name="w", src="relative/file", dest="/x").kwargs


@pytest.mark.parametrize("running, enabled, found, runs", [
    (True, True, {"SubState": "running", "UnitFileState": "enabled"}, False),
    (True, True, {"SubState": "dead", "UnitFileState": "enabled"}, True),
    (True, True, {"SubState": "running", "UnitFileState": "disabled"}, True),
    (None, True, {"SubState": "dead", "UnitFileState": "enabled"}, False),  # running=None: not judged
    (None, False, {"SubState": "dead", "UnitFileState": "enabled"}, True),
    (None, False, {"SubState": "dead", "UnitFileState": "disabled"}, False),
    (None, True, None, True),
])
def test_a_unit_as_pyinfras_systemd_facts_judge_it(deploy, running, enabled, found, runs):
    state, host, recorder = deploy
    host.facts["ManagedTargets"] = {"files": {}, "dirs": {}, "units": {"docker.service": found} if found else {}}
    op = unchanged.service(name="Enable and start Docker", service="docker", running=running, enabled=enabled)
    assert op.kwargs["service"] == "docker"  # pyinfra's own arguments, unchanged
    assert Recorder.runs(op) is runs


def test_the_fact_reads_files_directories_and_units_in_one_command(tmp_path):
    f = tmp_path / "a file"
    f.write_text(TEXT)
    f.chmod(0o640)
    (tmp_path / "link").symlink_to(f)
    d = tmp_path / "d"
    d.mkdir(mode=0o750)
    d.chmod(0o750)
    (tmp_path / "empty").write_text("")
    os.mkfifo(tmp_path / "fifo")  # never read: sha1sum of it would wait for a writer forever
    command = unchanged.ManagedTargets().command(
        files=(str(f), str(tmp_path / "missing"), str(tmp_path / "link"), str(d), str(tmp_path / "empty"),
               str(tmp_path / "fifo")), dirs=(str(d), str(f)), units=())
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                         timeout=30).stdout.splitlines()
    got = unchanged.ManagedTargets().process(out)
    me = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert got["files"][str(f)]["sha1"] == SHA1 and got["files"][str(f)]["mode"] == "640"
    assert got["files"][str(f)]["user"] == me
    assert got["files"][str(tmp_path / "missing")] is None
    assert got["files"][str(tmp_path / "link")] is None  # a symlink is pyinfra's to judge
    assert got["files"][str(d)] is None and got["dirs"][str(f)] is None
    assert got["dirs"][str(d)]["mode"] == "750"
    assert got["files"][str(tmp_path / "empty")]["sha1"] == hashlib.sha1(b"").hexdigest()  # "regular empty file"
    assert got["files"][str(tmp_path / "fifo")] is None
    assert set(got["files"]) == {str(f), str(tmp_path / "missing"), str(tmp_path / "link"), str(d),
                                 str(tmp_path / "empty"), str(tmp_path / "fifo")} and set(got["dirs"]) == {str(d), str(f)}


def test_units_parse_as_systemctl_show_prints_them():
    lines = ["Id=docker.service", "SubState=running", "UnitFileState=enabled", "",
             "Id=sparkfleet-rsyncd.service", "SubState=dead", "UnitFileState=disabled"]
    assert unchanged.parse_targets(lines)["units"] == {
        "docker.service": {"SubState": "running", "UnitFileState": "enabled"},
        "sparkfleet-rsyncd.service": {"SubState": "dead", "UnitFileState": "disabled"},
    }
