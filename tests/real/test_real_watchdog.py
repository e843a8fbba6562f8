"""The watchdog's drills against the real vLLM pair (after tests/real/test_real_pair.py, on the pair its
deploy left): each rank SIGKILLed and SIGSTOPped, the worker rebooted, a power cut of both hosts, and a
worker that dies while the pair is starting, which leaves the real head hung (LAB-NOTES: over 10
minutes, deaf to SIGTERM). Each must serve a chat completion again with no deploy, after a request
has failed since the fault, and the watchdog's journal must say what it saw and did; a deploy
afterwards changes nothing. Each time to recover is printed and recorded (tests/real/conftest.py
record_drill: `make watchdog-table` puts one run's figures into docs/watchdog.md). (The give-up drill
stays on the stand-in, tests/e2e/test_lab_drills.py: its repair deploy ships the whole image again.)
"""
import json
import math
import threading
import time

import pytest

from tests.e2e.drills import DRILLS, HEAD, UNITS, WORKER, run_drill, signal_engine, signal_every_engine_process, \
    wait_journal, wait_serving, wait_watchdog_settled, watchdog_journal
from tests.e2e.lab import Run, head_api, management_address, on, pause_watchdogs, read_failure_log, tls_context
from tests.real.conftest import REAL_INVENTORY, SERVED, deploy, record_drill

pytestmark = pytest.mark.lab

# lab/inventory_vllm_cpu.py's watchdog: 2 failed probes of 5 s + 5 s find a fault within 20 s; a
# pair restart of the real engine takes ~35 s warm (the head's stop waits out stop_timeout_s, 5 s,
# when its engine ignores SIGTERM). docs/watchdog.md states this bound for the real pair.
REAL_RECOVERY_BOUND_S = 300

# Every pairing of rank and kind meets the real engine (issue 42: the real drills are the proof, and
# docs/watchdog.md's table is their figures): a dead rank's container is gone or restarted by systemd, a
# frozen one's processes sit in state T until the watchdog kills its container; the head and the
# worker take different paths to the pair's restart (the head's watchdog restarts it; the worker's
# watchdog sees its own rank and hands the restart to the head). Each is what it saw in the journal.
FAULTS = {
    "worker SIGKILL": (WORKER, lambda: signal_engine(WORKER, "KILL"), WORKER),
    "worker SIGSTOP": (WORKER, lambda: signal_every_engine_process(WORKER, "STOP"), f"{WORKER}: sparkfleet-worker: process"),
    "head SIGKILL": (HEAD, lambda: signal_engine(HEAD, "KILL"), "sparkfleet-head"),
    "head SIGSTOP": (HEAD, lambda: signal_every_engine_process(HEAD, "STOP"), "sparkfleet-head"),
}


def report(capsys, line, drill: str, seconds: float | None, saw: str) -> None:
    """Print the drill's line (bench/drills_busy.py reads it) and record its figure for docs/watchdog.md."""
    with capsys.disabled():
        print(f"\n  real drill: {line}")
    record_drill(drill, seconds, line, saw)


def first_line(journal: str, *needles: str) -> str:
    """The journal's first line holding every needle ('' when none does): what the table quotes."""
    return next((ln for ln in journal.splitlines() if all(n in ln for n in needles)), "")


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_dead_or_frozen_real_rank_is_restarted_as_a_pair(real_deploy, fault, capsys):
    host, inject, saw = FAULTS[fault]
    took, since = run_drill(fault, REAL_RECOVERY_BOUND_S, SERVED, inject, outage_first=True)
    head = wait_journal(HEAD, since, "the pair serves again after", timeout=REAL_RECOVERY_BOUND_S)
    seen = first_line(head, "probe failed", saw)
    assert seen, head
    assert "restarting the pair" in head, head
    report(capsys, f"{fault}: serving again after {took:.1f} s (bound {REAL_RECOVERY_BOUND_S} s)", fault, took,
           "probe failed" + seen.split("probe failed", 1)[-1])


def firing(alertname: str, **labels) -> list[dict]:
    """The live Prometheus' (the head's, roles/monitoring) alerts of that name and labels, firing or pending."""
    alerts = json.loads(on(HEAD, "curl -fsS -m 10 http://127.0.0.1:9090/api/v1/alerts"))["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == alertname
            and all(a["labels"].get(k) == v for k, v in labels.items())]


