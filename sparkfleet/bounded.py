"""Every external command a deploy runs on a node that can wait on the network or a slow machine is
bounded: git fetch, docker build/push/pull, the weights fetch, every rsync.

`bounded()` wraps one POSIX sh command string (a pyinfra server.shell command, or a command an
operation body runs on a node) with coreutils `timeout`. At the limit, `timeout` sends TERM to the
command's whole process group (it makes its own), then KILL after KILL_AFTER_S more seconds to
whatever ignored TERM. Exit statuses, as coreutils documents them: 124 when the command timed out
(no --preserve-status), 137 (128 + KILL) when the KILL was needed; 125-127 are timeout's own
failures and anything else is the command's own status, passed through unchanged.

On a timeout the wrapper runs the step's cleanup (e.g. removing a container a killed docker client
left running), prints one line to stderr naming the step, the host, the limit and the data key to
raise, and exits with timeout's status, so the operation fails and the run stops
(config.FAIL_PERCENT = 0). Every bounded step resumes on a re-run: rsync keeps partial files,
the HTTP fetch resumes with ranges, docker build has its layer cache, push and pull skip the layers
already there.
"""
import shlex

KILL_AFTER_S = 30  # TERM first; KILL this long after, for a client that ignores TERM
TIMED_OUT = (124, 137)  # timeout's statuses: timed out (TERM sufficed), timed out and KILLed
RESUMES = "a re-run resumes from what arrived"


def timeout_message(step: str, host: str, limit_s: int, key: str, resume: str = RESUMES) -> str:
    """The one line an operator reads when a step hits its limit."""
    return f'sparkfleet: {host}: "{step}" stopped after {limit_s} s ({key}); {resume}'


def bounded(command: str, *, step: str, host: str, limit_s: int, key: str, resume: str = RESUMES,
            cleanup: str | None = None) -> str:
    """`command` (POSIX sh) run under `timeout --kill-after` with `limit_s` seconds; a subshell, so
    it composes with other commands. The command's own status passes through; at the limit: cleanup,
    one line naming step, host, limit and key on stderr, and timeout's status (124 or 137).

    A 137 is taken as the limit only when the limit has passed (a command the kernel's OOM killer
    ended also exits 137, and must not be reported as slow)."""
    limit = int(limit_s)
    if limit < 1:
        raise ValueError(f"{key}: a limit of {limit_s!r} s; it must be a whole number of seconds >= 1")
    q = shlex.quote
    after = f"{cleanup}; " if cleanup else ""
    return (
        f"( sfl_t0=$(date +%s); timeout --kill-after={KILL_AFTER_S} {limit} sh -c {q(command)}; sfl_rc=$?; "
        f'if [ "$sfl_rc" -eq 124 ] || {{ [ "$sfl_rc" -eq 137 ] && [ $(( $(date +%s) - sfl_t0 )) -ge {limit} ]; }}; then '
        f"{after}printf '%s\\n' {q(timeout_message(step, host, limit, key, resume))} >&2; fi; "
        f'exit "$sfl_rc" )'
    )
