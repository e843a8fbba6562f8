"""Where root makes directories and writes textfile metrics, no path a lesser user planted is followed
(issue 43 item 5): a symlink at every path root writes, into a directory holding a file and a
directory of known owner and mode; after each step nothing there changed, and the step failed naming
the path (or, for a symlink at the file's own name, replaced the link, never its target). Run as
this machine's root, with sh (dash), coreutils' mktemp and stat, and chown to nobody:nogroup."""
import os
import stat
import subprocess

import pytest

from roles.fingerprint import sfl_fingerprint
from sparkfleet.root_paths import (
    RootOnlyChain, absent_dir_command, chain_complete, chain_problem, root_only_chain_command, textfile_write_command,
)
from tests.unit.test_gid_at_start import HCA, IP, NETDEV, SCRIPT, env_text, metrics_run, sysfs, table

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown and root-owned chains need root")
NOBODY = 65534  # nobody:nogroup on Debian and Ubuntu


def outside(tmp_path):
    """What a root write following a planted symlink would change: /etc's stand-in."""
    etc = tmp_path / "etc"
    etc.mkdir(mode=0o755)
    (etc / "passwd").write_text("root:x:0:0\n")
    (etc / "sparkfleet.prom").write_text("not a metric\n")
    (etc / "sub").mkdir(mode=0o755)
    return etc


def snapshot(directory):
    return {name: (st.st_mode, st.st_uid, st.st_gid, st.st_ino, (directory / name).read_bytes() if stat.S_ISREG(st.st_mode) else None)
            for name in sorted(os.listdir(directory)) for st in [os.lstat(directory / name)]} | {
        ".": tuple(getattr(os.lstat(directory), k) for k in ("st_mode", "st_uid", "st_gid"))}


def sh(command):
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)


@needs_root
def test_the_textfile_chain_is_made_component_by_component_root_only(tmp_path):
    target = tmp_path / "var" / "lib" / "sparkfleet" / "textfile"
    done = sh(root_only_chain_command(str(target)))
    assert done.returncode == 0, done.stderr
    for d in (tmp_path / "var", tmp_path / "var/lib", tmp_path / "var/lib/sparkfleet", target):
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755
    assert sh(root_only_chain_command(str(target))).returncode == 0  # a second run: nothing to make, no error
    assert chain_complete(RootOnlyChain().process(sh(RootOnlyChain().command(str(target))).stdout.splitlines()))


@needs_root
@pytest.mark.parametrize("planted", ["var", "var/lib", "var/lib/sparkfleet", "var/lib/sparkfleet/textfile"])
def test_a_symlink_planted_at_any_directory_of_the_chain_stops_every_writer_naming_it(tmp_path, planted):
    etc = outside(tmp_path)
    before = snapshot(etc)
    target = tmp_path / "var/lib/sparkfleet/textfile"
    (tmp_path / planted).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(etc, tmp_path / planted)
    where = str(tmp_path / planted)
    # the fact read at prepare: the deploy stops before any host is touched, naming the link
    rows = RootOnlyChain().process(sh(RootOnlyChain().command(str(target))).stdout.splitlines())
    assert chain_problem(rows, str(target)) == (f"{where} is a symlink, not a root-only directory: refused (root "
                                                "writes only where no other user can swap a path)")
    # the command the deploy runs (and checks again at execution)
    made = sh(root_only_chain_command(str(target)))
    assert made.returncode == 1 and f"sparkfleet: {where} is a symlink, not a root-only directory" in made.stderr
    # the receipt's and the fabric speed's metrics
    wrote = sh(textfile_write_command(f"{target}/sparkfleet.prom", "sparkfleet_x 1\n"))
    assert wrote.returncode == 1 and f"{where} is a symlink" in wrote.stderr
    # the fingerprint's timer
    with pytest.raises(OSError, match=f"{where} is a symlink or not a directory, not a root-only directory"):
        sfl_fingerprint.write_textfile(f"{target}/sparkfleet-fingerprint.prom", "sparkfleet_fingerprint_info 1\n")
    # the GID index at a serving start: the metric is not written, the start goes on
    env = tmp_path / "rank.env"
    env.write_text(env_text(3))
    gid = metrics_run(sysfs(tmp_path / "sys", table(3)), HCA, IP, NETDEV, str(env), textfile_dir=target)
    assert gid.returncode == 0 and f"sparkfleet: {where} is a symlink" in gid.stderr
    assert f"could not write {target}/sparkfleet-gid-start-{HCA}.prom" in gid.stderr
    assert snapshot(etc) == before


