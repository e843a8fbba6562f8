"""roles/watchdog as the deploy wires it: the data keys and their refusals, the files it writes."""
import pytest

from sparkfleet.model.watchdog import WatchdogData, give_up_span_s
from sparkfleet.config import DATA_FIELDS, ConfigError, build_cluster
from tests.unit.helpers import pair


def both(**data):
    return build_cluster(pair(**{n: data for n in ("spark-a", "spark-b")}))


def refusal(**by_host) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**by_host))
    return err.value


def refused(**data) -> ConfigError:
    return refusal(**{n: data for n in ("spark-a", "spark-b")})


# ------------------------------------------------------------------------------------------ the data

def test_every_watchdog_key_is_a_data_key_with_the_programs_defaults():
    assert {k for k in DATA_FIELDS if k.startswith("watchdog_")} == set(WatchdogData.model_fields)
    node = both().head
    for key, field in WatchdogData.model_fields.items():
        assert getattr(node, key) == field.default, key


def test_the_defaults_and_the_labs_values_pass_the_cross_checks():
    both()
    both(serving_health_timeout_s=120)  # lab/group_data/all.py


def test_a_grace_shorter_than_a_cold_start_is_refused_naming_host_key_and_bound():
    err = refused(watchdog_startup_grace_s=600)
    assert [(p.hosts, p.key) for p in err.problems] == [(("spark-a",), "watchdog_startup_grace_s"),
                                                        (("spark-b",), "watchdog_startup_grace_s")]
    text = str(err)
    assert "key 'watchdog_startup_grace_s' = 600: must be at least serving_health_timeout_s (1200)" in text
    assert "set watchdog_startup_grace_s to 1200 or more" in text
    both(watchdog_startup_grace_s=600, serving_health_timeout_s=600)


def test_a_window_that_cannot_hold_max_restarts_cold_starts_is_refused_with_the_arithmetic():
    node = both().head
    span = give_up_span_s(node)
    # 3 cold starts of 1200 s; the failed probes, each time: 60 s of stall + 3 x (30 + 30) = 240; before
    # restart 2 and 3: max(240, 60 x 2) and max(240, 60 x 4); then 240.
    assert span == 3 * 1200 + 240 + 240 + 240 == 4320
    err = refused(watchdog_window_s=span)
    [problem] = [p for p in err.problems if p.hosts == ("spark-a",)]
    assert problem.key == "watchdog_window_s"
    assert f"key 'watchdog_window_s' = {span}: must be more than {span} s" in problem
    assert f"set watchdog_window_s above {span}" in problem.fix
    both(watchdog_window_s=span + 1)
    # More restarts, or longer backoffs, need a longer window.
    assert "watchdog_window_s" in str(refused(watchdog_max_restarts=6))
    assert "watchdog_window_s" in str(refused(watchdog_backoff_s=1800))


def test_a_disabled_watchdog_is_not_held_to_its_timing():
    both(watchdog_enabled=False, watchdog_startup_grace_s=0, watchdog_window_s=60)


def test_watchdog_settings_must_be_the_same_on_every_node():
    err = refusal(**{"spark-b": {"watchdog_enabled": False}})
    [problem] = err.problems
    assert problem.key == "watchdog_enabled" and problem.hosts == ("spark-a", "spark-b")
    assert "key 'watchdog_enabled' differs between nodes (spark-a=True, spark-b=False)" in problem
    assert "watchdog_follow_interval_s" in str(refusal(**{"spark-b": {"watchdog_follow_interval_s": 7}}))
    # Each node keeps its own state directory: the peers read it through the rsync module.
    c = build_cluster(pair(**{"spark-b": {"watchdog_state_dir": "/srv/sparkfleet/watchdog"}}))
    assert c.node("spark-b").watchdog_state_dir == "/srv/sparkfleet/watchdog"