def test_a_stopped_worker_fires_rank_down_in_the_live_prometheus_and_the_restart_is_seen(real_deploy, capsys):
    """The worker's unit stopped by hand, the watchdogs paused: SparkfleetRankDown fires for the worker once
    its `for:` has passed (15 s in lab/inventory_vllm_cpu.py) after Prometheus saw the unit inactive.
    With the watchdogs back, the pair is restarted, the alert resolves, and SparkfleetEngineRestarted
    says the engine units started again."""
    wait_watchdog_settled()
    started = unit_start_times()
    pause_watchdogs()
    since = time.monotonic()
    on(WORKER, "systemctl stop sparkfleet-worker")
    labels = {"node": WORKER, "name": "sparkfleet-worker.service"}
    while not [a for a in firing("SparkfleetRankDown", **labels) if a["state"] == "firing"]:
        assert time.monotonic() - since < 180, f"SparkfleetRankDown did not fire: {firing('SparkfleetRankDown')}"
        time.sleep(1)
    took = time.monotonic() - since
    alert = [a for a in firing("SparkfleetRankDown", **labels) if a["state"] == "firing"][0]
    assert alert["labels"]["group"] == "pair" and alert["labels"]["rank"] == "1", alert
    report(capsys, f"worker stopped: SparkfleetRankDown firing after {took:.1f} s (for: 15 s, scrape every 5 s)",
           "worker stopped: RankDown", took, f"SparkfleetRankDown firing for {alert['labels']['node']} "
           f"(group {alert['labels']['group']}, rank {alert['labels']['rank']})")
    for host in (WORKER, HEAD):  # the watchdogs back: the head's restarts the pair
        on(host, "systemctl start sparkfleet-watchdog")
    wait_serving(since, REAL_RECOVERY_BOUND_S + 180, SERVED)
    wait_watchdog_settled()
    deadline = time.monotonic() + 120
    while [a for a in firing("SparkfleetRankDown") if a["state"] == "firing"]:
        assert time.monotonic() < deadline, f"SparkfleetRankDown still firing: {firing('SparkfleetRankDown')}"
        time.sleep(2)
    deadline = time.monotonic() + 60
    while not all(unit_start_times().get(node, 0) > t for node, t in started.items()):
        assert time.monotonic() < deadline, f"Prometheus saw no new start of the engine units: {started}"
        time.sleep(2)
    restarted = {a["labels"]["node"] for a in firing("SparkfleetEngineRestarted") if a["state"] == "firing"}
    assert restarted == {HEAD, WORKER}, firing("SparkfleetEngineRestarted")
    # ... and the head's watchdog says it was the one (its restarts counter, from its textfile)
    deadline = time.monotonic() + 60
    while not [a for a in firing("SparkfleetWatchdogRestarted", node=HEAD) if a["state"] == "firing"]:
        assert time.monotonic() < deadline, f"SparkfleetWatchdogRestarted did not fire: {firing('SparkfleetWatchdogRestarted')}"
        time.sleep(2)


def unit_start_times() -> dict[str, float]:
    """node -> the engine unit's start time, as the live Prometheus last scraped it (systemd collector)."""
    expr = 'node_systemd_unit_start_time_seconds{name=~"sparkfleet-(head|worker)[.]service"}'
    out = on(HEAD, f"curl -fsS -m 10 http://127.0.0.1:9090/api/v1/query --data-urlencode 'query={expr}'")
    return {r["metric"]["node"]: float(r["value"][1]) for r in json.loads(out)["data"]["result"]}


class CONTEXT:
    """The fleet's CA (fetched from the head once) for the flood's clients: TLS verified as a client's."""
    _context = None

    @classmethod
    def get(cls):
        if cls._context is None:
            cls._context = tls_context(HEAD)
        return cls._context


