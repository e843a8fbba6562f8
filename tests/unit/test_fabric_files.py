"""What crosses the fabric between nodes is regular files and directories only: no device node,
fifo, socket or symlink, no setuid/setgid bit, owned by the receiving root, whichever end is asked
(the rsync daemon roles/fanout renders, and every rsync sparkfleet runs); and a kernel-cache
generation holding anything else has it dropped and named before a merge. Real rsync (3.5.0 here)
against a real daemon started from the rendered rsyncd.conf, on loopback."""
import os
import stat
import subprocess

import pytest

from roles.fanout import sfl_files
from roles.fanout.commands import rsync_pull_command
from roles.kernel_cache.checks import cache_count_command, dropped_lines, foreign_summary, scrub_command
from roles.kernel_cache.facts import CacheState
from sparkfleet.config import build_cluster
from tests.unit.helpers import fanout_rsyncd, pair

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="device nodes, chroot and chown need root")


def plant(gen):
    """A generation as a compromised engine could leave it: two honest cache files (one owned by a
    stranger), and a block device 8,0 of mode 0666, a fifo, a setuid-root binary, a setgid directory,
    a symlink to /, one leaving the tree through another, and one staying inside it."""
    os.makedirs(gen / "triton" / "ab", exist_ok=True)
    (gen / "triton" / "ab" / "kernel.json").write_text('{"rank": 1}\n')
    (gen / "inductor.bin").write_bytes(b"\0" * 4096)
    os.chown(gen / "inductor.bin", 1234, 1234)
    os.mknod(gen / "sda", 0o666 | stat.S_IFBLK, os.makedev(8, 0))
    os.chmod(gen / "sda", 0o666)
    os.mkfifo(gen / "pipe")
    (gen / "rootshell").write_bytes(b"#!/bin/sh\nexec /bin/sh -p\n")
    os.chmod(gen / "rootshell", 0o4755)
    os.makedirs(gen / "shared")
    os.chmod(gen / "shared", 0o2775)
    os.symlink("/", gen / "root")
    os.makedirs(gen / "d")
    os.symlink("..", gen / "d" / "up")  # resolves to the generation itself: inside
    os.symlink("d/up/..", gen / "chain")  # lexically inside (d/up/.. is d), physically the parent
    os.symlink("triton/ab/kernel.json", gen / "alias")  # inside


PLANTED = {"sda", "pipe", "rootshell", "shared", "root", "chain"}


@needs_root
def test_foreign_names_each_planted_entry_by_what_it_is_and_nothing_honest(tmp_path):
    gen = tmp_path / "0123456789ab"
    gen.mkdir()
    plant(gen)
    found = dict((rel, kind) for kind, rel in sfl_files.foreign(str(gen)))
    assert set(found) == PLANTED
    assert found["sda"] == "block device 8,0 mode 0666"
    assert found["rootshell"] == "setuid file mode 4755"
    assert found["shared"] == "setgid directory mode 2775"
    assert found["pipe"] == "fifo"
    assert found["root"].startswith("symlink to / (resolves to /,")
    assert found["chain"] == f"symlink to d/up/.. (resolves to {tmp_path}, outside the tree)"


@needs_root
def test_scrub_drops_what_it_prints_and_dry_run_only_prints(tmp_path, capsys):
    gen = tmp_path / "0123456789ab"
    gen.mkdir()
    plant(gen)
    assert sfl_files.main(["scrub", "--dry-run", str(gen)]) == 0
    printed = capsys.readouterr().out
    assert {line.split("\t")[1] for line in printed.splitlines()} == PLANTED
    assert all(os.path.lexists(gen / rel) for rel in PLANTED)
    assert sfl_files.main(["scrub", str(gen)]) == 0
    assert capsys.readouterr().out == printed
    assert not any(os.path.lexists(gen / rel) for rel in PLANTED - {"shared"})
    assert stat.S_IMODE(os.stat(gen / "shared").st_mode) == 0o775  # a directory keeps its contents, not the bit
    assert os.path.islink(gen / "alias") and (gen / "triton/ab/kernel.json").is_file() and (gen / "inductor.bin").is_file()
    assert sfl_files.foreign(str(gen)) == []


def test_a_name_with_a_newline_is_printed_on_one_line():
    assert sfl_files.shown("a\nb") == "'a\\nb'" and sfl_files.shown("triton/ab") == "triton/ab"


@pytest.fixture
def daemon(tmp_path):
    """roles/fanout's rsync daemon on loopback, serving a kernel-cache directory."""
    if os.geteuid() != 0:
        pytest.skip("the daemon's chroot needs root")
    cache = tmp_path / "kernel-cache"
    cache.mkdir()
    with fanout_rsyncd(tmp_path, kernel_cache=cache) as (url, text):
        assert "refuse options = D devices specials links owner group\n" in text and "outgoing chmod = ug-s\n" in text
        yield build_cluster(pair()).node("spark-a"), f"{url}/kernel-cache", cache


