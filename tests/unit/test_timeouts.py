"""Every external command bounded (sparkfleet/bounded.py): the wrapper's real behaviour under sh, the
limits each rendered command carries from data, rsync's --timeout, and the keys' refusals."""
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import sparkfleet.bounded as bounded_module
from roles.fanout import sfl_files
from roles.fanout.commands import rsync_pull_command
from roles.image.commands import build_command, git_fetch_command, pull_command as image_pull, push_command
from sparkfleet.model.serving import load_profile
from roles.weights.checks import HUB_FETCH_CONTAINER, fetch_command, pull_command
from sparkfleet.bounded import bounded, timeout_message
from sparkfleet.config import ConfigError, build_cluster
from tests.unit.helpers import pair

SFL = str(Path(sfl_files.__file__))
KEYS = ("image_git_fetch_timeout_s", "image_build_timeout_s", "image_push_timeout_s", "image_pull_timeout_s",
        "weights_fetch_timeout_s", "fanout_rsync_timeout_s", "fanout_rsync_io_timeout_s")


def sh(command: str, timeout=60):
    start = time.monotonic()
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - start


def cluster(**data):
    return build_cluster(pair(**{"spark-a": data, "spark-b": data}))


# --- The wrapper, run for real ------------------------------------------------------------------


def test_the_wrapper_stops_a_sleep_at_its_limit_naming_step_host_limit_and_key():
    cmd = bounded("sleep 30", step="Fetch org/m at abc on the head (hub)", host="spark-a", limit_s=1,
                  key="weights_fetch_timeout_s")
    done, took = sh(cmd)
    assert done.returncode == 124 and took < 5
    assert done.stderr == ('sparkfleet: spark-a: "Fetch org/m at abc on the head (hub)" stopped after 1 s '
                           "(weights_fetch_timeout_s); a re-run resumes from what arrived\n")


def test_within_its_limit_a_command_keeps_its_output_and_status_and_nothing_is_said():
    done, _ = sh(bounded("cd / && printf '%s\\n' \"it's $(pwd)\"; exit 3", step="s", host="h", limit_s=20, key="k"))
    assert (done.returncode, done.stdout, done.stderr) == (3, "it's /\n", "")
    done, _ = sh(bounded("true", step="s", host="h", limit_s=20, key="k") + " && echo composes")
    assert (done.returncode, done.stdout) == (0, "composes\n")


def test_the_cleanup_runs_at_the_limit_only(tmp_path):
    mark = tmp_path / "cleaned"
    cleanup = f"touch {mark}"
    done, _ = sh(bounded("true", step="s", host="h", limit_s=20, key="k", cleanup=cleanup))
    assert done.returncode == 0 and not mark.exists()
    done, _ = sh(bounded("sleep 30", step="s", host="h", limit_s=1, key="k", cleanup=cleanup))
    assert done.returncode == 124 and mark.exists()


def test_a_command_that_ignores_term_is_killed_and_still_named(monkeypatch):
    monkeypatch.setattr(bounded_module, "KILL_AFTER_S", 1)
    done, took = sh(bounded("trap '' TERM; sleep 30", step="Build x on the head", host="spark-a", limit_s=1,
                            key="image_build_timeout_s"))
    assert done.returncode == 137 and took < 6
    assert 'spark-a: "Build x on the head" stopped after 1 s (image_build_timeout_s)' in done.stderr


def test_a_kill_before_the_limit_is_not_reported_as_the_limit():
    # 137 from something else (the OOM killer) is the command's own failure, not slowness.
    done, _ = sh(bounded("kill -9 $$", step="s", host="h", limit_s=30, key="k"))
    assert done.returncode == 137 and "stopped after" not in done.stderr


def test_a_limit_below_one_second_is_refused():
    with pytest.raises(ValueError, match="weights_fetch_timeout_s"):
        bounded("true", step="s", host="h", limit_s=0, key="weights_fetch_timeout_s")


