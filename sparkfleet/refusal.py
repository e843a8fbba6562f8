"""Expected refusals and how they are printed: one block, never a Python traceback.

A refusal is an input sparkfleet will not act on (bad data, a profile that does not load) or a
check that failed (a guard, the fabric proof, recipe drift). Each is raised as `Refusal` (or
pyinfra's own `DeployError`, which sparkfleet's roles raise and treats the same way) and printed
by `block()`: the host, the key or file (with its line), the value found, what is allowed and what
to do. Anything else raised is a bug and keeps its traceback.

A `Problem` is one line of a refusal. It is a `str` (what the problem says, beginning with the
host names), so code and tests that treat problems as text keep working, and it carries what the
block needs besides: the hosts and key it is about, where the value came from, what to do.
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

from pyinfra.api.exceptions import DeployError


class Problem(str):
    """One refused input: `"<hosts>: <detail>"`, plus the hosts, key, sources and fix it is about."""

    hosts: tuple[str, ...]
    detail: str
    key: str | None
    sources: tuple[str, ...]
    fix: str | None

    def __new__(cls, detail: str, hosts: Iterable[str] = (), key: str | None = None,
                sources: Iterable[str] = (), fix: str | None = None) -> "Problem":
        hosts = tuple(hosts)
        obj = super().__new__(cls, f"{', '.join(hosts)}: {detail}" if hosts else detail)
        obj.hosts, obj.detail, obj.key, obj.sources, obj.fix = hosts, detail, key, tuple(sources), fix
        return obj

    def replace(self, **changes) -> "Problem":
        fields = {"detail": self.detail, "hosts": self.hosts, "key": self.key, "sources": self.sources, "fix": self.fix}
        return Problem(**{**fields, **changes})

    def __reduce__(self):
        return (Problem, (self.detail, self.hosts, self.key, self.sources, self.fix))


_KEY = re.compile(r"\bkey '([A-Za-z_][A-Za-z0-9_]*)'")


def as_problem(text: str, host_names: Sequence[str] = ()) -> Problem:
    """A problem line written as text elsewhere ("spark-a, spark-b: key 'x' = 1: ..."), as a Problem:
    the leading host names (those of `host_names`) and the first key it names are picked out."""
    if isinstance(text, Problem):
        return text
    hosts: tuple[str, ...] = ()
    detail = text
    head, sep, rest = text.partition(": ")
    if sep and host_names:
        names = tuple(n.strip() for n in head.split(","))
        if names and all(n in host_names for n in names):
            hosts, detail = names, rest
    m = _KEY.search(detail)
    return Problem(detail, hosts, key=m[1] if m else None)


def merge_hosts(problems: Iterable[Problem]) -> list[Problem]:
    """Problems that differ only by host (the same wrong value from one group file or --data on
    every node) as one line naming every host, in first-seen order."""
    merged: dict[tuple, Problem] = {}
    for p in problems:
        ident = (p.detail, p.key, p.sources, p.fix)
        if ident in merged and p.hosts:
            seen = merged[ident]
            merged[ident] = seen.replace(hosts=seen.hosts + tuple(h for h in p.hosts if h not in seen.hosts))
        else:
            merged[ident if p.hosts else (ident, len(merged))] = p
    return list(merged.values())


class Refusal(DeployError):
    """An expected refusal: printed as one block (`block()`), never with a traceback.

    A subclass of pyinfra's DeployError, so pyinfra counts it as an expected error and code that
    catches DeployError (the doctor) catches it too.
    """

    def __init__(self, title: str, problems: Sequence[str] = (), footer: str | None = None):
        self.title = title
        self.problems = list(problems)
        self.footer = footer
        super().__init__(self.block())

    def block(self) -> str:
        return block(self.title, self.problems, self.footer)


def _problem_lines(p: str) -> list[str]:
    lines = [f"  - {p}"]
    if isinstance(p, Problem):
        if p.sources:
            lines.append(f"      from: {'; '.join(p.sources)}")
        if p.fix:
            lines.append(f"      do:   {p.fix}")
    return lines


def block(title: str, problems: Sequence[str] = (), footer: str | None = None) -> str:
    lines = [f"sparkfleet: {title}"]
    for p in problems:
        lines += _problem_lines(p)
    if footer:
        lines.append(footer)
    return "\n".join(lines)


def refusal_block(err: BaseException, host: str | None = None) -> str:
    """The block for any expected refusal: a Refusal's own, or a DeployError's text under a title."""
    if isinstance(err, Refusal):
        return err.block()
    text = str(err).strip()
    title, _, rest = text.partition("\n")
    prefix = f"{host}: " if host and not title.startswith(f"{host}:") else ""
    return block(f"{prefix}{title}") + (f"\n{rest}" if rest else "")


def is_expected(err: BaseException) -> bool:
    return isinstance(err, DeployError)


def shared_key_problems(nodes, keys: Iterable[str], why: str) -> list[Problem]:
    """One problem per key whose value differs between `nodes` that must share it, saying `why`."""
    problems: list[Problem] = []
    names = [n.name for n in nodes]
    for key in keys:
        if len({repr(getattr(n, key)) for n in nodes}) > 1:
            found = ", ".join(f"{n.name}={getattr(n, key)!r}" for n in nodes)
            problems.append(Problem(f"key '{key}' differs between nodes ({found}); {why}", names, key=key,
                                    fix="set it once for every node (group_data)"))
    return problems
