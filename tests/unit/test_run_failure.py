"""Errors during the run as good as before it (sparkfleet/run_failure.py): each failure a run can meet
in its long steps, provoked here through the code that meets it, names the host, what was waited
for, the log to read (the exact command), the data key that governs it and the next step.

The shell steps are run for real under `sh`, with the tool they call (docker, git, rsync, python3)
replaced by a stub on PATH that fails or hangs; the operation bodies (the /health wait, the prewarm,
the push and the pull) run against fake hosts that answer as a failing node does."""
import os
import re
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import roles.image.checks as image_checks
import roles.kernel_cache.checks as kc
import roles.serving.ready as ready
import sparkfleet.run as run_module
from roles.fanout.commands import rsync_pull_command
from roles.image.commands import build_command, build_log, fetch_log, git_fetch_command, pull_command as image_pull
from roles.image.commands import push_command
from roles.weights.checks import fetch_command, pull_command as weights_pull, weights_log
from sparkfleet.bounded import bounded
from sparkfleet.config import DATA_FIELDS, build_cluster
from sparkfleet.model.serving import load_profile
from sparkfleet.run_failure import Advice, RunFailed, RunFailure, failure_line
from sparkfleet.watchdog_handover import PAUSE_STEPS, START_STEPS, paused_note
from tests.unit.helpers import pair

PROFILE = load_profile("glm-5.3-flash-exl3")
LINE = re.compile(r'^sparkfleet: (?P<host>[^:]+): (?P<waited>.+?): (?P<what>.+?); log: (?P<log>ssh root@\S+ .+?); '
                  r"key: (?P<key>[a-z0-9_]+); next: (?P<next>.+)$")


def cluster(tmp_path: Path | None = None, **data):
    c = build_cluster(pair(**{"spark-a": data, "spark-b": data}))
    if tmp_path is None:
        return c
    # Logs under the test's directory: the model refuses a data dir under /tmp, so set it past the model.
    nodes = {n.name: n.model_copy(update={"preflight_data_dir": str(tmp_path / "data" / n.name)}) for n in c.nodes}
    return SimpleNamespace(head=nodes["spark-a"], node=nodes.__getitem__, nodes=list(nodes.values()),
                           workers=[nodes["spark-b"]])


def parts(line: str) -> dict:
    m = LINE.match(line)
    assert m, line
    assert m["key"] in DATA_FIELDS
    return m.groupdict()


