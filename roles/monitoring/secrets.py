"""The monitoring stack's secrets: each a root-only file on the controller that data names (a receiver's
`*_file` setting, monitoring_remote_write_password_file or _credentials_file), copied to the monitoring
node's /etc/prometheus/secrets (0640 root:prometheus: the OS's units run Prometheus and Alertmanager as
user prometheus), where the rendered configurations name the copy (sparkfleet/model/monitoring.py
secret_files). The secret is in no data, no rendered file, no fact, no command line and no log: read
on the controller at prepare into memory, compared by sha1 (as roles/router compares the fleet's API
key), written through a shell's stdin (sparkfleet/keyfiles.py write: never files.put, whose `--diff`
prints the content). A controller file that is missing, not a regular file or readable by anyone but
its owner stops the deploy at prepare, naming it, before any host is changed.
"""
from __future__ import annotations

import hashlib
import os
import stat

from pyinfra.api.exceptions import DeployError

from sparkfleet.keyfiles import write
from sparkfleet.model.monitoring import secret_files
from sparkfleet.once import once_per_fleet

GROUP, MODE = "prometheus", "0640"


def controller_file_problem(host: str, what: str, path: str, found: os.stat_result | None | str,
                            uid: int) -> str | None:
    """Why the controller's file `path` (data's `what`) cannot be the secret's source: `found` is its
    os.stat, None when nothing is there, or the error reading it; `uid` the user running the deploy."""
    if found is None:
        # install -D: the named file's directory may not exist yet; -D makes only the missing ones.
        return (f"{host}: {what} names {path}, which does not exist on the controller; create it readable by you "
                f"alone (install -D -m 0600 /dev/stdin {path} < secret.txt). Nothing was changed.")
    if isinstance(found, str):
        return f"{host}: {what} names {path}, which cannot be read on the controller: {found}. Nothing was changed."
    if not stat.S_ISREG(found.st_mode):
        return f"{host}: {what} names {path}, which is not a regular file on the controller. Nothing was changed."
    mode = stat.S_IMODE(found.st_mode)
    if found.st_uid != uid or mode & 0o077:
        return (f"{host}: {what} names {path}, owned by uid {found.st_uid} with mode {mode:04o} on the controller; "
                f"it must be yours (uid {uid}) and readable by you alone (chmod 0600 {path}). Nothing was changed.")
    return None


def _stat(path: str) -> os.stat_result | None | str:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror or str(e)


def read_secrets(node) -> dict[str, bytes]:
    """{path on the monitoring node: the bytes of data's controller file}, or DeployError naming every
    controller file that cannot be used."""
    wanted = secret_files(node)
    problems, found = [], {}
    for dest, (what, source) in sorted(wanted.items()):
        why = controller_file_problem(node.name, what, source, _stat(source), os.getuid())
        if why is None:
            try:
                with open(source, "rb") as f:
                    found[dest] = f.read()
            except OSError as e:
                why = controller_file_problem(node.name, what, source, e.strerror or str(e), os.getuid())
        if why:
            problems.append(why)
    if problems:
        raise DeployError("\n".join(problems))
    return found


def controller_secrets(state, node) -> dict[str, bytes]:
    """read_secrets once per run (the monitoring node's greenlet asks; kept for the write operations)."""
    return once_per_fleet(state, "monitoring-secrets", lambda: read_secrets(node))


def stale(wanted: dict[str, bytes], found: dict) -> list[str]:
    """The copies to (re)write: those whose content, owner, group or mode on the node (ManagedTargets'
    `files` reading: path -> {user, group, mode, sha1} or None) is not the controller's file's."""
    return [path for path, content in sorted(wanted.items())
            if found.get(path) != {"user": "root", "group": GROUP, "mode": MODE.lstrip("0"),
                                   "sha1": hashlib.sha1(content).hexdigest()}]


def write_secret(path: str) -> None:
    """Operation body: the controller's secret for `path` into it, taken from the run's reading here (so it
    is in no operation's arguments), root-only from its first byte, then root:prometheus 0640."""
    from pyinfra import host, state  # the operation's own host and state, at execution

    write(host, path, controller_secrets(state, None)[path], group=GROUP, mode=MODE)
