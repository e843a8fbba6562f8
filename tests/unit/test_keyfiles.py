"""sparkfleet/keyfiles.py's shell, run for real here (as root, as the deploy reads a node, and as an
unprivileged user): a key file that does not exist is the only `missing`; one that cannot be read
is `unreadable` with the error, never taken for missing; a written or generated key file is
root-only from its first byte and holds exactly the bytes given; the key is in no answer but the
read's own."""
import os
import stat
import subprocess
import threading
import time

import pytest

from sparkfleet import keyfiles

PATTERN = "[A-Za-z0-9._~+/=-]{16,512}"
KEY = "k3y-0123456789abcdef-0123456789"
NOBODY = "65534"


def sh(command: str, user: str | None = None, stdin: str | None = None):
    argv = ["sh", "-c", command]
    if user:
        argv = ["setpriv", "--reuid", user, "--regid", user, "--clear-groups", *argv]  # (numeric ids)
    return subprocess.run(argv, capture_output=True, text=True, input=stdin, timeout=30)


def state(path, user=None) -> str:
    done = sh(keyfiles.state_command(str(path), PATTERN) + keyfiles.state_end(), user)
    assert done.returncode == 0, done.stderr
    assert KEY not in done.stdout + done.stderr
    return done.stdout.strip()


def read(path, user=None) -> bytes | None:
    done = sh(keyfiles.read_command(str(path)), user)
    return keyfiles.interpret_read("node-a", str(path), done.returncode == 0, done.stdout, done.stderr)


@pytest.fixture
def keydir(tmp_path):
    d = tmp_path / "etc"
    d.mkdir(mode=0o700)
    tmp_path.chmod(0o755)
    return d


def test_missing_is_only_a_path_with_nothing_at_it(keydir):
    assert state(keydir / "api-key") == "missing" and read(keydir / "api-key") is None
    assert state(keydir / "no" / "such" / "dir" / "api-key") == "missing"


def test_a_key_file_that_cannot_be_read_is_unreadable_with_the_error_never_missing(keydir):
    (keydir / "a-directory").mkdir()
    assert state(keydir / "a-directory") == "unreadable it is a directory, not a regular file"
    (keydir / "dangling").symlink_to(keydir / "gone")
    assert state(keydir / "dangling").startswith("unreadable ") and "No such file" in state(keydir / "dangling")
    key = keydir / "api-key"
    key.write_text(KEY)
    key.chmod(0o600)
    assert state(key) == "ok" and read(key) == KEY.encode()
    # An unprivileged reader (a non-root ssh_user without sudo) cannot even see into the directory:
    # stat says Permission denied, which is not "missing" (the deploy would generate a new fleet key).
    found = state(key, user=NOBODY)
    assert found.startswith("unreadable stat: ") and found.endswith("Permission denied"), found
    assert state(keydir / "absent", user=NOBODY).startswith("unreadable ")
    for path in (key, keydir / "a-directory", keydir / "dangling"):
        with pytest.raises(keyfiles.KeyFileError) as err:
            read(path, user=NOBODY if path == key else None)
        assert str(err.value).startswith(f"node-a: {path} exists but cannot be read: ") and KEY not in str(err.value)
    with pytest.raises(keyfiles.KeyFileError, match="Permission denied"):
        read(keydir / "absent", user=NOBODY)


def test_the_states_refused_name_the_host_the_path_and_the_error():
    why = keyfiles.problem("spark-a", "serving_api_key_file", "/etc/k", "unreadable cat: /etc/k: Input/output error",
                           "x")
    assert why.startswith("spark-a: serving_api_key_file /etc/k exists but cannot be read: cat: /etc/k: Input/output "
                          "error.") and "Nothing was changed" in why
    assert "owned by sfl with mode 644" in keyfiles.problem("spark-a", "k", "/etc/k", "owner sfl 644", "x")
    assert keyfiles.problem("spark-a", "k", "/etc/k", "format", "one line") == (
        "spark-a: k /etc/k must hold one line of one line. Nothing was changed.")
    for fine in ("ok", "missing", "stale"):
        assert keyfiles.problem("spark-a", "k", "/etc/k", fine, "x") is None


def test_a_key_file_mode_and_owner_other_than_root_only_is_refused(keydir):
    key = keydir / "api-key"
    key.write_text(KEY)
    key.chmod(0o640)
    assert state(key) == "owner root 640"
    key.chmod(0o600)
    key.write_text(KEY + "\nsecond line")
    assert state(key) == "format"


def watch_modes(path, stop: threading.Event, seen: list):
    """Every mode `path` (and path.new) is seen with while written, polled every 0.1 ms (for 20 s at most)."""
    deadline = time.monotonic() + 20
    while not stop.is_set() and time.monotonic() < deadline:
        for p in (path, path.with_name(path.name + ".new")):
            try:
                found = os.stat(p)
                seen.append((p.name, stat.S_IMODE(found.st_mode), found.st_size))
            except FileNotFoundError:
                pass
        time.sleep(0.0001)


