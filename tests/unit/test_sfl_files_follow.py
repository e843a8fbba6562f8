"""Issue 44 item 2: the weights pulled as files land. On the head, `sfl_files.py land` runs the fetch
and publishes what has landed so far (<model>.landed, a manifest of the files in place); a worker's
`sfl_files.py pull --follow` pulls each of them from `sfl_files.py serve` as it lands, then finishes
against the head's manifest without sending or hashing again what it holds. Real processes on
loopback: the fetch is a program writing the shards one by one, each only when the test lets it, so
"pulled before the next one landed" is an observed state, not a timing."""
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roles.fanout import sfl_files
from tests.unit.test_sfl_files_pull import SFL, crossed, served

SHARDS = {f"model-{i:05d}-of-00003.safetensors": bytes([i]) * (300_000 + i) for i in range(1, 4)}
HEADER = "model: org/m"

# The stand-in fetch: each shard written as an rsync receiver writes it (a temporary .NAME.XXXXXX,
# renamed into place once whole), the next only once the file `go-<i>` exists; then, optionally, the
# manifest (sfl_files.py seal, as the hub fetch ends), or an exit status of its own.
FETCH = r'''
import os, sys, time, subprocess
dest, gates, manifest, rc, sfl = sys.argv[1:6]
shards = sys.argv[6:]
os.makedirs(dest, exist_ok=True)
for i, spec in enumerate(shards, 1):
    while not os.path.exists(os.path.join(gates, f"go-{i}")):
        time.sleep(0.02)
    name, byte, size = spec.split(":")
    tmp = os.path.join(dest, f".{name}.Xy12Zq")
    with open(tmp, "wb") as f:
        f.write(bytes([int(byte)]) * (int(size) // 2))
        f.flush()
        time.sleep(0.3)  # half a file in place under rsync's temporary name, across a look or more
        f.write(bytes([int(byte)]) * (int(size) - int(size) // 2))
    os.replace(tmp, os.path.join(dest, name))
if int(rc):
    sys.exit(int(rc))
if manifest != "-":
    subprocess.run([sys.executable, sfl, "seal", dest, "--manifest", manifest, "--header", "model: org/m"], check=True)
'''


def spec(shards):
    return [f"{name}:{data[0]}:{len(data)}" for name, data in shards.items()]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.02)
    return found


def landed(path: Path):
    """(the fetch's state, {path: (size, sha256)}) of a landing list; (None, {}) before it exists."""
    try:
        header, entries = sfl_files.parse_manifest(path.read_text())
    except FileNotFoundError:
        return None, {}
    return header.get("fetch"), entries


def start_land(root: Path, shards=SHARDS, rc=0, manifest=True):
    """`land` on the head's model directory root/org/m around the stand-in fetch; (process, gates)."""
    gates = root.parent / "gates"
    gates.mkdir(exist_ok=True)
    dest = root / "org" / "m"
    fetch = [sys.executable, "-c", FETCH, str(dest), str(gates), str(root / "org" / "m.manifest") if manifest else "-",
             str(rc), SFL, *spec(shards)]
    proc = subprocess.Popen([sys.executable, SFL, "land", str(dest), "--landed", str(root / "org" / "m.landed"),
                             "--interval", "0.05", "--", *fetch], stderr=subprocess.PIPE, text=True)
    return proc, gates


def test_land_lists_each_file_once_it_is_whole_and_says_how_the_fetch_ended(tmp_path):
    root = tmp_path / "head"
    proc, gates = start_land(root)
    listing = root / "org" / "m.landed"
    assert wait_for(lambda: landed(listing)[0], 10, "the landing list") == "running"
    assert landed(listing)[1] == {}
    names = list(SHARDS)
    (gates / "go-1").touch()
    first = wait_for(lambda: landed(listing)[1], 10, "the first shard landed")
    assert first == {names[0]: (len(SHARDS[names[0]]), sha(SHARDS[names[0]]))}
    (gates / "go-2").touch()
    # While shard 2 is half written under rsync's temporary name it is never listed, whole or not.
    wait_for(lambda: (root / "org" / "m" / f".{names[1]}.Xy12Zq").exists(), 10, "shard 2 arriving")
    while (root / "org" / "m" / f".{names[1]}.Xy12Zq").exists():
        assert set(landed(listing)[1]) == {names[0]}
        time.sleep(0.02)
    (gates / "go-3").touch()
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    state, entries = landed(listing)
    assert state == "done"
    assert entries == {name: (len(data), sha(data)) for name, data in SHARDS.items()}