@pytest.mark.parametrize("path, why", [
    ("/var/lib", "system directory"),
    ("/var/lib/sparkfleet/models/watchdog", "each need a directory of their own"),
    ("/var/lib/sparkfleet/watch dog", "letters, digits"),
    ("relative/dir", "String should match pattern"),
])
def test_the_state_directory_is_a_directory_of_its_own(path, why):
    err = refused(watchdog_state_dir=path)
    assert why in str(err) and "watchdog_state_dir" in str(err)


def test_booleans_and_numbers_are_not_converted():
    assert "true or false" in str(refused(watchdog_enabled="yes"))
    assert "30 without quotes" in str(refused(watchdog_interval_s="30"))
    assert "greater than or equal to 5" in str(refused(watchdog_interval_s=1))


# ------------------------------------------------------------------------------- the files it writes

def test_the_config_and_unit_it_writes():
    import json

    from sparkfleet.model.serving import node_profile
    from roles.watchdog.node_config import unit_text, watch_config_text

    c = both()
    head = json.loads(watch_config_text(c, c.head, node_profile(c.head), c.head))
    assert head["role"] == "head" and head["unit"] == head["container"] == "sparkfleet-head"
    assert head["workers"] == [{"name": "spark-b", "state": "rsync://10.77.77.2:873/watchdog/state.json"}]
    assert head["ready_timeout_s"] == 1200 and head["startup_grace_s"] == 1200 and head["window_s"] == 7200
    worker = json.loads(watch_config_text(c, c.node("spark-b"), node_profile(c.head), c.node("spark-b")))
    assert worker["head"] == {"name": "spark-a", "state": "rsync://10.77.77.1:873/watchdog/state.json"}
    assert "key_file" not in worker and "workers" not in worker
    # Off: still written (the doctor's probe), without worker states nobody writes or serves.
    off = both(watchdog_enabled=False)
    assert json.loads(watch_config_text(off, off.head, node_profile(off.head), off.head))["workers"] == []
    for node in c.nodes:
        text = unit_text(node)
        assert text.startswith("# Managed by sparkfleet (roles/watchdog)")
        lines = text.splitlines()
        assert "ExecStart=/usr/bin/python3 /usr/local/libexec/sparkfleet/sfl_watch.py run /etc/sparkfleet/watchdog.json" in lines
        assert "Restart=always" in lines and "WantedBy=multi-user.target" in lines
        assert f"Description=sparkfleet watchdog ({'head' if node.is_head else 'worker'}) of " \
               f"{'sparkfleet-head' if node.is_head else 'sparkfleet-worker'}" in lines