@pytest.mark.parametrize("existing", [None, 0o644])
def test_a_written_key_is_root_only_from_its_first_byte_and_exactly_the_bytes_given(keydir, existing):
    key = keydir / "api-key"
    if existing is not None:  # a leftover temporary file of another mode is not reused
        leftover = keydir / "api-key.new"
        leftover.write_text("old")
        leftover.chmod(existing)
    content = (KEY * 4000).encode()  # large enough for the watcher to see it being written
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=watch_modes, args=(key, stop, seen))
    watcher.start()
    try:
        done = sh(keyfiles.write_command(str(key)), stdin=keyfiles.base64.b64encode(content).decode() + "\n")
    finally:
        time.sleep(0.05)
        stop.set()
        watcher.join()
    assert done.returncode == 0, done.stderr
    assert key.read_bytes() == content and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert not (keydir / "api-key.new").exists()
    written = [(name, mode) for name, mode, size in seen if size > 0 and (name, mode) != ("api-key.new", existing)]
    assert written and {mode for _, mode in written} == {0o600}, seen[:20]


def test_a_generated_key_is_root_only_64_hex_digits_and_never_replaces_a_file_there(keydir):
    key = keydir / "router-control-key"
    assert sh(keyfiles.generate_command(str(key))).returncode == 0
    first = key.read_text()
    assert len(first) == 64 and int(first, 16) >= 0 and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert state(key) == "ok"
    assert sh(keyfiles.generate_command(str(key))).returncode == 0 and key.read_text() == first
    (keydir / "a-directory").mkdir()
    assert sh(keyfiles.generate_command(str(keydir / "a-directory"))).returncode == 0
    assert (keydir / "a-directory").is_dir() and not list((keydir / "a-directory").iterdir())


class LocalHost:
    """A pyinfra Host as keyfiles.read/write use it: commands run here, stdin handed over as pyinfra does."""

    name = "node-a"

    def run_shell_command(self, command, _stdin=None, **arguments):
        from pyinfra.connectors.util import CommandOutput, OutputLine

        text = None
        if _stdin is not None:  # pyinfra's write_stdin: each line ends with a newline
            text = _stdin if _stdin.endswith("\n") else _stdin + "\n"
        done = sh(command.get_raw_value(), stdin=text)
        lines = [OutputLine("stdout", line) for line in done.stdout.splitlines()]
        lines += [OutputLine("stderr", line) for line in done.stderr.splitlines()]
        return done.returncode == 0, CommandOutput(lines)


def test_write_then_read_round_trips_the_exact_bytes_with_no_newline_added(keydir, monkeypatch):
    monkeypatch.setattr(keyfiles, "connector_arguments", lambda host: {})
    host, key = LocalHost(), keydir / "api-key"
    for content in (KEY.encode(), (KEY + "\n").encode()):
        keyfiles.write(host, str(key), content)
        assert key.read_bytes() == content and keyfiles.read(host, str(key)) == content
    assert keyfiles.read(host, str(keydir / "absent")) is None
    (keydir / "a-directory").mkdir()
    with pytest.raises(keyfiles.KeyFileError, match="node-a: .*a-directory exists but cannot be read: it is a directory"):
        keyfiles.read(host, str(keydir / "a-directory"))
    with pytest.raises(keyfiles.KeyFileError, match="could not write"):
        keyfiles.write(host, str(keydir / "a-directory"), b"x" * 16)


def test_a_hosts_own_sudo_settings_reach_the_direct_commands():
    from pyinfra.api import Config, Inventory, State

    inventory = Inventory((["node-a"], {}), override_data={"_sudo": True, "_sudo_user": "root"})
    state_ = State(inventory, Config())
    host = inventory.get_host("node-a")
    host.state = state_
    args = keyfiles.connector_arguments(host)
    assert args["_sudo"] is True and args["_sudo_user"] == "root"
    assert "_stdin" not in args and "_success_exit_codes" not in args


def test_a_key_written_for_a_daemon_s_group_is_that_group_s_with_the_mode_asked_and_the_exact_bytes(keydir):
    """roles/monitoring's secrets: root:prometheus 0640 (here the group nogroup, 65534), the bytes as given."""
    key = keydir / "secrets" / "ops.webhook_configs.0.url_file"
    content = b"https://hooks.example/services/T0/B0/" + KEY.encode()
    done = sh(keyfiles.write_command(str(key), group=NOBODY, mode="0640"),
              stdin=keyfiles.base64.b64encode(content).decode() + "\n")
    assert done.returncode == 0, done.stderr
    info = key.stat()
    assert key.read_bytes() == content and (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 65534, 0o640)
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700  # a directory it made: umask 077
    assert KEY not in keyfiles.write_command(str(key), group=NOBODY, mode="0640")