def long_prompt(key: str, prompt_tokens: int = 7000) -> int | str:
    """One long prompt (token ids: exactly prompt_tokens, of the tiny model's 2048-token vocabulary,
    drawn at random: vLLM's prefix cache would serve a repeated prompt without computing it), a few
    tokens asked: its HTTP status, or what went wrong."""
    import random
    import urllib.request

    prompt = [random.randrange(300, 2000) for _ in range(prompt_tokens)]
    body = json.dumps({"model": SERVED, "prompt": prompt, "max_tokens": 16}).encode()
    request = urllib.request.Request(f"{head_api(HEAD)}/v1/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=600, context=CONTEXT.get()) as r:
            return r.status
    except Exception as e:  # noqa: BLE001: counted, the test asserts on it
        return repr(e)[:120]


def flood(key: str, stop: threading.Event, results: list) -> None:
    """One client of the load: long prompts, one after another until `stop`."""
    while not stop.is_set():
        results.append(long_prompt(key))


def clients_for_backlog(key: str, seconds: float) -> tuple[int, float]:
    """How many flood() clients keep about `seconds` of prefill queued before any new request on this
    machine, from one long prompt timed alone (the pair's own speed, not a count tuned to one machine),
    and that prompt's seconds. At least 8: the queue must stay deep while a client's next prompt is sent."""
    took = []
    for _ in range(2):  # the faster of two: a first long prompt may pay a one-time cost
        t0 = time.monotonic()
        status = long_prompt(key)
        took.append(time.monotonic() - t0)
        assert status == 200, status
    alone = min(took)
    return max(8, min(96, math.ceil(seconds / alone))), alone


def test_a_busy_real_pair_whose_probe_waits_behind_long_prompts_is_not_restarted(real_deploy, capsys):
    """Clients keep the real head's queue full of 7000-token prompts, about 30 s of prefill on this
    machine (vLLM schedules the running requests' prefill, max_num_batched_tokens a step, before any
    new request), so the watchdog's one-token probe waits behind them past watchdog_probe_timeout_s
    (5 s, six times less) at every probe, while the engine's own counters rise. The watchdog must
    call that busy, never a failure: no restart, and the probe passes again once the load stops. The start-up grace (300 s here) would
    hide the verdict, so for this test the head's watchdog runs with its grace at 0 (its config
    restored after, byte for byte: the deploy that follows changes nothing)."""
    wait_watchdog_settled(REAL_RECOVERY_BOUND_S)  # the drill before may still be ending its restart
    config = "/etc/sparkfleet/watchdog.json"
    original = on(HEAD, f"cat {config}")
    settings = json.loads(original)
    assert settings["progress_metrics"]["path"] == "/metrics", settings
    key = on(HEAD, "cat /etc/sparkfleet/api-key").strip()
    count, alone = clients_for_backlog(key, 30.0)
    on(HEAD, f"python3 -c \"import json; p='{config}'; c=json.load(open(p)); c['startup_grace_s']=0; "
             f"json.dump(c, open(p, 'w'))\" && systemctl restart sparkfleet-watchdog")
    started = container_started(HEAD)
    stop, results = threading.Event(), []
    clients = [threading.Thread(target=flood, args=(key, stop, results), daemon=True) for _ in range(count)]
    since = time.time()
    try:
        wait_journal(HEAD, since, "probe ok", timeout=60)  # the restarted watchdog's first probe
        for c in clients:
            c.start()
        # At least two probes' worth of failures_before_restart (2 x 2 probes, 5 s apart, each up to 5 s)
        # in a row, and the watchdog has said the pair is busy.
        journal = wait_journal(HEAD, since, "busy, not judged", timeout=180)
        # Then four more probes judged busy (a state, not a time: each probe's record in the saved state),
        # twice failures_before_restart in a row: a verdict of failure would have restarted the pair.
        wait_busy_probes(4, timeout=8 * (settings["interval_s"] + settings["probe_timeout_s"]))
        journal = watchdog_journal(HEAD, since)
    finally:
        stop.set()
        on(HEAD, f"cat > {config} <<'EOF'\n{original.rstrip(chr(10))}\nEOF\nchmod 600 {config}")
        for c in clients:
            if c.ident is not None:  # started
                c.join(timeout=600)
        on(HEAD, "systemctl restart sparkfleet-watchdog")
    assert on(HEAD, f"cat {config}") == original
    # Busy: counters that rose since the last probe, or (an engine step outlasting a probe interval on
    # a loaded machine) counters flat for less than watchdog_stall_s; at least one probe saw them rise.
    busy = [line for line in journal.splitlines() if "busy, not judged" in line
            and "the engine made progress: its token and request counters rose by" in line]
    assert busy, journal
    assert "restarting the pair" not in journal and "probe failed 2/2" not in journal, journal
    assert container_started(HEAD) == started, "the head was restarted under load"
    served = sum(1 for r in results if r == 200)
    assert served >= count and all(r == 200 for r in results), results[:20]
    wait_journal(HEAD, since, "probe ok", timeout=120)
    report(capsys, f"busy pair: {count} clients (one prompt alone took {alone:.1f} s), {served} prompts of "
                   f"7000 tokens served; the watchdog said busy "
                   f"{len(busy)} time(s), restarted nothing: {busy[0].split('probe failed ')[-1][:160]}",
           "busy pair", None, f"{count} clients of random 7000-token prompts: no restart; "
           f"{busy[0].split('probe failed ', 1)[-1]}")


@pytest.mark.parametrize("key", ["d", "e"])
def test_after_a_reboot_or_a_power_cut_the_real_pair_serves_again_without_a_deploy(real_deploy, key, capsys):
    took, since = run_drill(key, REAL_RECOVERY_BOUND_S, SERVED, outage_first=True)
    for host in (HEAD, WORKER):
        assert on(host, "systemctl is-enabled sparkfleet-watchdog " + UNITS[host]).split() == ["enabled", "enabled"]
    # Whether the ranks met by themselves or the watchdog restarted them, the journal says which.
    head = wait_journal(HEAD, since, "probe ok", "the pair serves again after", timeout=REAL_RECOVERY_BOUND_S)
    seen = first_line(head, "probe failed") or first_line(head, "grace") or first_line(head, "probe ok")
    report(capsys, f"{DRILLS[key].what}: serving again after {took:.1f} s, the boot included "
                   f"(bound {REAL_RECOVERY_BOUND_S} s)", DRILLS[key].what, took,
           ("probe failed" + seen.split("probe failed", 1)[-1]) if "probe failed" in seen else seen)


def wait_busy_probes(count: int, timeout: float) -> None:
    """Until the head's watchdog has saved `count` more probes (each its own `at`), every one judged busy."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < count:
        probe = json.loads(on(HEAD, "cat /var/lib/sparkfleet/watchdog/state.json")).get("last_probe") or {}
        if probe.get("at") and probe.get("at") not in seen:
            assert probe.get("ok") or probe.get("kind") == "busy", f"a probe judged neither ok nor busy: {probe}"
            seen.add(probe["at"])
        assert time.monotonic() < deadline, f"{len(seen)} of {count} probes saved in {timeout} s"
        time.sleep(1)


def container_started(host: str) -> float:
    """The epoch its rank's container started at (0 when none runs)."""
    out = on(host, f"docker inspect --format '{{{{.State.StartedAt}}}}' {UNITS[host]} 2>/dev/null || true").strip()
    if not out:
        return 0.0
    return float(on(host, f"date -d {out} +%s.%N").strip())


def test_a_worker_that_dies_while_the_pair_starts_does_not_leave_the_head_hung(real_deploy, capsys):
    """Found by running the real engine: a worker that fails while the head is starting leaves the
    real vLLM head waiting for it for over ten minutes, deaf to SIGTERM. The watchdog must see the
    worker restarted alone during the start-up grace, restart the pair at once (the head's container
    killed after its stop timeout), and the pair must serve again, with no deploy."""
    def inject():
        signal_engine(WORKER, "KILL")  # the watchdog restarts the pair ...
        deadline = time.monotonic() + REAL_RECOVERY_BOUND_S
        while container_started(HEAD) < since_epoch:  # ... and its new head is starting:
            assert time.monotonic() < deadline, "the watchdog never restarted the head"
            time.sleep(1)
        assert on(HEAD, "curl -s -o /dev/null -w '%{http_code}' -m 3 http://127.0.0.1:18000/health || true").strip() != "200"
        signal_engine(WORKER, "KILL")  # the worker dies during the pair's start-up

    since_epoch = time.time()
    took, since = run_drill("startup", REAL_RECOVERY_BOUND_S, SERVED, inject, outage_first=True)
    head = wait_journal(HEAD, since, "the pair serves again after", timeout=REAL_RECOVERY_BOUND_S)
    report(capsys, f"worker killed during the pair's start-up: serving again after {took:.1f} s "
                   f"(bound {REAL_RECOVERY_BOUND_S} s)", "worker killed during the watchdog's restart", took,
           first_line(head, "restart", "failed") or first_line(head, WORKER, "does not exist"))
    assert head.count("restarting the pair") >= 2, head  # once for the first kill, again during the start
    # the first kill is the dead-worker drill: the head's probe failed naming the worker
    assert [line for line in head.splitlines() if "probe failed" in line and WORKER in line], head
    # what it saw of the worker during the start: its container gone, stopped, or restarted by systemd
    assert any(seen in head for seen in ("container sparkfleet-worker does not exist", "not running",
                                         "container restarted on its own")), head


def test_a_deploy_whose_worker_dies_while_the_pair_starts_stops_at_once_and_says_so(real_deploy, capsys):
    """The deploy's side of the same fault: its wait for the head's /health would spend the whole
    serving_health_timeout_s on a head that can never finish; it must stop as soon as the worker's
    engine is gone, naming the worker, and a re-run must bring the pair back."""
    for host in (HEAD, WORKER):  # nothing but the deploy may restart the pair here
        on(host, "systemctl stop sparkfleet-watchdog")
    on(HEAD, "systemctl stop sparkfleet-head")  # the deploy finds the pair down and restarts it
    since, result = time.time(), {}
    thread = threading.Thread(target=lambda: result.setdefault("run", deploy(inventory=REAL_INVENTORY)))
    thread.start()
    deadline = time.monotonic() + REAL_RECOVERY_BOUND_S
    while container_started(HEAD) < since:  # the deploy started the head: now the worker dies
        assert time.monotonic() < deadline and thread.is_alive(), result
        time.sleep(1)
    killed = time.monotonic()
    signal_engine(WORKER, "KILL")
    thread.join(REAL_RECOVERY_BOUND_S)
    run: Run = result["run"]
    took = time.monotonic() - killed
    assert run.returncode != 0, run.output[-5000:]
    assert f"{WORKER}: the worker's engine exited while the pair was starting" in run.output, run.output[-5000:]
    assert took < 120, f"the deploy took {took:.0f} s to stop after the worker died"
    # The five parts: the worker, what the deploy was waiting for, the worker's journal (as printed, run
    # against the worker), the key, the next step.
    lost = run.failure(WORKER, "serving_profile", form="block")
    assert lost.what.startswith("the worker's engine exited while the pair was starting (") and \
        f"{HEAD} cannot finish starting without it" in lost.what, lost
    assert lost.waited_for.startswith("the head's /health while the pair started (the worker's container: "), lost
    assert lost.log == f"ssh root@{management_address(WORKER)} 'journalctl -u sparkfleet-worker -n 200 --no-pager'"
    assert lost.next_step.endswith("then re-deploy: a re-run restarts the pair"), lost.next_step
    read_failure_log(lost)
    # The watchdogs were stopped by hand before the run, so it paused none and says none stays paused.
    assert "stays paused" not in run.output, run.output[-5000:]
    report(capsys, f"deploy, worker killed during the pair's start-up: the deploy stopped {took:.1f} s later, naming it",
           "worker killed during a deploy's restart", took,
           first_line(run.output, "the worker's engine exited while the pair was starting"))
    again = deploy(inventory=REAL_INVENTORY)
    assert again.returncode == 0, again.output[-5000:]
    wait_serving(time.monotonic(), REAL_RECOVERY_BOUND_S, SERVED)


def test_after_the_drills_a_deploy_changes_nothing(real_deploy):
    wait_serving(time.monotonic(), REAL_RECOVERY_BOUND_S, SERVED)
    wait_watchdog_settled(REAL_RECOVERY_BOUND_S)
    state = json.loads(on(HEAD, "cat /var/lib/sparkfleet/watchdog/state.json"))
    assert not state.get("gave_up"), state
    run = deploy(inventory=REAL_INVENTORY)
    assert run.returncode == 0 and run.changed() == [], run.output[-8000:]
    assert "restarts the pair (generation" in watchdog_journal(WORKER, 0)