def stubs(tmp_path: Path, script: str, *tools: str) -> dict:
    """An environment whose PATH finds `script` first for each of `tools`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in tools:
        (bin_dir / tool).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def sh(command: str, env: dict, timeout: int = 60):
    start = time.monotonic()
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, timeout=timeout)
    return done, time.monotonic() - start


def sparkfleet_line(stderr: str) -> str:
    [line] = [line for line in stderr.splitlines() if line.startswith("sparkfleet: ")]
    return line


# --- The shell form, run for real ------------------------------------------------------------------

ADVICE = Advice(log="ssh root@10.0.0.11 'journalctl -u docker -n 200 --no-pager'", key="docker_registry_port",
                next_step="check the registry; a re-run pushes only the layers the registry lacks")


def test_a_command_that_fails_prints_its_status_and_all_five_parts(tmp_path):
    done, _ = sh(bounded("echo 'denied: requested access' >&2; exit 7", step="Push x", host="spark-a", limit_s=20,
                         key="image_push_timeout_s", advice=ADVICE), os.environ)
    assert done.returncode == 7
    assert done.stderr.splitlines()[0] == "denied: requested access"  # the command's own words, then the line
    p = parts(sparkfleet_line(done.stderr))
    assert p == {"host": "spark-a", "waited": '"Push x"', "what": "failed (exit status 7)", "log": ADVICE.log,
                 "key": "docker_registry_port", "next": ADVICE.next_step}


def test_a_command_that_times_out_with_a_1_s_limit_names_the_limit_key(tmp_path):
    done, took = sh(bounded("sleep 30", step="Push x", host="spark-a", limit_s=1, key="image_push_timeout_s",
                            advice=ADVICE), os.environ)
    assert done.returncode == 124 and took < 10
    p = parts(sparkfleet_line(done.stderr))
    assert (p["host"], p["waited"], p["what"], p["key"]) == ("spark-a", '"Push x"', "stopped after 1 s, its limit",
                                                             "image_push_timeout_s")
    assert p["log"] == ADVICE.log and "raise image_push_timeout_s" in p["next"]
    assert "failed (exit status" not in done.stderr  # one line, not two


def test_success_says_nothing_and_keeps_the_output(tmp_path):
    done, _ = sh(bounded("echo pushed", step="s", host="h", limit_s=20, key="image_push_timeout_s", advice=ADVICE),
                 os.environ)
    assert (done.returncode, done.stdout, done.stderr) == (0, "pushed\n", "")


def test_a_log_file_keeps_the_output_root_only_and_its_tail_is_printed_on_failure(tmp_path):
    log = tmp_path / "logs" / "step.log"
    command = "i=0; while [ $i -lt 50 ]; do echo line $i; i=$((i+1)); done; exit 2"
    done, _ = sh(bounded(command, step="s", host="h", limit_s=20, key="image_build_timeout_s", advice=ADVICE,
                         log_file=str(log)), os.environ)
    assert done.returncode == 2 and done.stdout == ""
    err = done.stderr.splitlines()
    assert err[:-1] == [f"line {i}" for i in range(20, 50)]  # the last LOG_TAIL_LINES lines
    assert err[-1].startswith("sparkfleet: h: ") and "failed (exit status 2)" in err[-1]
    # The log keeps the whole output, then the same line: it says how the step ended.
    assert log.read_text().splitlines() == [f"line {i}" for i in range(50)] + [err[-1]]
    assert oct(log.parent.stat().st_mode & 0o777) == "0o700" and oct(log.stat().st_mode & 0o777) == "0o600"
    done, _ = sh(bounded("echo fine", step="s", host="h", limit_s=20, key="image_build_timeout_s", advice=ADVICE,
                         log_file=str(log)), os.environ)
    assert (done.returncode, done.stderr, log.read_text()) == (0, "", "fine\n")  # the last run's log


def test_a_command_stopped_at_its_limit_before_printing_anything_leaves_a_log_that_says_so(tmp_path):
    # As a fetch from a source that accepts the connection and never answers: nothing printed, then TERM.
    log = tmp_path / "logs" / "fetch.log"
    done, took = sh(bounded("sleep 30", step="Fetch m", host="spark-a", limit_s=1, key="weights_fetch_timeout_s",
                            advice=ADVICE, log_file=str(log)), os.environ)
    assert done.returncode == 124 and took < 10
    [line] = log.read_text().splitlines()  # not empty: the operator who reads the log named learns why
    assert line == sparkfleet_line(done.stderr) and "stopped after 1 s, its limit" in line
    assert parts(line)["key"] == "weights_fetch_timeout_s"


# --- Each long shell step of a deploy, rendered from data and run with its tool failing -------------

def image_steps(c, tmp_path):
    src = tmp_path / "src"
    (src / ".git").mkdir(parents=True, exist_ok=True)
    head, worker = c.head, c.node("spark-b")
    ref = f"10.77.77.1:5000/{PROFILE.image}@sha256:{'0' * 64}"
    return {
        "git fetch": (git_fetch_command(head, PROFILE.recipe, str(src)), "git", "spark-a",
                      "serving_recipe_repository", f"cat {fetch_log(head)}"),
        "docker build": (build_command(head, PROFILE, str(src)), "docker", "spark-a", "serving_recipe_commit",
                         f"tail -n 200 {build_log(head, PROFILE)}"),
        "docker push": (push_command(head, PROFILE, ref), "docker", "spark-a", "docker_registry_port",
                        "journalctl -u docker-registry"),
        "docker pull": (image_pull(worker, PROFILE, ref), "docker", "spark-b", "docker_registry_port",
                        "journalctl -u docker "),
        "weights fetch": (fetch_command(head, PROFILE, "org/m", "abc"), "docker", "spark-a", "weights_source",
                          f"tail -n 200 {weights_log(head, 'fetch', 'org/m')}"),
        "weights pull": (weights_pull(c, worker, "org/m"), "python3", "spark-b", "fanout_http_port",
                         f"tail -n 200 {weights_log(worker, 'pull', 'org/m')}"),
        "kernel cache rsync": (rsync_pull_command(head, "rsync://10.77.77.2:873/kernel-cache/g/", str(tmp_path / "k"),
                                                  "Pull spark-b's kernel cache g onto spark-a", source=worker),
                               "rsync", "spark-a", "fanout_rsync_port", "journalctl -u sparkfleet-rsyncd"),  # (on spark-b)
    }


STEPS = ("git fetch", "docker build", "docker push", "docker pull", "weights fetch", "weights pull",
         "kernel cache rsync")


@pytest.fixture(autouse=True)
def sfl_files_from_the_repository(monkeypatch):
    """The weights fetch runs under sfl_files.py land: here the repository's copy, where a node has it
    installed (roles/fanout), so that the fetch's own tools are what the stubs stand in for."""
    import roles.fanout.sfl_files

    monkeypatch.setattr("roles.weights.checks.SFL_FILES", roles.fanout.sfl_files.__file__)


