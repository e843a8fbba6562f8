"""What the pair attempted and what it served, on the head: <data_dir>/recipes/<profile>.history.

One line per event, appended, never rewritten: `<UTC time> <event> <recipe commit>`, the event being
- attempted: the prewarm of a new kernel-cache generation starts, or the pair is about to restart onto
  the commit (roles/kernel_cache, roles/serving);
- served: the head's /health is 200 on it (roles/serving, and the repair after a failed prewarm);
- failed: the prewarm, or the wait for /health after a restart, failed on it.

`<profile>.deployed` (the served commits, deduplicated, the current one last) is still written: the
launch-default drift check reads its last line. A head that has only it (written by an older
sparkfleet) reads here as served events without a time, before every line of the history.

rollback.py returns to the commit that served last, other than the one data names: after a failed
upgrade to v2 (attempted, failed, never served), v1; after v2 served, v1 as well.
"""
import shlex
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import DeployError

from roles.serving.ready import wait_for_health


EVENTS = ("attempted", "served", "failed")
TIME_FORMAT = "+%Y-%m-%dT%H:%M:%SZ"  # date -u


@dataclass(frozen=True)
class Event:
    time: str | None  # None: from a .deployed line (no time recorded)
    event: str  # one of EVENTS
    commit: str


def history_file(node, profile) -> str:
    return f"{node.preflight_data_dir}/recipes/{profile.name}.history"


def deployed_file(node, profile) -> str:
    """The served commits, deduplicated, the current one last (sparkfleet/model/image.py history_path)."""
    return f"{node.preflight_data_dir}/recipes/{profile.name}.deployed"


def parse_history(history_lines, deployed_lines=()) -> list[Event]:
    """Events oldest first: every .deployed line as a served event without a time, then each line of
    the history. A line that is not `<time> <event> <commit>` with a known event is skipped."""
    events = [Event(None, "served", line.strip()) for line in deployed_lines if line.strip()]
    for line in history_lines:
        words = line.split()
        if len(words) == 3 and words[1] in EVENTS:
            events.append(Event(words[0], words[1], words[2]))
    return events


def same_commit(a: str | None, b: str | None) -> bool:
    """Whether two recipe commits name the same one (a full SHA and an abbreviation of it match)."""
    return bool(a) and bool(b) and (a.startswith(b) or b.startswith(a))


def last_event(events: list[Event], commit: str, kind: str) -> Event | None:
    return next((e for e in reversed(events) if e.event == kind and same_commit(e.commit, commit)), None)


def last_served(events: list[Event]) -> str | None:
    """The commit of the newest served event, or None."""
    return next((e.commit for e in reversed(events) if e.event == "served"), None)


def record_command(path: str, event: str, commit: str) -> str:
    """Append one event, stamped with the node's UTC clock, and fsync the file and its directory
    (coreutils `sync FILE...`), so that a power cut right after a deploy does not lose it (a line
    torn by one is skipped by parse_history)."""
    if event not in EVENTS:
        raise ValueError(f"unknown history event {event!r}")
    p = shlex.quote(path)
    return (f"mkdir -p $(dirname {p}) && echo \"$(date -u {TIME_FORMAT}) {event} {shlex.quote(commit)}\" >> {p}"
            f" && sync {p} \"$(dirname {p})\"")


def wait_then_record(history: str, commit: str, **wait) -> None:
    """Operation body (head): roles/serving/ready.py wait_for_health; when it fails, a failed event
    is appended before the deploy stops."""


    try:
        wait_for_health(**wait)
    except DeployError:
        host.run_shell_command(StringCommand(record_command(history, "failed", commit)))
        raise


class RecipeHistory(FactBase):
    """The events of `path` (the history) after those of `deployed` (the legacy served list)."""

    def command(self, path: str, deployed: str) -> str:
        return (
            f"sed 's/^/D /' {shlex.quote(deployed)} 2>/dev/null; sed 's/^/H /' {shlex.quote(path)} 2>/dev/null; true"
        )

    def process(self, output):
        history, deployed = [], []
        for line in output:
            kind, _, rest = line.partition(" ")
            (history if kind == "H" else deployed if kind == "D" else []).append(rest)
        return parse_history(history, deployed)


def describe(events: list[Event], commit: str) -> str:
    """What the history says of one commit: `last served <time>`, `attempted <time>, failed <time>,
    never served`, ..."""
    served, attempted, failed = (last_event(events, commit, k) for k in ("served", "attempted", "failed"))
    parts = []
    if attempted:
        parts.append(f"last attempted {attempted.time}")
    if failed:
        parts.append(f"last failed {failed.time}")
    if served:
        parts.append(f"last served {served.time or '(time not recorded)'}")
    else:
        parts.append("never served")
    return ", ".join(parts)


@dataclass(frozen=True)
class RollbackChoice:
    current: str  # the commit data names
    target: str  # the commit that served last, other than `current`
    served_at: str | None  # when `target` last served (None: recorded without a time)
    current_note: str  # what the history says of `current`


class NothingToRollBackTo(DeployError):
    pass


def rollback_target(events: list[Event], data_commit: str, head: str, profile: str, path: str) -> RollbackChoice:
    """The commit that served last other than the one data names, or a refusal naming the head and
    the profile when the history holds none."""
    for e in reversed(events):
        if e.event == "served" and not same_commit(e.commit, data_commit):
            return RollbackChoice(data_commit, e.commit, e.time, describe(events, data_commit))
    served = sorted({e.commit for e in events if e.event == "served"})
    seen = f"it served only {', '.join(served)}" if served else "it has served no recipe commit"
    raise NothingToRollBackTo(
        f"rollback: {head} has no record of serving {profile} at a recipe commit other than {data_commit}, "
        f"the one data names ({path}: {seen}); nothing to roll back to. Nothing was changed."
    )


def rollback_message(choice: RollbackChoice, profile: str, image: str) -> str:
    when = choice.served_at or "at a time not recorded"
    return (
        f"--> sparkfleet rollback: {profile} recipe {choice.current} -> {choice.target}\n"
        f"    from {choice.current[:12]} (what data names: {choice.current_note})\n"
        f"    to {choice.target[:12]}, the commit that served last before it (last served {when}); "
        f"image {image}:{choice.target}, kept on every node, no rebuild\n"
        f"    To stay there, set serving_recipe_commit = \"{choice.target}\" in data; "
        f"a plain deploy returns to {choice.current[:12]}."
    )
