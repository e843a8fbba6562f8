"""sparkfleet/progress.py, really run: a local command that writes bytes slowly, watched at a tiny
interval by the node-side probes the roles use (du, df), through the bound every long step runs
under (sparkfleet/bounded.py), and through pyinfra's own @local connector as a deploy runs it."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkfleet import progress
from sparkfleet.bounded import bounded
from sparkfleet.progress import (
    BYTES_FIGURE, PREFIX, Ticker, dir_bytes_probe, fs_used_probe, parse_bytes, phase_text, progress_command,
    read_progress, watched,
)

INTERVAL = 0.2
BYTES_LINE = re.compile(r"^--> sparkfleet: spark-a: Fetch m: (\d+) s, ([\d.]+) (B|KiB|MiB) \(([\d.]+) (B|KiB|MiB)/s\)$")
DONE_LINE = re.compile(r"^--> sparkfleet: spark-a: Fetch m: done in (\d+) s( \(failed\))?$")
REPO = Path(__file__).resolve().parents[2]
UNITS = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2}


def writer(target, chunks: int, pause: float, exit_code: int = 0) -> str:
    """sh: append 256 KiB to `target`/data every `pause` s, `chunks` times, then exit `exit_code`."""
    return (f"mkdir -p {target}; i=0; while [ $i -lt {chunks} ]; do head -c 262144 /dev/zero >> {target}/data; "
            f"i=$((i+1)); sleep {pause}; done; exit {exit_code}")


def sh(command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)


def du_probe(path):
    """The fan-out's and the fetch's probe, run as the node runs it."""
    return lambda: parse_bytes(sh(dir_bytes_probe(str(path))).stdout)


class Lines(list):
    """What a step printed, with when (time.monotonic) each line came."""

    def __call__(self, line: str) -> None:
        self.append(line)
        self.at = getattr(self, "at", []) + [time.monotonic()]


def test_a_slow_writer_prints_bytes_and_a_rate_every_interval_and_a_done_line_with_its_elapsed_time(tmp_path):
    lines = Lines()
    began = time.monotonic()
    result = watched(lambda: sh(writer(tmp_path / "m", chunks=12, pause=0.1)), du_probe(tmp_path / "m"),
                     label="spark-a: Fetch m", interval=INTERVAL, emit=lines, ok=lambda r: r.returncode == 0)
    took = time.monotonic() - began
    assert result.returncode == 0
    *ticks, done = lines
    assert len(ticks) >= 2, lines  # ~1.2 s of writing at 0.2 s
    parsed = [BYTES_LINE.match(line) for line in ticks]
    assert all(parsed), lines
    landed = [float(m[2]) * UNITS[m[3]] for m in parsed]
    assert landed == sorted(landed) and landed[-1] > 0, lines  # what landed grows, as the writer writes
    assert any(float(m[4]) > 0 for m in parsed), lines  # a rate while bytes arrive
    assert landed[-1] <= 12 * 262144
    gaps = [b - a for a, b in zip(lines.at, lines.at[1:-1])]
    assert all(gap >= INTERVAL * 0.9 for gap in gaps), gaps  # never more often than the interval
    match = DONE_LINE.match(done)
    assert match and match[2] is None, lines
    assert abs(int(match[1]) - took) <= 1, (done, took)


def test_a_step_faster_than_the_interval_prints_nothing(tmp_path):
    lines = Lines()
    result = watched(lambda: sh(writer(tmp_path / "m", chunks=1, pause=0)), du_probe(tmp_path / "m"),
                     label="spark-a: Fetch m", interval=2.0, emit=lines, ok=lambda r: r.returncode == 0)
    assert result.returncode == 0 and (tmp_path / "m" / "data").stat().st_size == 262144
    assert lines == []


def test_a_failing_step_keeps_its_exit_status_and_still_prints_its_done_line(tmp_path):
    lines = Lines()
    result = watched(lambda: sh(writer(tmp_path / "m", chunks=4, pause=0.1, exit_code=3)), du_probe(tmp_path / "m"),
                     label="spark-a: Fetch m", interval=INTERVAL, emit=lines, ok=lambda r: r.returncode == 0)
    assert result.returncode == 3
    assert DONE_LINE.match(lines[-1])[2] == " (failed)", lines
    assert all(BYTES_LINE.match(line) for line in lines[:-1]), lines


def test_the_bound_still_stops_a_hung_step_and_the_done_line_says_it_failed(tmp_path):
    lines = Lines()
    command = bounded("sleep 30", step="Fetch m", host="spark-a", limit_s=1, key="weights_fetch_timeout_s")
    began = time.monotonic()
    result = watched(lambda: sh(command), du_probe(tmp_path / "absent"), label="spark-a: Fetch m",
                     interval=INTERVAL, emit=lines, ok=lambda r: r.returncode == 0)
    assert result.returncode == 124 and time.monotonic() - began < 10
    assert '"Fetch m" stopped after 1 s (weights_fetch_timeout_s)' in result.stderr
    # nothing in the directory: 0 B landed, and still a line each interval
    assert all(re.search(r": \d+ s, 0 B \(0 B/s\)$", line) for line in lines[:-1]) and len(lines) >= 2, lines
    assert DONE_LINE.match(lines[-1])[2] == " (failed)", lines


def test_a_step_that_raises_raises_unchanged_after_its_done_line():
    lines = Lines()

    def step():
        time.sleep(INTERVAL * 2.5)
        raise OSError("the connection dropped")

    with pytest.raises(OSError, match="the connection dropped"):
        watched(step, lambda: 0, label="spark-a: Fetch m", interval=INTERVAL, emit=lines)
    assert DONE_LINE.match(lines[-1])[2] == " (failed)", lines


def test_a_probe_that_fails_costs_its_figure_never_the_step():
    lines = Lines()

    def probe():
        raise RuntimeError("du: cannot read")

    result = watched(lambda: sh("sleep 0.7; echo out").stdout, probe, label="spark-a: Fetch m", interval=INTERVAL,
                     emit=lines)
    assert result == "out\n"
    assert all(re.fullmatch(r"--> sparkfleet: spark-a: Fetch m: \d+ s", line) for line in lines[:-1]), lines
    assert len(lines) >= 3 and DONE_LINE.match(lines[-1]), lines


def test_the_filesystem_probe_reads_a_number_of_used_bytes(tmp_path):
    used = parse_bytes(sh(fs_used_probe(str(tmp_path))).stdout)
    assert isinstance(used, int) and used > 0
    assert parse_bytes(sh(dir_bytes_probe(str(tmp_path / "not-made-yet"))).stdout) == 0
    assert parse_bytes("du: something odd\n") is None


def test_an_engine_s_phase_is_its_log_s_last_meaningful_line_without_prefix_colour_or_secret():
    log = ("INFO 12-05 13:00:01 [loader.py:42] Loading weights took 12.31 seconds\n"
           "\x1b[32mINFO 12-05 13:00:09 [gpu_model_runner.py:2001] Capturing CUDA graphs (decode): 35%\x1b[0m\n"
           'INFO:     127.0.0.1:40000 - "GET /health HTTP/1.1" 503 Service Unavailable\n\n')
    assert phase_text(log) == "Capturing CUDA graphs (decode): 35%"
    secret = "hf_AbCdEf0123456789xyz"
    for line in (f"downloading with token={secret} now", f"HF_TOKEN: {secret}", f"Authorization: Bearer {secret}",
                 f"header api_key='{secret}'"):
        shown = phase_text(line)
        assert secret not in shown and "***" in shown, shown
    assert len(phase_text("x" * 500)) == progress.PHASE_WIDTH
    assert phase_text("\n  \n") is None


def test_a_phase_line_and_quiet_done_with_a_clock_the_test_moves():
    now = [100.0]
    lines = []
    ticker = Ticker("spark-a: start of sparkfleet-head", 30, lines.append, clock=lambda: now[0])
    now[0] += 10
    assert not ticker.due()
    now[0] += 25
    assert ticker.due()
    ticker.report("Loading weights (/health: 503)")
    assert lines == [f"{PREFIX}spark-a: start of sparkfleet-head: 35 s, Loading weights (/health: 503)"]
    assert not ticker.due()
    now[0] += 7
    ticker.done()
    ticker.done(ok=False)  # once: the first outcome stands
    assert lines[-1] == f"{PREFIX}spark-a: start of sparkfleet-head: done in 42 s"
    assert len(lines) == 2
    quick = Ticker("spark-a: prewarm", 30, lines.append, clock=lambda: now[0])
    now[0] += 29
    quick.done()
    assert len(lines) == 2  # faster than the interval: no done line either
    build = Ticker("spark-a: Build sparkfleet/lab-vllm-cpu:0a1b2c on the head", 30, lines.append, clock=lambda: now[0])
    build.base(10 * 2 ** 30)
    now[0] += 30
    build.report(10 * 2 ** 30 + 3 * 2 ** 29)
    now[0] += 31
    build.done(ok=False)
    read = read_progress("    [spark-a] Success\n" + "\n".join(lines))
    assert read == {
        ("spark-a", "start of sparkfleet-head"): {"ticks": [(35, "Loading weights (/health: 503)")], "done": (42, False)},
        ("spark-a", "Build sparkfleet/lab-vllm-cpu:0a1b2c on the head"): {
            "ticks": [(30, "1.5 GiB (51.2 MiB/s)")], "done": (61, True)},
    }


DEPLOY = """
from pyinfra.operations import server
from sparkfleet.progress import dir_bytes_probe, progress_command