@pytest.mark.parametrize("step", STEPS)
def test_each_step_that_fails_on_the_node_prints_its_five_parts(step, tmp_path):
    c = cluster(tmp_path)
    command, tool, host, key, log = image_steps(c, tmp_path)[step]
    env = stubs(tmp_path, f"echo '{tool}: the error of the tool itself' >&2; exit 1", tool)
    done, _ = sh(command, env)
    assert done.returncode == 1, done.stderr
    assert f"{tool}: the error of the tool itself" in done.stderr  # the tool's own words stay (or the log's tail)
    p = parts(sparkfleet_line(done.stderr))
    # The log is the node's own, but for the kernel-cache rsync: the journal of the daemon it pulled from.
    address = c.node("spark-b" if step == "kernel cache rsync" else host).management_address
    assert p["host"] == host and p["what"] == "failed (exit status 1)" and p["key"] == key
    assert p["log"].startswith(f"ssh root@{address} ") and log in p["log"]
    assert p["waited"].startswith('"') and p["next"]


@pytest.mark.parametrize("step", ["docker push", "weights fetch"])
def test_each_step_at_a_1_s_limit_names_the_limit_and_the_log(step, tmp_path, monkeypatch):
    monkeypatch.setattr("sparkfleet.bounded.KILL_AFTER_S", 1)
    c = cluster(tmp_path, image_push_timeout_s=1, weights_fetch_timeout_s=1)
    command, tool, host, _, log = image_steps(c, tmp_path)[step]
    # (docker rm, the hub fetch's cleanup, answers at once)
    done, took = sh(command, stubs(tmp_path, '[ "$1" = rm ] && exit 0; exec sleep 30', tool))
    assert done.returncode == 124 and took < 10, done.stderr
    p = parts(sparkfleet_line(done.stderr))
    limit = {"docker push": "image_push_timeout_s", "weights fetch": "weights_fetch_timeout_s"}[step]
    assert p["host"] == host and p["what"] == "stopped after 1 s, its limit" and p["key"] == limit
    assert log in p["log"] and f"raise {limit}" in p["next"]


# --- The operation bodies ----------------------------------------------------------------------------

class FakeHost:
    """A pyinfra host whose shell answers by the first matching command prefix (or substring)."""

    def __init__(self, name, answers):
        self.name = name
        self.answers = answers
        self.commands = []

    def run_shell_command(self, command):
        text = str(command)
        self.commands.append(text)
        for pattern, (ok, out) in self.answers.items():
            if pattern in text:
                return ok, SimpleNamespace(stdout=out, stderr="" if ok else out)
        return True, SimpleNamespace(stdout="", stderr="")


@pytest.fixture
def clock(monkeypatch):
    """time.monotonic advancing 10 s a call, sleep doing nothing: a wait reaches its bound at once."""
    now = [0.0]

    def tick():
        now[0] += 10
        return now[0]
    monkeypatch.setattr(ready.time, "monotonic", tick)
    monkeypatch.setattr(ready.time, "sleep", lambda s: None)
    return now


def serving(monkeypatch, head_answers, worker_answers=None):
    c = build_cluster(pair())
    head, worker = FakeHost("spark-a", head_answers), FakeHost("spark-b", worker_answers or {})
    monkeypatch.setattr(ready, "host", head)
    monkeypatch.setattr(ready, "state", SimpleNamespace(inventory=SimpleNamespace(
        get_host={"spark-a": head, "spark-b": worker}.__getitem__)))
    monkeypatch.setattr(ready, "cluster_from_state", lambda state: c)
    return c, head, worker


def wait(**extra):
    ready.wait_for_health(unit="sparkfleet-head", api="https://10.0.0.11:8000", tls="--cacert /etc/sparkfleet/tls/ca.crt",
                          timeout_s=60, endpoint="https://10.0.0.11:8000/v1", max_model_len=65536, **extra)


