"""Root-only key files on a node: judged from one shell reading, read into the controller's memory,
written and generated, with the key never on a command line, in a fact, a diff or a log.

A key file that does not exist and one that cannot be read are different answers: only `missing`
lets a deploy generate a key; a file that exists but cannot be read (a directory or a dangling
symlink at its path, an I/O error, an NFS share that squashes root) stops the deploy naming the
host, the path and the error (`problem`). A non-root ssh_user without sudo is refused before any
connection (sparkfleet/config.py), so every reading here is root's.

Writing never goes through files.put: with `--diff`, pyinfra's files.put prints the content it
uploads, and the current content too (read as a FileContents fact), and it uploads before it sets
the mode. `write` hands the content to a shell on its stdin (pyinfra's `_stdin`, which pyinfra logs
nowhere), under umask 077: the file is root-only from its first byte, then renamed into place.
"""
from __future__ import annotations

import base64
import shlex

from pyinfra.api import StringCommand

# read_command's answer on stdout when nothing is at the path: '-' is in no base64 text.
MISSING = "-missing-"
# stat's message for ENOENT; LC_ALL=C keeps it this text whatever the node's locale.
_ENOENT = "No such file or directory"


def _stat(k: str) -> str:
    """Shell: sets $e to `<user> <mode> <type>` of the file (following a symlink), or to stat's error
    (then fails); $missing is 1 only when nothing at all is at the path."""
    return (f"missing=0; if ! e=$(LC_ALL=C stat -L -c '%U %a %F' -- {k} 2>&1); then "
            f"case \"$e\" in *'{_ENOENT}'*) [ -L {k} ] || missing=1;; esac; false; fi")


def state_command(path: str, pattern: str) -> str:
    """Shell, one line: missing | unreadable <why> | owner <user> <mode> | format | ok (then, when
    ok, the key is in the shell's $v for whatever the caller appends). Never the key."""
    k = shlex.quote(path)
    return (
        f"if ! {{ {_stat(k)}; }}; then "
        f"if [ $missing = 1 ]; then echo missing; else echo \"unreadable $e\"; fi; "
        f"else set -- $e; u=$1; m=$2; shift 2; "
        f"if [ \"$*\" != 'regular file' ] && [ \"$*\" != 'regular empty file' ]; then "
        f"echo \"unreadable it is a $*, not a regular file\"; "
        f"elif [ \"$u\" != root ] || [ $(( 0$m & 077 )) -ne 0 ]; then echo owner $u $m; "
        f"elif ! v=$(cat -- {k} 2>/dev/null); then echo \"unreadable $(LC_ALL=C cat -- {k} 2>&1 >/dev/null)\"; "
        f"elif [ \"$(printf '%s' \"$v\" | wc -l)\" -ne 0 ] || ! printf '%s' \"$v\" | grep -Eqx '{pattern}'; then "
        f"echo format; "
    )


def state_end() -> str:
    """The end of state_command when the caller adds no judgement of its own."""
    return "else echo ok; fi; fi"


def problem(host: str, what: str, path: str, found: str, pattern_text: str) -> str | None:
    """A refusal for a key file state (state_command's line) the deploy must not use; None when it
    can go on (ok, stale, or missing: the caller decides whether a missing file is generated)."""
    if found.startswith("unreadable"):
        why = found[len("unreadable"):].strip() or "unknown error"
        return (f"{host}: {what} {path} exists but cannot be read: {why}. A key is generated only when the file "
                f"does not exist; fix or remove it. Nothing was changed.")
    if found.startswith("owner"):
        _, user, mode = (found.split() + ["?", "?"])[:3]
        return (f"{host}: {what} {path} is owned by {user} with mode {mode}; it must be root-only "
                f"(chown root {path} && chmod 0600 {path}). Nothing was changed.")
    if found == "format":
        return f"{host}: {what} {path} must hold one line of {pattern_text}. Nothing was changed."
    return None


