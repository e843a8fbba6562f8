#!/usr/bin/env python3
"""sparkfleet's watchdog: keeps the serving pair serving, unattended. Python 3 standard library only
(it runs on DGX OS); installed as /usr/local/libexec/sparkfleet/sfl_watch.py and run on every node by
sparkfleet-watchdog.service, from one JSON config file written by the deploy.

  sfl_watch.py run CONFIG      the node's loop: the head's (probe, restart the pair) or a worker's (follow)
  sfl_watch.py probe CONFIG    run the probe once; print 'ok: ...' or 'failed: <reason>'; exit 0 or 1
  sfl_watch.py status CONFIG   print the node's state (JSON), then one line 'verdict: ok|fail: ...';
                               exit 0 when the verdict is ok, 1 otherwise
  sfl_watch.py deployed CONFIG the deploy hands the pair back (run by the deploy while this node's
                               watchdog is stopped, before it starts it): see 'A deploy' below
Exit codes: 0 ok, 1 not ok, 2 usage or config error.

Design
------
Liveness means serving. The probe (head only) passes when all of these hold:
  (a) the head's container is running and not paused, and no process of it (its main process or any
      descendant: the engine runs under the container's init) is stopped (state T in /proc/<pid>/stat:
      a SIGSTOPped rank blocks every request while /health stays 200);
  (b) a real request succeeds: POST http://127.0.0.1:<port>/v1/completions
      {"model": <served name>, "prompt": "ping", "max_tokens": 1} to the engine itself (its own port,
      behind the API proxy; the engine holds no API key, the proxy checks it, so the watchdog reads
      none), answered 200 with a choice within probe_timeout_s (a hard bound on the whole request);
      its latency is recorded;
  (c) every worker's state is fresh and says its container is running with no process stopped.
/health is never asked: it stays 200 through the hangs this watchdog exists for. A worker's state
that is stale or unreadable while the completion passes fails the probe (status and doctor say the
watchdog is blind) but never restarts the pair: a restart could not be done in order without it.

How ranks learn that the pair must restart, with no SSH between nodes and no new network daemon:
each node's watchdog writes its own state, atomically, to <state_dir>/state.json; the read-only
rsync daemon every node already runs on its fabric address (roles/fanout, peers only) serves that
directory as module `watchdog`; a node reads a peer's state with
  rsync --timeout=N --contimeout=N rsync://<peer fabric ip>:<port>/watchdog/state.json <tmp file>
(a peer's state source may also be a local path, for tests). Nothing is ever pushed. The head
drives, the workers follow:
  * The head's state carries `generation` (a counter of pair restarts) and `want`
    (serving | restarting | stopped, with `gave_up: {at, reason}` when stopped).
  * Each worker's state carries its container's state and `handled_generation`, the last generation
    it acted on, and a `seq` that grows with every write. The head judges a worker's freshness by
    that seq advancing (on the head's own monotonic clock, so clock skew between nodes does not
    matter); the one-shot `probe` command, which sees one snapshot, uses the worker's wall-clock
    `updated` instead (nodes keep NTP time).

The head's loop, every interval_s: run the probe. Within startup_grace_s of the head unit's start
(systemd's InactiveExitTimestampMonotonic: a cold start takes minutes) a failure is not judged,
unless a container is not running, a process is stopped, or a rank's container restarted on its own
(below). failures_before_restart consecutive judged failures restart the pair as one, in the
deploy's order:
  1. stop the head unit;
  2. generation += 1, want = restarting (written to the head's state);
  3. wait (bounded) until every worker's state shows handled_generation == generation and its
     container running; a worker that does not get there fails the attempt and the head stays
     stopped (a head started beside a worker that never came up cannot serve);
  4. start the head unit, want = serving;
  5. wait (bounded: ready_timeout_s, a cold start) for the probe to pass; log how long it all took.
A failed completion is first weighed against the engine's own counters (progress_metrics: on vLLM
its /metrics, vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:request_success_total and
the gauges vllm:num_requests_running + vllm:num_requests_waiting), sampled at every probe: when a
counter rose since the last probe, the engine is producing tokens and completing requests and the
probe only waited behind its queue: alive, not a failure, whatever its latency (journal: "busy, not
judged"). So is an engine whose counters have been flat, with requests in hand, for less than
stall_s: one engine step (a long prompt's prefill, max_num_batched_tokens at a time) rises no
counter until it ends, and on a loaded machine it can outlast a probe interval (seen in the lab: a
probe judged "no progress in 5.4 s with 12 request(s) in hand" under 7000-token prompts). The stall
clock runs from the last sample at which a counter rose or nothing was in hand. A failure is judged
when nothing moved for stall_s while requests are in hand (stuck), when nothing is in hand (the
queue is empty and the probe still fails), or without two comparable samples (no counters, or the
metrics unreadable).
Backoff: a restart waits backoff_s * 2**f after the previous one ended, f being the restarts within
window_s that did not end the failure: that did not bring the pair back, or after which it failed
again within recovered_after_s (the probe keeps running meanwhile; a pass cancels it).
The window and the backoff run on this boot's monotonic clock (a wall-clock step moves neither; a
reboot resets both: "clocks" below).
Once max_restarts restarts that did not end the failure (or were interrupted) fell within window_s
and the probe still fails, the head gives up (a restart after which the pair served for
recovered_after_s never counts: three unrelated crashes in a window are three recoveries, not a
reason to stop serving; a pair that fails again within minutes of every restart is not cured by
them): it stops the
head unit, sets want = stopped and gave_up = {at, reason}, and says so in the journal; the workers
stop their units.
It keeps probing without restarting, and clears gave_up (and the restart count) as soon as the probe
passes again (someone deployed a fix). A restart interrupted by the watchdog's own stop
(want = restarting in its state when it starts) is resumed from step 3.
A rank restarted alone (its container's start time or pid changed without a pair restart by this
watchdog, e.g. systemd's Restart=always after an engine exited) leaves its peer orphaned: a vLLM
headless worker cannot rejoin a restarted head. Such a pair gets no start-up grace: a failing probe
is judged at once, and the pair restarted as one (a probe that passes forgives it: the ranks
rejoined). The containers seen running when the watchdog starts are its baseline (kept in memory).
A deploy restarts the pair itself: it stops sparkfleet-watchdog on every node first (the head's
first) and starts it again after (the workers' first), so that the watchdog never acts on a pair
the deploy is changing. Before starting it, the deploy runs `deployed` on every node: the pair it
hands back serves (the deploy awaited it), so on the head a restart the stop interrupted
(want = restarting) is not resumed, a give-up is cleared and the restart count starts afresh
(want = serving, gave_up = None, restarts = []); each node records the hand-over as an action.
`deployed` refuses (exit 1) while the node's `run` loop is alive (the pid in its state).

A worker's loop, every follow_interval_s: read the head's state, then
  * want == restarting and generation != handled_generation: `systemctl restart` its unit, wait
    (bounded) for its container to run, set handled_generation = generation; no sooner than
    backoff_s after its last restart ended (the head's own backoff never asks sooner);
  * otherwise generation != handled_generation (the head's state was reset, this worker's state is
    new, or it missed a restart the head finished): adopt the head's generation without restarting;
  * want == stopped: stop its unit, once per give-up (gave_up.at remembered as handled_stop);
  * the head's state unreachable, over STATE_MAX_BYTES or of the wrong shape: do nothing but log
    (rate-limited);
and always write its own state (updated, seq, container running | absent | <docker status>, the
stopped processes if any).

Journal: every decision is one line on stdout (journald), prefixed 'sparkfleet-watchdog:', e.g.
  sparkfleet-watchdog: probe failed 2/2 (completion timed out after 30 s); restarting the pair (restart 1 within 7200 s; 0 failed, the watchdog gives up at 3)
and state.json keeps the last 20 actions with their times (for make status / make doctor).
External commands (systemctl, docker, rsync) run through one runner with a timeout each; their
names come from the config's `commands`.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

PREFIX = "sparkfleet-watchdog"
ACTIONS_KEPT = 20
STATE_FILE = "state.json"
# A peer's state is a few KiB (20 actions, the restarts of one window); anything larger is refused
# unread: a broken or spoofed peer must not make this loop read or parse without bound.
STATE_MAX_BYTES = 256 * 1024

DEFAULTS = {
    "node": None,  # this node's name (default: the host name)
    "interval_s": 30.0,  # head: seconds between probes
    "follow_interval_s": 5.0,  # worker: seconds between reads of the head's state
    "probe_timeout_s": 30.0,  # bound on the completion request
    "failures_before_restart": 3,
    # With requests in hand, counters flat for less than this is an engine step still running, not
    # a stall: the probe is not judged (progress_verdict).
    "stall_s": 60.0,
    "max_restarts": 3,
    "window_s": 7200.0,
    "backoff_s": 60.0,
    "startup_grace_s": 1200.0,
    # A restart ended the failure only if the pair then served this long before failing again; one
    # that did not counts toward the give-up like a restart that never served (a pair that fails
    # again within minutes of each restart is not being cured by them).
    "recovered_after_s": 600.0,
    "stale_after_s": None,  # derived when absent (stale_after())
    "worker_wait_s": 300.0,  # a rank's bound on its container running after its restart (the head's too)
    "ready_timeout_s": 1200.0,  # head: bound on the probe passing after the head started
    "command_timeout_s": 30.0,  # systemctl show, docker inspect
    "stop_timeout_s": 180.0,  # systemctl stop / restart (docker stop waits stop_timeout_s, then kills)
    "rsync_timeout_s": 10.0,
    "unreachable_log_every_s": 300.0,
    "api_host": "127.0.0.1",
    "commands": {},
    "port": None,
    "model": None,
    "workers": [],
    "head": None,
    # The engine's own counters on its metrics endpoint (head): {"path": "/metrics", "progress":
    # [counter, ...] (a rise of any is progress), "work": [gauge, ...] (their sum is the work in hand:
    # requests running and waiting)}; None: the engine exposes none, the probe alone is judged.
    "progress_metrics": None,
    # The node exporter's textfile collector file (a path ending .prom) this watchdog rewrites with
    # each state it saves: its restarts and give-ups, for Prometheus (roles/monitoring's rules
    # SparkfleetWatchdogRestarted and SparkfleetWatchdogGaveUp); None: monitoring is off, none.
    "metrics_file": None,
}
REQUIRED = ("role", "unit", "container", "state_dir")
COMMANDS = {"systemctl": ["systemctl"], "docker": ["docker"], "rsync": ["rsync"]}


class ConfigError(ValueError):
    pass


class Config:
    def __init__(self, data, path):
        unknown = sorted(set(data) - set(DEFAULTS) - set(REQUIRED))
        if unknown:
            raise ConfigError(f"{path}: unknown keys {', '.join(unknown)}")
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise ConfigError(f"{path}: missing keys {', '.join(missing)}")
        merged = {**DEFAULTS, **data}
        for key, value in merged.items():
            setattr(self, key, value)
        if self.role not in ("head", "worker"):
            raise ConfigError(f"{path}: role must be head or worker, not {self.role!r}")
        if self.role == "head":
            for key in ("port", "model"):
                if merged[key] in (None, ""):
                    raise ConfigError(f"{path}: the head needs {key}")
            for w in self.workers:
                if not isinstance(w, dict) or not w.get("name") or not w.get("state"):
                    raise ConfigError(f"{path}: each worker needs a name and a state source: {w!r}")
        elif not isinstance(self.head, dict) or not self.head.get("name") or not self.head.get("state"):
            raise ConfigError(f"{path}: a worker needs head: {{name, state}}")
        for key in ("interval_s", "follow_interval_s", "probe_timeout_s", "stall_s", "window_s", "backoff_s",
                    "startup_grace_s", "recovered_after_s", "worker_wait_s", "ready_timeout_s", "command_timeout_s",
                    "stop_timeout_s", "rsync_timeout_s", "unreachable_log_every_s"):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{path}: {key} must be a number >= 0, not {v!r}")
            setattr(self, key, float(v))
        for key in ("failures_before_restart", "max_restarts"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{path}: {key} must be an integer >= 1, not {v!r}")
        pm = self.progress_metrics
        if pm is not None and not (isinstance(pm, dict) and isinstance(pm.get("path"), str) and pm["path"].startswith("/")
                                   and all(isinstance(pm.get(k), list) and pm[k] and all(isinstance(m, str) for m in pm[k])
                                           for k in ("progress", "work"))):
            raise ConfigError(f"{path}: progress_metrics must be null or {{path: '/...', progress: [names], work: "
                              f"[names]}}, not {pm!r}")
        self.node = self.node or socket.gethostname()
        cmds = dict(COMMANDS)
        for name, value in (self.commands or {}).items():
            if name not in COMMANDS:
                raise ConfigError(f"{path}: commands: unknown command {name!r} (known: {', '.join(COMMANDS)})")
            cmds[name] = [value] if isinstance(value, str) else list(value)
        self.commands = cmds
        if self.stale_after_s is None:
            self.stale_after_s = stale_after(self)
        self.stale_after_s = float(self.stale_after_s)
        self.state_path = os.path.join(self.state_dir, STATE_FILE)
        mf = self.metrics_file
        if mf is not None and not (isinstance(mf, str) and mf.startswith("/") and mf.endswith(".prom")):
            raise ConfigError(f"{path}: metrics_file must be null or an absolute path ending .prom, not {mf!r}")

    @classmethod
    def load(cls, path):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path}: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: not a JSON object")
        return cls(data, path)


def stale_after(cfg):
    """Seconds without a new write after which a peer's state is stale: three of the slower loop's
    periods, plus one probe and one state read (a head's loop iteration can take that long)."""
    return 3 * max(cfg.interval_s, cfg.follow_interval_s) + cfg.probe_timeout_s + 2 * cfg.rsync_timeout_s


# ---------------------------------------------------------------------------------------------- output

def say(msg):
    print(f"{PREFIX}: {msg}", flush=True)


def iso(t=None):
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() if t is None else t))


