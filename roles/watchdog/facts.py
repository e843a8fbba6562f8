"""Facts of roles/watchdog: the unit's state on a node, the program's own verdicts (probe, status),
and a rank's container as `make status` shows it."""
import shlex

from pyinfra.api import FactBase

from sparkfleet.model.watchdog import SFL_WATCH, WATCH_CONFIG, WATCH_UNIT
from sparkfleet.keyvalue import key_values


class WatchdogUnit(FactBase):
    """{"active": ..., "enabled": ...} of sparkfleet-watchdog.service ("inactive" and "" when absent)."""

    def command(self) -> str:
        u = shlex.quote(f"{WATCH_UNIT}.service")
        return (f"echo active=$(systemctl is-active {u} 2>/dev/null); "
                f"echo enabled=$(systemctl is-enabled {u} 2>/dev/null)")

    def process(self, output):
        return key_values(output)


def program_command(verb: str) -> str:
    """`sfl_watch.py <verb> <config>` as root on the node; its exit status as the last line (`rc=N`),
    `rc=absent` when the deploy never installed the program or its config."""
    return (f"if [ -f {SFL_WATCH} ] && [ -f {WATCH_CONFIG} ]; then python3 {SFL_WATCH} {verb} {WATCH_CONFIG} 2>&1; "
            f"echo rc=$?; else echo rc=absent; fi")


def split_rc(lines) -> tuple[str | None, list[str]]:
    """(exit status or 'absent', the program's lines before it) of a program_command's output."""
    lines = list(lines)
    if lines and lines[-1].startswith("rc="):
        return lines[-1][3:].strip(), lines[:-1]
    return None, lines


class WatchProbe(FactBase):
    """`sfl_watch.py probe` on the node: {"rc": "0"|"1"|"2"|"absent", "line": its one-line verdict}.
    On the head: the completion through the API, every rank's container and processes (the workers'
    through their watchdogs' states); on a worker: its own container and processes."""

    def command(self) -> str:
        return program_command("probe")

    def process(self, output):
        rc, lines = split_rc(output)
        return {"rc": rc, "line": " ".join(l.strip() for l in lines if l.strip())}


class WatchStatus(FactBase):
    """`sfl_watch.py status` on the node: {"rc", "state": its state.json (a dict), "verdict": line}."""

    def command(self) -> str:
        return program_command("status")

    def process(self, output):
        import json

        rc, lines = split_rc(output)
        verdict = next((l for l in reversed(lines) if l.startswith("verdict: ")), "")
        body = "\n".join(l for l in lines if not l.startswith("verdict: "))
        try:
            state = json.loads(body) if body.strip() else {}
        except ValueError:
            state = {}
        return {"rc": rc, "state": state if isinstance(state, dict) else {}, "verdict": verdict.removeprefix("verdict: "),
                "text": body if not state else ""}


class RankContainer(FactBase):
    """{"status", "started_at", "image", "up_s"} of a rank's container, from docker inspect and the
    node's own clock (status "missing" when there is none; up_s only while it runs)."""

    def command(self, unit: str) -> str:
        u = shlex.quote(unit)
        return (f"s=$(docker inspect --format '{{{{.State.Status}}}} {{{{.State.StartedAt}}}} {{{{.Config.Image}}}}' {u} "
                f"2>/dev/null) || s='missing - -'; set -- $s; echo status=$1; echo started_at=$2; echo image=$3; "
                f"[ \"$1\" = running ] && echo up_s=$(( $(date +%s) - $(date -d \"$2\" +%s) )); true")

    def process(self, output):
        return key_values(output)