def test_the_program_accepts_the_config_with_the_watchdog_off(tmp_path):
    import json
    import subprocess
    import sys

    from sparkfleet.model.serving import node_profile
    from roles.watchdog.node_config import watch_config
    from tests.unit.test_watchdog import PROGRAM

    c = both(watchdog_enabled=False)
    cfg = watch_config(c, c.head, node_profile(c.head), c.head)
    cfg["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "watchdog.json"
    path.write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, str(PROGRAM), "status", str(path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "no state at" in r.stdout, r.stdout + r.stderr


# ------------------------------------------------------------- the deploy's steps, without any host
#
# The task files run as pyinfra runs them at prepare time (once per host, `host` and `state` set),
# with pyinfra's operations replaced by recorders. The recorded operations are then "executed" in
# pyinfra's order (by include, then by line in the file: each step is defined on every host, gated
# by _if) with _if evaluated when the step runs, as pyinfra does. State operations (files.put,
# files.directory, systemd.service without restarted) count only when the test says they change.

import runpy  # noqa: E402
import sys  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from sparkfleet import decided  # noqa: E402
from pyinfra.context import ctx_host, ctx_state  # noqa: E402
from pyinfra.operations import apt, files, python, server, systemd  # noqa: E402

from roles.watchdog.checks import WatchdogPlan, plan_for  # noqa: E402

COMMANDS = ("server.shell", "python.call", "systemd.daemon_reload")
INCLUDES = ("roles/fanout/tasks.py", "roles/watchdog/pause_tasks.py", "roles/watchdog/tasks.py")


class Op:
    def __init__(self, kind, kwargs, changed):
        self.kind, self.kwargs, self.changed = kind, kwargs, changed
        self.name = kwargs.get("name")

    def did_change(self):
        return self.changed

    def gate(self):
        cond = self.kwargs.get("_if")
        if cond is None:
            return True
        return all(c() for c in cond) if isinstance(cond, list) else bool(cond())


class FakeHost:
    def __init__(self, name):
        self.name = name

    def get_fact(self, cls, **kwargs):
        return {"Which": "/usr/bin/rsync"}.get(cls.__name__)


class Deploy:
    def __init__(self, monkeypatch, cluster, plan: WatchdogPlan | None, changed=(), firewall=None):
        self.cluster, self.changed = cluster, set(changed)
        self.state = SimpleNamespace(_sparkfleet_cluster=cluster, ops={})
        # The run's plan as deploy.py's step 1b installs it (sparkfleet/decided.py), on the state the
        # task files read; only the watchdog's slice (and the firewall's, tests/unit/test_firewall.py) is
        # read by the files these tests run.
        decided.install(self.state, {"pair": decided.Decisions(summary=None, fabric=None, key="ok", image=None, weights=None, caches=None,
                                                               speed=None, serving=None, watchdog=plan, memory={},
                                                               firewall=firewall or {})},
                        decided.FleetDecision(summary=None, key=None))
        self.ops = []  # (include index, line, occurrence, host index, Op)
        for module, names in ((files, ("put", "directory")), (server, ("shell",)), (python, ("call",)),
                              (systemd, ("service", "daemon_reload")), (apt, ("packages",))):
            for n in names:
                monkeypatch.setattr(module, n, self.recorder(f"{module.__name__.rsplit('.', 1)[1]}.{n}"))

    def recorder(self, kind):
        def op(**kwargs):
            # The task file's line, as pyinfra orders operations by it (its stack from the deploy file down): an
            # operation declared through a helper (sparkfleet/unchanged.py, roles/api_proxy/gate_ops.py) takes the
            # line of the task file's call, several from one call keep their order (`seen`).
            frame = sys._getframe(1)
            while frame.f_back is not None and not frame.f_code.co_filename.endswith(self.path):
                frame = frame.f_back
            line = frame.f_lineno
            seen = sum(1 for o in self.ops if o[:2] == (self.include_no, line) and o[3] == self.host_no)
            o = Op(kind, kwargs, kwargs.get("name") in self.changed)
            self.ops.append((self.include_no, line, seen, self.host_no, o))
            return o
        return op

    def run(self, includes=INCLUDES):
        for self.include_no, path in enumerate(includes):
            self.path = path
            for self.host_no, node in enumerate(self.cluster.nodes):
                with ctx_state.use(self.state), ctx_host.use(FakeHost(node.name)):
                    runpy.run_path(path, run_name="__pyinfra_task__")
        done = []
        for include_no, line, seen, host_no, o in sorted(self.ops, key=lambda x: x[:4]):
            if not o.gate():
                o.changed = False
                continue
            if o.kind in COMMANDS or (o.kind == "systemd.service" and o.kwargs.get("restarted")):
                o.changed = True
            if o.changed:
                done.append((o.name, self.cluster.nodes[host_no].name))
        return done

    def op(self, name, host):
        return next(o for *_k, h, o in self.ops if o.name == name and self.cluster.nodes[h].name == host)


def plan(cluster, moves=None, running=("spark-a", "spark-b")):
    units = {n.name: {"active": "active" if n.name in running else "inactive"} for n in cluster.nodes}
    return plan_for(cluster, moves, units)


PAUSE_HEAD = ("Pause the head's sparkfleet-watchdog (the deploy moves the pair)", "spark-a")
PAUSE_WORKER = ("Pause the workers' sparkfleet-watchdog (the deploy moves the pair)", "spark-b")
HAND_OVER = "Hand the pair over to the watchdog (sfl_watch.py deployed)"
START_WORKER = ("Start the workers' sparkfleet-watchdog", "spark-b")
START_HEAD = ("Start the head's sparkfleet-watchdog (every worker's runs)", "spark-a")


def test_an_unchanged_deploy_stops_and_starts_nothing(monkeypatch):
    c = both()
    assert Deploy(monkeypatch, c, plan(c)).run() == []


@pytest.mark.parametrize("moves", ["the prewarm", "the pair restart"])
def test_the_watchdog_pauses_before_the_pair_moves_and_starts_after_workers_first(monkeypatch, moves):
    c = both()
    done = Deploy(monkeypatch, c, plan(c, moves)).run()
    assert done == [PAUSE_HEAD, PAUSE_WORKER, (HAND_OVER, "spark-a"), (HAND_OVER, "spark-b"), START_WORKER, START_HEAD]


def test_the_pause_comes_before_the_prewarm_and_the_start_after_the_pair_serves():
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]

    def includes(path):  # deploy.py's includes, each serving group's turn's steps among them
        return [line.split('"')[1] for line in (repo / path).read_text().splitlines() if "local.include(" in line]

    order = [f for f in includes("deploy.py") if not f.startswith("roles/rolling/")]  # the turns' barrier
    at = order.index
    assert at("roles/fanout/tasks.py") < at("roles/watchdog/pause_tasks.py") < at("roles/kernel_cache/tasks.py") \
        < at("roles/serving/tasks.py") < at("roles/watchdog/tasks.py") == len(order) - 5
    # after it only the receipt, which measures and changes nothing, the router and the monitoring, which
    # move no unit of a group, and step 13, which declares no operation (it writes a plan's verdicts, in a
    # plan only)
    assert order[-4:] == ["roles/receipt/tasks.py", "roles/router/tasks.py", "roles/monitoring/tasks.py",
                          "roles/plan/operations_tasks.py"]


def test_a_watchdog_found_stopped_is_handed_over_and_started_even_when_nothing_moves(monkeypatch):
    """What a re-run does after a deploy that failed with the watchdogs paused."""
    c = both()
    done = Deploy(monkeypatch, c, plan(c, running=())).run()
    assert done == [(HAND_OVER, "spark-a"), (HAND_OVER, "spark-b"), START_WORKER, START_HEAD]
    done = Deploy(monkeypatch, c, plan(c, moves="the pair restart", running=("spark-b",))).run()
    assert done == [PAUSE_WORKER, (HAND_OVER, "spark-a"), (HAND_OVER, "spark-b"), START_WORKER, START_HEAD]


def test_a_changed_program_or_config_restarts_a_running_watchdog_without_a_hand_over(monkeypatch):
    c = both()
    config = "Write /etc/sparkfleet/watchdog.json"
    done = Deploy(monkeypatch, c, plan(c), changed={config}).run()
    check = "Check /etc/sparkfleet/watchdog.json with the program"
    assert done == [(config, "spark-a"), (config, "spark-b"), (check, "spark-a"), (check, "spark-b"),
                    START_WORKER, START_HEAD]
    unit = "Write the sparkfleet-watchdog unit"
    done = Deploy(monkeypatch, c, plan(c), changed={unit}).run()
    reload = "Reload systemd (sparkfleet-watchdog unit changed)"
    assert done == [(unit, "spark-a"), (unit, "spark-b"), (reload, "spark-a"), (reload, "spark-b"),
                    START_WORKER, START_HEAD]


def test_the_first_deploy_creates_the_state_dir_before_rsyncd_serves_it_and_starts_the_watchdog(monkeypatch):
    c = both()
    new = {"Create /var/lib/sparkfleet/watchdog", "Write the fabric rsync daemon config",
           "Install sfl_watch.py (the pair's watchdog: probe, restart as one, status)",
           "Write /etc/sparkfleet/watchdog.json", "Write the sparkfleet-watchdog unit", "Set sparkfleet-watchdog start at boot to True"}
    d = Deploy(monkeypatch, c, plan(c, moves="the pair restart", running=()), changed=new)
    done = [name for name, host in d.run() if host == "spark-b"]
    assert done.index("Create /var/lib/sparkfleet/watchdog") < done.index("Restart sparkfleet-rsyncd (config changed)")
    assert done[-5:] == ["Reload systemd (sparkfleet-watchdog unit changed)", "Check /etc/sparkfleet/watchdog.json with the program",
                         "Set sparkfleet-watchdog start at boot to True", HAND_OVER, START_WORKER[0]]
    assert d.op("Write /etc/sparkfleet/watchdog.json", "spark-a").kwargs["mode"] == "0600"
    assert d.op("Install sfl_watch.py (the pair's watchdog: probe, restart as one, status)", "spark-a").kwargs["dest"] \
        == "/usr/local/libexec/sparkfleet/sfl_watch.py"


def test_enabled_at_boot_with_the_pair_only_and_stopped_when_off(monkeypatch):
    c = build_cluster(pair(**{"spark-a": {"serving_start_at_boot": False}}))
    d = Deploy(monkeypatch, c, plan(c))
    d.run()
    assert d.op("Set sparkfleet-watchdog start at boot to False", "spark-a").kwargs["enabled"] is False
    assert d.op("Set sparkfleet-watchdog start at boot to True", "spark-b").kwargs["enabled"] is True
    off = both(watchdog_enabled=False)
    d = Deploy(monkeypatch, off, plan(off, moves="the pair restart"))
    stop = "Stop sparkfleet-watchdog (watchdog_enabled is false)"
    assert d.run() == [PAUSE_HEAD, PAUSE_WORKER, (stop, "spark-a"), (stop, "spark-b")]
    assert d.op("Set sparkfleet-watchdog start at boot to False", "spark-b").kwargs["running"] is None
    assert "Create /var/lib/sparkfleet/watchdog" not in {o.name for *_k, o in d.ops}
    # Off and already stopped: nothing to do.
    assert Deploy(monkeypatch, off, plan(off, moves="the pair restart", running=())).run() == []


def test_a_failed_prewarm_that_restored_production_starts_the_watchdogs_it_paused():
    from pyinfra.api.exceptions import DeployError

    from sparkfleet.watchdog_handover import resume_watchdogs

    c = both()
    ran = []
    assert resume_watchdogs(lambda n, cmd, what: ran.append((n, cmd)), c, ()) is None and ran == []
    said = resume_watchdogs(lambda n, cmd, what: ran.append((n, cmd)), c, ("spark-a", "spark-b"))
    deployed = "python3 /usr/local/libexec/sparkfleet/sfl_watch.py deployed /etc/sparkfleet/watchdog.json"
    start = "systemctl restart sparkfleet-watchdog.service"
    assert ran == [("spark-b", deployed), ("spark-a", deployed), ("spark-b", start), ("spark-a", start)]
    assert said == "sparkfleet-watchdog watches it again on spark-b, spark-a"

    def failing(n, cmd, what):
        raise DeployError(f"{n}: {what} failed:\nboom")

    said = resume_watchdogs(failing, c, ("spark-a",))
    assert said.startswith("sparkfleet-watchdog stays stopped (spark-a: handing the pair over to its watchdog failed:)")


# ------------------------------------------------------------------------ doctor: probe and verdicts

def program_output(tmp_path, command, cfg_over=None, state=None):
    """What program_command prints on a node: the real program's output, then `rc=N`."""
    import json
    import subprocess

    from sparkfleet.model.serving import node_profile
    from roles.watchdog.node_config import watch_config
    from tests.unit.test_watchdog import PROGRAM

    c = both()
    cfg = {**watch_config(c, c.head, node_profile(c.head), c.head), "state_dir": str(tmp_path), **(cfg_over or {})}
    (tmp_path / "watchdog.json").write_text(json.dumps(cfg))
    if state is not None:
        (tmp_path / "state.json").write_text(json.dumps(state))
    r = subprocess.run([sys.executable, str(PROGRAM), command, str(tmp_path / "watchdog.json")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
    return (r.stdout + f"rc={r.returncode}\n").splitlines()


def test_the_status_fact_reads_the_programs_verdict(tmp_path):
    import time

    from roles.watchdog.facts import WatchStatus

    gave_up = {"role": "head", "generation": 3, "want": "stopped", "updated_epoch": time.time(), "seq": 4,
               "gave_up": {"at": "2026-01-01T00:00:00+0000", "reason": "3 restart(s) within 7200 s did not keep "
                           "the pair serving; last probe: completion timed out after 30 s"},
               "actions": [{"at": "then", "what": "GAVE UP"}]}
    fact = WatchStatus().process(program_output(tmp_path, "status", state=gave_up))
    assert fact["rc"] == "1" and fact["state"]["generation"] == 3 and fact["state"]["actions"][0]["what"] == "GAVE UP"
    assert fact["verdict"] == ("fail: GAVE UP at 2026-01-01T00:00:00+0000: 3 restart(s) within 7200 s did not keep the "
                               "pair serving; last probe: completion timed out after 30 s")
    broken = WatchStatus().process(program_output(tmp_path, "status", cfg_over={"max_restarts": 0}))
    assert broken["rc"] == "2" and broken["state"] == {} and "max_restarts must be an integer >= 1" in broken["text"]
    assert WatchStatus().process(["rc=absent"]) == {"rc": "absent", "state": {}, "verdict": "", "text": ""}


def test_the_probe_fact_reads_the_programs_line(tmp_path):
    from roles.watchdog.facts import WatchProbe, program_command

    fact = WatchProbe().process(program_output(tmp_path, "probe", cfg_over={
        "commands": {"docker": "false"}, "workers": []}))
    assert fact["rc"] == "1" and fact["line"].startswith("failed: docker inspect sparkfleet-head: exit 1"), fact
    assert program_command("probe") == (
        "if [ -f /usr/local/libexec/sparkfleet/sfl_watch.py ] && [ -f /etc/sparkfleet/watchdog.json ]; then "
        "python3 /usr/local/libexec/sparkfleet/sfl_watch.py probe /etc/sparkfleet/watchdog.json 2>&1; echo rc=$?; "
        "else echo rc=absent; fi")


class DoctorHost:
    def __init__(self, **facts):
        self.facts = facts

    def get_fact(self, cls, **kwargs):
        return self.facts[cls.__name__]


def test_the_doctors_health_is_the_probe_never_health_alone():
    from tools.doctor import health_problems

    c = both()
    ok = {"rc": "0", "line": "ok: completion in 0.05 s"}
    hung = {"rc": "1", "line": "failed: completion timed out after 30 s"}
    worker_ok = DoctorHost(WatchProbe={"rc": "0", "line": "ok: sparkfleet-worker running (pid 7)"})
    assert health_problems(c, {"spark-a": DoctorHost(WatchProbe=ok), "spark-b": worker_ok}, 8000) == []
    hosts = {"spark-a": DoctorHost(WatchProbe=hung, HeadHealth=True), "spark-b": worker_ok}
    assert health_problems(c, hosts, 8000) == ["spark-a: failed: completion timed out after 30 s (probe exit 1); /health 200"]
    stopped = DoctorHost(WatchProbe={"rc": "1", "line": "failed: sparkfleet-worker: process 4242 (python3) stopped "
                                                        "(SIGSTOP): the rank makes no progress"})
    hosts = {"spark-a": DoctorHost(WatchProbe=ok), "spark-b": stopped}
    assert health_problems(c, hosts, 8000) == ["spark-b: failed: sparkfleet-worker: process 4242 (python3) stopped "
                                               "(SIGSTOP): the rank makes no progress (probe exit 1)"]
    hosts = {"spark-a": DoctorHost(WatchProbe={"rc": "absent", "line": ""}, HeadHealth=True), "spark-b": worker_ok}
    assert health_problems(c, hosts, 8000) == ["spark-a: the probe is not installed (/usr/local/libexec/sparkfleet/"
                                               "sfl_watch.py or its config missing): deploy; /health 200"]


def test_a_watchdog_that_gave_up_or_does_not_run_fails_the_doctor():
    from tools.doctor import watchdog_problems

    c = both()
    head = c.head
    running = {"active": "active", "enabled": "enabled"}
    assert watchdog_problems(head, running, {"rc": "0", "verdict": "ok: serving: probe ok"}) == []
    gave_up = {"rc": "1", "verdict": "fail: GAVE UP at then: 3 restart(s) within 7200 s did not keep the pair serving"}
    assert watchdog_problems(head, running, gave_up) == [
        "spark-a: watchdog: fail: GAVE UP at then: 3 restart(s) within 7200 s did not keep the pair serving"]
    paused = watchdog_problems(head, {"active": "inactive", "enabled": "enabled"},
                               {"rc": "1", "verdict": "fail: state not updated for 600 s: is sparkfleet-watchdog running on spark-a?"})
    assert paused[0].startswith("spark-a: sparkfleet-watchdog is inactive (a deploy that paused it did not finish? "
                                "the next deploy starts it")
    assert len(paused) == 2
    no_boot = build_cluster(pair(**{"spark-a": {"serving_start_at_boot": False}})).head
    assert watchdog_problems(no_boot, running, {"rc": "0"}) == [
        "spark-a: sparkfleet-watchdog is enabled at boot, data says disabled (serving_start_at_boot): deploy"]
    assert watchdog_problems(head, {"active": "inactive", "enabled": ""}, {"rc": "absent"})[1:] == [
        "spark-a: sparkfleet-watchdog is not installed at boot, data says enabled (serving_start_at_boot): deploy",
        "spark-a: /usr/local/libexec/sparkfleet/sfl_watch.py or its config is missing: deploy"]


# ------------------------------------------------------------------------------------- make status

def test_the_rank_container_fact_reads_docker_and_the_nodes_clock(tmp_path):
    import os
    import subprocess

    from roles.watchdog.facts import RankContainer

    docker = tmp_path / "docker"
    started = subprocess.run(["date", "-u", "-d", "-90 seconds", "+%Y-%m-%dT%H:%M:%S.123456789Z"], capture_output=True,
                             text=True, check=True).stdout.strip()
    docker.write_text(f"#!/bin/sh\n[ \"$4\" = sparkfleet-head ] || exit 1\necho running {started} sparkfleet/p:abc1234\n")
    docker.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}

    def fact(unit):
        r = subprocess.run(["sh", "-c", RankContainer().command(unit)], capture_output=True, text=True, env=env, timeout=10)
        assert r.returncode == 0, r.stderr
        return RankContainer().process(r.stdout.splitlines())

    got = fact("sparkfleet-head")
    assert got["status"] == "running" and got["image"] == "sparkfleet/p:abc1234" and got["started_at"] == started
    assert 89 <= int(got["up_s"]) <= 95
    assert fact("sparkfleet-worker") == {"status": "missing", "started_at": "-", "image": "-"}


def test_status_shows_probe_ranks_watchdog_actions_and_the_served_commit():
    from roles.serving.history import parse_history
    from sparkfleet.model.serving import node_profile
    from tools.status import duration, status_lines

    assert [duration(s) for s in (42, 425, 10920, 187200, None)] == ["42 s", "7 min 05 s", "3 h 02 min", "2 d 4 h", "?"]
    c = both()
    profile = node_profile(c.head)
    commit = profile.recipe.commit
    image = f"{profile.image}:{commit}"
    units = {"spark-a": {"active": "active", "enabled": "enabled", "container": "running"},
             "spark-b": {"active": "active", "enabled": "enabled", "container": "running"}}
    containers = {"spark-a": {"status": "running", "started_at": "2026-01-01T00:00:00Z", "image": image, "up_s": "3720"},
                  "spark-b": {"status": "running", "started_at": "2026-01-01T00:00:00Z", "image": image, "up_s": "3725"}}
    watch_units = {n: {"active": "active", "enabled": "enabled"} for n in ("spark-a", "spark-b")}
    actions = [{"at": f"2026-01-01T00:0{i}:00+0000", "what": f"action {i}"} for i in range(7)]
    statuses = {
        "spark-a": {"rc": "0", "verdict": "ok: serving: probe ok at then (completion in 0.08 s)",
                    "state": {"generation": 2, "want": "serving", "restarts": [{}], "actions": actions,
                              "last_probe": {"ok": True, "at": "then", "latency_s": 0.08}}},
        "spark-b": {"rc": "0", "verdict": "ok: container running", "state": {"actions": []}},
    }
    events = parse_history([f"2026-01-01T00:00:00Z attempted {commit}", f"2026-01-01T00:10:00Z served {commit}"])
    probe = {"rc": "0", "line": "ok: completion in 0.07 s"}
    text = "\n".join(status_lines(c, profile, probe, units, containers, watch_units, statuses, events))
    assert "  probe     spark-a    ok: completion in 0.07 s  [latency 0.07 s]" in text
    assert (f"  rank      spark-b    worker sparkfleet-worker active, enabled at boot; container running, up 1 h 02 min "
            f"(since 2026-01-01T00:00:00Z); image {image}") in text
    assert ("  watchdog  spark-a    sparkfleet-watchdog active: ok: serving: probe ok at then (completion in 0.08 s); "
            "generation 2, want serving, 1 restart(s) in the window; its last probe ok at then (latency 0.08 s)") in text
    assert "action 1" not in text and "2026-01-01T00:06:00+0000  action 6" in text  # the last five
    assert "  watchdog  spark-b    sparkfleet-watchdog active: ok: container running\n" in text + "\n"
    assert f"  recipe    spark-a    {commit}, last served 2026-01-01T00:10:00Z" in text
    # the engine's version, from the in-image proof's record for the image the head runs (roles/engine_proof)
    assert f"  engine    spark-a    vllm, version not recorded for {image} (no engine proof of it)" in text
    from sparkfleet.model.engine_proof import record_text
    proof = record_text(image, "vllm", "0.33.0", "abc", True)
    text = "\n".join(status_lines(c, profile, probe, units, containers, watch_units, statuses, events, proof=proof))
    assert "  engine    spark-a    vllm 0.33.0 (read by the image's own engine at its last deploy)" in text
    # A failed upgrade after it: the running commit, and the history's last word.
    events += parse_history([f"2026-01-02T00:00:00Z failed {'b' * 40}"])
    containers["spark-a"] = {"status": "exited", "started_at": "-", "image": image}
    text = "\n".join(status_lines(c, profile, {"rc": "1", "line": "failed: connection refused on 127.0.0.1:8000"}, units,
                                  containers, watch_units, statuses, events))
    assert "  probe     spark-a    failed: connection refused on 127.0.0.1:8000\n" in text
    assert f"last in the history: failed {'b' * 40} at 2026-01-02T00:00:00Z" in text
    assert "container exited; image" in text