server.shell(name="Fetch m", commands=[progress_command({command!r}, step="Fetch m", interval={interval},
                                                        probe=dir_bytes_probe({target!r}))])
"""


def pyinfra_run(tmp_path, command: str, target) -> subprocess.CompletedProcess:
    """`pyinfra -y @local deploy.py` (no -v), the deploy one server.shell step with progress_command, as
    roles/weights and roles/image run theirs: what reaches the terminal while it runs."""
    deploy = tmp_path / "deploy.py"
    deploy.write_text(DEPLOY.format(command=command, interval=INTERVAL, target=str(target)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([str(Path(sys.executable).parent / "pyinfra"), "-y", "@local", str(deploy)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)


def test_under_pyinfra_without_v_the_lines_reach_the_terminal_and_the_status_is_the_step_s(tmp_path):
    target = tmp_path / "m"
    token = "hf_SecretSecret0123456789"
    run = pyinfra_run(tmp_path, f"TOKEN={token}; {writer(target, chunks=8, pause=0.1)}", target)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert (target / "data").stat().st_size == 8 * 262144
    at = "--> sparkfleet: @local: Fetch m:"
    ticks = re.findall(rf"^.*{re.escape(at)} \d+ s, [\d.]+ (?:B|KiB|MiB) \([\d.]+ (?:B|KiB|MiB)/s\)$", out, re.M)
    assert len(ticks) >= 2, out
    assert re.search(rf"{re.escape(at)} done in \d+ s$", out, re.M), out
    assert token not in out  # the command line is never printed (no -v)
    # what tests/real reads of a lab deploy's output, read here of one this mechanism printed
    read = read_progress(out)
    assert list(read) == [("@local", "Fetch m")], read
    ticks, done = read["@local", "Fetch m"]["ticks"], read["@local", "Fetch m"]["done"]
    assert len(ticks) >= 2 and all(BYTES_FIGURE.match(what) for _, what in ticks), ticks
    assert done is not None and done[1] is False and done[0] >= ticks[-1][0], read
    failing = pyinfra_run(tmp_path, writer(target, chunks=4, pause=0.1, exit_code=5), target)
    out = failing.stdout + failing.stderr
    assert failing.returncode != 0, out
    assert re.search(rf"{re.escape(at)} done in \d+ s \(failed\)$", out, re.M), out
    assert read_progress(out)["@local", "Fetch m"]["done"][1] is True


def test_an_operation_body_s_context_host_is_probed_as_itself_from_the_probe_s_thread():
    """push_image and pull_by_digest hand run_with_progress pyinfra's `host`, a context proxy local to
    the greenlet (or thread) that set it: the probe, in a thread of its own, must reach the host itself.
    (Through the proxy every probe failed: the lab's push printed its elapsed time with no bytes.)"""
    import threading as _threading
    from types import SimpleNamespace

    from pyinfra import host as context_host
    from pyinfra.context import ctx_host

    calls = []

    class Node:
        name = "spark-a"

        def run_shell_command(self, command, **_):
            calls.append((_threading.current_thread().name, str(command)))
            if "df " in str(command):
                return True, SimpleNamespace(stdout=f"{1024 * len(calls)}\n", stderr="")
            time.sleep(0.7)  # the step: long enough for probes at 0.2 s
            return True, SimpleNamespace(stdout="pushed\n", stderr="")

    lines = []
    node = Node()
    with ctx_host.use(node):
        ok, out = progress.run_with_progress(context_host, "docker push x", step="Push x", interval=0.2,
                                             probe=progress.fs_used_probe("/var/lib/docker-registry"))
    assert ok and out.stdout == "pushed\n"
    probes = [c for c in calls if "df " in c[1]]
    assert probes and all(thread.startswith("progress ") for thread, _ in probes), calls


# ------------------------------------------------------------------ the record of each step (SPANS)

def test_every_step_is_recorded_quiet_or_not_with_its_outcome_in_the_wall_clock(tmp_path):
    """A step faster than its interval prints nothing, and is still recorded: the bring-up benchmark
    reads every phase from the record (bench/bringup.py), not from the lines."""
    before, began = len(progress.SPANS), time.time()
    watched(lambda: sh(writer(tmp_path / "m", chunks=1, pause=0)), du_probe(tmp_path / "m"), label="spark-a: Fetch m",
            interval=5.0, emit=Lines(), ok=lambda r: r.returncode == 0)
    watched(lambda: sh("sleep 0.3; exit 2"), lambda: None, label="spark-b: Send m to the workers over the fabric",
            interval=5.0, emit=Lines(), ok=lambda r: r.returncode == 0)
    def lost():
        raise OSError("the connection dropped")

    with pytest.raises(OSError):
        watched(lost, lambda: None, label="spark-a: prewarm", interval=5.0, emit=Lines())
    ended = time.time()
    fetch, send, prewarm = progress.SPANS[before:]
    assert (fetch.host, fetch.step, fetch.ok) == ("spark-a", "Fetch m", True)
    assert (send.host, send.step, send.ok) == ("spark-b", "Send m to the workers over the fabric", False)
    assert (prewarm.host, prewarm.step, prewarm.ok) == ("spark-a", "prewarm", False)
    assert began <= fetch.start <= fetch.end <= send.start <= send.end <= prewarm.start <= prewarm.end <= ended
    assert send.end - send.start >= 0.3


def test_a_step_done_twice_is_recorded_once_with_its_first_outcome():
    """roles/serving/ready.py ends a start's Ticker on success, and again (failed) in its finally."""
    wall, record = [1000.0], []
    ticker = Ticker("spark-a: start of sparkfleet-head", 30, [].append, wall=lambda: wall[0], record=record)
    wall[0] += 24.5
    ticker.done()
    wall[0] += 3
    ticker.done(ok=False)
    assert record == [progress.Span("spark-a", "start of sparkfleet-head", 1000.0, 1024.5, True)]


def test_the_record_of_a_pair_is_its_hosts_steps_only():
    spans = [progress.Span("spark-a", "prewarm", 1.0, 2.0, True), progress.Span("spark-c", "prewarm", 1.5, 2.5, True),
             progress.Span("spark-b", "Send m to the workers over the fabric", 0.5, 0.9, False)]
    assert progress.spans_of(["spark-a", "spark-b"], spans) == [
        {"host": "spark-a", "step": "prewarm", "start": 1.0, "end": 2.0, "ok": True},
        {"host": "spark-b", "step": "Send m to the workers over the fabric", "start": 0.5, "end": 0.9, "ok": False}]


RECORDED = """
import json
from pyinfra.operations import python, server
from sparkfleet.progress import dir_bytes_probe, progress_command, spans_of

server.shell(name="Fetch m", commands=[progress_command("sleep 0.5", step="Fetch m", interval=30,
                                                        probe=dir_bytes_probe({target!r}))])
python.call(name="Print the record", function=lambda: print("RECORD " + json.dumps(spans_of(["@local"]))))
"""


def test_under_pyinfra_a_later_operation_reads_the_record_of_an_earlier_step(tmp_path):
    """As the benchmark receipt reads its deploy's steps: an operation body, later in the same run."""
    deploy = tmp_path / "deploy.py"
    deploy.write_text(RECORDED.format(target=str(tmp_path / "m")))
    began = time.time()
    run = subprocess.run([str(Path(sys.executable).parent / "pyinfra"), "-y", "@local", str(deploy)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    (line,) = re.findall(r"^RECORD (.*)$", out, re.M)
    (step,) = json.loads(line)
    assert (step["host"], step["step"], step["ok"]) == ("@local", "Fetch m", True), step
    assert began < step["start"] and step["end"] - step["start"] >= 0.5 and step["end"] < time.time(), step


def test_a_step_that_ran_in_the_background_has_its_own_done_line_read_back_as_such():
    from sparkfleet.progress import background_done_line

    assert background_done_line("spark-a", "Fetch m", 9.9, True, interval=10) is None  # quiet when fast
    line = background_done_line("spark-a", "Fetch m", 81.6, False, interval=10)
    assert line == f"{PREFIX}spark-a: Fetch m: done in 82 s (failed) (in the background)"
    read = read_progress("    [spark-a] Success\n" + line + f"\n{PREFIX}spark-b: Send m: done in 14 s")
    assert read == {("spark-a", "Fetch m"): {"ticks": [], "done": (82, True), "background": True},
                    ("spark-b", "Send m"): {"ticks": [], "done": (14, False)}}