def entries(root):
    """{relative path: lstat} of everything under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, root)] = os.lstat(full)
    return out


def test_the_merge_pull_carries_regular_files_only_owned_by_root_without_setuid(daemon, tmp_path):
    node, url, cache = daemon
    plant(cache / "0123456789ab")
    dest = tmp_path / "dest"
    dest.mkdir()
    cmd = rsync_pull_command(node, f"{url}/0123456789ab/", f"{dest}/", "Pull spark-b's kernel cache", "--ignore-existing")
    done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = entries(dest)
    assert {rel for rel, st in got.items() if stat.S_ISREG(st.st_mode)} == {"triton/ab/kernel.json", "inductor.bin", "rootshell"}
    assert all(stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) for st in got.values()), got
    assert not any(st.st_mode & (stat.S_ISUID | stat.S_ISGID) for st in got.values())
    assert {(st.st_uid, st.st_gid) for st in got.values()} == {(0, 0)}  # inductor.bin was 1234's
    assert (dest / "triton/ab/kernel.json").read_text() == '{"rank": 1}\n'


def test_the_daemon_refuses_a_client_that_asks_for_devices_links_or_owners(daemon, tmp_path):
    """The command the merge ran before (plain `rsync -a`) is refused: the daemon, not only sparkfleet's
    client options, keeps anything but regular files from leaving a node."""
    _, url, cache = daemon
    plant(cache / "0123456789ab")
    for extra in ([], ["--no-links", "--no-owner", "--no-group"], ["--no-devices", "--no-specials", "--no-links"]):
        dest = tmp_path / f"dest{len(extra)}"
        done = subprocess.run(["rsync", "-a", *extra, f"{url}/0123456789ab/", f"{dest}/"], capture_output=True, text=True)
        assert done.returncode != 0 and "The server is configured to refuse" in done.stderr, (extra, done.stderr)
        assert not os.path.lexists(dest / "sda") and not os.path.lexists(dest / "root")


def test_the_weights_transfers_carry_the_same_options(tmp_path, monkeypatch):
    """Both rsyncs of sfl_files.py (a pull's streams, the manifest and a directory fetch) say SAFE_RSYNC."""
    seen = []
    monkeypatch.setattr(sfl_files.subprocess, "run", lambda cmd, **kw: seen.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    monkeypatch.setattr(sfl_files.subprocess, "Popen", lambda cmd, **kw: seen.append(cmd) or pytest.skip("recorded"))
    sfl_files.rsync(["a/", "b/"])
    assert seen[0][:2] == ["rsync", "--archive"] and set(sfl_files.SAFE_RSYNC) <= set(seen[0])
    job = sfl_files.Pull("rsync://h/weights/m", str(tmp_path), type("A", (), {"streams": 1, "bwlimit": 0, "io_timeout": 0})())
    with pytest.raises(pytest.skip.Exception):
        job.launch()
    assert seen[1][:2] == ["rsync", "--archive"] and set(sfl_files.SAFE_RSYNC) <= set(seen[1])


def test_the_kernel_cache_merge_command_says_what_crosses():
    node = build_cluster(pair()).node("spark-a")
    cmd = rsync_pull_command(node, "rsync://10.77.77.2:873/kernel-cache/abc/", "/k/abc/", "step", "--ignore-existing")
    assert ("rsync -a --timeout=300 --no-links --no-devices --no-specials --no-owner --no-group --chmod=ug-s "
            "--ignore-existing rsync://10.77.77.2:873/kernel-cache/abc/ /k/abc/") in cmd


def test_the_cache_fact_reports_what_scrub_would_drop_and_the_plan_names_it():
    command = CacheState().command("/var/lib/sparkfleet/kernel-cache", "img:tag")
    assert "sfl_files.py scrub --dry-run /var/lib/sparkfleet/kernel-cache/$g" in command
    facts = CacheState().process([
        "I\tsha256:0123456789abcdef", "C\t0123456789ab", "F\t3\ttriton/k.json",
        "X\tblock device 8,0 mode 0666\tsda", "X\tsymlink to / (resolves to /, outside the tree)\troot",
    ])
    assert facts["foreign"] == [("block device 8,0 mode 0666", "sda"), ("symlink to / (resolves to /, outside the tree)", "root")]
    assert foreign_summary(facts["foreign"]) == (
        "2 entries not regular files: sda (block device 8,0 mode 0666), root (symlink to / (resolves to /, outside the tree))")
    assert CacheState().process([])["foreign"] == []


def test_the_merge_names_each_dropped_entry_with_its_rank():
    assert scrub_command("/k", "0123456789ab") == "python3 /usr/local/libexec/sparkfleet/sfl_files.py scrub /k/0123456789ab"
    out = "block device 8,0 mode 0666\tsda\nsetuid file mode 4755\trootshell\n"
    assert dropped_lines("spark-b", "0123456789ab", out) == [
        "spark-b: dropped 0123456789ab/sda (block device 8,0 mode 0666): refused, never merged",
        "spark-b: dropped 0123456789ab/rootshell (setuid file mode 4755): refused, never merged",
    ]
    assert dropped_lines("spark-b", "0123456789ab", "") == []


def test_the_prewarms_count_follows_current_and_no_link_inside_it(tmp_path):
    gen = tmp_path / "0123456789ab"
    (gen / "triton").mkdir(parents=True)
    (gen / "triton" / "k.json").write_text("12345")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * 1000)
    os.symlink(outside, gen / "out")
    os.symlink(gen.name, tmp_path / "current")
    done = subprocess.run(["sh", "-c", cache_count_command(str(tmp_path))], capture_output=True, text=True)
    assert done.stdout.split() == ["1", "5"]