def block_of(err) -> dict:
    """The five parts of a RunFailed's printed block (and its title)."""
    text = err.value.block()
    lines = text.splitlines()
    labelled = dict(re.match(r"  (waited for|log|key|next): +(.*)", line).groups() for line in lines[1:5])
    assert lines[0].startswith("sparkfleet: ") and labelled["key"] in DATA_FIELDS
    return {"title": lines[0], **labelled, "text": text}


def test_the_health_timeout_names_the_heads_journal_the_key_and_the_next_step(monkeypatch, clock):
    serving(monkeypatch, {"journalctl -u sparkfleet-head": (True, "CUDA out of memory\n"), "curl": (True, "503")})
    with pytest.raises(RunFailed) as err:
        wait()
    b = block_of(err)
    assert b["title"] == "sparkfleet: spark-a: /health not 200 after 60 s (last: 503)"
    assert b["waited for"] == "the head's /health to answer 200 (up to 60 s)"
    assert b["log"] == "ssh root@10.0.0.11 'journalctl -u sparkfleet-head -n 200 --no-pager'"
    assert b["key"] == "serving_health_timeout_s" and "raise serving_health_timeout_s (now 60)" in b["next"]
    assert "    | CUDA out of memory" in b["text"]  # the journal's last lines, as read


def test_a_worker_that_dies_while_the_pair_starts_is_named_with_its_own_journal(monkeypatch, clock):
    seen = iter(["true 2026-12-05T10:00:00Z 4242", "gone"])
    _, _, worker = serving(monkeypatch, {"curl": (True, "503")},
                           {"journalctl": (True, "NCCL error: unhandled system error\n")})
    worker.run_shell_command = (lambda orig: lambda cmd: (True, SimpleNamespace(stdout=next(seen), stderr=""))
                                if "docker inspect" in str(cmd) else orig(cmd))(worker.run_shell_command)
    with pytest.raises(RunFailed) as err:
        wait(workers=("spark-b",))
    b = block_of(err)
    assert b["title"].startswith("sparkfleet: spark-b: the worker's engine exited") and "spark-a cannot finish" in b["title"]
    assert b["log"] == "ssh root@10.0.0.12 'journalctl -u sparkfleet-worker -n 200 --no-pager'"
    assert b["key"] == "serving_profile" and "re-deploy" in b["next"]
    assert "NCCL error" in b["text"]


def test_a_kv_cache_too_small_names_the_profiles_file_not_a_missing_key(monkeypatch, clock):
    serving(monkeypatch, {"curl": (True, "200"), "KV cache size": (True, "GPU KV cache size: 4,096 tokens\n")})
    with pytest.raises(RunFailed) as err:
        wait()
    b = block_of(err)
    assert "4096 tokens < max_model_len 65536" in b["title"]
    assert b["key"] == "serving_profile" and "gpu_memory_utilization" not in DATA_FIELDS
    assert "roles/serving/profiles/glm-5.3-flash-exl3.yaml" in b["next"]


def test_a_container_that_never_runs_names_its_unit(monkeypatch, clock):
    serving(monkeypatch, {"docker inspect": (True, "created"), "journalctl": (True, "no such image\n")})
    with pytest.raises(RunFailed) as err:
        ready.wait_for_container("sparkfleet-head", timeout_s=30)
    b = block_of(err)
    assert b["title"] == "sparkfleet: spark-a: sparkfleet-head container not running after 30 s"
    assert "journalctl -u sparkfleet-head" in b["log"] and "no such image" in b["text"]


def image_body(monkeypatch, name, answers):
    c = build_cluster(pair())
    fake = FakeHost(name, answers)
    monkeypatch.setattr(image_checks, "host", fake)
    monkeypatch.setattr(image_checks, "state", SimpleNamespace())
    monkeypatch.setattr(image_checks, "cluster_from_state", lambda state: c)
    return c


def test_a_failed_push_names_the_registrys_journal_and_port(monkeypatch):
    image_body(monkeypatch, "spark-a", {"docker push": (False, "Get http://10.77.77.1:5000/v2/: connection refused")})
    with pytest.raises(RunFailed) as err:
        image_checks.push_image(local="sparkfleet/x:c", remote="10.77.77.1:5000/sparkfleet/x:c",
                                push="docker push 10.77.77.1:5000/sparkfleet/x:c", step="Push", interval=30)
    b = block_of(err)
    assert b["title"] == "sparkfleet: spark-a: pushing 10.77.77.1:5000/sparkfleet/x:c failed"
    assert b["log"] == "ssh root@10.0.0.11 'journalctl -u docker-registry -n 200 --no-pager'"
    assert b["key"] == "docker_registry_port" and "10.77.77.1:5000" in b["next"]
    assert "connection refused" in b["text"]