# ---------------------------------------------------------------------------------------------- clocks
# The restart window and the backoff run on CLOCK_MONOTONIC of this boot, never on the wall clock: a
# restart recorded while the clock was a day ahead made the next wait 87060 s, and a step forward
# forgot every restart in the window. Each restart records the boot it happened in; one from another
# boot counts for nothing (a reboot resets the window and the backoff, deliberately). The wall-clock
# fields beside them are for people reading the state.

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def boot_id():
    try:
        with open(BOOT_ID_FILE) as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"  # then a restart whose monotonic time is ahead of now is another boot's


def restart_age_s(restart, now_mono, boot, since="started"):
    """Seconds since `restart` started (since="finished": since it ended, or started if it never did),
    on this boot's monotonic clock; None when it was recorded in another boot or without one."""
    if restart.get("boot") != boot:
        return None
    at = restart.get(f"{since}_mono")
    if at is None and since == "finished":
        at = restart.get("started_mono")
    try:
        age = now_mono - float(at)
    except (TypeError, ValueError):
        return None
    return age if age >= 0 else None


def unended_restarts(recent, failing_since, recovered_after_s):
    """The restarts of `recent` (this boot's, oldest first) that did not end the failure: those that
    never brought the pair back (or were interrupted), and those after which the pair failed again
    within recovered_after_s (the next failure began at the next restart's failing_since_mono, or
    at `failing_since` for the last: the first judged failure of the current run of them)."""
    out = []
    for i, r in enumerate(recent):
        next_failure = recent[i + 1].get("failing_since_mono") if i + 1 < len(recent) else failing_since
        finished = r.get("finished_mono")
        held = (r.get("ok") is True and (next_failure is None or finished is None
                                          or next_failure - finished >= recovered_after_s))
        if not held:
            out.append(r)
    return out


def restarts_in_window(restarts, window_s, now_mono, boot):
    """The restarts of this boot that started less than window_s ago (monotonic)."""
    out = []
    for r in restarts:
        age = restart_age_s(r, now_mono, boot)
        if age is not None and age < window_s:
            out.append(r)
    return out


def secs(x):
    """A duration for a log line: whole seconds from 10 s up, one decimal below."""
    return f"{x:.0f} s" if x >= 10 else f"{x:.1f} s"


def num(x):
    return f"{x:g}"


# --------------------------------------------------------------------------------------------- commands

class Result:
    def __init__(self, rc, out, err, timed_out=False):
        self.rc, self.out, self.err, self.timed_out = rc, out, err, timed_out

    @property
    def ok(self):
        return self.rc == 0

    def why(self):
        if self.timed_out:
            return "timed out"
        text = (self.err or self.out or "").strip().splitlines()
        return f"exit {self.rc}" + (f": {text[-1][:200]}" if text else "")


