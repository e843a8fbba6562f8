"""files.put, files.directory and systemd.service that need no round trip when nothing changed.

pyinfra's operations read their own facts while they run, one operation after the other: a
files.put is three SSH round trips per host (the file, its directory, its sha1), a systemd.service
two. On a converged pair that was most of a no-op re-deploy. Each wrapper here declares pyinfra's
own operation with the same arguments and one more `_if`: the operation runs as always (reading
its facts, judging for itself) unless one fact, gathered once per host for every wrapped operation
of the deploy, shows its target already as declared; then it is skipped, reports "No changes" and
did_change() is False, as pyinfra's own verdict would be.

That fact is taken when the first wrapped operation of a host is about to run, and taken again
whenever an operation on any host changed something or failed since (any of them may have touched
a target), so a target is never judged from a stale reading. Only what pyinfra itself compares is
compared: content (sha1), owner, group and mode of a regular file; owner, group and mode of a
directory; a unit's running and enabled state as pyinfra's systemd facts read them. Anything else
(a src that is not text or a local file, restarts, reloads, other arguments) leaves the operation
to pyinfra.
"""
from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path

from pyinfra.api import FactBase
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import files, systemd
from pyinfra.operations.util.files import ensure_mode_int


UNIT_SUFFIXES = (".service", ".socket", ".device", ".mount", ".automount", ".swap", ".target", ".path", ".timer",
                 ".slice", ".scope")


class ManagedTargets(FactBase):
    """Owner, group, mode and sha1 of files; owner, group and mode of directories; units' SubState and
    UnitFileState: everything the wrapped operations of one host compare, in one round trip.

    One stat for the files, one sha1sum for those that are regular files (not symlinks), one stat for
    the directories: a loop that ran stat, sha1sum and cut (each in a subshell) per path forked about
    five processes a path, a few hundred on a host, in the first operation of every run and again after
    each change. The declared paths are listed first (printf, a builtin), so one that stat cannot read
    is there too, as absent."""

    def command(self, files: tuple = (), dirs: tuple = (), units: tuple = ()) -> str:
        lines = []
        if files:
            quoted = " ".join(shlex.quote(p) for p in files)
            lines += [
                f"printf 'file? %s\\n' {quoted}",
                f"LC_ALL=C stat -c 'file %F|%U|%G|%a|%n' -- {quoted} 2>/dev/null",  # %F in English: regular file...
                # sha1sum follows a symlink and reads a FIFO forever: only regular files, as pyinfra hashes
                f"set --; for p in {quoted}; do if [ -f \"$p\" ] && [ ! -L \"$p\" ]; then set -- \"$@\" \"$p\"; fi; "
                f"done; if [ $# -gt 0 ]; then sha1sum -- \"$@\" 2>/dev/null; fi",
            ]
        if dirs:
            quoted = " ".join(shlex.quote(p) for p in dirs)
            lines += [f"printf 'dir? %s\\n' {quoted}", f"LC_ALL=C stat -c 'dir %F|%U|%G|%a|%n' -- {quoted} 2>/dev/null"]
        if units:
            lines.append(
                "systemctl show --all --property Id --property SubState --property UnitFileState "
                f"{' '.join(shlex.quote(u) for u in units)} 2>/dev/null"
            )
        lines.append("true")  # a path stat cannot read, a unit systemctl does not know: answers, not errors
        return "\n".join(lines)

    def process(self, output):
        return parse_targets(list(output))


SHA1_LINE = re.compile(r"^([0-9a-f]{40})  (.+)$")  # sha1sum's; a name it had to escape starts with "\\"


def parse_targets(lines: list[str]) -> dict:
    """A declared path (`file? ` / `dir? `) is None unless stat found it of its kind (a regular file,
    not a symlink, with its sha1; a directory, not a symlink)."""
    out: dict = {"files": {}, "dirs": {}, "units": {}}
    stats: dict = {"files": {}, "dirs": {}}
    sha1s: dict = {}
    unit = None
    for line in lines:
        if line.startswith("file? "):
            out["files"][line[6:]] = None
        elif line.startswith("dir? "):
            out["dirs"][line[5:]] = None
        elif line.startswith(("file ", "dir ")):
            kind, rest = line.split(" ", 1)
            parts = rest.split("|", 4)
            if len(parts) == 5:
                stats["files" if kind == "file" else "dirs"][parts[4]] = parts[:4]
        elif hashed := SHA1_LINE.match(line):
            sha1, path = hashed.groups()
            sha1s[path] = sha1
        elif line.startswith("Id="):
            unit = line[3:].strip()
            out["units"].setdefault(unit, {})
        elif unit and "=" in line:
            key, value = line.split("=", 1)
            out["units"][unit][key] = value.strip()
        elif not line.strip():
            unit = None
    for path in out["files"]:
        kind, user, group, mode = stats["files"].get(path) or ("-",) * 4
        if kind.startswith("regular") and path in sha1s:  # "regular file", "regular empty file"
            out["files"][path] = {"user": user, "group": group, "mode": mode, "sha1": sha1s[path]}
    for path in out["dirs"]:
        kind, user, group, mode = stats["dirs"].get(path) or ("-",) * 4
        if kind == "directory":
            out["dirs"][path] = {"user": user, "group": group, "mode": mode}
    return out