def test_a_failed_pull_names_the_workers_docker_journal_and_how_to_reach_the_registry(monkeypatch):
    """The worker's pull runs in the background (roles/image/background.py); its wait fails with what
    the pull printed, under the pull's own failure block."""
    from roles.image import background as image_background

    c = build_cluster(pair())
    fake = FakeHost("spark-b", {image_background.PULL_UNIT: (False, "manifest unknown")})
    remote = f"10.77.77.1:5000/{PROFILE.image}:{PROFILE.recipe.commit}"
    monkeypatch.setattr(image_background, "host", fake)
    monkeypatch.setattr(image_background, "state", SimpleNamespace())
    monkeypatch.setattr(image_background, "cluster_from_state", lambda state: c)
    monkeypatch.setattr(image_background, "pushed_digests", lambda state: {remote: "sha256:" + "1" * 64})
    with pytest.raises(RunFailed) as err:
        image_background.await_pull(remote=remote, pin="/x/pin", step="Pull")
    assert any(f"systemctl is-active --quiet {image_background.PULL_UNIT}" in cmd for cmd in fake.commands)
    b = block_of(err)
    assert b["title"].startswith("sparkfleet: spark-b: pulling 10.77.77.1:5000/") and b["key"] == "docker_registry_port"
    assert b["log"] == "ssh root@10.0.0.12 'journalctl -u docker -n 200 --no-pager'"
    assert "curl -sS http://10.77.77.1:5000/v2/" in b["next"] and "manifest unknown" in b["text"]


def test_a_failed_background_build_fails_its_wait_with_the_builds_own_lines(monkeypatch):
    """The head's build runs in the background from step 2d (roles/image/background.py); step 5's wait
    fails with what the bounded build printed: its step, exit status, log on the head and data key."""
    from pyinfra.api.exceptions import DeployError

    from roles.image import background as image_background

    c = build_cluster(pair())
    said = (f'sparkfleet: spark-a: "Build {PROFILE.image_ref} on the head": failed (exit status 1); '
            f"log: ssh root@10.0.0.11 'tail -n 200 /var/lib/sparkfleet/logs/build-x.log'; key: serving_recipe_commit")
    fake = FakeHost("spark-a", {image_background.BUILD_UNIT: (False, said)})
    monkeypatch.setattr(image_background, "host", fake)
    monkeypatch.setattr(image_background, "state", SimpleNamespace())
    monkeypatch.setattr(image_background, "cluster_from_state", lambda state: c)
    with pytest.raises(DeployError) as err:
        image_background.await_build(ref=PROFILE.image_ref, step=f"Build {PROFILE.image_ref} on the head")
    assert any(f"systemctl is-active --quiet {image_background.BUILD_UNIT}" in cmd for cmd in fake.commands)
    assert str(err.value).startswith(f'spark-a: "Build {PROFILE.image_ref} on the head" failed; what it printed:')
    assert said in str(err.value)


class PrewarmNodes:
    """kernel_cache's _Nodes: every node answers `answers` (substring -> stdout); counts are steady."""

    def __init__(self, answers):
        self.cluster = build_cluster(pair())
        self.answers = answers
        self.commands = []
        self.hosts = {n.name: FakeHost(n.name, {"curl": (True, answers.get("request", "200"))})
                      for n in self.cluster.nodes}

    def run(self, name, command, what, check=True):
        self.commands.append((name, command))
        return next((out for pattern, out in self.answers.items() if pattern in command), "")

    def counts(self):
        return {n.name: (5, 500) for n in self.cluster.nodes}


@pytest.fixture
def prewarm_clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(kc.time, "monotonic", lambda: now.__setitem__(0, now[0] + 100) or now[0])
    monkeypatch.setattr(kc.time, "sleep", lambda s: None)