class Runner:
    """Every external command: its program from the config, a timeout, output captured."""

    def __init__(self, cfg):
        self.cfg = cfg

    def run(self, name, args, timeout):
        argv = [*self.cfg.commands[name], *args]
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
        except OSError as e:
            return Result(127, "", f"{argv[0]}: {e.strerror}")
        try:
            out, err = p.communicate(timeout=timeout)
            return Result(p.returncode, out, err)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.communicate()
            return Result(None, "", "", timed_out=True)

    def systemctl(self, verb, unit, timeout=None):
        return self.run("systemctl", [verb, f"{unit}.service"], timeout or self.cfg.stop_timeout_s)


# -------------------------------------------------------------------------------------- local facts

def proc_table():
    """{pid: (ppid, state letter, comm)} of every process in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        head, _, rest = stat.rpartition(")")
        fields = rest.split()
        if len(fields) < 2:
            continue
        comm = head.partition("(")[2]
        table[int(name)] = (int(fields[1]), fields[0], comm)
    return table


def stopped_processes(pid):
    """[(pid, comm)] of the processes stopped by a signal (state T) among pid and its descendants;
    None when pid is gone. A tracing stop (t: a debugger, py-spy) is not counted."""
    table = proc_table()
    if pid not in table:
        return None
    children = {}
    for p, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(p)
    stopped, todo, seen = [], [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        if table[p][1] == "T":
            stopped.append((p, table[p][2]))
        todo.extend(children.get(p, ()))
    return sorted(stopped)


def container_state(runner, cfg):
    """The node's serving container: {container, running, pid, started_at, process, stopped, detail}.
    container: running | absent | paused | <docker's status>; process: running | stopped | gone | -."""
    r = runner.run("docker", ["inspect", "--format", "{{json .State}}", cfg.container], cfg.command_timeout_s)
    if not r.ok:
        text = (r.err or "").lower()
        if not r.timed_out and ("no such" in text or "not found" in text):
            return {"container": "absent", "running": False, "pid": 0, "started_at": None, "process": "-",
                    "stopped": [], "detail": f"container {cfg.container} does not exist"}
        return {"container": "unknown", "running": False, "pid": 0, "started_at": None, "process": "-",
                "stopped": [], "detail": f"docker inspect {cfg.container}: {r.why()}"}
    try:
        st = json.loads(r.out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"container": "unknown", "running": False, "pid": 0, "started_at": None, "process": "-",
                "stopped": [], "detail": f"docker inspect {cfg.container}: unreadable output"}
    pid = int(st.get("Pid") or 0)
    out = {"container": "running" if st.get("Running") else (st.get("Status") or "not running"),
           "running": bool(st.get("Running")), "pid": pid, "started_at": st.get("StartedAt"),
           "process": "-", "stopped": [], "detail": ""}
    if st.get("Paused"):
        out.update(container="paused", running=False, detail=f"container {cfg.container} is paused")
        return out
    if not out["running"]:
        out["detail"] = f"container {cfg.container} is {out['container']}"
        return out
    stopped = stopped_processes(pid) if pid else None
    if stopped is None:
        out.update(process="gone", detail=f"container {cfg.container}'s main process {pid} is gone")
    elif stopped:
        out.update(process="stopped", stopped=[[p, c] for p, c in stopped],
                   detail=f"{cfg.container}: process " + ", ".join(f"{p} ({c})" for p, c in stopped)
                   + " stopped (SIGSTOP): the rank makes no progress")
    else:
        out["process"] = "running"
    return out


def container_ok(cs):
    return cs["running"] and cs["process"] == "running"


def unit_state(runner, cfg):
    """{active, started_mono (seconds on CLOCK_MONOTONIC, None if never started)} of the node's unit."""
    r = runner.run("systemctl", ["show", "-p", "ActiveState", "-p", "SubState", "-p", "ExecMainStatus",
                                 "-p", "InactiveExitTimestampMonotonic", f"{cfg.unit}.service"], cfg.command_timeout_s)
    vals = {}
    for line in (r.out or "").splitlines():
        k, _, v = line.partition("=")
        vals[k.strip()] = v.strip()
    try:
        usec = int(vals.get("InactiveExitTimestampMonotonic") or 0)
    except ValueError:
        usec = 0
    return {"active": vals.get("ActiveState") or ("unknown" if not r.ok else ""), "started_mono": usec / 1e6 or None,
            "sub": vals.get("SubState") or "", "status": vals.get("ExecMainStatus") or ""}


def start_failed(us):
    """Whether the unit's last start ended in a failure systemd saw (its process exited non-zero or was
    killed): it is failed, or waiting for its automatic restart (Restart=always, RestartSec)."""
    return us["active"] == "failed" or us["sub"] == "auto-restart"


def kill_if_frozen(runner, cfg):
    """A rank whose processes are stopped (SIGSTOP) cannot shut down: `docker stop` would wait its
    whole stop timeout for nothing. Kill its container first; None, or what was done."""
    cs = container_state(runner, cfg)
    if cs["process"] != "stopped":
        return None
    r = runner.run("docker", ["kill", cfg.container], cfg.command_timeout_s)
    return (f"killed container {cfg.container} ({cs['detail']})" if r.ok
            else f"docker kill {cfg.container} failed ({r.why()})")


# ------------------------------------------------------------------------------------------- state files

def read_json(path, max_bytes=None):
    with open(path) as f:
        text = f.read(max_bytes + 1) if max_bytes else f.read()
    if max_bytes and len(text) > max_bytes:
        raise ValueError(f"larger than {max_bytes} bytes: refused unread")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


# What each side reads of its peer's state, and the types it must have (None allowed where listed):
# a state that breaks them is refused whole, as one that cannot be read.
PEER_FIELDS = {
    "head": {"generation": (int,), "want": (str,), "gave_up": (dict, type(None))},
    "worker": {"handled_generation": (int, type(None)), "failed_generation": (int, type(None)),
               "container": (str, type(None)), "process": (str, type(None)), "seq": (int, type(None))},
}
HEAD_WANTS = ("serving", "restarting", "stopped")


def peer_state_problem(state, role):
    """Why `state` (the peer's, of `role`) is not one to act on, or None."""
    for key, types in PEER_FIELDS[role].items():
        value = state.get(key)
        if key in state and (not isinstance(value, types) or isinstance(value, bool)):
            return f"{key} is {type(value).__name__}, not {' or '.join(t.__name__ for t in types)}"
    if role == "head":
        if "generation" not in state:
            return "it has no generation"
        if state["generation"] < 0:
            return f"generation {state['generation']} is negative"
        if state.get("want") not in HEAD_WANTS:
            return f"want {state.get('want')!r} is none of {', '.join(HEAD_WANTS)}"
    return None


def replace_file(path, text, prefix, durable):
    """`path` holds `text` whole or keeps what it held: a temporary file (named `prefix`..., which
    no reader of the directory takes for the file) renamed over it; durable: fsynced, and the
    directory too, so that after a power cut it is the old one or the new one."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        if durable:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_state(path, data):
    """Durably (a give-up is not forgotten by a power cut)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    replace_file(path, json.dumps(data, indent=1, sort_keys=True) + "\n", ".state-", durable=True)


def metrics_text(role, state):
    """What this node's watchdog did, in the node exporter's text format (its textfile collector).
    The head's generation counts the pair restarts it ordered (a counter: Prometheus's increase()
    reads a reset, a state removed by hand, as one); gave_up is 1 while it has stopped the pair."""
    lines = ["# HELP sparkfleet_watchdog_state_saved_timestamp_seconds When this node's watchdog last saved its state.",
             "# TYPE sparkfleet_watchdog_state_saved_timestamp_seconds gauge",
             f"sparkfleet_watchdog_state_saved_timestamp_seconds {float(state.get('updated_epoch') or 0):.3f}"]
    if role == "head":
        lines += ["# HELP sparkfleet_watchdog_restarts_total Restarts of the pair the head's watchdog ordered.",
                  "# TYPE sparkfleet_watchdog_restarts_total counter",
                  f"sparkfleet_watchdog_restarts_total {int(state.get('generation') or 0)}",
                  "# HELP sparkfleet_watchdog_gave_up 1 while the head's watchdog has given up on the pair and stopped it.",
                  "# TYPE sparkfleet_watchdog_gave_up gauge",
                  f"sparkfleet_watchdog_gave_up {1 if state.get('gave_up') else 0}"]
    return "\n".join(lines) + "\n"


def write_metrics(path, text):
    """Whole or not at all; the collector reads *.prom only, never the temporary file."""
    replace_file(path, text, ".sfl-watch-", durable=False)


def fetch_state(runner, cfg, source, role=None):
    """(peer state dict, None) or (None, why). source: rsync://... (the peer's rsync daemon) or a path;
    role: the peer's ("head" or "worker"), whose fields are checked (peer_state_problem); a state
    over STATE_MAX_BYTES is refused unread."""
    state, why = _fetch_state(runner, cfg, source)
    if state is not None and role:
        problem = peer_state_problem(state, role)
        if problem:
            return None, f"{source}: not a {role}'s state to act on: {problem}"
    return state, why