class BlackHole:
    """A TCP listener that accepts and never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.conns = []
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                continue

    def close(self):
        self.stop.set()
        for c in self.conns:
            c.close()
        self.sock.close()


def test_an_http_fetch_from_a_black_hole_stops_at_its_limit_and_writes_nothing(tmp_path):
    hole = BlackHole()
    try:
        port = hole.sock.getsockname()[1]
        dest, out = tmp_path / "m", tmp_path / "m.manifest"
        inner = f"{sys.executable} {SFL} fetch-http http://127.0.0.1:{port}/org/m {dest} --manifest {out}"
        done, took = sh(bounded(inner, step="Fetch org/m", host="spark-a", limit_s=2, key="weights_fetch_timeout_s"))
    finally:
        hole.close()
    assert done.returncode == 124 and took < 10
    assert '"Fetch org/m" stopped after 2 s (weights_fetch_timeout_s)' in done.stderr
    assert not out.exists() and not list(tmp_path.glob(".manifest-*"))


class Stall(http.server.BaseHTTPRequestHandler):
    """Serves `files`; the first request for `stall_on` sends `stall_after` bytes, then nothing."""

    files: dict = {}
    stall_on = ""
    stall_after = 0
    ranges: list = []
    release = threading.Event()

    def do_GET(self):
        data = self.files.get(self.path)
        if data is None:
            return self.send_error(404)
        start = int(self.headers.get("Range", "bytes=0-").removeprefix("bytes=").split("-")[0])
        Stall.ranges.append((self.path, start))
        body = data[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path == Stall.stall_on:
            Stall.stall_on = ""
            self.wfile.write(body[:self.stall_after])
            self.wfile.flush()
            Stall.release.wait(30)
            return
        self.wfile.write(body)

    def log_message(self, *_):
        pass


def test_a_fetch_stopped_mid_file_leaves_no_manifest_and_a_rerun_resumes_from_what_arrived(tmp_path):
    src = tmp_path / "src"
    big = os.urandom(12 * 1024 * 1024)  # more than one 8 MiB chunk arrives before the stall
    (src / "org" / "m").mkdir(parents=True)
    (src / "org" / "m" / "w.safetensors").write_bytes(big)
    (src / "org" / "m" / "config.json").write_bytes(b"{}\n")
    Stall.files = {"/org/m.manifest": sfl_files.manifest_text(src / "org" / "m").encode(),
                   "/org/m/w.safetensors": big, "/org/m/config.json": b"{}\n"}
    Stall.stall_on, Stall.stall_after, Stall.ranges = "/org/m/w.safetensors", 9 * 1024 * 1024, []
    Stall.release.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stall)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dest, out = tmp_path / "dest", tmp_path / "dest.manifest"
    inner = (f"{sys.executable} {SFL} fetch-http http://127.0.0.1:{server.server_address[1]}/org/m {dest} "
             f"--manifest {out} --header 'model: org/m'")
    try:
        done, _ = sh(bounded(inner, step="Fetch org/m", host="spark-a", limit_s=3, key="weights_fetch_timeout_s"))
        assert done.returncode == 124, done.stderr
        assert not out.exists() and not list(tmp_path.glob(".manifest-*"))  # no manifest, whole or half
        arrived = (dest / sfl_files.PARTIAL / "w.safetensors").stat().st_size
        assert arrived >= 8 * 1024 * 1024
        done, _ = sh(bounded(inner, step="Fetch org/m", host="spark-a", limit_s=30, key="weights_fetch_timeout_s"))
        assert done.returncode == 0, done.stderr
    finally:
        Stall.release.set()
        server.shutdown()
    assert ("/org/m/w.safetensors", arrived) in Stall.ranges  # the rest only
    assert (dest / "w.safetensors").read_bytes() == big
    _, entries = sfl_files.parse_manifest(out.read_text())
    assert sfl_files.differences(dest, entries) == []


# --- What each rendered command carries from data -----------------------------------------------


def limit_of(command: str) -> str:
    """'<seconds> (<key>)' of a bounded command: its timeout's limit and the key its message names."""
    seconds = command.split("timeout --kill-after=30 ", 1)[1].split(" ", 1)[0]
    line = command.split(f" stopped after {seconds} s, its limit; log: ", 1)[1]
    key = line.split("; key: ", 1)[1].split(";", 1)[0]
    return f"{seconds} ({key})"


