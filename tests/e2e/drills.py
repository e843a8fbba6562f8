"""Faults the watchdog must repair on the lab, and the clock on the repair: used by the e2e drills
(tests/e2e/test_lab_drills.py) and `make bench` (bench/recovery.py).

A drill injects one fault and then sends a real chat completion through the head every second until
one is answered 200; the time from the fault to that answer is the time to recover. Nothing here
deploys: recovering is the watchdog's job (and systemd's, after a reboot).
"""
import json
import shlex
import subprocess
import time
from dataclasses import dataclass

from tests.e2e.lab import HEAD, SSH_CONFIG, WORKER, api_curl, head_api, on, reboot

# HEAD, WORKER: the pair this process drives (tests/e2e/lab.py, SFL_LAB_PAIR)
UNITS = {HEAD: "sparkfleet-head", WORKER: "sparkfleet-worker"}
SERVED = "glm-5.3-flash"  # the lab's profile's api_model_name (tests/real serves "tiny-llama")


def chat_command(model: str = SERVED) -> str:
    """A chat completion through the head's API (TLS, verified), as a client sends it; its own 4 s bound."""
    return (api_curl("-s -o /dev/null -w '%{http_code}' -m 4") + " "
            "-H 'Content-Type: application/json' -d "
            + shlex.quote(json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}))
            + f" {head_api(HEAD)}/v1/chat/completions")
# The lab's watchdog (lab/group_data/all.py): 2 failed probes of 5 s + 5 s find a fault within 20 s,
# and a pair restart of the stand-ins takes ~10 s. A reboot adds the host's boot. docs/watchdog.md states
# this bound for the lab.
RECOVERY_BOUND_S = 120