def test_land_passes_the_fetchs_status_through_and_lists_it_as_failed(tmp_path):
    proc, gates = start_land(tmp_path / "head", rc=3)
    for i in (1, 2, 3):
        (gates / f"go-{i}").touch()
    assert proc.wait(timeout=30) == 3
    state, entries = landed(tmp_path / "head" / "org" / "m.landed")
    assert state == "failed 3" and len(entries) == 3


def test_a_following_pull_takes_each_file_as_it_lands_and_ends_with_the_heads_manifest(tmp_path):
    root = tmp_path / "head"
    (root / "org").mkdir(parents=True)
    dest = tmp_path / "worker" / "org" / "m"
    names = list(SHARDS)
    with served(root) as url:
        proc, gates = start_land(root)
        puller = subprocess.Popen([sys.executable, SFL, "pull", f"{url}/org/m", str(dest), "--manifest",
                                   f"{dest}.manifest", "--streams", "2", "--follow"],
                                  stderr=subprocess.PIPE, text=True)
        (gates / "go-1").touch()
        # Shard 1 is on the worker, verified and in place, before shard 2 exists on the head.
        wait_for(lambda: (dest / names[0]).exists(), 20, "shard 1 on the worker")
        assert (dest / names[0]).read_bytes() == SHARDS[names[0]]
        assert not (root / "org" / "m" / names[1]).exists() and not Path(f"{dest}.manifest").exists()
        (gates / "go-2").touch()
        wait_for(lambda: (dest / names[1]).exists(), 20, "shard 2 on the worker")
        (gates / "go-3").touch()
        assert proc.wait(timeout=30) == 0
        assert puller.wait(timeout=30) == 0, puller.stderr.read()
    err = puller.stderr.read()
    assert Path(f"{dest}.manifest").read_bytes() == (root / "org" / "m.manifest").read_bytes()
    assert {rel: (dest / rel).read_bytes() for rel in sfl_files.listing(dest)} == SHARDS
    # Each byte crossed once: what the follow pulled was neither sent nor hashed again at the end.
    assert crossed(err) == sum(len(d) for d in SHARDS.values()), err
    assert "in place at the right size" not in err