@pytest.mark.parametrize("source", ["hub", "/srv/models", "http://198.18.0.1:8097"])
def test_the_weights_fetch_carries_its_limit_in_every_form(source):
    c = cluster(weights_source=source, weights_fetch_timeout_s=123, fanout_rsync_io_timeout_s=45)
    cmd = fetch_command(c.head, load_profile("glm-5.3-flash-exl3"), "org/m", "abc")
    assert limit_of(cmd) == "123 (weights_fetch_timeout_s)"
    assert f'sparkfleet: spark-a: "Fetch org/m at abc on the head ({source})": stopped after 123 s' in cmd
    if source == "/srv/models":
        assert "fetch-dir /srv/models/org/m" in cmd and "--io-timeout 45" in cmd


def test_the_hub_fetch_names_its_container_and_removes_it_at_the_limit():
    c = cluster(weights_fetch_timeout_s=60)
    cmd = fetch_command(c.head, load_profile("glm-5.3-flash-exl3"), "org/m", "abc")
    assert f"docker run --rm --init --name {HUB_FETCH_CONTAINER} " in cmd
    inner, _, after = cmd.partition("; sfl_rc=$?")
    assert f"docker rm -f {HUB_FETCH_CONTAINER}" in inner.split("docker run")[0]  # a leftover goes first
    assert after.index(f"docker rm -f {HUB_FETCH_CONTAINER}") < after.index("printf")  # and at the limit


def test_a_worker_pull_carries_the_transfer_limit_and_rsyncs_io_timeout():
    c = cluster(fanout_rsync_timeout_s=900, fanout_rsync_io_timeout_s=45)
    cmd = pull_command(c, c.node("spark-b"), "org/m")
    assert limit_of(cmd) == "900 (fanout_rsync_timeout_s)" and "--io-timeout 45" in cmd
    assert 'sparkfleet: spark-b: "Send org/m to the workers over the fabric": stopped after 900 s' in cmd


def test_the_image_steps_carry_their_limits():
    c = cluster(image_git_fetch_timeout_s=11, image_build_timeout_s=22, image_push_timeout_s=33,
                image_pull_timeout_s=44)
    profile = load_profile("glm-5.3-flash-exl3")
    head, worker = c.head, c.node("spark-b")
    fetch = git_fetch_command(head, profile.recipe, "/var/lib/sparkfleet/recipes/x")
    assert limit_of(fetch) == "11 (image_git_fetch_timeout_s)" and "git fetch --quiet --tags origin" in fetch
    build = build_command(head, profile, "/var/lib/sparkfleet/recipes/x")
    assert limit_of(build) == "22 (image_build_timeout_s)" and f"docker build --quiet -f {profile.recipe.dockerfile}" in build
    assert f'"Build {profile.image_ref} on the head": stopped after 22 s' in build
    assert limit_of(push_command(head, profile, "10.77.77.1:5000/x:y")) == "33 (image_push_timeout_s)"
    pull = image_pull(worker, profile, "10.77.77.1:5000/x:y")
    assert limit_of(pull) == "44 (image_pull_timeout_s)" and "docker pull 10.77.77.1:5000/x:y" in pull
    assert 'sparkfleet: spark-b: "Pull' in pull