def _fetch_state(runner, cfg, source):
    if not source.startswith("rsync://"):
        try:
            return read_json(source, STATE_MAX_BYTES), None
        except FileNotFoundError:
            return None, f"{source} does not exist"
        except (OSError, ValueError) as e:
            return None, f"{source}: {e}"
    tmpdir = tempfile.mkdtemp(prefix="sfl-watch-")
    try:
        dest = os.path.join(tmpdir, STATE_FILE)  # a new file each time: rsync's quick check never skips it
        t = max(1, int(cfg.rsync_timeout_s + 0.5))
        # One regular file, owned by this root and without setuid/setgid bits: without -a rsync makes
        # no symlink, device or special file and keeps no owner; said here as sfl_files.py's SAFE_RSYNC
        # says it for every other transfer (the peer's daemon refuses -l -D -o -g anyway).
        safe = ["--no-links", "--no-devices", "--no-specials", "--no-owner", "--no-group", "--chmod=ug-s"]
        r = runner.run("rsync", ["--quiet", *safe, f"--max-size={STATE_MAX_BYTES}", f"--timeout={t}",
                                 f"--contimeout={t}", source, dest], cfg.rsync_timeout_s + 5)
        if not r.ok and "No such file or directory" in (r.err or ""):
            return None, f"{source}: no state written yet (that node's watchdog has not run since it was installed)"
        if not r.ok:
            return None, f"rsync {source}: {r.why()}"
        if not os.path.exists(dest):  # --max-size skips a larger file without an error
            return None, f"{source}: larger than {STATE_MAX_BYTES} bytes: refused unread"
        try:
            return read_json(dest, STATE_MAX_BYTES), None
        except (OSError, ValueError) as e:
            return None, f"{source}: {e}"
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


# -------------------------------------------------------------------------------------------- the probe

def completion(cfg):
    """(ok, reason, latency seconds) of one tiny completion from the head's engine, bounded by
    probe_timeout_s as a whole. No key: the engine holds none (the API proxy in front of it checks it)."""
    t = cfg.probe_timeout_s
    url = f"http://{cfg.api_host}:{int(cfg.port)}/v1/completions"
    body = json.dumps({"model": cfg.model, "prompt": "ping", "max_tokens": 1}).encode()
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy for loopback
    got = {}

    def send():
        try:
            with opener.open(req, timeout=t) as r:
                got["code"], got["body"] = r.status, r.read(1 << 20)
        except urllib.error.HTTPError as e:
            got["code"] = e.code
            try:
                got["body"] = e.read(4096)
            except Exception:
                got["body"] = b""
        except Exception as e:  # noqa: BLE001: every failure is a reason, never a crash
            got["error"] = e

    start = time.monotonic()
    th = threading.Thread(target=send, daemon=True)
    th.start()
    th.join(t)
    latency = time.monotonic() - start
    if th.is_alive() or isinstance(got.get("error"), (socket.timeout, TimeoutError)) or (
            isinstance(got.get("error"), urllib.error.URLError)
            and isinstance(getattr(got["error"], "reason", None), (socket.timeout, TimeoutError))):
        return False, f"completion timed out after {num(t)} s", latency
    if "error" in got:
        e = got["error"]
        reason = getattr(e, "reason", e)
        if isinstance(reason, ConnectionRefusedError):
            return False, f"connection refused on {cfg.api_host}:{cfg.port} (the API is not listening)", latency
        return False, f"completion failed: {reason}", latency
    code = got["code"]
    text = got.get("body", b"").decode("utf-8", "replace")
    if code != 200:
        snippet = " ".join(text.split())[:200]
        return False, f"completion answered HTTP {code}" + (f": {snippet}" if snippet else ""), latency
    try:
        choices = json.loads(text).get("choices")
    except (ValueError, AttributeError):
        choices = None
    if not choices:
        return False, "completion answered 200 without a choice", latency
    return True, f"completion in {latency:.2f} s", latency



METRICS_MAX_BYTES = 4 << 20  # vLLM's exposition is some 100 KiB; anything past this is not read


