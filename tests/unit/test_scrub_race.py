"""sfl_files.py scrub against a tree that changes under it (issue 43 item 5): root never follows a path
the engine controls. A flipper process swaps a subdirectory of the tree for a symlink to an outside
directory and back, as fast as it can, while the scrub runs again and again over the tree holding
foreign entries under the same names as the outside directory's files; nothing outside may change.
Against the path-based scrub before this fix (os.walk, then lstat/unlink/chmod by path) the outside
directory lost its setuid binary and the files named as the planted fifo and device node at rounds
25, 43, 16, 35 and 123 of five runs; with the descriptor walk, 100-140 rounds meet the flipper's
symlink 3-5 times and nothing outside changes."""
import os
import stat
import subprocess
import sys
import time

import pytest

from roles.fanout import sfl_files

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="device nodes need root")

# The flipper: tree/sub (the real directory) and tree/sub.real swap places with a symlink to the
# outside directory (made beside the tree, in the flipper's own directory, then renamed in), the
# symlink held ten times as long as the directory, so that a scrub meets it often (the scrub removes
# it, a symlink leaving the tree; the flipper puts the directory back and goes on).
FLIPPER = r"""
import os, sys
tree, outside, own = sys.argv[1:4]
sub, real, link = os.path.join(tree, "sub"), os.path.join(tree, "sub.real"), os.path.join(own, "sub.link")
def hold(n):
    for _ in range(n):
        pass
while True:
    try:
        os.symlink(outside, link)
        os.rename(sub, real)
        os.rename(link, sub)
        hold(3000)
        os.rename(sub, link)
        os.rename(real, sub)
        os.unlink(link)
        hold(300)
    except OSError:
        for p in (link,):
            try: os.unlink(p)
            except OSError: pass
        if not os.path.isdir(sub) or os.path.islink(sub):
            try: os.unlink(sub)
            except OSError: pass
            try: os.rename(real, sub)
            except OSError: pass
"""

NAMES = ("rootshell", "pipe", "sda", "out", "shared")


def outside_dir(tmp_path):
    """What a root scrub following the swapped symlink would hit: a setuid-root binary, files named as
    the tree's foreign entries, and a directory of mode 0755 (a setgid 'shared' in the tree)."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "rootshell").write_bytes(b"#!/bin/sh\nexec /bin/sh -p\n")
    os.chmod(out / "rootshell", 0o4755)
    for name in ("pipe", "sda", "out"):
        (out / name).write_text(f"{name} outside\n")
        os.chmod(out / name, 0o644)
    (out / "shared").mkdir()
    os.chmod(out / "shared", 0o755)
    return out


def snapshot(out):
    """{name: (mode, content)} of the outside directory: what must not change."""
    seen = {}
    for name in sorted(os.listdir(out)):
        st = os.lstat(out / name)
        seen[name] = (st.st_mode, st.st_ino, (out / name).read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return seen


def plant(dfd, outside):
    """The foreign entries, planted through the real subdirectory's descriptor wherever it now is."""
    for name in NAMES:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if name == "shared":
                os.chmod(name, 0o2775, dir_fd=dfd)
            continue
        if name == "rootshell":
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755, dir_fd=dfd)
            os.write(fd, b"#!/bin/sh\n")
            os.fchmod(fd, 0o4755)
            os.close(fd)
        elif name == "pipe":
            os.mkfifo(name, dir_fd=dfd)
        elif name == "sda":
            os.mknod(name, 0o666 | stat.S_IFBLK, os.makedev(8, 0), dir_fd=dfd)
        elif name == "out":
            os.symlink(str(outside), name, dir_fd=dfd)
        else:
            os.mkdir(name, dir_fd=dfd)
            os.chmod(name, 0o2775, dir_fd=dfd)


def run_scrub(argv):
    """sfl_files.main's exit code; an exception a path-based scrub raises mid-race counts as a failed run."""
    try:
        return sfl_files.main(argv)
    except (OSError, SystemExit) as e:
        return getattr(e, "code", 1) or 1