def chat_code(model: str = SERVED) -> str:
    """The HTTP status of one chat completion through the head, '000' when none came back."""
    try:
        r = subprocess.run(["ssh", "-F", str(SSH_CONFIG), "-o", "ConnectTimeout=3", HEAD, chat_command(model)],
                           capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "000"
    return r.stdout.strip()[-3:] or "000"


def wait_serving(since: float, bound: float = RECOVERY_BOUND_S, model: str = SERVED) -> float:
    """Seconds from `since` (time.monotonic()) until a chat completion is answered 200; AssertionError
    naming the last status after `bound` seconds."""
    code = None
    while time.monotonic() - since < bound:
        code = chat_code(model)
        if code == "200":
            return time.monotonic() - since
        time.sleep(1)
    raise AssertionError(f"the pair did not serve again within {bound} s of the fault (last status {code})")


def engine_pid(host: str) -> int:
    """The rank's engine: the child of its container's init (docker run --init)."""
    unit = UNITS[host]
    out = on(host, f"pgrep -P $(docker inspect -f '{{{{.State.Pid}}}}' {unit}) | head -1").strip()
    return int(out)


def signal_engine(host: str, signal: str) -> int:
    pid = engine_pid(host)
    on(host, f"kill -{signal} {pid}")
    return pid


def signal_every_engine_process(host: str, signal: str) -> list[int]:
    """Signal every process of the rank's engine (the real vLLM runs its API server, engine core and
    workers as processes under the one its container's init started): a frozen rank, all of it."""
    unit = UNITS[host]
    init = int(on(host, f"docker inspect -f '{{{{.State.Pid}}}}' {unit}").strip())
    children: dict[int, list[int]] = {}
    for line in on(host, "ps -e -o pid=,ppid=").splitlines():
        pid, ppid = map(int, line.split())
        children.setdefault(ppid, []).append(pid)
    pids, todo = [], list(children.get(init, []))
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += children.get(pid, [])
    assert pids, f"{host}: no engine process under {unit}'s init ({init})"
    on(host, f"kill -{signal} {' '.join(map(str, pids))}")
    return pids


def watchdog_journal(host: str, since_epoch: float) -> str:
    """What the host's watchdog logged since `since_epoch` (a reboot's earlier boots included)."""
    return on(host, f"journalctl -u sparkfleet-watchdog --since @{int(since_epoch)} -o cat --no-pager")


def wait_journal(host: str, since_epoch: float, *needles: str, timeout: float = 60) -> str:
    """The watchdog's journal since `since_epoch` once it has a line with one of `needles` (a client
    can be served a moment before the watchdog's next probe says so); AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while not any(n in (text := watchdog_journal(host, since_epoch)) for n in needles):
        if time.monotonic() > deadline:
            raise AssertionError(f"{host}: none of {needles} in the watchdog's journal after {timeout} s:\n{text}")
        time.sleep(2)
    return text


@dataclass
class Drill:
    key: str
    what: str
    host: str

    def inject(self) -> float:
        """The fault; the seconds lab.sh waited for the lab's lock before it (the other pair's reboot)."""
        if self.key in ("a", "c"):
            signal_engine(self.host, "KILL")
        elif self.key == "b":
            signal_engine(self.host, "STOP")
        elif self.key == "d":
            return reboot(WORKER)
        elif self.key == "e":
            return reboot(HEAD, WORKER, power_cut=True)
        else:
            raise ValueError(self.key)
        return 0.0


DRILLS = {
    "a": Drill("a", "SIGKILL the worker's engine", WORKER),
    "b": Drill("b", "SIGSTOP the worker's engine", WORKER),
    "c": Drill("c", "SIGKILL the head's engine", HEAD),
    "d": Drill("d", "reboot the worker", WORKER),  # the name its figure is recorded under, whichever pair
    "e": Drill("e", "power cut of both hosts", HEAD),
}


def wait_watchdog_settled(timeout: float = RECOVERY_BOUND_S) -> None:
    """Until the head's watchdog has seen the pair serve and ended any restart of its own: a fault
    injected while it still waits on its last restart would be timed against that restart."""
    deadline = time.monotonic() + timeout
    while True:
        state = json.loads(on(HEAD, "cat /var/lib/sparkfleet/watchdog/state.json"))
        restarts = state.get("restarts") or []
        if (state.get("last_probe") or {}).get("ok") and (not restarts or restarts[-1].get("finished")):
            return
        assert time.monotonic() < deadline, f"the head's watchdog did not settle in {timeout} s: {state}"
        time.sleep(1)


def wait_outage(since: float, bound: float, model: str = SERVED) -> float:
    """Seconds from `since` until a chat completion is not answered 200: a fault the engine takes a
    moment to feel (the real vLLM answers from the head until its next step needs the dead rank)."""
    code = "200"
    while time.monotonic() - since < bound:
        code = chat_code(model)
        if code != "200":
            return time.monotonic() - since
        time.sleep(0.5)
    raise AssertionError(f"the pair still served {bound} s after the fault (the fault never took effect)")


def run_drill(key: str, bound: float = RECOVERY_BOUND_S, model: str = SERVED, inject=None,
              outage_first: bool = False) -> tuple[float, float]:
    """Inject drill `key` (or call `inject`) once the pair serves and its watchdog has settled;
    (seconds until it serves again, epoch of the fault). outage_first: it serves again only after a
    request has failed since the fault. The clock starts at the fault: a wait for the lab's lock before
    it (lab.sh reboot while make test's other pair reboots its hosts) is not the pair's recovery."""
    wait_serving(time.monotonic(), bound, model)
    wait_watchdog_settled(bound)
    epoch, start = time.time(), time.monotonic()
    if inject is None:  # a drill of DRILLS: the seconds lab.sh waited for the lab's lock before the fault
        waited = DRILLS[key].inject()
    else:  # a test's own fault: what it returns (a pid, the processes it stopped) is no wait
        inject()
        waited = 0.0
    epoch, start = epoch + waited, start + waited
    if outage_first:
        wait_outage(start, bound, model)
    return wait_serving(start, bound, model), epoch