def parse_metrics(text, names):
    """{name: the sum over its label sets} of each metric of `names` in Prometheus' text exposition
    (`name{labels} value` or `name value`); a name absent from the text is absent from the result."""
    wanted, sums = set(names), {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end <= 0 or line[:name_end] not in wanted:
            continue
        rest = line[line.rindex("}") + 1:] if line[name_end] == "{" and "}" in line else line[name_end:]
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        sums[line[:name_end]] = sums.get(line[:name_end], 0.0) + value
    return sums


def read_metrics(cfg):
    """(progress: the sum of the progress counters, work: the sum of the work gauges) from the
    engine's metrics endpoint, or (None, reason). Bounded by probe_timeout_s, like the probe."""
    pm = cfg.progress_metrics
    url = f"http://{cfg.api_host}:{int(cfg.port)}{pm['path']}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url), timeout=cfg.probe_timeout_s) as r:
            text = r.read(METRICS_MAX_BYTES).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return None, f"{pm['path']} answered HTTP {e.code}"
    except Exception as e:  # noqa: BLE001: no counters is a reason, never a crash
        return None, f"{pm['path']} unreadable: {getattr(e, 'reason', e)}"
    found = parse_metrics(text, pm["progress"] + pm["work"])
    missing = [m for m in pm["progress"] + pm["work"] if m not in found]
    if missing:
        return None, f"{pm['path']} has no {', '.join(missing)}"
    return (sum(found[m] for m in pm["progress"]), sum(found[m] for m in pm["work"])), None


def progress_verdict(before, now, elapsed, stall_s):
    """How a pair whose probe failed is doing, from two samples of its counters `elapsed` seconds
    apart (each (progress, work), or None; `before` is where the stall clock started: the last
    sample at which a counter rose or nothing was in hand): ('moving', why) when a progress counter
    rose (tokens produced, requests completed: the engine works, however slow a probe behind its
    queue is); ('stepping', why) when work is in hand and nothing moved for less than stall_s (one
    engine step rises no counter until it ends); ('stuck', why) when work is in hand and nothing
    moved for stall_s or more; ('idle', why) when nothing is in hand (a probe that fails with the
    queue empty is the engine's fault); ('unknown', why) without two comparable samples (no
    counters, the first sample, or counters that went back: a new engine)."""
    if now is None or before is None:
        return "unknown", "no earlier sample of the engine's counters"
    (p0, _w0), (p1, w1) = before, now
    if p1 < p0:
        return "unknown", "the engine's counters went back (a new engine process)"
    if p1 > p0:
        return "moving", f"the engine made progress: its token and request counters rose by {num(round(p1 - p0, 1))} " \
                         f"in {secs(elapsed)}, {num(round(w1))} request(s) in hand"
    if w1 > 0 and elapsed < stall_s:
        return "stepping", f"no counter rose in {secs(elapsed)} with {num(round(w1))} request(s) in hand, under " \
                           f"stall_s ({secs(stall_s)}): an engine step still running"
    if w1 > 0:
        return "stuck", f"no progress in {secs(elapsed)} with {num(round(w1))} request(s) in hand"
    return "idle", "no request in hand"


# How much a probe problem weighs. WATCH: the watchdog cannot see a peer (its state stale or
# unreadable) while the pair may serve: reported (probe, status, doctor), never a restart, which
# could not happen in order anyway. SOFT: the completion failed: judged outside the start-up grace.
# HARD: a container not running, a process stopped, a rank restarted alone: judged at once.
OK, WATCH, SOFT, HARD = 0, 1, 2, 3
SEVERITY = ("ok", "watch", "soft", "hard")


class Probe:
    """The head's probe. One instance per loop: it remembers each worker's last seq (freshness on
    this node's monotonic clock) and each rank's container identity (a rank restarted alone)."""

    def __init__(self, cfg, runner, one_shot=False):
        self.cfg, self.runner, self.one_shot = cfg, runner, one_shot
        self.seen = {}  # worker -> (seq, monotonic time it changed, state)
        self.identity = {}  # rank name -> (started_at, pid) last seen running
        self.live = set()  # workers whose state this process has seen written (its seq moved)
        self.unpaired = None  # why the pair is not one pair any more (a rank restarted alone)

    def forget_identities(self):
        self.identity.clear()
        self.unpaired = None

    def _identity(self, name, started_at, pid, running):
        if not running or not started_at:
            return
        ident = (started_at, pid)
        before = self.identity.get(name)
        self.identity[name] = ident
        if before and before != ident and not self.unpaired:
            self.unpaired = (f"{name}'s container restarted on its own (pid {before[1]} -> {pid}): "
                             f"its peer is orphaned, the pair restarts as one")

    def worker_view(self, w):
        """(view for the head's state, problem or None, its severity)."""
        state, err = fetch_state(self.runner, self.cfg, w["state"], role="worker")
        now = time.monotonic()
        name = w["name"]
        if state is not None:
            seq = state.get("seq")
            last = self.seen.get(name)
            if last is not None and last[0] != seq:
                self.live.add(name)
            if last is None or last[0] != seq:
                self.seen[name] = (seq, now, state)
            else:
                self.seen[name] = (seq, last[1], state)
        if name not in self.seen:
            return {"reachable": False, "error": err}, f"{name}: state unreadable ({err})", WATCH
        seq, changed, state = self.seen[name]
        if self.one_shot:
            try:
                age = time.time() - float(state.get("updated_epoch"))
            except (TypeError, ValueError):
                age = float("inf")
        else:
            age = now - changed
        view = {"reachable": err is None, "error": err, "age_s": round(age, 1), "container": state.get("container"),
                "process": state.get("process"), "started_at": state.get("started_at"),
                "unit": state.get("unit_active"), "handled_generation": state.get("handled_generation")}
        if age > self.cfg.stale_after_s:
            more = f"; last read: {err}" if err else ""
            return view, f"{name}: state not updated for {secs(age)}{more}", WATCH
        if name in self.live:  # a state file left from before a reboot names a container long gone
            self._identity(name, state.get("started_at"), state.get("pid"), state.get("container") == "running")
        if state.get("container") != "running":
            return view, f"{name}: {state.get('detail') or 'container ' + str(state.get('container'))}", HARD
        if state.get("process") != "running":
            return view, f"{name}: {state.get('detail') or 'process ' + str(state.get('process'))}", HARD
        return view, None, OK

    def run(self):
        """{ok, reason, latency_s, severity, head, workers, at} (severity: OK, WATCH, SOFT or HARD)."""
        cfg = self.cfg
        problems, severity = [], OK
        cs = container_state(self.runner, cfg)
        self._identity(cfg.node, cs["started_at"], cs["pid"], cs["running"])
        if not container_ok(cs):
            problems.append(cs["detail"])
            severity = HARD
        workers = {}
        for w in cfg.workers:
            view, problem, level = self.worker_view(w)
            workers[w["name"]] = view
            if problem:
                problems.append(problem)
                severity = max(severity, level)
        latency = None
        if severity < HARD:
            ok, why, latency = completion(cfg)
            if not ok:
                problems.insert(0, why)
                severity = max(severity, SOFT)
        if severity >= SOFT and self.unpaired:
            problems.append(self.unpaired)
            severity = HARD
        result = {"ok": not problems, "reason": "; ".join(problems) if problems else f"completion in {latency:.2f} s",
                  "latency_s": None if latency is None else round(latency, 3), "severity": severity, "at": iso(),
                  "head": {k: cs[k] for k in ("container", "process", "pid", "started_at")}, "workers": workers}
        if severity < SOFT:
            self.unpaired = None  # the pair serves: whatever restarted, it rejoined
        return result


# ------------------------------------------------------------------------------------------ the loops

class Stop(BaseException):
    """SIGTERM or SIGINT: leave the loop (a restart in progress resumes at the next start)."""


class Node:
    def __init__(self, cfg):
        self.cfg, self.runner = cfg, Runner(cfg)
        self.boot = boot_id()
        self.save_failed = None  # why the last save failed (its streak said once), or None
        try:
            self.state = read_json(cfg.state_path)
        except FileNotFoundError:
            self.state = {}
        except (OSError, ValueError) as e:
            say(f"own state {cfg.state_path} unreadable ({e}); starting afresh")
            self.state = {}
        self.state.setdefault("actions", [])
        self.seq = int(self.state.get("seq") or 0)  # continued: a peer sees every write as new
        self._limited = {}

    def act(self, msg):
        """A decision: one journal line, and one of the last actions in the state."""
        say(msg)
        self.state["actions"] = (self.state.get("actions") or [])[-(ACTIONS_KEPT - 1):] + [{"at": iso(), "what": msg}]

    def say_limited(self, key, msg, every):
        """say() at most once per `every` seconds for one condition (key); forget(key) ends it."""
        last = self._limited.get(key)
        now = time.monotonic()
        if last is None or now - last >= every:
            say(msg)
            self._limited[key] = now

    def forget(self, *keys):
        for key in keys:
            self._limited.pop(key, None)

    def save(self, **fields):
        self.seq += 1
        self.state.update(fields)
        self.state.update(role=self.cfg.role, node=self.cfg.node, unit=self.cfg.unit, container_name=self.cfg.container,
                          seq=self.seq, updated=iso(), updated_epoch=round(time.time(), 3), pid_watchdog=os.getpid())
        self.save_metrics()
        path = self.cfg.state_path
        try:
            write_state(path, self.state)
        except OSError as e:
            # A full disk (or any write error) must not kill the loop: systemd would restart it every
            # few seconds and nothing would watch the pair. It goes on from its state in memory.
            # Said once per streak of failures, not once per reason: a directory swapped for a file
            # under a save in flight fails first as "Not a directory" (the temporary file) and then
            # as "File exists" (makedirs), one fault (tests/unit/test_watchdog.py, CI of this stop).
            why = f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")
            if self.save_failed is None:
                say(f"cannot save its state to {path}: {why}; it goes on watching from memory (its peers "
                    f"read the last state it saved, and `status` shows that state growing stale)")
            self.save_failed = why
            return False
        if self.save_failed:
            say(f"its state is saved again to {path}")
            self.save_failed = None
        return True

    def save_metrics(self):
        """The textfile for Prometheus, beside the state; a failure is said once an hour and changes
        nothing else (the directory is the monitoring role's, and may not exist yet)."""
        if not self.cfg.metrics_file:
            return
        try:
            write_metrics(self.cfg.metrics_file, metrics_text(self.cfg.role, self.state))
            self.forget("metrics")
        except OSError as e:
            self.say_limited("metrics", f"cannot write its metrics to {self.cfg.metrics_file}: {e.strerror or e}", 3600)

    def sleep(self, seconds):
        time.sleep(max(0.0, seconds))


class Head(Node):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.probe = Probe(cfg, self.runner)
        self.failures = 0
        self.failing_since = None  # monotonic time of the first judged failure of the current run of them
        # (monotonic time, (progress, work)) of the engine's counters where the stall clock started:
        # the last probe's sample at which a counter rose or nothing was in hand (progress())
        self.sample = None
        self.grace_exempt_start = None  # the unit start this watchdog made and already waited for
        self.backoff_told = None  # the backoff already announced in the journal
        self.state.setdefault("generation", 0)
        self.state.setdefault("want", "serving")
        self.state.setdefault("restarts", [])
        self.state.setdefault("gave_up", None)

    # ---- bookkeeping
    def recent_restarts(self):
        return restarts_in_window(self.state["restarts"], self.cfg.window_s, time.monotonic(), self.boot)

    def record_probe(self, result):
        self.state["last_probe"] = {**{k: result[k] for k in ("ok", "reason", "latency_s", "at")},
                                    "kind": SEVERITY[result["severity"]]}
        self.state["head_container"] = result["head"]
        self.state["workers"] = result["workers"]
        self.state["failures"] = self.failures

    def in_grace(self, u):
        """Seconds of start-up grace left for the head unit's current start (0: none)."""
        start = u["started_mono"]
        if start is None or u["active"] not in ("active", "activating", "reloading"):
            return 0.0
        if self.grace_exempt_start is not None and abs(start - self.grace_exempt_start) < 1e-3:
            return 0.0
        return max(0.0, start + self.cfg.startup_grace_s - time.monotonic())

    # ---- the loop
    def run(self):
        cfg = self.cfg
        say(f"head {cfg.node}: probing {cfg.unit} every {num(cfg.interval_s)} s through "
            f"http://{cfg.api_host}:{cfg.port}/v1/completions and the states of "
            f"{', '.join(w['name'] for w in cfg.workers) or 'no worker'}; generation {self.state['generation']}")
        if self.state.get("want") == "restarting":
            self.act(f"a restart of the pair was interrupted (generation {self.state['generation']}); resuming it")
            self.restart_pair(resume=True)
        elif self.state.get("gave_up"):
            g = self.state["gave_up"]
            say(f"still given up since {g.get('at')} ({g.get('reason')}); probing without restarting")
        self.save()
        first = True
        while True:
            started = time.monotonic()
            try:
                self.tick(first)
                first = False
            except Exception as e:  # noqa: BLE001: a watchdog keeps watching
                say(f"internal error ({type(e).__name__}: {e}); continuing")
            self.sleep(started + cfg.interval_s - time.monotonic())

    def progress(self, result):
        """The engine's counters now, against those where the stall clock started: progress_verdict's
        (kind, why); ('unknown', why) without counters. Sampled at every probe that reached the API;
        the clock starts again at every sample but one that finds the counters flat with work in hand."""
        cfg = self.cfg
        if not cfg.progress_metrics:
            return "unknown", "the engine exposes no counters"
        if result["severity"] >= HARD:
            self.sample = None
            return "unknown", "a rank is down"
        now = time.monotonic()
        counters, why = read_metrics(cfg)
        if counters is None:
            self.sample = None
            return "unknown", why
        before = self.sample
        verdict = progress_verdict(before[1] if before else None, counters, now - before[0] if before else 0.0,
                                   cfg.stall_s)
        if verdict[0] not in ("stepping", "stuck"):
            self.sample = (now, counters)
        return verdict

    def tick(self, first=False):
        cfg = self.cfg
        result = self.probe.run()
        progress, progress_why = self.progress(result)
        unit = unit_state(self.runner, cfg)
        self.state["unit_active"] = unit["active"]
        n = cfg.failures_before_restart
        if result["ok"]:
            if self.failures:
                self.act(f"probe ok again ({result['reason']}) after {self.failures} failure(s)")
            elif first or "grace" in self._limited:  # the first pass, or the first after a start-up
                say(f"probe ok ({result['reason']})")
            self.failures, self.failing_since = 0, None
            self.forget("watch", "grace", "gave-up", "busy", "stepping")
            g = self.state.get("gave_up")
            if g:
                self.act(f"probe passes again ({result['reason']}): clearing the give-up of {g.get('at')} "
                         f"({g.get('reason')}); watching and restarting again")
                self.state.update(gave_up=None, want="serving", restarts=[])
            self.record_probe(result)
            recent = self.recent_restarts()
            if recent and recent[-1].get("finished_mono") is None:
                # This watchdog was restarted after the last restart had started the head unit but
                # before the pair served (`want` was already "serving", so run() resumed nothing):
                # the pair serves now, so that restart worked. Left without an end it would count
                # as failed until it left the window (seen in the lab: the busy drill restarted the
                # watchdog a moment after a SIGSTOP restart, and the restart never ended).
                age = restart_age_s(recent[-1], time.monotonic(), self.boot)
                self.finish_restart(True, f"the restart of {recent[-1].get('started')} ended when this watchdog "
                                    f"restarted during it: the pair serves again"
                                    + (f" {secs(age)} after it began" if age is not None else "")
                                    + f" ({result['reason']})")
                return
            self.save()
            return
        if result["severity"] < SOFT:
            self.failures = 0
            self.record_probe(result)
            self.say_limited("watch", f"probe: the pair serves, but {result['reason']}; no restart for that (the "
                             f"watchdog cannot order one without the peers' states)", cfg.unreachable_log_every_s)
            self.save()
            return
        self.forget("watch")
        if progress in ("moving", "stepping") and result["severity"] < HARD:
            # Alive: the engine produces tokens and completes requests (moving), or is inside one step
            # that rises no counter until it ends (stepping); the probe only waited behind its queue.
            # Not judged, whatever the probe's latency. Only a rise is evidence enough to forgive the
            # failures before; a step keeps their count, and stall_s bounds it (then: stuck).
            if progress == "moving":
                if self.failures:
                    self.act(f"probe failed ({result['reason']}) but {progress_why}: alive, not a failure "
                             f"(the {self.failures} failure(s) before are forgiven)")
                self.failures, self.failing_since = 0, None
            result = {**result, "reason": f"{result['reason']}; {progress_why}"}
            self.record_probe(result)
            self.state["last_probe"]["kind"] = "busy"
            self.say_limited("busy" if progress == "moving" else "stepping",
                             f"probe failed ({result['reason']}); busy, not judged", 60)
            self.save()
            return
        if result["severity"] < HARD and cfg.progress_metrics:
            result = {**result, "reason": f"{result['reason']}; {progress_why}"}
        grace = self.in_grace(unit)
        if grace > 0 and result["severity"] < HARD:
            self.record_probe(result)
            self.say_limited("grace", f"probe failed ({result['reason']}); not judged: start-up grace, "
                             f"{secs(grace)} left", 60)
            self.save()
            return
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        self.record_probe(result)
        if self.state.get("gave_up"):
            g = self.state["gave_up"]
            self.say_limited("gave-up", f"probe failed ({result['reason']}); given up at {g.get('at')}: not "
                             f"restarting (deploy a fix, or start the pair by hand)", cfg.unreachable_log_every_s)
            self.save()
            return
        line = f"probe failed {self.failures}/{n} ({result['reason']})"
        if self.failures < n:
            self.act(line)
            self.save()
            return
        recent = self.recent_restarts()
        # Only restarts that did not end the failure count towards the give-up: those that did not
        # bring the pair back (an interrupted one has no verdict: it counts), and those after which it
        # failed again within recovered_after_s. The backoff below grows with each of them.
        failed = unended_restarts(recent, self.failing_since, cfg.recovered_after_s)
        if len(failed) >= cfg.max_restarts:
            self.give_up(f"{len(failed)} restart(s) within {num(cfg.window_s)} s did not keep the pair serving; "
                         f"last probe: {result['reason']}", line)
            return
        k = len(recent) + 1
        if recent:
            # Doubles with each failed restart in the window; after one that worked, backoff_s again.
            wait = cfg.backoff_s * 2 ** len(failed)
            # A restart whose watchdog was stopped before it ended has no end: count from its start.
            left = wait - (restart_age_s(recent[-1], time.monotonic(), self.boot, since="finished") or 0.0)
            if left > 0:
                if self.backoff_told != (k, recent[-1].get("started_mono")):
                    self.act(f"{line}; restart {k} waits for its backoff: {secs(left)} more "
                             f"({num(wait)} s after restart {k - 1} ended)")
                    self.backoff_told = (k, recent[-1].get("started_mono"))
                else:
                    say(line)
                self.save()
                return
        self.act(f"{line}; restarting the pair (restart {k} within {num(cfg.window_s)} s; {len(failed)} failed, "
                 f"the watchdog gives up at {cfg.max_restarts})")
        self.restart_pair(k=k, reason=result["reason"])

    # ---- actions
    def give_up(self, reason, line):
        cfg = self.cfg
        self.act(f"{line}; GAVE UP: {reason}. Stopping {cfg.unit}; the workers stop theirs. The pair stays "
                 f"stopped until the probe passes again (deploy a fix, or start the pair by hand)")
        r = self.runner.systemctl("stop", cfg.unit)
        if not r.ok:
            self.act(f"systemctl stop {cfg.unit} failed ({r.why()})")
        self.state.update(want="stopped", gave_up={"at": iso(), "at_epoch": round(time.time(), 3), "reason": reason})
        self.save()

    def workers_ready(self, generation):
        """({worker: what it shows} of those not yet restarted and running for generation,
        {worker: why} of those whose restart for generation failed for good)."""
        pending, failed = {}, {}
        for w in self.cfg.workers:
            state, err = fetch_state(self.runner, self.cfg, w["state"], role="worker")
            if state is None:
                pending[w["name"]] = f"state unreadable ({err})"
            elif state.get("handled_generation") != generation:
                pending[w["name"]] = f"handled generation {state.get('handled_generation')}, want {generation}"
            elif state.get("failed_generation") == generation:
                failed[w["name"]] = state.get("failed_why") or "its restart failed"
            elif state.get("container") != "running" or state.get("process") != "running":
                pending[w["name"]] = state.get("detail") or f"container {state.get('container')}"
        return pending, failed

    def restart_pair(self, k=None, reason="", resume=False):
        cfg = self.cfg
        label = f"restart {k}" if k else "restart"
        t0, t0_epoch = time.monotonic(), time.time()
        entry = {"started": iso(t0_epoch), "started_epoch": round(t0_epoch, 3), "boot": self.boot,
                 "started_mono": round(t0, 3), "reason": reason,
                 "failing_since_mono": None if self.failing_since is None else round(self.failing_since, 3)}
        if not resume:
            self.state["restarts"] = self.recent_restarts() + [entry]
            say(f"{label}: stopping {cfg.unit}")
            killed = kill_if_frozen(self.runner, cfg)
            if killed:
                self.act(f"{label}: {killed}")
            r = self.runner.systemctl("stop", cfg.unit)
            if not r.ok:
                self.act(f"{label}: systemctl stop {cfg.unit} failed ({r.why()}); going on")
            self.state["generation"] = int(self.state.get("generation") or 0) + 1
            self.state["want"] = "restarting"
            self.save()
        elif not self.state["restarts"]:
            self.state["restarts"] = [entry]
        gen = self.state["generation"]
        self.probe.forget_identities()
        bound = cfg.worker_wait_s + cfg.stop_timeout_s + 2 * cfg.follow_interval_s + cfg.rsync_timeout_s
        names = ", ".join(w["name"] for w in cfg.workers) or "none"
        say(f"{label}: generation {gen}: waiting for the workers ({names}) to restart their units "
            f"(up to {secs(bound)})")
        poll = max(0.05, min(cfg.interval_s, cfg.follow_interval_s, 2.0))
        deadline = time.monotonic() + bound
        last_report = time.monotonic()
        while True:
            pending, failed = self.workers_ready(gen)
            if not pending and not failed:
                break
            if failed:
                shown = "; ".join(f"{n}: {why}" for n, why in failed.items())
                self.finish_restart(False, f"{label} failed after {secs(time.monotonic() - t0)}: a worker's unit "
                                    f"did not start ({shown}); {cfg.unit} stays stopped")
                return
            if time.monotonic() >= deadline:
                shown = "; ".join(f"{n}: {why}" for n, why in pending.items())
                self.finish_restart(False, f"{label} failed after {secs(time.monotonic() - t0)}: the workers did not "
                                    f"restart within {secs(bound)} ({shown}); {cfg.unit} stays stopped")
                return
            if time.monotonic() - last_report >= 60:
                say(f"{label}: still waiting for {', '.join(pending)} ({secs(time.monotonic() - t0)})")
                last_report = time.monotonic()
            self.save()
            self.sleep(poll)
        say(f"{label}: workers restarted and running after {secs(time.monotonic() - t0)}; starting {cfg.unit}")
        r = self.runner.systemctl("start", cfg.unit)
        if not r.ok:
            self.act(f"{label}: systemctl start {cfg.unit} failed ({r.why()})")
        self.state["want"] = "serving"
        self.save()
        # systemctl start returns before the unit's `docker run` has made the container: a probe now
        # would find it absent and count that against the restart (seen in the lab: "container
        # sparkfleet-head does not exist" 0.3 s after the start). Wait for it as a worker waits for
        # its own; a start that failed, or no container within worker_wait_s, is the probes' to judge.
        made_by = time.monotonic() + cfg.worker_wait_s
        while not container_ok(container_state(self.runner, cfg)):
            if start_failed(unit_state(self.runner, cfg)) or time.monotonic() >= made_by:
                break
            self.sleep(min(1.0, cfg.interval_s))
        else:
            say(f"{label}: {cfg.unit}'s container running after {secs(time.monotonic() - t0)}")
        deadline = time.monotonic() + cfg.ready_timeout_s
        poll = max(0.05, min(cfg.interval_s, 5.0))
        last_report = time.monotonic()
        hard = 0  # probes in a row that found a rank's container gone or frozen: no cold start to wait for
        while True:
            result = self.probe.run()
            self.record_probe(result)
            if result["severity"] < SOFT:  # serving (a peer's state unseen is reported, not waited for)
                self.grace_exempt_start = None
                self.finish_restart(True, f"{label}: the pair serves again after {secs(time.monotonic() - t0)} "
                                    f"({result['reason']})")
                return
            hard = hard + 1 if result["severity"] >= HARD else 0
            if hard >= cfg.failures_before_restart:
                self.finish_restart(False, f"{label} failed after {secs(time.monotonic() - t0)}: {result['reason']} "
                                    f"({hard} probes in a row while waiting for the pair to serve)")
                return
            if time.monotonic() >= deadline:
                self.grace_exempt_start = unit_state(self.runner, cfg)["started_mono"]
                self.finish_restart(False, f"{label} failed: the probe still fails {secs(cfg.ready_timeout_s)} after "
                                    f"{cfg.unit} started ({result['reason']})")
                return
            if time.monotonic() - last_report >= 60:
                say(f"{label}: waiting for the pair to serve ({secs(time.monotonic() - t0)}): {result['reason']}")
                last_report = time.monotonic()
            self.save()
            self.sleep(poll)

    def finish_restart(self, ok, msg):
        self.act(msg)
        self.sample = None  # a new engine: its counters start again
        now, now_mono = time.time(), time.monotonic()
        if self.state["restarts"]:
            last = self.state["restarts"][-1]
            took = restart_age_s(last, now_mono, self.boot)
            last.update(finished=iso(now), finished_epoch=round(now, 3), finished_mono=round(now_mono, 3), ok=ok,
                        took_s=round(took if took is not None else now - last["started_epoch"], 1))
        self.failures, self.failing_since = 0, None
        self.state["failures"] = 0
        self.save()

    def handed_over(self):
        """The pair serves (the deploy awaited it): nothing of before is resumed or counted."""
        st = self.state
        dropped = []
        if st.get("want") == "restarting":
            dropped.append(f"the restart of generation {st.get('generation')} it interrupted is not resumed")
        g = st.get("gave_up")
        if g:
            dropped.append(f"the give-up of {g.get('at')} ({g.get('reason')}) is cleared")
        recent = self.recent_restarts()
        if recent:
            dropped.append(f"{len(recent)} restart(s) in the window are forgotten")
        st.update(want="serving", gave_up=None, restarts=[], failures=0)
        self.act("a deploy handed the pair back (the watchdog was stopped meanwhile)" + (": " + "; ".join(dropped) if dropped
                 else "") + f"; watching generation {st.get('generation')}")


class Worker(Node):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.state.setdefault("handled_generation", None)
        self.state.setdefault("handled_stop", None)
        if self.state.get("busy"):  # written by a loop that was stopped mid-restart: that restart is over
            say(f"the previous run was stopped while {self.state['busy']}; the head's state decides what is next")
            self.state["busy"] = None

    def handed_over(self):
        self.state["last_restart"] = None  # the head's restarts start afresh, so does their spacing
        self.act(f"a deploy handed the pair back (this rank's watchdog was stopped meanwhile); following head "
                 f"{self.cfg.head['name']} from handled generation {self.state.get('handled_generation')}")

    def restart_spacing_left(self):
        """(seconds before the head's rules allow another restart of this rank, seconds since its last
        one ended), on this boot's monotonic clock; (0, None) when none ended in this boot."""
        last = self.state.get("last_restart") or {}
        ago = restart_age_s(last, time.monotonic(), self.boot, since="finished")
        if ago is None:
            return 0.0, None
        return max(0.0, self.cfg.backoff_s - ago), ago

    def observe(self):
        """This rank's container and unit into the state; the container's state returned."""
        cs = container_state(self.runner, self.cfg)
        self.state.update({k: cs[k] for k in ("container", "process", "pid", "started_at", "stopped", "detail")})
        self.state["unit_active"] = unit_state(self.runner, self.cfg)["active"]
        return cs

    def run(self):
        cfg = self.cfg
        say(f"worker {cfg.node}: following head {cfg.head['name']} ({cfg.head['state']}) every "
            f"{num(cfg.follow_interval_s)} s; handled generation {self.state['handled_generation']}")
        while True:
            started = time.monotonic()
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001
                say(f"internal error ({type(e).__name__}: {e}); continuing")
            self.sleep(started + cfg.follow_interval_s - time.monotonic())

    def tick(self):
        cfg = self.cfg
        head, err = fetch_state(self.runner, cfg, cfg.head["state"], role="head")
        if head is None:
            self.say_limited("unreachable", f"head {cfg.head['name']}'s state unreachable ({err}); doing nothing",
                             cfg.unreachable_log_every_s)
            self.state["head"] = {"reachable": False, "error": err, "at": iso()}
            self.observe()
            self.save()
            return
        if "unreachable" in self._limited:
            say(f"head {cfg.head['name']}'s state readable again")
            self.forget("unreachable")
        gen, want, handled = head.get("generation"), head.get("want"), self.state.get("handled_generation")
        self.state["head"] = {"reachable": True, "generation": gen, "want": want, "at": iso()}
        if want == "restarting" and gen != handled:
            left, ago = self.restart_spacing_left()
            if left > 0:
                # The head starts restart k+1 no sooner than backoff_s after restart k ended, and this
                # rank's part of k ended before the head's did: a request sooner than that is not the
                # head's own rules at work (a broken or spoofed state). It waits, it is not refused.
                self.say_limited("spacing", f"head {cfg.head['name']} asks for generation {gen}'s restart "
                                 f"{secs(ago)} after this rank's last restart ended, sooner than the head's backoff "
                                 f"({num(cfg.backoff_s)} s) allows: it waits {secs(left)}", cfg.backoff_s)
            else:
                self.forget("spacing")
                self.restart(gen)
        elif gen != handled:
            if handled is None:
                self.act(f"first sight of head {cfg.head['name']}: adopting its generation {gen} ({want}) "
                         f"without a restart")
            elif gen < handled:
                self.act(f"head {cfg.head['name']}'s generation {gen} is below this worker's {handled} (the head's state "
                         f"was reset): adopting {gen} without a restart")
            else:
                self.act(f"head {cfg.head['name']} is at generation {gen} ({want}), this worker handled {handled}: "
                         f"adopting {gen} without a restart (the head is not waiting for one)")
            self.state["handled_generation"] = gen
        if want == "stopped":
            g = head.get("gave_up") or {}
            mark = g.get("at") or f"generation {gen}"
            if self.state.get("handled_stop") != mark:
                self.act(f"head {cfg.head['name']} gave up at {g.get('at')} ({g.get('reason')}): stopping {cfg.unit}")
                r = self.runner.systemctl("stop", cfg.unit)
                if not r.ok:
                    self.act(f"systemctl stop {cfg.unit} failed ({r.why()})")
                self.state["handled_stop"] = mark
        self.observe()
        self.save()

    def restart(self, gen):
        """Restart this rank for the head's generation `gen`. The generation counts as handled however
        the attempt ends (an error included): the head judges the result, and a rank is never
        restarted twice for one generation."""
        cfg = self.cfg
        t0 = time.monotonic()
        self.act(f"head {cfg.head['name']} restarts the pair (generation {gen}): restarting {cfg.unit}")
        self.state["busy"] = f"restarting {cfg.unit} since {iso()}"
        try:
            self.observe()
            self.save()
            killed = kill_if_frozen(self.runner, cfg)
            if killed:
                self.act(killed)
            r = self.runner.systemctl("restart", cfg.unit)
            if not r.ok:
                self.act(f"systemctl restart {cfg.unit} failed ({r.why()})")
            deadline = time.monotonic() + cfg.worker_wait_s
            while True:
                cs = self.observe()
                if container_ok(cs):
                    self.act(f"{cfg.unit}'s container running after {secs(time.monotonic() - t0)}; "
                             f"handled generation {gen}")
                    break
                us = unit_state(self.runner, cfg)
                if not cs["running"] and start_failed(us):
                    why = (f"{cfg.unit} exited with status {us['status'] or '?'} at its start "
                           f"(journalctl -u {cfg.unit})")
                    self.act(f"{why}; handled generation {gen} as failed (the head decides)")
                    self.state.update(failed_generation=gen, failed_why=why)
                    break
                if time.monotonic() >= deadline:
                    self.act(f"{cfg.unit}'s container not running {secs(cfg.worker_wait_s)} after its restart "
                             f"({cs['detail']}); handled generation {gen} anyway (the head decides)")
                    break
                self.save()
                self.sleep(min(1.0, cfg.follow_interval_s))
        finally:
            self.state["busy"] = None
            self.state["handled_generation"] = gen
            self.state["last_restart"] = {"generation": gen, "boot": self.boot, "finished_mono": round(time.monotonic(), 3)}


# -------------------------------------------------------------------------------------------- commands

def verdict(cfg, state, now=None):
    """(ok, one line) for `status`: what doctor and make status print."""
    now = time.time() if now is None else now
    try:
        age = now - float(state.get("updated_epoch"))
    except (TypeError, ValueError):
        return False, "no valid state (the watchdog never wrote one)"
    period = cfg.interval_s if cfg.role == "head" else cfg.follow_interval_s
    limit = max(cfg.stale_after_s, 3 * period + cfg.probe_timeout_s)
    if age > limit and not state.get("busy"):
        return False, f"state not updated for {secs(age)}: is sparkfleet-watchdog running on {cfg.node}?"
    if cfg.role == "head":
        g, probe = state.get("gave_up"), state.get("last_probe") or {}
        restarts = state.get("restarts") or []
        tail = f"; generation {state.get('generation')}, {len(restarts)} restart(s) in the window"
        if g:
            return False, f"GAVE UP at {g.get('at')}: {g.get('reason')}"
        if state.get("want") == "restarting":
            return False, f"restarting the pair (generation {state.get('generation')})"
        if not probe:
            return False, "no probe yet"
        if probe.get("kind") == "watch":
            return False, (f"the pair serves, but the watchdog cannot see it whole at {probe.get('at')}: "
                           f"{probe.get('reason')}{tail}")
        if not probe.get("ok"):
            return False, (f"probe failing ({state.get('failures', 0)} judged failure(s) in a row) at "
                           f"{probe.get('at')}: {probe.get('reason')}{tail}")
        return True, f"serving: probe ok at {probe.get('at')} ({probe.get('reason')}){tail}"
    head = state.get("head") or {}
    where = (f"head at generation {head.get('generation')} ({head.get('want')})" if head.get("reachable")
             else f"head state unreachable ({head.get('error')})")
    line = (f"container {state.get('container')}, process {state.get('process')}; handled generation "
            f"{state.get('handled_generation')}; {where}")
    if state.get("busy"):
        return False, f"{state['busy']}; {line}"
    ok = state.get("container") == "running" and state.get("process") == "running"
    if head.get("want") == "stopped" and not ok:
        return False, f"stopped: the head gave up; {line}"
    return ok, line


def cmd_status(cfg):
    try:
        state = read_json(cfg.state_path)
    except FileNotFoundError:
        print(json.dumps({}, indent=1))
        print(f"verdict: fail: no state at {cfg.state_path} (the watchdog never ran on {cfg.node})")
        return 1
    except (OSError, ValueError) as e:
        print(json.dumps({}, indent=1))
        print(f"verdict: fail: state {cfg.state_path} unreadable ({e})")
        return 1
    ok, line = verdict(cfg, state)
    print(json.dumps(state, indent=1, sort_keys=True))
    print(f"verdict: {'ok' if ok else 'fail'}: {line}")
    return 0 if ok else 1


def running_loop(state):
    """The pid of this node's `run` loop when it is alive (the pid its state names runs sfl_watch.py run)."""
    pid = state.get("pid_watchdog")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    return pid if b"run" in argv and any(a.endswith(b"sfl_watch.py") for a in argv) else None


def cmd_deployed(cfg):
    try:
        state = read_json(cfg.state_path)
    except FileNotFoundError:
        print(f"{PREFIX}: no state at {cfg.state_path}: nothing to hand over (the watchdog starts afresh)")
        return 0
    except (OSError, ValueError):
        state = {}  # Node starts afresh from an unreadable state, and says so
    pid = running_loop(state)
    if pid:
        print(f"{PREFIX}: the watchdog runs on {cfg.node} (pid {pid}); stop sparkfleet-watchdog before `deployed`",
              file=sys.stderr)
        return 1
    node = (Head if cfg.role == "head" else Worker)(cfg)
    node.handed_over()
    return 0 if node.save() else 1  # the deploy must not start a watchdog on a hand-over it did not save


def cmd_probe(cfg):
    runner = Runner(cfg)
    if cfg.role == "head":
        result = Probe(cfg, runner, one_shot=True).run()
        print(("ok: " if result["ok"] else "failed: ") + result["reason"])
        return 0 if result["ok"] else 1
    cs = container_state(runner, cfg)
    if container_ok(cs):
        print(f"ok: {cfg.container} running (pid {cs['pid']})")
        return 0
    print(f"failed: {cs['detail']}")
    return 1


def main(argv):
    p = argparse.ArgumentParser(prog="sfl_watch.py", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("run", "probe", "status", "deployed"))
    p.add_argument("config")
    a = p.parse_args(argv)
    try:
        cfg = Config.load(a.config)
    except ConfigError as e:
        print(f"{PREFIX}: config error: {e}", file=sys.stderr)
        return 2
    if a.command == "status":
        return cmd_status(cfg)
    if a.command == "probe":
        return cmd_probe(cfg)
    if a.command == "deployed":
        return cmd_deployed(cfg)

    def stop(signum, _frame):
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        (Head if cfg.role == "head" else Worker)(cfg).run()
    except Stop as e:
        say(f"stopping ({e})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
