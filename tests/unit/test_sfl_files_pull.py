"""sfl_files.py pull: a worker's copy of a model from the head, in parallel streams, each file's
sha256 checked as it arrives and installed only then. Each behaviour twice, one per transport: real
rsync against a real daemon on loopback, configured like roles/fanout's (chroot, read-only; loopback
for the fabric), and HTTP against `sfl_files.py serve` on loopback (sendfile on the head, the hash
taken from the bytes as they are received)."""
import http.client
import os
import socket
import contextlib
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roles.fanout import sfl_files
from tests.unit.helpers import fanout_rsyncd


SFL = str(Path(sfl_files.__file__))
SHARDS = {f"model-{i:05d}-of-00005.safetensors": 200_000 + 50_000 * i for i in range(1, 6)}


def write_model(root: Path) -> dict[str, bytes]:
    files = {rel: os.urandom(size) for rel, size in SHARDS.items()}
    files |= {"config.json": b'{"a": 1}\n', "tokenizer/tokenizer.json": b"{}\n"}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(root: Path, allow: str = "127.0.0.0/8"):
    """`sfl_files.py serve root` on loopback, for clients in `allow`; yields its http:// URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, SFL, "serve", str(root), "--address", "127.0.0.1", "--port", str(port),
                             "--allow", allow], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:  # listening once a connection is accepted
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "no listener"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(params=["rsync", "http"])
def head(request, tmp_path):
    """(URL of org/m from the head on loopback, the model's directory, its files): roles/fanout's
    read-only rsync daemon, or `sfl_files.py serve` over the same directory."""
    models = tmp_path / "head"
    files = write_model(models / "org" / "m")
    (models / "org" / "m.manifest").write_text(sfl_files.manifest_text(models / "org" / "m", ["model: org/m"]))
    if request.param == "http":
        with served(models) as url:
            yield f"{url}/org/m", models / "org" / "m", files
        return
    if not shutil.which("rsync"):
        pytest.skip("rsync is not installed")
    if os.geteuid() != 0:
        # roles/fanout's daemon chroots (root only); without it rsync 3.5 sends no file of a
        # --files-from list under a module's subdirectory ("file has vanished").
        pytest.skip("the rsync daemon's chroot needs root")
    # roles/fanout's own daemon config: the pulls below are accepted by what every node runs.
    with fanout_rsyncd(tmp_path, weights=models) as (url, _):
        yield f"{url}/weights/org/m", models / "org" / "m", files


def over_http(url: str) -> bool:
    return url.startswith("http://")


def pull(url, dest, *extra):
    """sfl_files.py pull's exit code (0, or what it exited with)."""
    try:
        return sfl_files.main(["pull", url, str(dest), "--manifest", f"{dest}.manifest", *extra])
    except SystemExit as e:
        return e.code


def crossed(stderr: str) -> int:
    return int(re.search(r"(\d+) bytes crossed the link", stderr).group(1))


def same_tree(dest: Path, files: dict[str, bytes]) -> bool:
    found = set(sfl_files.listing(dest))  # the stage, left by a failed pull, is not the model
    return found == set(files) and all((dest / rel).read_bytes() == data for rel, data in files.items())


@pytest.mark.parametrize("n", [1, 2, 3, 4, 9])
def test_streams_split_the_files_by_bytes_each_file_in_exactly_one(n):
    sizes = {"a": 900, "b": 500, "c": 400, "d": 300, "e": 300, "f": 100, "config.json": 3, "tok": 2}
    groups = sfl_files.balance(sizes, n)
    assert len(groups) == min(n, len(sizes))
    assert sorted(rel for g in groups for rel in g) == sorted(sizes)
    loads = [sum(sizes[rel] for rel in g) for g in groups]
    assert max(loads) - min(loads) <= max(sizes.values())  # no stream idles while another has two shards' work
    assert max(loads) <= sum(sizes.values()) / len(groups) + max(sizes.values())
    shards = {f"model-{i:05d}-of-00008.safetensors": 5_000_000 for i in range(1, 9)} | {"config.json": 3}
    loads = sorted(sum(shards[rel] for rel in g) for g in sfl_files.balance(shards, 4))
    assert loads[-1] - loads[0] == 3 and all(len(g) in (2, 3) for g in sfl_files.balance(shards, 4))


@pytest.mark.parametrize("streams", ["1", "2", "4"])
def test_a_pull_installs_every_file_verified_and_writes_the_heads_manifest(head, tmp_path, capsys, streams):
    url, src, files = head
    dest = tmp_path / "worker" / "org" / "m"
    assert pull(url, dest, "--streams", streams) == 0
    assert same_tree(dest, files)
    assert not (dest / sfl_files.PARTIAL).exists()
    assert Path(f"{dest}.manifest").read_bytes() == (src.parent / "m.manifest").read_bytes()
    assert crossed(capsys.readouterr().err) >= sum(len(d) for d in files.values())
    # Everything in place: hashed, nothing sent.
    assert pull(url, dest, "--streams", streams) == 0
    assert crossed(capsys.readouterr().err) == 0


def test_a_file_that_differs_from_the_heads_manifest_is_never_installed_and_the_pull_exits_1(head, tmp_path, capsys):
    url, src, files = head
    victim = "model-00003-of-00005.safetensors"
    data = bytearray((src / victim).read_bytes())
    data[1000] ^= 0xFF  # same size: only the sha256 can tell
    (src / victim).write_bytes(bytes(data))
    dest = tmp_path / "worker" / "org" / "m"
    assert pull(url, dest, "--streams", "2") == 1
    err = capsys.readouterr().err
    assert f"sha256 {victim} differs from the head's manifest (removed, not installed" in err
    assert not (dest / victim).exists() and not (dest / sfl_files.PARTIAL / victim).exists()
    assert not Path(f"{dest}.manifest").exists()
    assert same_tree(dest, {rel: d for rel, d in files.items() if rel != victim})  # the others are verified


def test_an_interrupted_pull_resumes_from_its_partial_file(head, tmp_path, capsys):
    url, src, files = head
    big = "model-00006-of-00006.safetensors"
    files[big] = os.urandom(3 * 1024 * 1024)
    (src / big).write_bytes(files[big])
    (src.parent / "m.manifest").write_text(sfl_files.manifest_text(src, ["model: org/m"]))
    dest = tmp_path / "worker" / "org" / "m"
    stage = dest / sfl_files.PARTIAL
    # A slow link (1 MiB/s shared by 2 streams) to stop halfway, as `timeout` stops a bounded pull:
    # TERM to the whole process group.
    slow = subprocess.Popen([sys.executable, SFL, "pull", url, str(dest), "--manifest", f"{dest}.manifest",
                             "--streams", "2", "--bwlimit", "1024"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "slow.err", "w"))
    # rsync writes a temporary .<name>.XXXXXX and keeps it in its --partial-dir on a TERM; the HTTP
    # pull writes stage/<name> itself and keeps it there.
    growing = (lambda: [stage / big]) if over_http(url) else (lambda: stage.glob(f".{big}.*"))
    deadline = time.monotonic() + 60
    arriving = 0
    while arriving < 1024 * 1024 and time.monotonic() < deadline:
        time.sleep(0.05)
        arriving = max((p.stat().st_size for p in growing() if p.exists()), default=0)
    os.killpg(slow.pid, signal.SIGTERM)
    slow.wait(timeout=20)
    assert slow.returncode != 0 and arriving >= 1024 * 1024, f"{arriving} bytes arrived before the stop"
    partial = stage / big if over_http(url) else stage / sfl_files.PARTIAL / big
    deadline = time.monotonic() + 20
    while not partial.exists() and time.monotonic() < deadline:  # rsync moves it there as it exits
        time.sleep(0.05)
    assert partial.exists(), sorted((str(p.relative_to(dest)), p.stat().st_size) for p in dest.rglob("*") if p.is_file())
    kept = partial.stat().st_size
    assert kept >= 1024 * 1024 and kept < len(files[big]) and not (dest / big).exists()
    assert not Path(f"{dest}.manifest").exists()

    assert pull(url, dest, "--streams", "2") == 0
    sent = crossed(capsys.readouterr().err)
    missing = sum(len(d) for rel, d in files.items() if not rel == big) + len(files[big]) - kept
    # What crossed is what was missing (plus rsync's block checksums), not the partial again.
    assert sent < missing + 64 * 1024, f"{sent} bytes crossed for {missing} missing"
    assert same_tree(dest, files) and not stage.exists()


def test_a_file_in_place_that_differs_is_sent_again_and_the_others_only_hashed(head, tmp_path, capsys):
    url, src, files = head
    dest = tmp_path / "worker" / "org" / "m"
    assert pull(url, dest) == 0
    capsys.readouterr()
    victim = "model-00002-of-00005.safetensors"
    data = bytearray((dest / victim).read_bytes())
    data[-1] ^= 0xFF
    (dest / victim).write_bytes(bytes(data))
    head_times = (src / victim).stat()
    os.utime(dest / victim, ns=(head_times.st_atime_ns, head_times.st_mtime_ns))  # rsync's quick check is fooled
    assert pull(url, dest) == 0
    err = capsys.readouterr().err
    assert f"{victim}: in place at the right size but its sha256 differs from the head's manifest; sent again" in err
    assert len(files[victim]) <= crossed(err) < len(files[victim]) + 64 * 1024
    assert same_tree(dest, files)


def test_a_whole_file_left_in_the_stage_is_verified_and_installed_without_crossing_again(head, tmp_path, capsys):
    url, src, files = head
    dest = tmp_path / "worker" / "org" / "m"
    left = "model-00005-of-00005.safetensors"  # arrived, then the pull stopped before hashing it
    (dest / sfl_files.PARTIAL).mkdir(parents=True)
    shutil.copy2(src / left, dest / sfl_files.PARTIAL / left)
    assert pull(url, dest, "--streams", "3") == 0
    assert crossed(capsys.readouterr().err) < sum(len(d) for d in files.values()) - len(files[left]) + 64 * 1024
    assert same_tree(dest, files)


def test_the_bandwidth_cap_is_the_whole_pulls_shared_by_its_streams(head, tmp_path, monkeypatch):
    url, _, files = head
    if over_http(url):
        # The cap paces every stream's reads from one shared clock: 3 streams at 500 KiB/s take at least
        # the bytes / the rate, whatever the load (a lower bound: a busy machine only adds to it).
        dest = tmp_path / "worker" / "org" / "m"
        t0 = time.monotonic()
        assert pull(url, dest, "--streams", "3", "--bwlimit", "500", "--io-timeout", "45") == 0
        total = sum(len(d) for d in files.values())
        assert time.monotonic() - t0 >= total / (500 * 1024) * 0.95
        assert same_tree(dest, files)
        return
    started, real = [], subprocess.Popen

    def popen(cmd, *a, **kw):
        started.append(cmd)
        return real(cmd, *a, **kw)

    monkeypatch.setattr(sfl_files.subprocess, "Popen", popen)
    dest = tmp_path / "worker" / "org" / "m"
    assert pull(url, dest, "--streams", "3", "--bwlimit", "1000", "--io-timeout", "45") == 0
    streams = [cmd for cmd in started if "--files-from=-" in cmd]  # subprocess.run's manifest fetch is a Popen too
    assert len(streams) == 3
    for cmd in streams:
        # `rsync --archive` first: the lab's resume test stops the pull's rsyncs by that command line.
        assert cmd[:2] == ["rsync", "--archive"] and "--bwlimit=334" in cmd and "--timeout=45" in cmd
        assert "--delay-updates" not in cmd  # rsync installs into the stage; only sfl_files installs into DEST
    assert same_tree(dest, files)


def test_a_transport_failure_exits_with_rsyncs_code_and_writes_no_manifest(head, tmp_path, capsys):
    url, src, files = head
    (src / "config.json").unlink()  # listed by the head's manifest, gone from its directory
    dest = tmp_path / "worker" / "org" / "m"
    if over_http(url):
        assert pull(url, dest, "--streams", "2") == sfl_files.HTTP_FAILED
        err = capsys.readouterr().err
        assert "transfer failed: config.json: HTTP Error 404" in err
        assert "the transfer failed; a re-run resumes from what arrived" in err
    else:
        assert pull(url, dest, "--streams", "2") == 23  # rsync: partial transfer due to error
        assert "rsync exited 23; a re-run resumes from what arrived" in capsys.readouterr().err
    assert not Path(f"{dest}.manifest").exists() and not (dest / "config.json").exists()
    assert same_tree(dest, {rel: d for rel, d in files.items() if rel != "config.json"})


def test_a_shortfall_of_disk_refuses_before_any_file_is_written(head, tmp_path, capsys):
    url, _, _ = head
    dest = tmp_path / "worker" / "org" / "m"
    assert pull(url, dest, "--margin-gib", "100000") == 3
    assert "nothing was transferred" in capsys.readouterr().err
    assert not (tmp_path / "worker").exists()  # the streams, connected early, were given no files


def test_a_partial_file_left_where_the_stage_keeps_whole_files_is_the_basis_of_the_transfer(head, tmp_path, capsys):
    # The layout before the stage kept a top-level file's partial at DEST/.sparkfleet-partial/<name>,
    # where whole files now wait for their hash: it is resumed from, not taken for whole nor lost.
    url, src, files = head
    dest = tmp_path / "worker" / "org" / "m"
    half = "model-00004-of-00005.safetensors"
    (dest / sfl_files.PARTIAL).mkdir(parents=True)
    (dest / sfl_files.PARTIAL / half).write_bytes(files[half][: len(files[half]) // 2])
    assert pull(url, dest, "--streams", "2") == 0
    assert crossed(capsys.readouterr().err) < sum(len(d) for d in files.values()) - len(files[half]) // 2 + 64 * 1024
    assert same_tree(dest, files) and not (dest / sfl_files.PARTIAL).exists()


# --- sfl_files.py serve: what the head answers, and to whom -----------------------------------

def get(url: str, path: str, headers=None) -> tuple[int, bytes, dict]:
    """A raw GET of `path` as written (no client-side normalising of '..')."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read(), dict(r.getheaders())
    finally:
        conn.close()


def test_serve_answers_a_file_and_a_range_of_it(tmp_path):
    files = write_model(tmp_path / "head" / "org" / "m")
    with served(tmp_path / "head") as url:
        status, body, _ = get(url, "/org/m/config.json")
        assert (status, body) == (200, files["config.json"])
        shard = "model-00002-of-00005.safetensors"
        status, body, headers = get(url, f"/org/m/{shard}", {"Range": "bytes=1000-"})
        assert (status, body) == (206, files[shard][1000:])
        assert headers["Content-Range"] == f"bytes 1000-{len(files[shard]) - 1}/{len(files[shard])}"
        assert get(url, f"/org/m/{shard}", {"Range": f"bytes={len(files[shard]) + 1}-"})[0] == 416


def test_serve_refuses_what_is_no_regular_file_inside_its_directory(tmp_path):
    root = tmp_path / "head"
    write_model(root / "org" / "m")
    (tmp_path / "secret").write_text("not served\n")
    (root / "org" / "m" / "out").symlink_to(tmp_path / "secret")
    (root / "org" / "m" / sfl_files.PARTIAL).mkdir()
    (root / "org" / "m" / sfl_files.PARTIAL / "half").write_text("a partial download\n")
    with served(root) as url:
        for path in ("/org/m/out", "/org/m/../../secret", "/org/m/%2e%2e/%2e%2e/secret",
                     f"/org/m/{sfl_files.PARTIAL}/half", "/org/m", "/org/m/", "/", "/org/m/absent"):
            status, body, _ = get(url, path)
            assert status == 404 and b"not served" not in body and b"partial" not in body, path


def test_serve_answers_no_client_outside_its_networks(tmp_path):
    files = write_model(tmp_path / "head" / "org" / "m")
    with served(tmp_path / "head", allow="10.77.77.0/24") as url:
        assert get(url, "/org/m/config.json")[0] == 403
    with served(tmp_path / "head", allow="127.0.0.1/32") as url:
        assert get(url, "/org/m/config.json")[1] == files["config.json"]


def test_an_http_pull_from_no_server_exits_4_naming_the_manifest_and_writes_nothing(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}/org/m"  # nothing listens there
    dest = tmp_path / "worker" / "org" / "m"
    assert pull(url, dest) == sfl_files.HTTP_FAILED
    assert f"{url}.manifest: <urlopen error [Errno 111] Connection refused>; a re-run resumes" in capsys.readouterr().err
    assert not (tmp_path / "worker").exists()


def test_serve_tells_systemd_it_is_ready_only_once_it_listens(tmp_path):
    """Its unit is Type=notify: READY=1 reaches $NOTIFY_SOCKET after the port is bound, so a connection
    made as soon as it arrives is accepted (the deploy starts the workers' pulls right after a restart)."""
    (tmp_path / "head").mkdir()
    port = free_port()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(tmp_path / "notify"))
        notify.settimeout(20)
        proc = subprocess.Popen([sys.executable, SFL, "serve", str(tmp_path / "head"), "--address", "127.0.0.1",
                                 "--port", str(port), "--allow", "127.0.0.0/8"], stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")})
        try:
            assert notify.recv(64) == b"READY=1"
            socket.create_connection(("127.0.0.1", port), timeout=1).close()  # no retry: it listens already
        finally:
            proc.terminate()
            proc.wait(timeout=10)


# --- the HTTP pull's writes around the page cache ---------------------------------------------------------

@contextlib.contextmanager
def http_head(tmp_path):
    models = tmp_path / "head"
    files = write_model(models / "org" / "m")
    big = "model-00006-of-00006.safetensors"  # several chunks, then a tail that is not whole blocks
    files[big] = os.urandom(3 * sfl_files.CHUNK + 5000)
    (models / "org" / "m" / big).write_bytes(files[big])
    (models / "org" / "m.manifest").write_text(sfl_files.manifest_text(models / "org" / "m", ["model: org/m"]))
    with served(models) as url:
        yield f"{url}/org/m", files


def writes(monkeypatch, refuse_open=False, refuse_write=False) -> list[tuple[str, bool]]:
    """(path, with O_DIRECT) of each write the pull makes into its stage; a filesystem that refuses
    O_DIRECT at open, or accepts it there and refuses the write, as some do (EINVAL), when asked."""
    seen, direct = [], {}
    real_open, real_write = os.open, os.write

    def opened(path, flags, *mode):
        if refuse_open and flags & os.O_DIRECT:
            raise OSError(22, "Invalid argument")
        fd = real_open(path, flags, *mode)
        direct[fd] = str(path)
        return fd

    def wrote(fd, data):
        if fd in direct:
            on = bool(sfl_files.fcntl.fcntl(fd, sfl_files.fcntl.F_GETFL) & os.O_DIRECT)
            seen.append((direct[fd], on))
            if refuse_write and on:
                raise OSError(22, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(sfl_files.os, "open", opened)
    monkeypatch.setattr(sfl_files.os, "write", wrote)
    return seen


def test_the_http_pull_writes_whole_blocks_around_the_page_cache_and_the_tail_through_it(tmp_path, monkeypatch):
    with http_head(tmp_path) as (url, files):
        seen = writes(monkeypatch)
        dest = tmp_path / "worker" / "org" / "m"
        assert pull(url, dest, "--streams", "2") == 0
        assert same_tree(dest, files)
    big = [on for path, on in seen if path.endswith("model-00006-of-00006.safetensors")]
    assert big == [True, True, True, False], big  # three whole chunks directly, the 5000-byte tail buffered
    # every shard's first chunk straight to the disk, unless it is its tail
    firsts = {path: on for path, on in reversed(seen)}
    assert all(on for path, on in firsts.items() if path.endswith("6.safetensors")), firsts


@pytest.mark.parametrize("refused_at", ["open", "write"])
def test_a_filesystem_that_refuses_o_direct_gets_the_same_files_buffered(tmp_path, monkeypatch, refused_at):
    with http_head(tmp_path) as (url, files):
        seen = writes(monkeypatch, refuse_open=refused_at == "open", refuse_write=refused_at == "write")
        dest = tmp_path / "worker" / "org" / "m"
        assert pull(url, dest, "--streams", "3") == 0
        assert same_tree(dest, files)
    if refused_at == "open":
        assert seen and not any(on for _, on in seen)
    else:  # each file tries once, then writes buffered
        tried = [path for path, on in seen if on]
        assert len(tried) == len(set(tried)) and seen.count((tried[0], False)) >= 1


def test_a_partial_file_that_ends_inside_a_block_is_resumed_buffered(tmp_path, monkeypatch, capsys):
    with http_head(tmp_path) as (url, files):
        dest = tmp_path / "worker" / "org" / "m"
        big = "model-00006-of-00006.safetensors"
        (dest / sfl_files.PARTIAL).mkdir(parents=True)
        (dest / sfl_files.PARTIAL / big).write_bytes(files[big][:sfl_files.CHUNK + 123])
        seen = writes(monkeypatch)
        assert pull(url, dest, "--streams", "2") == 0
        sent = crossed(capsys.readouterr().err)
        assert same_tree(dest, files)
    assert sent == sum(len(d) for d in files.values()) - sfl_files.CHUNK - 123
    assert [on for path, on in seen if path.endswith(big)] == [False, False, False]
