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
(config.FAIL_PERCENT = 0). Given the step's `Advice` (sparkfleet/run_failure.py), that line also
names the log to read and the next step, and any other failure of the command prints one line too
(its exit status, the log, the data key that governs the command, the next step): a failed docker
push is not left as bare docker output. With a `log_file`, the command's output goes to that file on
the node (kept for the operator: the line names it), and its last lines are printed when it fails.

Every bounded step resumes on a re-run: rsync keeps partial files, the HTTP fetch resumes with
ranges, docker build has its layer cache, push and pull skip the layers already there.
"""
import posixpath
import shlex

from sparkfleet.run_failure import LOG_TAIL_LINES, Advice, failure_line

KILL_AFTER_S = 30  # TERM first; KILL this long after, for a client that ignores TERM
TIMED_OUT = (124, 137)  # timeout's statuses: timed out (TERM sufficed), timed out and KILLed
RESUMES = "a re-run resumes from what arrived"


def timeout_message(step: str, host: str, limit_s: int, key: str, resume: str = RESUMES,
                    advice: Advice | None = None) -> str:
    """The one line an operator reads when a step hits its limit."""
    if advice is None:
        return f'sparkfleet: {host}: "{step}" stopped after {limit_s} s ({key}); {resume}'
    return failure_line(host, f'"{step}"', f"stopped after {limit_s} s, its limit", advice.log, key,
                        f"{resume}; raise {key} if it was still making progress")


EXIT_STATUS = "\0"  # where failed_message's text takes the command's exit status, in the shell


def failed_message(step: str, host: str, advice: Advice) -> str:
    """The one line an operator reads when a step's command fails before its limit; EXIT_STATUS
    stands for its exit status (the shell puts it in)."""
    return failure_line(host, f'"{step}"', f"failed (exit status {EXIT_STATUS})", advice.log, advice.key,
                        advice.next_step)


def bounded(command: str, *, step: str, host: str, limit_s: int, key: str, resume: str = RESUMES,
            cleanup: str | None = None, advice: Advice | None = None, log_file: str | None = None) -> str:
    """`command` (POSIX sh) run under `timeout --kill-after` with `limit_s` seconds; a subshell, so
    it composes with other commands. The command's own status passes through; at the limit: cleanup,
    one line naming step, host, limit and key on stderr, and timeout's status (124 or 137). With
    `advice`, any other failure prints its line too (failed_message). With `log_file`, the command's
    stdout and stderr go to that file (mode 0600; its directory made 0700 when missing); on a
    failure its last lines go to stderr before the line, and the line is appended to the file, so the
    log the line names says how the step ended even when the command printed nothing (a client
    stopped at its limit while it waited for a first byte).

    A 137 is taken as the limit only when the limit has passed (a command the kernel's OOM killer
    ended also exits 137, and must not be reported as slow)."""
    limit = int(limit_s)
    if limit < 1:
        raise ValueError(f"{key}: a limit of {limit_s!r} s; it must be a whole number of seconds >= 1")
    q = shlex.quote
    after = f"{cleanup}; " if cleanup else ""
    start, into, tail, say = "", "", "", " >&2"
    if log_file:
        # Root-only: the directory when it is made, the file whatever mode an earlier run left it in.
        start = f"mkdir -p -m 0700 {q(posixpath.dirname(log_file))}; : > {q(log_file)}; chmod 0600 {q(log_file)}; "
        into = f" >{q(log_file)} 2>&1"
        tail = f"tail -n {LOG_TAIL_LINES} {q(log_file)} >&2; "
        say = f" | tee -a {q(log_file)} >&2"  # the line ends the log too (after its tail was printed)
    failed = ""
    if advice is not None:
        before, _, rest = failed_message(step, host, advice).partition(EXIT_STATUS)
        failed = f'elif [ "$sfl_rc" -ne 0 ]; then {tail}printf \'%s%s%s\\n\' {q(before)} "$sfl_rc" {q(rest)}{say}; '
    elif tail:
        failed = f'elif [ "$sfl_rc" -ne 0 ]; then {tail}'
    return (
        f"( {start}sfl_t0=$(date +%s); timeout --kill-after={KILL_AFTER_S} {limit} sh -c {q(command)}{into}; sfl_rc=$?; "
        f'if [ "$sfl_rc" -eq 124 ] || {{ [ "$sfl_rc" -eq 137 ] && [ $(( $(date +%s) - sfl_t0 )) -ge {limit} ]; }}; then '
        f"{tail}{after}printf '%s\\n' {q(timeout_message(step, host, limit, key, resume, advice))}{say}; {failed}fi; "
        f'exit "$sfl_rc" )'
    )
