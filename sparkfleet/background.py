"""A long step run in the background on a node, and waited for by a later operation (issue 44 item 2).

pyinfra runs one operation at a time across the hosts: a step that takes minutes on one node (the
head's weights fetch, a worker's image pull) holds every other node's next operation until it ends.
Started as a transient systemd unit instead (`systemd-run`), it runs while the deploy goes on with
work that does not need it, and the operation that needs its result waits for it there.

The unit runs one root-only script in its own directory. The script runs its jobs in turn, each a
shell command, stopping at the first that fails; per job it leaves `<name>.start` (the node's clock
when it began), `<name>.out` (what it printed) and `<name>.end` (when it ended, and its exit status).
The wait reads them back: it prints the job's output, its span, and exits with its status; a unit
that ended without ending the job (stopped, killed, an earlier job failed) is named with its journal.

A run that stops after the start (a later step failed, a Ctrl-C) leaves the unit running, bounded as
its commands are: the next run finds it active with the same script and waits for it instead of
starting it again; a script that differs (another revision, image or model) stops it first. Used by
roles/weights/background.py (the head's fetch) and roles/image/background.py (the head's build, a
worker's pull).
"""
from __future__ import annotations

import re
import shlex

_SPAN = re.compile(r"^sparkfleet-span (?P<start>[\d.]+) (?P<end>[\d.]+) (?P<rc>\d+)$", re.M)


def slug(name: str) -> str:
    """A job's name (a model id, say) as a file name: '/' as '--', anything outside [A-Za-z0-9._-] as '-'."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", name.replace("/", "--"))


def job_script(header: str, jobs: list[tuple[str, str]], base: str) -> str:
    """The unit's script: each (name, command) of `jobs` in turn, its status files in `base` around it;
    the first failure ends the script with its exit status. `header`: the managed-by comment."""
    lines = ["#!/bin/sh", f"# {header}"]
    for name, command in jobs:
        b = shlex.quote(f"{base}/{slug(name)}")
        lines += [
            f"date +%s.%N > {b}.start",
            f"( {command} ) > {b}.out 2>&1",
            "rc=$?",
            f'echo "$(date +%s.%N) $rc" > {b}.end.tmp && mv {b}.end.tmp {b}.end',
            '[ "$rc" -eq 0 ] || exit "$rc"',
        ]
    return "\n".join(lines) + "\n"


def start_command(unit: str, base: str, script: str, *, description: str, already: str, stop_also: str = "",
                  before_start: str = "") -> str:
    """Start `unit` running `script` (kept as `<base>/run.sh`, root-only), unless it runs that very
    script already (an earlier run's: `already` is printed, and it is waited for, not started again).
    A unit running another script is stopped first, then `stop_also` runs (what a stopped job can
    leave behind, such as its container). `before_start` runs right before the unit starts (never
    when it is waited for instead): what must be gone when this operation ends, whatever the unit has
    done by then."""
    b = shlex.quote(base)
    path = f"{b}/run.sh"
    return "\n".join([
        f"umask 077 && mkdir -p {b} && chmod 0700 {b}",
        f"printf '%s' {shlex.quote(script)} > {path}.new",
        f"if systemctl is-active --quiet {unit}; then",
        f"  if cmp -s {path}.new {path}; then",
        f"    rm -f {path}.new; echo {shlex.quote(already)}; exit 0",
        "  fi",
        f"  systemctl stop {unit}" + (f"; {stop_also}" if stop_also else ""),
        "fi",
        f"systemctl reset-failed {unit} 2>/dev/null",
        f"rm -f {b}/*.start {b}/*.out {b}/*.end {b}/*.end.tmp",
        f"mv {path}.new {path} && chmod 0700 {path}",
        *([before_start] if before_start else []),
        f"systemd-run --quiet --collect --unit={unit} --description={shlex.quote(description)} /bin/sh {path}",
    ])


def wait_command(unit: str, base: str, name: str, lost: str) -> str:
    """Wait for the job `name` of `unit` to end; print what it printed (to stderr), then its span on
    stdout, and exit with its status. A unit that ended without ending this job fails with `lost` and
    the unit's journal."""
    b = shlex.quote(f"{base}/{slug(name)}")
    return "\n".join([
        f"while [ ! -f {b}.end ]; do",
        f"  if ! systemctl is-active --quiet {unit}; then",
        f"    [ -f {b}.end ] && break",
        f"    echo {shlex.quote(lost)} >&2; journalctl -u {unit} -n 20 --no-pager >&2; exit 1",
        "  fi",
        "  sleep 1",
        "done",
        f"cat {b}.out >&2",
        f"read started < {b}.start; read ended rc < {b}.end",
        'echo "sparkfleet-span $started $ended $rc"',
        'exit "$rc"',
    ])


def job_span(stdout: str) -> tuple[float, float, int] | None:
    """(start, end, exit status) of a job, as wait_command printed them; None when it printed none."""
    m = _SPAN.search(stdout)
    return (float(m["start"]), float(m["end"]), int(m["rc"])) if m else None


def await_job(host, *, unit: str, base: str, name: str, lost: str, step: str, interval: float, probe: str):
    """In an operation body: wait for the job `name` (wait_command) with `step`'s progress while it
    runs (`probe`: sparkfleet/progress.py), record the job's own start and end under `step` (SPANS:
    what bench/bringup.py reads), and, when it had ended before the wait took an interval, print its
    done line with its own duration. Returns pyinfra's (ok, output) for the caller's verdict."""
    import time

    from pyinfra import logger
    from pyinfra.api import StringCommand

    from sparkfleet.progress import background_done_line, record_span, run_with_progress

    began = time.monotonic()
    ok, out = run_with_progress(host, StringCommand(wait_command(unit, base, name, lost)), step=step,
                                interval=interval, probe=probe)
    waited = time.monotonic() - began
    span = job_span(out.stdout)
    if span is not None:
        start, end, status = span
        record_span(host.name, step, start, end, status == 0)
        # Waited for less than an interval: the job ran (mostly) before this step, unwatched; its own
        # duration is its done line. Otherwise the wait's progress and done lines were printed already.
        line = background_done_line(host.name, step, end - start, status == 0, interval) if waited < interval else None
        if line:
            logger.info(line)
    return ok, out