def test_the_kernel_cache_rsync_carries_both_timeouts():
    c = cluster(fanout_rsync_timeout_s=600, fanout_rsync_io_timeout_s=30)
    cmd = rsync_pull_command(c.head, "rsync://10.77.77.2:873/kernel-cache/abc/", "/k/abc/", "Pull spark-b's cache",
                             "--ignore-existing")
    assert limit_of(cmd) == "600 (fanout_rsync_timeout_s)"
    assert "rsync -a --timeout=30 " in cmd and " --ignore-existing rsync://10.77.77.2:873/kernel-cache/abc/ /k/abc/" in cmd


def test_the_defaults_are_a_real_pairs():
    node = cluster().head
    assert (node.image_git_fetch_timeout_s, node.image_build_timeout_s, node.image_push_timeout_s,
            node.image_pull_timeout_s) == (600, 7200, 1800, 1800)
    assert (node.weights_fetch_timeout_s, node.fanout_rsync_timeout_s, node.fanout_rsync_io_timeout_s) == (21600, 7200, 300)


def test_every_limit_message_names_the_key_to_raise():
    assert timeout_message("s", "spark-a", 5, "weights_fetch_timeout_s") == (
        'sparkfleet: spark-a: "s" stopped after 5 s (weights_fetch_timeout_s); a re-run resumes from what arrived')


# --- rsync's own --timeout, through sfl_files.py ------------------------------------------------


def fake_rsync(calls):
    """subprocess.run for sfl_files: records rsync's argv and copies like `rsync --archive SRC DEST`."""
    def run(cmd, *a, **kw):
        calls.append(cmd)
        src, dest = cmd[-2], cmd[-1]
        if src.endswith("/"):
            shutil.copytree(src, dest, dirs_exist_ok=True)
        else:
            shutil.copy(src, dest)
        return subprocess.CompletedProcess(cmd, 0)
    return run


def test_the_pull_and_the_directory_fetch_pass_rsyncs_io_timeout(tmp_path, monkeypatch):
    src = tmp_path / "head" / "org" / "m"
    src.mkdir(parents=True)
    (src / "w.safetensors").write_bytes(b"w" * 1000)
    (tmp_path / "head" / "org" / "m.manifest").write_text(sfl_files.manifest_text(src))
    calls, real_popen = [], subprocess.Popen
    monkeypatch.setattr(sfl_files.subprocess, "run", fake_rsync(calls))
    # The pull's streams are real rsyncs (between local paths here), recorded on their way.
    monkeypatch.setattr(sfl_files.subprocess, "Popen", lambda cmd, *a, **kw: calls.append(cmd) or real_popen(cmd, *a, **kw))
    dest = tmp_path / "worker" / "org" / "m"
    assert sfl_files.main(["pull", str(src), str(dest), "--manifest", str(dest) + ".manifest", "--io-timeout", "45",
                           "--streams", "2"]) == 0
    assert len(calls) == 3 and all("--timeout=45" in c for c in calls)  # the manifest, then 2 streams
    assert (dest / "w.safetensors").read_bytes() == b"w" * 1000
    monkeypatch.setattr(sfl_files.subprocess, "Popen", real_popen)
    calls.clear()
    assert sfl_files.main(["fetch-dir", str(src), str(tmp_path / "d"), "--manifest", str(tmp_path / "d.manifest"),
                           "--io-timeout", "46"]) == 0
    assert len(calls) == 1 and "--timeout=46" in calls[0]
    monkeypatch.setattr(sfl_files.subprocess, "run", lambda cmd: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    sfl_files.rsync(["a", "b/"])  # 0 (the default): no --timeout at all
    assert not any(arg.startswith("--timeout") for arg in calls[-1])


# --- Bad values are refused, naming host and key -------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("value", [0, -5, "600"])
def test_a_bad_limit_is_refused_naming_host_and_key(key, value):
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**{"spark-b": {key: value}}))
    [msg] = err.value.problems
    assert msg.startswith(f"spark-b: key '{key}' = {value!r}")
    if isinstance(value, str):
        assert "valid integer" in msg and msg.fix == "write it as 600 without quotes"
    else:
        assert "greater than or equal to 1" in msg