def test_a_following_pull_stops_when_the_heads_fetch_failed_and_writes_no_manifest(tmp_path):
    root = tmp_path / "head"
    (root / "org").mkdir(parents=True)
    dest = tmp_path / "worker" / "org" / "m"
    with served(root) as url:
        proc, gates = start_land(root, rc=5)
        for i in (1, 2, 3):
            (gates / f"go-{i}").touch()
        assert proc.wait(timeout=30) == 5
        r = subprocess.run([sys.executable, SFL, "pull", f"{url}/org/m", str(dest), "--manifest", f"{dest}.manifest",
                            "--follow"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 4, r.stderr
    assert "the head's fetch failed 5" in r.stderr and not Path(f"{dest}.manifest").exists()
    assert len(sfl_files.listing(dest)) == 3  # what landed stays: a re-run's pull only hashes it


def test_a_file_the_head_replaced_after_it_was_pulled_is_pulled_again_before_the_manifest(tmp_path):
    """A fetch into a directory with an older revision's files: the old shard is listed first (it is in
    place), the worker holds it, then the fetch replaces it; the worker ends with the new one."""
    root = tmp_path / "head"
    model = root / "org" / "m"
    model.mkdir(parents=True)
    names = list(SHARDS)
    (model / names[0]).write_bytes(b"old" * 1000)
    dest = tmp_path / "worker" / "org" / "m"
    with served(root) as url:
        proc, gates = start_land(root)
        puller = subprocess.Popen([sys.executable, SFL, "pull", f"{url}/org/m", str(dest), "--manifest",
                                   f"{dest}.manifest", "--follow"], stderr=subprocess.PIPE, text=True)
        wait_for(lambda: (dest / names[0]).exists(), 20, "the old shard on the worker")
        assert (dest / names[0]).read_bytes() == b"old" * 1000
        for i in (1, 2, 3):
            (gates / f"go-{i}").touch()
        assert proc.wait(timeout=30) == 0
        assert puller.wait(timeout=30) == 0, puller.stderr.read()
    assert {rel: (dest / rel).read_bytes() for rel in sfl_files.listing(dest)} == SHARDS
    assert Path(f"{dest}.manifest").read_bytes() == (root / "org" / "m.manifest").read_bytes()


def test_a_following_pull_never_takes_an_older_manifest_for_the_fetchs(tmp_path):
    """The head holds an older revision's manifest while it fetches the new one (the deploy leaves it,
    so that a failed fetch changes nothing): the pull waits for the list's `done`, then takes the new."""
    root = tmp_path / "head"
    (root / "org").mkdir(parents=True)
    old = "# model: org/m\n" + f"{sha(b'old')}\t3\tmodel-00001-of-00003.safetensors\n"
    (root / "org" / "m.manifest").write_text(old)
    dest = tmp_path / "worker" / "org" / "m"
    with served(root) as url:
        puller = subprocess.Popen([sys.executable, SFL, "pull", f"{url}/org/m", str(dest), "--manifest",
                                   f"{dest}.manifest", "--follow"], stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)  # a look or more at the old manifest, with no list yet: the pull must still wait
        assert puller.poll() is None and not Path(f"{dest}.manifest").exists()
        proc, gates = start_land(root)
        for i in (1, 2, 3):
            (gates / f"go-{i}").touch()
        assert proc.wait(timeout=30) == 0
        assert puller.wait(timeout=30) == 0, puller.stderr.read()
    assert Path(f"{dest}.manifest").read_text() != old
    assert Path(f"{dest}.manifest").read_bytes() == (root / "org" / "m.manifest").read_bytes()
    assert {rel: (dest / rel).read_bytes() for rel in sfl_files.listing(dest)} == SHARDS


def test_follow_needs_the_http_server(tmp_path, capsys):
    assert sfl_files.main(["pull", "rsync://127.0.0.1:1/weights/org/m", str(tmp_path / "m"), "--manifest",
                           str(tmp_path / "m.manifest"), "--follow"]) == 2
    assert "--follow needs the head's HTTP server" in capsys.readouterr().err


@pytest.mark.parametrize("name, temporary", [(".model.safetensors.Ab3dE9", True), (".gitattributes", False),
                                             ("config.json", False)])
def test_rsyncs_temporary_names_are_never_landed(name, temporary):
    assert bool(sfl_files.RSYNC_TEMP.match(name)) is temporary


def test_a_file_renamed_away_while_it_is_looked_at_is_no_error(tmp_path, monkeypatch):
    """`land` lists a directory a fetch is writing: rsync renames its temporary file into place at any
    moment, so a name may be there at one look and gone at the next (make test of 11c4db0: `land` died
    on it with FileNotFoundError, failing the fetch). Here the temporary file answers the first look at
    it and is gone after: the listing takes what one look saw and goes on, never raising."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    temp = tmp_path / "m" / ".model.safetensors.Xy12Zq"
    temp.write_bytes(b"x" * 5)
    looks = []
    real_stat, real_lstat = os.stat, os.lstat

    def renamed_after_one_look(real):
        def look(path, *args, **kwargs):
            if str(path) == str(temp):
                looks.append(path)
                if len(looks) > 1:
                    raise FileNotFoundError(2, "No such file or directory", str(path))
            return real(path, *args, **kwargs)
        return look
    monkeypatch.setattr(os, "stat", renamed_after_one_look(real_stat))
    monkeypatch.setattr(os, "lstat", renamed_after_one_look(real_lstat))
    listed = sfl_files.listing(str(tmp_path / "m"))
    assert listed["config.json"] == 2 and set(listed) <= {"config.json", temp.name}
    assert len(looks) == 1  # one look per file: what it saw is what is listed