@pytest.mark.parametrize("case, answers, title, key", [
    ("an engine that exits", {"inspect": "exited", "docker logs --tail 30": "RuntimeError: NCCL error\n"},
     "the prewarm engine stopped (exited) before the pair was up", "serving_profile"),
    ("a pair never healthy", {"inspect": "running", "curl": "503", "docker logs --tail 30": "compiling\n"},
     "prewarm pair not healthy after", "kernel_cache_prewarm_timeout_s"),
    ("a warm-up request refused", {"inspect": "running", "curl": "200", "request": "400"},
     "warm-up request 'short prompt' answered 400", "serving_profile"),
])
def test_each_prewarm_failure_names_the_kept_prewarm_log(case, answers, title, key, prewarm_clock):
    nodes = PrewarmNodes(answers)
    with pytest.raises(RunFailed) as err:
        kc._prewarm(nodes, PROFILE)
    b = block_of(err)
    assert title in b["title"] and b["key"] == key
    host = b["title"].split(": ")[1]
    address = nodes.cluster.node(host).management_address
    assert b["log"] == f"ssh root@{address} 'tail -n 200 /var/lib/sparkfleet/logs/prewarm.log'"
    # Every rank's log is kept there before its prewarm container is removed.
    for n in nodes.cluster.nodes:
        stop = next(c for name, c in nodes.commands if name == n.name and "docker rm -f sparkfleet-prewarm" in c
                    and "docker stop" in c)
        assert stop.index("docker logs --tail") < stop.index("docker rm -f") and "chmod 0600" in stop


# --- Keys, and the watchdogs a stopped run leaves paused ---------------------------------------------

def test_a_failure_naming_no_data_key_is_refused_when_made():
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        RunFailure("spark-a", "x", "y", "ssh root@a true", "gpu_memory_utilization", "z")
    with pytest.raises(ValueError, match="serving_health_timeout"):
        Advice("ssh root@a true", "serving_health_timeout", "z")
    assert parts(failure_line("a", "w", "x", "ssh root@a 'l'", "serving_profile", "n"))["key"] == "serving_profile"


def test_the_note_says_where_the_watchdogs_stay_paused_and_how_to_check():
    note = paused_note(["spark-a", "spark-b"], {"spark-a": "10.0.0.11", "spark-b": "10.0.0.12"})
    assert "sparkfleet-watchdog stays paused on spark-a, spark-b" in note
    assert "until the next successful deploy" in note
    assert "ssh root@10.0.0.11 'systemctl status sparkfleet-watchdog'" in note
    assert "ssh root@10.0.0.12 'systemctl status sparkfleet-watchdog'" in note
    assert paused_note([], {}) is None


class FakeNode:
    """A pyinfra host as stop_summary reads it: a name and its data; hashable, as pyinfra's are."""

    def __init__(self, name, address):
        self.name, self.data = name, {"ssh_hostname": address}


class Meta:
    def __init__(self, changed):
        self.changed = changed

    def is_complete(self):
        return True

    def did_change(self):
        return self.changed


def stopped_run(ops: dict, resumed=()):
    """A run stopped at an operation on spark-a; ops: (host, step) -> whether it ran a command."""
    hosts = {n: FakeNode(n, ip) for n, ip in
             (("spark-a", "10.0.0.11"), ("spark-b", "10.0.0.12"))}
    run = run_module.RunContext(inventory_arg="inventory.py", cwd="/", data_args=(), group_data_dirs=())
    run.failed_ops = {"spark-a": ["Wait for the head's /health"]}
    op_meta, host_ops = {}, {}
    recorder = run_module._Recorder(run)
    st = SimpleNamespace(
        inventory=list(hosts.values()), failed_hosts={hosts["spark-a"]}, activated_hosts=set(hosts.values()),
        current_stage=run_module.StateStage.Execute, get_op_meta=op_meta.__getitem__,
        get_op_data_for_host=lambda h, op: host_ops[(h.name, op)])
    for i, ((name, step), changed) in enumerate(ops.items()):
        # as pyinfra names an operation of an included file (pyinfra/api/operation.py: f"{host.current_deploy_name} | {name}")
        op_meta[str(i)] = SimpleNamespace(names={f"roles/watchdog/pause_tasks.py | {step}"})
        host_ops[(name, str(i))] = SimpleNamespace(operation_meta=Meta(changed))
        recorder.operation_host_success(st, hosts[name], str(i))
    run.watchdogs_resumed.update(resumed)
    return run_module.stop_summary(st, run, RuntimeError())