@needs_root
def test_a_directory_swapped_for_a_symlink_while_scrubbed_changes_nothing_outside(tmp_path, capsys):
    outside = outside_dir(tmp_path)
    before = snapshot(outside)
    tree = tmp_path / "0123456789ab"
    (tree / "sub").mkdir(parents=True)
    (tree / "honest.bin").write_bytes(b"\0" * 64)
    dfd = os.open(tree / "sub", os.O_RDONLY | os.O_DIRECTORY)
    (tmp_path / "flipper").mkdir()
    flipper = subprocess.Popen([sys.executable, "-c", FLIPPER, str(tree), str(outside), str(tmp_path / "flipper")])
    rounds, swapped, linked, dropped = 0, 0, 0, 0
    try:
        # Until the scrub has met the flipper's symlink a few times and run 100 rounds (a few seconds
        # here, the CPUs shared with other work), for at most 30 s.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (rounds < 100 or linked + swapped < 3):
            plant(dfd, outside)
            run_scrub(["scrub", "--dry-run", str(tree)])
            run_scrub(["scrub", str(tree)])
            printed = capsys.readouterr().out
            swapped += printed.count(sfl_files.SWAPPED)
            linked += sum(1 for line in printed.splitlines() if line == f"symlink to {outside} (resolves to {outside}, outside the tree)\tsub")
            dropped += sum(1 for line in printed.splitlines() if line.endswith("\tsub/rootshell"))
            rounds += 1
            assert snapshot(outside) == before, f"round {rounds}: outside changed"
    finally:
        flipper.kill()
        flipper.wait()
        os.close(dfd)
    assert snapshot(outside) == before
    assert stat.S_IMODE(os.lstat(outside / "rootshell").st_mode) == 0o4755
    assert stat.S_IMODE(os.lstat(outside / "shared").st_mode) == 0o755
    # The race was run, not dodged: the scrub met the subdirectory as the flipper's symlink (listed as
    # one, or swapped between its listing and its opening) and still dropped planted entries.
    print(f"race: {rounds} rounds, {linked} symlinks and {swapped} swaps met, {dropped} setuid drops", file=sys.__stderr__)
    assert rounds >= 20 and linked + swapped > 0 and dropped > 0, (rounds, linked, swapped, dropped)


@needs_root
def test_a_swapped_directory_is_named_and_the_scrub_exits_1(tmp_path, capsys, monkeypatch):
    """A directory that is a symlink by the time it is opened (the flipper's move, made deterministic
    here by swapping it between the parent's lstat and the open): named, not entered, exit 1."""
    outside = outside_dir(tmp_path)
    before = snapshot(outside)
    tree = tmp_path / "0123456789ab"
    (tree / "sub").mkdir(parents=True)
    plant(os.open(tree / "sub", os.O_RDONLY | os.O_DIRECTORY), outside)
    real_open = os.open

    def swapping_open(path, flags, *args, **kw):
        if path == "sub" and kw.get("dir_fd") is not None and not os.path.islink(tree / "sub"):
            os.rename(tree / "sub", tree / "sub.real")
            os.symlink(outside, tree / "sub")
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(sfl_files.os, "open", swapping_open)
    assert sfl_files.main(["scrub", str(tree)]) == 1
    monkeypatch.undo()
    out, err = capsys.readouterr()
    assert out == f"{sfl_files.SWAPPED} (now a symlink or not a directory), not entered\tsub\n"
    assert "sub: directory swapped while scrubbed" in err
    assert snapshot(outside) == before
    # Put back, the same directory is scrubbed whole on the next run.
    os.unlink(tree / "sub")
    os.rename(tree / "sub.real", tree / "sub")
    assert sfl_files.main(["scrub", str(tree)]) == 0
    assert sorted(os.listdir(tree / "sub")) == ["shared"] and snapshot(outside) == before


@needs_root
def test_another_inode_at_a_listed_directory_is_not_entered(tmp_path, capsys, monkeypatch):
    tree = tmp_path / "0123456789ab"
    (tree / "sub").mkdir(parents=True)
    os.mkfifo(tree / "sub" / "pipe")
    (tmp_path / "other").mkdir()
    os.mkfifo(tmp_path / "other" / "pipe")
    real_open = os.open

    def swapping_open(path, flags, *args, **kw):
        if path == "sub" and kw.get("dir_fd") is not None and not (tree / "sub.real").exists():
            os.rename(tree / "sub", tree / "sub.real")
            os.rename(tmp_path / "other", tree / "sub")
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(sfl_files.os, "open", swapping_open)
    assert sfl_files.main(["scrub", str(tree)]) == 1
    monkeypatch.undo()
    assert capsys.readouterr().out == f"{sfl_files.SWAPPED} (another directory now), not entered\tsub\n"
    assert os.path.exists(tree / "sub" / "pipe") and os.path.exists(tree / "sub.real" / "pipe")


@needs_root
def test_a_symlinked_root_is_not_entered(tmp_path, capsys):
    (tmp_path / "real").mkdir()
    os.mkfifo(tmp_path / "real" / "pipe")
    os.symlink(tmp_path / "real", tmp_path / "gen")
    assert sfl_files.main(["scrub", str(tmp_path / "gen")]) == 1
    assert capsys.readouterr().out.startswith("not a directory")
    assert os.path.exists(tmp_path / "real" / "pipe")
