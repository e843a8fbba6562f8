"""Progress of a long step, printed on the controller while the step runs (issue 45 item 4).

A deploy's long steps (the image build, push and pull, the hub fetch, the fan-out, the prewarm and the
engine's start) can take an hour on a Spark. Every `progress_interval_s` (data) while one runs, one line:

    --> sparkfleet: <host>: <step>: <elapsed> s, <bytes> (<rate>/s)     where bytes can be measured
    --> sparkfleet: <host>: <step>: <elapsed> s, <the engine's phase>   where there are none

and, when it ends (success or failure), `--> sparkfleet: <host>: <step>: done in <elapsed> s` (with
" (failed)" when it failed). Quiet when fast: a step that ends before its first interval prints no
line at all, not even the done line (a done line is printed only when elapsed >= the interval, i.e.
exactly when the step could have printed progress).

How a line reaches the terminal while the step runs, without -v: a pyinfra command's own output is
echoed only when state.print_output is set, which only -vvv sets (pyinfra 3.10:
pyinfra_cli/cli.py _set_verbosity; pyinfra/api/command.py StringCommand.execute passes
state.print_output; pyinfra/connectors/util.py read_buffer echoes only with print_output). pyinfra's
own logger at INFO does reach it (pyinfra_cli/cli.py _setup_log_level: INFO unless --debug), from any
greenlet, when the call is made: the /health wait's lines already arrive that way. So the controller
measures: while the step's command runs on its SSH channel, a second greenlet (pyinfra_cli/__init__.py
monkey-patches threading to gevent) asks the node every interval for a small figure on another
channel of the same connection (the bytes of a directory, the used bytes of a filesystem, the last
line of an engine's log) and logs the line. The step's command is untouched: its exit status, its
bound (sparkfleet/bounded.py, on the node) and its output are what they were; a probe that fails or
hangs costs a missing line, never the step.

Bytes are what landed since the step began (the first probe's figure is the baseline), the rate is
over the last interval. A phase is the log's last meaningful line, trimmed, with anything shaped like
a token or key masked (redact): the hub fetch's token stays in its root-only file, and no probe
prints the command line of any step.

Every step watched here is also recorded, quiet or not: its host, its name, when it began and ended
in the controller's clock (seconds since the epoch) and whether it succeeded (SPANS, one Span per
step of the run). The benchmark receipt keeps its pair's (roles/receipt), and bench/bringup.py reads
each phase of a bring-up from them (issue 44).
"""
from __future__ import annotations

import re
import shlex
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
PREFIX = "--> sparkfleet: "
PHASE_WIDTH = 120  # characters of an engine's log line kept in a progress line
JOIN_S = 5.0  # how long the end of a step waits for a probe still running (its line is then dropped)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# vLLM/SGLang log prefixes ("INFO 12-05 13:00:01 [loader.py:42] ", "[2026-12-05 13:00:01 TP0] "), so
# that the phase itself fits in PHASE_WIDTH.
_LOG_PREFIX = re.compile(
    r"^(?:\(\w+[^)]*\)\s+)?(?:(?:DEBUG|INFO|WARNING|ERROR)\s+)?(?:\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+)?"
    r"(?:\[[^\]]*\]\s+)?")
_SECRETS = (
    (re.compile(r"\bhf_[A-Za-z0-9]{6,}"), "hf_***"),
    (re.compile(r"(?i)\b(bearer)\s+\S+"), r"\1 ***"),
    (re.compile(r"(?i)([\w-]*(?:token|key|secret|password)[\w-]*[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]+"), r"\1***"),
)
# Lines that say nothing about the engine's progress: the health polls' own access lines, blank ones.
_NOISE = re.compile(r"GET /health|^\s*$")


