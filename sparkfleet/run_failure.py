"""A failure during the run's long steps, said so that the operator can act on it: the host, what
was waited for, the log to read (the exact command), the data key that governs the step, and the
next step. The pre-run errors say the same of bad data (sparkfleet/refusal.py: host, key, value,
what to do); these say it of what the run met on a node.

Two forms, one wording:
- `RunFailed`, raised by an operation body (the /health wait, the prewarm, a push or a pull):
  a `Refusal`, so sparkfleet/run.py prints it as one block, never a traceback;
- `failure_line()`, the one line a shell command prints on stderr when it fails on the node
  (sparkfleet/bounded.py prints it for docker build/push/pull, git fetch, the weights fetch and
  every rsync, at their limit and on any other failure).

Every key named must be a key of the config model (sparkfleet/config.py DATA_FIELDS): checked when
the failure is made, so a renamed key fails the unit tests that render each step.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from sparkfleet.refusal import Refusal

LOG_TAIL_LINES = 30  # the log's last lines a failure carries (the log command reads more)


def _check_key(key: str) -> None:
    from sparkfleet.config import DATA_FIELDS  # (sparkfleet.config imports this module's neighbours)

    if key not in DATA_FIELDS:
        raise ValueError(f"run failure names {key!r}, which is not a data key of the config model")


def on_node(address: str, command: str) -> str:
    """`command` as the operator runs it from the machine that deploys: over ssh as root, quoted."""
    return f"ssh root@{address} {shlex.quote(command)}"


def journal(address: str, unit: str, lines: int = 200) -> str:
    """The command that reads the last `lines` of a systemd unit's journal on a node."""
    return on_node(address, f"journalctl -u {unit} -n {int(lines)} --no-pager")


@dataclass(frozen=True)
class Advice:
    """What a failed shell step adds to its own output (sparkfleet/bounded.py): the log to read,
    the data key that governs what the command does (other than its time limit: the registry's
    port, the weights source) and the next step."""

    log: str
    key: str
    next_step: str

    def __post_init__(self):
        _check_key(self.key)


def failure_line(host: str, waited_for: str, what: str, log: str, key: str, next_step: str) -> str:
    """The one line: `sparkfleet: <host>: <waited for>: <what happened>; log: ...; key: ...; next: ...`."""
    return f"sparkfleet: {host}: {waited_for}: {what}; log: {log}; key: {key}; next: {next_step}"


@dataclass(frozen=True)
class RunFailure:
    """One failure a run met on a node, with all that the operator needs to act on it."""

    host: str  # where it failed (the node whose log tells why)
    waited_for: str  # what the step waited for: "the head's /health to answer 200 (up to 1200 s)"
    what: str  # what happened instead: "no 200 after 1200 s (last: 503)"
    log: str  # the exact command that shows the log (on_node, journal)
    key: str  # the data key that governs the step
    next_step: str  # what to do next

    def __post_init__(self):
        _check_key(self.key)

    def line(self) -> str:
        return failure_line(self.host, self.waited_for, self.what, self.log, self.key, self.next_step)

    def block(self, output: str = "") -> str:
        """The block an operator reads at the end of the step: a title, the four labelled lines and
        the last lines of the log, when the step read them."""
        lines = [
            f"sparkfleet: {self.host}: {self.what}",
            f"  waited for: {self.waited_for}",
            f"  log:        {self.log}",
            f"  key:        {self.key}",
            f"  next:       {self.next_step}",
        ]
        tail = [line for line in output.rstrip().splitlines()[-LOG_TAIL_LINES:]]
        if tail:
            lines.append(f"  last {len(tail)} lines of the log:")
            lines += [f"    | {line}" for line in tail]
        return "\n".join(lines)


class RunFailed(Refusal):
    """A run-time failure raised by an operation body: printed as its block (RunFailure.block), not
    a traceback; the operation fails and the run stops (config.FAIL_PERCENT = 0)."""

    def __init__(self, failure: RunFailure, output: str = "", note: str = ""):
        self.failure = failure
        self.output = output  # the log's last lines, as the step read them
        self.note = note  # what the step left (a failed prewarm: whether production serves again)
        super().__init__(f"{failure.host}: {failure.what}")

    def block(self) -> str:
        return self.failure.block(self.output) + (f"\n{self.note}" if self.note else "")
