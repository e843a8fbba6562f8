"""Where root makes directories and writes files on a node, as POSIX sh commands that never follow a
path a lesser user controls (issue 43 item 5).

- root_only_chain_command: a directory every component of which, from / down, is a real directory
  (no symlink) owned by root and writable by root alone, made component by component when absent
  (mkdir, never -p). A sticky directory on the way (/tmp) is allowed: others cannot rename or remove
  root's entries in it (the next component is checked to be root's). The last one may not be sticky
  and writable by others. What fails names the path and why, exit 1, nothing made past it.
- absent_dir_command: a directory another user owns (Prometheus's data under /var/lib/prometheus,
  itself the prometheus user's) made only when absent: mkdir does not follow a symlink at the path (it
  fails EEXIST), its chown is `chown -h` (a symlink swapped in after the mkdir keeps its own owner
  changed, never its target's); a symlink or a non-directory found there fails naming it, an existing
  directory is left as it is.
- textfile_write_command: a file written whole into a root-only chain (root_only_chain_command
  first): a temporary file made by mktemp (O_CREAT|O_EXCL, mode 0600: coreutils' mktemp(1)) beside
  it, filled, chmod 0644, renamed over the file.
"""
import shlex

from pyinfra.api import FactBase

ROOT_ONLY_REFUSED = "not a root-only directory: refused (root writes only where no other user can swap a path)"


def root_only_chain_command(path: str, mode: str = "0755") -> str:
    """sh: `path` and every directory above it root's alone (module docstring); made when absent."""
    if not path.startswith("/") or "/." in path or "//" in path:
        raise ValueError(f"{path!r}: an absolute, normalised path is needed")
    q = shlex.quote(path)
    # A subshell: IFS and the positional parameters stay the caller's.
    return (
        f"( IFS=/; d=; last={q}; for c in $last; do [ -n \"$c\" ] || continue; d=\"$d/$c\"; "
        f"if [ -L \"$d\" ]; then echo \"sparkfleet: $d is a symlink, {ROOT_ONLY_REFUSED}\" >&2; exit 1; fi; "
        f"[ -e \"$d\" ] || mkdir -m {mode} \"$d\" || exit 1; "
        f"if [ -L \"$d\" ] || [ ! -d \"$d\" ]; then echo \"sparkfleet: $d is not a directory, {ROOT_ONLY_REFUSED}\" >&2; "
        "exit 1; fi; "
        "owner=$(stat -c %u \"$d\") && perms=$(stat -c %a \"$d\") || exit 1; "
        "if [ \"$owner\" != 0 ] || { [ $(( 0$perms & 022 )) -ne 0 ] && "
        "{ [ $(( 0$perms & 01000 )) -eq 0 ] || [ \"$d\" = \"$last\" ]; }; }; then "
        f"echo \"sparkfleet: $d is owned by uid $owner with mode $perms, {ROOT_ONLY_REFUSED}\" >&2; exit 1; fi; "
        "done )"
    )


def absent_dir_command(path: str, user: str, group: str, mode: str = "0755") -> str:
    """sh: `path` made (mode, user:group) only when absent, never through a symlink (module docstring)."""
    q = shlex.quote(path)
    return (
        f"if [ -L {q} ] || {{ [ -e {q} ] && [ ! -d {q} ]; }}; then "
        f"echo \"sparkfleet: {path} is a symlink or not a directory: refused, nothing changed (root never "
        f"follows a path another user controls)\" >&2; false; "
        f"elif [ ! -d {q} ]; then mkdir -m {mode} {q} && chown -h {shlex.quote(f'{user}:{group}')} {q}; fi"
    )


def textfile_write_command(path: str, text: str) -> str:
    """sh: `path` (in a root-only chain, made when absent) holds `text` whole: mktemp beside it, renamed."""
    directory, name = path.rsplit("/", 1)
    return (
        f"{root_only_chain_command(directory)} && "
        f"t=$(mktemp {shlex.quote(f'{directory}/.{name}.XXXXXX')}) && "
        f"{{ printf '%s' {shlex.quote(text)} > \"$t\" && chmod 0644 \"$t\" && mv -f \"$t\" {shlex.quote(path)} "
        "|| { rm -f \"$t\"; false; }; }"
    )


def chain_prefixes(path: str) -> list[str]:
    """'/a/b' -> ['/a', '/a/b']."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


class RootOnlyChain(FactBase):
    """Each directory of a path from / down, as lstat sees it: [(kind, uid, perms, path)], kind one of
    dir, symlink, other, absent (uid and perms: a directory's, else None). Read at prepare; the
    command root_only_chain_command renders checks again at execution."""

    def command(self, path: str) -> str:
        return "; ".join(
            f"if [ -L {q} ]; then echo symlink - - {q}; elif [ -d {q} ]; then echo dir $(stat -c '%u %a' {q}) {q}; "
            f"elif [ -e {q} ]; then echo other - - {q}; else echo absent - - {q}; fi"
            for q in map(shlex.quote, chain_prefixes(path))
        )

    def process(self, output):
        rows = []
        for line in output:
            kind, uid, perms, path = line.split(" ", 3)
            rows.append((kind, None if uid == "-" else int(uid), None if perms == "-" else perms, path))
        return rows


def chain_problem(rows: list, path: str) -> str | None:
    """Why the chain RootOnlyChain read cannot hold root's files (None: it can, or its missing tail can
    be made by root_only_chain_command). The same rules as that command's."""
    for kind, uid, perms, where in rows:
        if kind == "absent":
            return None  # made by root below a root-only chain: nothing past it exists
        if kind != "dir":
            return f"{where} is {'a symlink' if kind == 'symlink' else 'not a directory'}, {ROOT_ONLY_REFUSED}"
        mode = int(perms, 8)
        if uid != 0 or (mode & 0o022 and (not mode & 0o1000 or where == path)):
            return f"{where} is owned by uid {uid} with mode {perms}, {ROOT_ONLY_REFUSED}"
    return None


def chain_complete(rows: list) -> bool:
    """Every directory of the chain is there (nothing to make)."""
    return bool(rows) and all(kind == "dir" for kind, *_ in rows)