def human_bytes(n: float) -> str:
    """Binary units, as df -h and docker print them: 512 B, 3.4 MiB, 12.0 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def redact(line: str) -> str:
    """`line` with anything shaped like a credential masked (hf_ tokens, Bearer values, key=value)."""
    for pattern, mask in _SECRETS:
        line = pattern.sub(mask, line)
    return line


def phase_text(log: str, width: int = PHASE_WIDTH) -> str | None:
    """The last meaningful line of an engine's log (`log`: its tail), without colours or the log
    prefix, masked (redact) and trimmed to `width`; None when there is none."""
    for raw in reversed(log.splitlines()):
        line = _ANSI.sub("", raw).strip()
        if _NOISE.search(line):
            continue
        line = redact(_LOG_PREFIX.sub("", line).strip() or line)
        return line if len(line) <= width else line[: width - 3] + "..."
    return None


def parse_bytes(text: str) -> int | None:
    """The figure a bytes probe printed (its last line's first word); an empty answer (the directory
    not made yet) is 0; anything else None (no line this time)."""
    lines = text.strip().splitlines()
    if not lines:
        return 0
    word = lines[-1].split()[0] if lines[-1].split() else ""
    return int(word) if word.isdigit() else None


def dir_bytes_probe(path: str) -> str:
    """Node-side: the bytes under `path` (apparent sizes, partial and hub-client files included);
    nothing when it does not exist yet."""
    return f"du -sb {shlex.quote(path)} 2>/dev/null | cut -f1; true"


def fs_used_probe(path: str) -> str:
    """Node-side: the used bytes of the filesystem holding `path` (docker's data, the registry's)."""
    return f"df -B1 --output=used {shlex.quote(path)} 2>/dev/null | tail -n 1; true"


DOCKER_ROOT = "$(docker info -f '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)"


def docker_used_probe() -> str:
    """Node-side: the used bytes of the filesystem holding docker's data root (where a build writes
    its layers and a pull extracts them)."""
    return f'df -B1 --output=used "{DOCKER_ROOT}" 2>/dev/null | tail -n 1; true'


@dataclass(frozen=True)
class Span:
    """One long step as it ran: its host, its name (as its progress lines print it), when it began and
    ended (the controller's clock, seconds since the epoch) and whether it succeeded."""
    host: str
    step: str
    start: float
    end: float
    ok: bool


# Every long step of this run, in the order they ended (a run is one controller process: pyinfra's CLI).
SPANS: list[Span] = []


def record_span(host: str, step: str, start: float, end: float, ok: bool) -> None:
    """Record `step` on `host` as it ran on the node (start and end in the node's clock, seconds since the
    epoch), in place of what the controller recorded of it: a step that ran in the background
    (roles/weights/background.py) was only waited for by the operation that watched it."""
    SPANS[:] = [span for span in SPANS if (span.host, span.step) != (host, step)]
    SPANS.append(Span(host, step, start, end, ok))


def spans_of(hosts: Iterable[str], spans: Iterable[Span] | None = None) -> list[dict]:
    """The recorded steps of `hosts` (of SPANS unless given), as JSON-ready dicts, in the order they ended."""
    names = set(hosts)
    return [asdict(span) for span in (SPANS if spans is None else spans) if span.host in names]


class Ticker:
    """The lines of one step: progress (at most one per `interval`) and done. `emit` gets each line;
    `clock` is time.monotonic (a test may pass its own). `label` is "<host>: <step>"; when the step is
    done it is recorded in `record` (SPANS), with its start and end in `wall`'s clock (time.time)."""

    def __init__(self, label: str, interval: float, emit: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 record: list[Span] | None = None):
        if interval <= 0:
            raise ValueError(f"progress interval {interval!r}: it must be > 0")
        self.label, self.interval, self.emit, self.clock = label, float(interval), emit, clock
        self.wall, self.record = wall, SPANS if record is None else record
        self.began_at = wall()
        self.start = self.last = clock()
        self.baseline: int | None = None
        self.previous: tuple[float, int] | None = None
        self.lock = threading.Lock()
        self.ended = False

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    def due(self) -> bool:
        return self.clock() - self.last >= self.interval

    def base(self, figure: int | None) -> None:
        """The bytes already there when the step began (what a resumed transfer had kept)."""
        if figure is not None:
            self.baseline = figure
            self.previous = (self.clock(), figure)

    def report(self, figure: int | str | None) -> None:
        """One progress line: bytes (an int: since the baseline, and the rate since the last figure),
        a phase (a str), or the elapsed time alone (None)."""
        now = self.clock()
        text = f"{self.label}: {now - self.start:.0f} s"
        if isinstance(figure, int):
            if self.baseline is None:
                self.base(figure)
            landed = max(0, figure - self.baseline)
            then, before = self.previous
            rate = max(0, figure - before) / (now - then) if now > then else 0.0
            self.previous = (now, figure)
            text += f", {human_bytes(landed)} ({human_bytes(rate)}/s)"
        elif figure:
            text += f", {figure}"
        with self.lock:
            if not self.ended:
                self.emit(PREFIX + text)
        self.last = now

    def done(self, ok: bool = True) -> None:
        """The done line, once, when the step took at least one interval; no progress line after it.
        The step is recorded (its Span) whatever its length."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
            host, _, step = self.label.partition(": ")
            self.record.append(Span(host, step, self.began_at, self.wall(), ok))
            elapsed = self.elapsed
            if elapsed >= self.interval:
                self.emit(f"{PREFIX}{self.label}: done in {elapsed:.0f} s" + ("" if ok else " (failed)"))


def watched(run: Callable[[], T], probe: Callable[[], int | str | None], *, label: str, interval: float,
            emit: Callable[[str], None], ok: Callable[[T], bool] = lambda result: True) -> T:
    """run() (the step, in this thread: its result, or its exception, is the caller's unchanged) while
    another thread calls probe() at the start (a bytes baseline) and every `interval`, printing a
    progress line each time; then the done line (Ticker.done). `ok(result)`: whether the step
    succeeded, for the done line. A probe that raises is skipped: progress never fails a step."""
    ticker = Ticker(label, interval, emit)
    stop = threading.Event()

    def measure() -> int | str | None:
        try:
            return probe()
        except Exception:  # noqa: BLE001 (a probe's failure costs a line, never the step)
            return None

    def tick() -> None:
        first = measure()
        if isinstance(first, int):
            ticker.base(first)
        while not stop.wait(max(0.0, ticker.interval - (ticker.clock() - ticker.last))):
            figure = measure()
            if stop.is_set():
                return
            ticker.report(figure)

    thread = threading.Thread(target=tick, name=f"progress {label}", daemon=True)
    thread.start()
    succeeded = False
    try:
        result = run()
        succeeded = ok(result)
        return result
    finally:
        stop.set()
        thread.join(JOIN_S)
        ticker.done(succeeded)


IN_THE_BACKGROUND = " (in the background)"


def background_done_line(host: str, step: str, seconds: float, ok: bool, interval: float) -> str | None:
    """The done line of a step that ran in the background and ended before the deploy waited for it
    (roles/weights/background.py), with its own duration; None when it took less than an interval
    (quiet when fast, as Ticker.done). It had no progress lines: nothing watched it while it ran."""
    if seconds < interval:
        return None
    return f"{PREFIX}{host}: {step}: done in {seconds:.0f} s" + ("" if ok else " (failed)") + IN_THE_BACKGROUND


_TICK = re.compile(rf"^.*?{re.escape(PREFIX)}(?P<host>\S+): (?P<step>.+?): (?P<s>\d+) s(?:, (?P<what>.*))?$")
_DONE = re.compile(rf"^.*?{re.escape(PREFIX)}(?P<host>\S+): (?P<step>.+?): done in (?P<s>\d+) s(?P<failed> \(failed\))?"
                   rf"(?P<background>{re.escape(IN_THE_BACKGROUND)})?$")
BYTES_FIGURE = re.compile(r"^[\d.]+ (?:B|KiB|MiB|GiB|TiB) \([\d.]+ (?:B|KiB|MiB|GiB|TiB)/s\)$")


def read_progress(output: str) -> dict[tuple[str, str], dict]:
    """A run's progress, read back from its output (tests/real reads a lab deploy's): (host, step) ->
    {"ticks": [(elapsed s, what)], "done": (elapsed s, failed) or None}, in the order printed; and
    "background": True for a step whose done line says it ran in the background (background_done_line)."""
    steps: dict[tuple[str, str], dict] = {}
    for line in output.splitlines():
        if done := _DONE.match(line):
            entry = steps.setdefault((done["host"], done["step"]), {"ticks": [], "done": None})
            entry["done"] = (int(done["s"]), bool(done["failed"]))
            if done["background"]:
                entry["background"] = True
        elif tick := _TICK.match(line):
            entry = steps.setdefault((tick["host"], tick["step"]), {"ticks": [], "done": None})
            entry["ticks"].append((int(tick["s"]), tick["what"] or ""))
    return steps


# --- pyinfra: a command that reports its progress (the glue; everything above runs without pyinfra) ---

# Connector arguments of the step that do not apply to a probe: its stdin, its own timeout, its exit codes.
_STEP_ONLY = ("_stdin", "_timeout", "_success_exit_codes", "_get_pty", "print_output", "print_input")


def run_with_progress(host, command, *, step: str, interval: float, probe: str, parse=parse_bytes, **arguments):
    """host.run_shell_command(command, **arguments), watched (module docstring): every `interval` the
    node runs `probe` (as the step's user: the same sudo arguments) and `parse` turns its stdout into
    bytes or a phase. Returns what run_shell_command returns, (ok, output)."""
    from pyinfra import logger
    from pyinfra.api import StringCommand

    # pyinfra's `host` in an operation body is a context proxy whose value is local to the greenlet that
    # set it (pyinfra/context.py LocalContextObject, a gevent.local): read from the probe's own greenlet it
    # is unset, and every probe failed (a push's and a pull's lines carried no figure). The host itself.
    host = host._get_module() if getattr(host, "_get_module", None) and host._get_module() is not None else host
    probe_arguments = {k: v for k, v in arguments.items() if k not in _STEP_ONLY}

    def measure():
        done, out = host.run_shell_command(StringCommand(probe), **probe_arguments)
        return parse(out.stdout) if done else None

    return watched(lambda: host.run_shell_command(command, **arguments), measure, label=f"{host.name}: {step}",
                   interval=interval, emit=logger.info, ok=lambda result: bool(result[0]))


def progress_command(command: str, *, step: str, interval: float, probe: str, parse=parse_bytes):
    """A pyinfra StringCommand for a server.shell step that reports its progress while it runs
    (run_with_progress); its text, and so its status and output, are `command`'s."""
    from pyinfra.api import StringCommand

    class ProgressCommand(StringCommand):
        def execute(self, state, host, connector_arguments):
            # as StringCommand.execute (pyinfra/api/command.py), the run watched
            connector_arguments.update(self.connector_arguments)
            return run_with_progress(host, StringCommand(*self.bits), step=step, interval=interval, probe=probe,
                                     parse=parse, print_output=state.print_output, print_input=state.print_input,
                                     **connector_arguments)

    return ProgressCommand(command)