def test_a_run_that_stops_after_pausing_the_watchdogs_ends_saying_so():
    text = stopped_run({("spark-a", PAUSE_STEPS[0]): True, ("spark-b", PAUSE_STEPS[1]): True})
    last = text.splitlines()
    assert "the run stopped at \"Wait for the head's /health\": spark-a failed" in last[0]
    assert "stays paused on spark-a, spark-b" in text and last[-1].endswith("'systemctl status sparkfleet-watchdog'")


def test_no_note_when_nothing_was_paused_or_it_was_started_again():
    assert "stays paused" not in stopped_run({("spark-a", PAUSE_STEPS[0]): False})  # _if false: nothing ran
    assert "stays paused" not in stopped_run({("spark-a", PAUSE_STEPS[0]): True, ("spark-a", START_STEPS[1]): True})
    assert "stays paused" not in stopped_run({("spark-a", PAUSE_STEPS[0]): True}, resumed={"spark-a"})
    partly = stopped_run({("spark-a", PAUSE_STEPS[0]): True, ("spark-b", PAUSE_STEPS[1]): True,
                          ("spark-b", START_STEPS[0]): True})
    assert "stays paused on spark-a:" in partly


# --- The lab reads the five parts back from a deploy's output (tests/e2e/lab.py Run.failures) ----------

def test_the_lab_reads_both_forms_back_as_pyinfra_prints_them():
    from sparkfleet.refusal import refusal_block
    from tests.e2e.lab import Run

    step = "Push sparkfleet/x:c to the fabric registry"
    done, _ = sh(bounded("echo 'dial tcp: connection refused' >&2; exit 1", step=step, host="spark-a", limit_s=20,
                         key="image_push_timeout_s", advice=ADVICE), os.environ)
    line = sparkfleet_line(done.stderr)
    pulled = RunFailure(host="spark-b", waited_for="docker pull of r from the head's registry over the fabric",
                        what="pulling r failed", log="ssh root@10.0.0.12 'journalctl -u docker -n 200 --no-pager'",
                        key="docker_registry_port", next_step="check that spark-b reaches the registry; then re-deploy")
    # As the run prints them: a failed shell command's stderr under "[host] ", an operation body's
    # RunFailed as its block (sparkfleet/run.py _OperationRefusalLog), then the stop summary.
    output = "\n".join([
        f"--> Starting operation: {step}", "    [spark-a] dial tcp: connection refused", f"    [spark-a] {line}",
        "    [spark-a] Error: executed 0/1 commands", "",
        "--> " + refusal_block(RunFailed(pulled, f"Error response from daemon: connection refused\n{line}")), "",
        "--> sparkfleet: the run stopped at 'Pull': spark-b failed (the error is above)"])
    for text in (output, "\n".join(f"\x1b[31m{ln}\x1b[0m" for ln in output.splitlines())):  # coloured or not
        run = Run(1, text)
        first, block, tail = run.failures()
        assert (first.form, first.host, first.waited_for, first.what, first.key) == (
            "line", "spark-a", f'"{step}"', "failed (exit status 1)", "docker_registry_port")
        assert (first.log, first.next_step) == (ADVICE.log, ADVICE.next_step)
        assert block == lab_failure(pulled, "block")
        assert tail == first  # the shell step's line, again in the block's log tail
        assert run.failure("spark-b", "docker_registry_port") == block
        assert run.failure("spark-a", "docker_registry_port") == first
    with pytest.raises(AssertionError, match="no failure of spark-a naming key docker_registry_port as a block"):
        Run(1, output).failure("spark-a", "docker_registry_port", form="block")
    with pytest.raises(AssertionError, match="no failure of spark-b naming key serving_profile"):
        Run(1, output).failure("spark-b", "serving_profile")


def lab_failure(f: RunFailure, form: str):
    from tests.e2e.lab import Failure

    return Failure(f.host, f.waited_for, f.what, f.log, f.key, f.next_step, form)


def test_watchdogs_a_failed_prewarm_started_again_are_not_named_paused():
    """watchdog_handover keeps them on pyinfra's state (no import of sparkfleet.run: no circle);
    run.py's end reads them there."""
    from pyinfra.context import ctx_state
    from sparkfleet import watchdog_handover

    st = SimpleNamespace()
    with ctx_state.use(st):
        watchdog_handover._resumed(["spark-b", "spark-a"])
    assert watchdog_handover.resumed_on(st) == {"spark-a", "spark-b"}
    assert watchdog_handover.resumed_on(SimpleNamespace()) == set()
