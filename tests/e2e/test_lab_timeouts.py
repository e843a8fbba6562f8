"""Every external command bounded, in the lab: a weights source that accepts connections and never
answers stops the deploy at weights_fetch_timeout_s, with the five parts of a run-time failure (the
host, the step, the log command, which shows the head's fetch log, the key to raise, the next step);
the pair keeps serving; a plain re-deploy succeeds and leaves nothing to change (the one after it, when it
repaired something, changes nothing).

Runs in the lab's order after the serving tests (same lab, pair deployed by them or by this module's
first fixture).
"""
import socket
import threading
import time

import pytest

from sparkfleet.model.serving import load_profile
from tests.e2e.lab import deploy, management_address, models_command, on, read_failure_log

pytestmark = pytest.mark.lab

BRIDGE = "198.18.0.1"  # the lab machine's address on the lab bridge: the nodes reach it
PORT = 8097  # unused by the lab (its models are on 8089)
LIMIT = 5
PROFILE = load_profile("glm-5.3-flash-exl3")
MODEL, SERVED = PROFILE.model, PROFILE.api_model_name


@pytest.fixture(scope="module", autouse=True)
def serving_pair():
    run = deploy()
    assert run.returncode == 0, run.output
    yield


@pytest.fixture
def black_hole():
    """An HTTP 'server' on the bridge that accepts every connection and never sends a byte."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((BRIDGE, PORT))
    sock.listen(16)
    sock.settimeout(0.2)
    held, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])  # held open, never answered
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://{BRIDGE}:{PORT}", held
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    sock.close()


def test_a_fetch_that_never_answers_stops_at_its_limit_the_pair_serves_and_a_rerun_repairs(black_hole):
    source, held = black_hole
    start = time.monotonic()
    run = deploy("--data", f"weights_source={source}", "--data", f"weights_fetch_timeout_s={LIMIT}")
    took = time.monotonic() - start
    assert run.returncode != 0, run.output
    assert held, "the head never connected to the black hole: the fetch did not run"
    # The five parts, in the one line the bounded fetch printed on the head.
    stopped = run.failure("spark-a", "weights_fetch_timeout_s", form="line")
    assert stopped.waited_for.startswith(f'"Fetch {MODEL} at ') and stopped.waited_for.endswith(f'({source})"')
    assert stopped.what == f"stopped after {LIMIT} s, its limit"
    log = f"/var/lib/sparkfleet/logs/weights-fetch-{MODEL.replace('/', '--')}.log"
    assert stopped.log == f"ssh root@{management_address('spark-a')} 'tail -n 200 {log}'", stopped.log
    assert "a re-run resumes" in stopped.next_step and "raise weights_fetch_timeout_s" in stopped.next_step
    # The log it names is on the head, root-only, and says why, though the client printed nothing.
    shown = read_failure_log(stopped)
    assert shown.splitlines()[-1].endswith(f"stopped after {LIMIT} s, its limit; log: {stopped.log}; "
                                           f"key: weights_fetch_timeout_s; next: {stopped.next_step}"), shown
    assert "stays paused" not in run.output  # the fetch comes before the watchdogs are paused (step 7c)
    # The run stopped at the fetch: nothing after it ran, on either node.
    assert not any(op.startswith("Send ") for op, _, _ in run.results()), run.output
    assert took < 300, f"the stopped deploy took {took:.0f} s"
    print(f"\nstopped deploy: {took:.1f} s (limit {LIMIT} s)")

    # The pair still serves what it served; the head's copy and manifest are untouched.
    assert f'"id": "{SERVED}"' in on("spark-a", models_command())
    assert "source: http://198.18.0.1:8089" in on("spark-a", f"cat /var/lib/sparkfleet/models/{MODEL}.manifest")

    run = deploy()
    assert run.returncode == 0, run.output
    if run.changed():  # the re-deploy repaired something: the one after it must find nothing left
        run = deploy()  # (one that changed nothing has shown that already: another would show it again)
        assert run.returncode == 0, run.output
    assert run.changed() == []
    assert f'"id": "{SERVED}"' in on("spark-a", models_command())