@needs_root
def test_another_users_or_a_writable_directory_on_the_way_is_refused(tmp_path):
    target = tmp_path / "var/lib/prometheus/textfile"
    target.mkdir(parents=True)
    os.chown(tmp_path / "var/lib/prometheus", NOBODY, NOBODY)  # as the package's postinst leaves it
    made = sh(root_only_chain_command(str(target)))
    assert made.returncode == 1
    assert f"sparkfleet: {tmp_path}/var/lib/prometheus is owned by uid {NOBODY} with mode 755" in made.stderr
    rows = RootOnlyChain().process(sh(RootOnlyChain().command(str(target))).stdout.splitlines())
    assert chain_problem(rows, str(target)).startswith(f"{tmp_path}/var/lib/prometheus is owned by uid {NOBODY}")
    os.chown(tmp_path / "var/lib/prometheus", 0, 0)
    os.chmod(target, 0o1777)  # sticky on the way is allowed (as /tmp); the textfile directory itself may not be
    assert "with mode 1777" in sh(root_only_chain_command(str(target))).stderr
    assert chain_problem(RootOnlyChain().process(sh(RootOnlyChain().command(str(target))).stdout.splitlines()),
                         str(target)).endswith("root-only directory: refused (root writes only where no other user can swap a path)")
    os.chmod(target, 0o755)
    assert sh(root_only_chain_command(str(target))).returncode == 0


@needs_root
def test_a_symlink_at_the_metrics_own_name_is_replaced_never_followed(tmp_path):
    etc = outside(tmp_path)
    before = snapshot(etc)
    target = tmp_path / "textfile"
    target.mkdir()
    os.symlink(etc / "sparkfleet.prom", target / "sparkfleet-receipt.prom")
    os.symlink(etc / "passwd", target / "sparkfleet-fingerprint.prom")
    assert sh(textfile_write_command(f"{target}/sparkfleet-receipt.prom", "sparkfleet_receipt 1\n")).returncode == 0
    sfl_fingerprint.write_textfile(f"{target}/sparkfleet-fingerprint.prom", "sparkfleet_fingerprint_info 1\n")
    assert (target / "sparkfleet-receipt.prom").read_text() == "sparkfleet_receipt 1\n"
    assert (target / "sparkfleet-fingerprint.prom").read_text() == "sparkfleet_fingerprint_info 1\n"
    for name in ("sparkfleet-receipt.prom", "sparkfleet-fingerprint.prom"):
        st = os.lstat(target / name)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
    assert sorted(os.listdir(target)) == ["sparkfleet-fingerprint.prom", "sparkfleet-receipt.prom"]  # no temporary left
    assert snapshot(etc) == before


@needs_root
def test_prometheus_data_is_made_only_when_absent_and_never_through_a_symlink(tmp_path):
    etc = outside(tmp_path)
    before = snapshot(etc)
    data = tmp_path / "metrics2"
    # absent: made, given to the service's user
    assert sh(absent_dir_command(str(data), "nobody", "nogroup")).returncode == 0
    st = os.lstat(data)
    assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid) == (NOBODY, NOBODY) and stat.S_IMODE(st.st_mode) == 0o755
    # there: left as it is (a second deploy changes nothing)
    os.chmod(data, 0o700)
    assert sh(absent_dir_command(str(data), "nobody", "nogroup")).returncode == 0
    assert stat.S_IMODE(os.lstat(data).st_mode) == 0o700
    # the user swaps it for a symlink to /etc: the step fails naming it, /etc keeps its owner
    os.rename(data, tmp_path / "moved")
    os.symlink(etc, data)
    failed = sh(absent_dir_command(str(data), "nobody", "nogroup"))
    assert failed.returncode == 1 and f"sparkfleet: {data} is a symlink or not a directory: refused" in failed.stderr
    os.unlink(data)
    data.write_text("")
    assert sh(absent_dir_command(str(data), "nobody", "nogroup")).returncode == 1
    assert snapshot(etc) == before


@needs_root
def test_the_old_forms_did_follow_the_planted_links(tmp_path):
    """What the fix is against, shown on the same tree: `install -d -o` chowns a symlink's target, and
    the GID script's fixed temporary name `.NAME.$$` is written through a link planted at it."""
    etc = outside(tmp_path)
    os.symlink(etc / "sub", tmp_path / "metrics2")
    assert sh(f"install -d -o nobody -g nogroup {tmp_path}/metrics2").returncode == 0
    assert os.lstat(etc / "sub").st_uid == NOBODY
    assert "mktemp" in SCRIPT.read_text() and ".$3.$$" not in SCRIPT.read_text()