@dataclass
class _Host:
    files: dict = field(default_factory=dict)  # path -> a check of its reading
    dirs: dict = field(default_factory=dict)
    units: dict = field(default_factory=dict)
    reading: dict | None = None
    taken_at: int = -1  # the changes() count when `reading` was taken


def _registry(pyinfra_state) -> dict[str, _Host]:
    return pyinfra_state.__dict__.setdefault("_sparkfleet_unchanged", {})


def changes(pyinfra_state) -> int:
    """Operations, on any host, that have run and changed something or failed."""
    count = 0
    for ops in pyinfra_state.ops.values():
        for op_data in ops.values():
            meta = op_data.operation_meta
            if meta.is_complete() and (not meta.did_succeed() or meta.did_change()):
                count += 1
    return count


def _reading(pyinfra_state, pyinfra_host) -> dict:
    entry = _registry(pyinfra_state)[pyinfra_host.name]
    now = changes(pyinfra_state)
    if entry.reading is None or entry.taken_at != now:
        entry.reading = pyinfra_host.get_fact(
            ManagedTargets, files=tuple(entry.files), dirs=tuple(entry.dirs), units=tuple(entry.units))
        entry.taken_at = now
    return entry.reading


def _unless_unchanged(kind: str, key: str, same, _if) -> dict:
    """The operation's `_if`: its own condition first (when false, nothing is read), then the target."""
    pyinfra_state, pyinfra_host = ctx_state.get(), ctx_host.get()
    getattr(_registry(pyinfra_state).setdefault(pyinfra_host.name, _Host()), kind)[key] = same

    def differs() -> bool:
        reading = _reading(pyinfra_state, pyinfra_host) or {}  # no reading: unknown, pyinfra judges
        return not same(reading.get(kind, {}).get(key))

    return {"_if": [*(_if if isinstance(_if, list) else [_if] if _if is not None else []), differs]}


def _as_given(_if) -> dict:
    return {} if _if is None else {"_if": _if}


def _content(src) -> bytes | None:
    if isinstance(src, StringIO):
        return src.getvalue().encode()
    if isinstance(src, str) and Path(src).is_absolute() and Path(src).is_file():
        return Path(src).read_bytes()
    return None


def _owner_mode_match(found: dict, user, group, mode) -> bool:
    return ((not user or found["user"] == user) and (not group or found["group"] == group)
            and (not mode or (found["mode"].isdigit() and int(found["mode"]) == ensure_mode_int(mode))))


def put(*, src, dest: str, user=None, group=None, mode=None, _if=None, **kwargs):
    """files.put, skipped when `dest` already has src's content, owner, group and mode."""
    content = _content(src)
    if content is None or set(kwargs) - {"name", "create_remote_dir"}:  # create_remote_dir: only for a new file
        return files.put(src=src, dest=dest, user=user, group=group, mode=mode, **_as_given(_if), **kwargs)
    sha1 = hashlib.sha1(content).hexdigest()

    def same(found) -> bool:
        return bool(found) and found["sha1"] == sha1 and _owner_mode_match(found, user, group, mode)

    return files.put(src=src, dest=dest, user=user, group=group, mode=mode,
                     **_unless_unchanged("files", dest, same, _if), **kwargs)


def directory(*, path: str, user=None, group=None, mode=None, _if=None, **kwargs):
    """files.directory (present, not recursive), skipped when `path` is already a directory as declared."""
    if set(kwargs) - {"name"}:
        return files.directory(path=path, user=user, group=group, mode=mode, **_as_given(_if), **kwargs)

    def same(found) -> bool:
        return bool(found) and _owner_mode_match(found, user, group, mode)

    return files.directory(path=path, user=user, group=group, mode=mode,
                           **_unless_unchanged("dirs", path, same, _if), **kwargs)


def service(*, service: str, running=True, enabled=None, _if=None, **kwargs):
    """systemd.service that only starts/stops and enables/disables, skipped when the unit already is as
    declared (pyinfra's SystemdStatus and SystemdEnabled verdicts, read in the one fact)."""
    if set(kwargs) - {"name"}:  # restarted, reloaded, command, daemon_reload, ...: pyinfra's call
        return systemd.service(service=service, running=running, enabled=enabled, **_as_given(_if), **kwargs)
    unit = service if service.endswith(UNIT_SUFFIXES) else f"{service}.service"  # as pyinfra names it

    def same(found) -> bool:
        if not found:
            return False
        is_running = found.get(SystemdStatus.state_key) in SystemdStatus.state_values
        is_enabled = found.get(SystemdEnabled.state_key) in SystemdEnabled.state_values
        return (running is None or running == is_running) and (enabled is None or enabled == is_enabled)

    return systemd.service(service=service, running=running, enabled=enabled,
                           **_unless_unchanged("units", unit, same, _if), **kwargs)