def generate_command(path: str) -> str:
    """Shell: create `path` with a new key (32 bytes of /dev/urandom, 64 hex digits) unless a file is
    there; root-only from its first byte (umask 077, a fresh temporary file renamed into place)."""
    k = shlex.quote(path)
    return (f"umask 077 && mkdir -p -- \"$(dirname -- {k})\" && {{ [ -e {k} ] || {{ rm -f -- {k}.new && "
            f"od -An -tx1 -N32 /dev/urandom | tr -d ' \\n' > {k}.new && mv -fT -- {k}.new {k}; }}; }}")


def read_command(path: str) -> str:
    """Shell: the file's bytes as base64 on stdout; MISSING when nothing is at the path; a failure
    with the error on stderr when it cannot be read."""
    k = shlex.quote(path)
    return (f"{_stat(k)} && set -- $e && shift 2 && case \"$*\" in 'regular file'|'regular empty file') "
            f"exec base64 -w0 -- {k};; *) echo \"it is a $*, not a regular file\" >&2; exit 4;; esac; "
            f"if [ $missing = 1 ]; then echo {MISSING}; exit 0; fi; echo \"$e\" >&2; exit 4")


def write_command(path: str, group: str = "root", mode: str = "0600") -> str:
    """Shell: stdin (base64: pyinfra ends what it sends with a newline) decoded into `path`, root-only
    before its first byte, then given to `group` with `mode` (a daemon's group that reads it), renamed
    into place."""
    k = shlex.quote(path)
    return (f"set -e; umask 077; mkdir -p -- \"$(dirname -- {k})\"; rm -f -- {k}.new; base64 -d > {k}.new; "
            f"chown root:{shlex.quote(group)} {k}.new; chmod {shlex.quote(mode)} {k}.new; mv -fT -- {k}.new {k}")


class KeyFileError(RuntimeError):
    pass


def connector_arguments(host) -> dict:
    """The host's own sudo/su settings (host data `_sudo`...), as its operations and facts get them:
    a direct run_shell_command gets none by itself."""
    from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments

    arguments, _ = pop_global_arguments(host.state, host, {})
    control = ("_stdin", "_timeout", "_success_exit_codes", "_get_pty", "_chdir", "_env")
    return {k: v for k, v in arguments.items() if k in CONNECTOR_ARGUMENT_KEYS and k not in control}


def interpret_read(host: str, path: str, ok: bool, stdout: str, stderr: str) -> bytes | None:
    """read_command's answer: the bytes, None when the file does not exist; KeyFileError (host, path,
    error; never the content) for anything else."""
    if ok and stdout.strip() == MISSING:
        return None
    if ok:
        try:
            return base64.b64decode(stdout.strip(), validate=True)
        except ValueError:
            raise KeyFileError(f"{host}: {path} could not be read (its content did not arrive whole)") from None
    raise KeyFileError(f"{host}: {path} exists but cannot be read: {stderr.strip()[-300:] or 'no error given'}")


def read(host, path: str) -> bytes | None:
    """The file's bytes from `host` into memory (over the deploy's own connection, as root)."""
    ok, out = host.run_shell_command(StringCommand(read_command(path)), **connector_arguments(host))
    return interpret_read(host.name, path, ok, out.stdout, "\n".join(out.stderr_lines))


def write(host, path: str, content: bytes, group: str = "root", mode: str = "0600") -> None:
    """`content` into `path` on `host`, root-only from the first byte (stdin, never an argument), then
    root:`group` `mode`."""
    ok, out = host.run_shell_command(StringCommand(write_command(path, group, mode)),
                                     _stdin=base64.b64encode(content).decode(),
                                     **connector_arguments(host))
    if not ok:
        error = "\n".join(out.stderr_lines).strip()
        raise KeyFileError(f"{host.name}: could not write {path}: {error[-300:]}")
