"""The lab pair end to end: serving through the stand-in, repair after a hand-stopped container (and
the benchmark receipt that restart leaves, shown by `make status`), and a recipe bump that rebuilds
once, ships only new layers over the fabric, restarts worker-first; the run-time failures no other
lab module provokes (the head's /health wait, the image push and pull) each say their five parts,
and a re-run lands the change.

Runs after test_lab_fabric.py (same lab, pair already deployed by it).
"""

import json
import re
import secrets
import time

import pytest

from sparkfleet.model.serving import load_profile
from tests.e2e.lab import CA_BUNDLE, HOSTS, REPO, deploy, fabric_rx_bytes, head_api, management_address, models_command, \
    on, pause_watchdogs, plan, read_failure_log, run, run_printed, running_tag, state_checks
from tests.e2e.plan_conformance import operations_mismatches, starts_in_background

pytestmark = pytest.mark.lab

COMMITS = dict(line.split() for line in (REPO / "lab/recipe/COMMITS").read_text().splitlines() if line.strip())
IMAGE = "sparkfleet/glm-5.3-flash-exl3"
RECEIPTS = "/var/lib/sparkfleet/receipts/glm-5.3-flash-exl3"


def receipts() -> list[str]:
    """The head's receipt files of the lab's profile, oldest first."""
    return sorted(on("spark-a", f"ls -1 {RECEIPTS} 2>/dev/null || true").split())


def models() -> str:
    return on("spark-a", models_command())


def started_at(host: str, container: str) -> str:
    return on(host, f"docker inspect --format '{{{{.State.StartedAt}}}}' {container}").strip()


@pytest.fixture(scope="module", autouse=True)
def serving_pair():
    run = deploy(receipt=True)  # this module's deploys take the benchmark receipt (tests/e2e/lab.py NO_RECEIPT)
    assert run.returncode == 0, run.output
    yield


def test_the_pair_serves_the_profile_model_through_the_stand_in():
    assert '"id": "glm-5.3-flash"' in models()


def test_capture_of_the_deployed_pair_holds_no_key_and_replays_to_its_plan(tmp_path):
    """`make capture` on the settled pair (issue 41): every node's facts in one bundle, 0600, no secret in
    it (the contents of every root-only key, token and key-derived file the nodes hold, line by line), and
    the bundle replayed through the deploy's own readers gives the live plan: nothing to do."""
    from sparkfleet import capture
    from tools.replay import replay_plan

    out = tmp_path / "bundle.json"
    result = run([str(REPO / ".venv/bin/python"), "-m", "sparkfleet", "capture", "lab/inventory.py", "--out", str(out)])
    assert result.returncode == 0, result.output
    assert "nothing was changed" in result.output and (out.stat().st_mode & 0o777) == 0o600
    text = out.read_text()
    secrets_seen = 0
    for host in ("spark-a", "spark-b"):
        files = on(host, "find /etc/sparkfleet /etc/sparkfleet-router -maxdepth 1 -type f "
                         "\\( -name '*key*' -o -name '*token*' -o -name '*.env' \\) 2>/dev/null || true").split()
        for path in files:
            for line in on(host, f"cat {path}").splitlines():
                value = line.split("=", 1)[-1].split(" ")[-1].strip().strip('"')
                if len(value) >= 16 and any(c.isdigit() for c in value) and any(c.isalpha() for c in value):
                    secrets_seen += "key" in path
                    assert value not in text, f"{host}:{path}'s value is in the capture bundle"
    # the head's key, api-key.curl and api-key.haproxy (the engine's own api-key.env and .yaml are gone:
    # issue 43 item 7); a router's key files when an earlier module left one (tests/e2e/test_lab_keys.py)
    assert secrets_seen >= 3, "the head's key and its derived files were held against the bundle"
    bundle = capture.load(out)
    assert {h: bool(r) for h, r in bundle["nodes"].items()} == {"spark-a": True, "spark-b": True}
    assert replay_plan(bundle, "lab/inventory.py")["pair"].summary.actions() == []


def code(command: str) -> str:
    return on("spark-a", f"{command} --cacert {CA_BUNDLE} -sS -m 10 -o /dev/null -w '%{{http_code}}' {head_api()}/v1/models")


def test_the_api_needs_the_key_and_a_new_key_is_taken_by_the_proxy_with_the_pair_serving():
    assert code("curl") == "401" and code("curl -K /etc/sparkfleet/api-key.curl") == "200"
    # A key file anyone may read stops the deploy at prepare, naming owner and mode; nothing changes.
    on("spark-a", "chmod 0644 /etc/sparkfleet/api-key")
    refused = deploy()
    on("spark-a", "chmod 0600 /etc/sparkfleet/api-key")
    assert refused.returncode != 0
    assert "serving_api_key_file /etc/sparkfleet/api-key is owned by root with mode 644" in refused.output
    assert "Traceback" not in refused.output
    # A new key (the operator rotates it): the API proxy reloads with it and the old one is refused;
    # the engine holds no key (issue 43 item 7), so the pair is not restarted: its containers are the
    # ones that ran before.
    started = {h: started_at(h, c) for h, c in (("spark-a", "sparkfleet-head"), ("spark-b", "sparkfleet-worker"))}
    old = on("spark-a", "cat /etc/sparkfleet/api-key").strip()
    new = f"rotated-key-{secrets.token_hex(12)}"  # new on every run, on a lab used before too
    on("spark-a", f"printf '%s\\n' {new} > /etc/sparkfleet/api-key")
    run = deploy()
    assert run.returncode == 0, run.output
    assert "the API key is new or changed" not in run.output
    assert old not in run.output and new not in run.output
    assert "/etc/sparkfleet/api-key on spark-a (root-only" in run.output
    # No more than a rotation needs: the derived key files and the proxy's reload; nothing built,
    # shipped, fetched, warmed, re-firewalled or restarted.
    ops = run.changed()
    assert not [op for op, _ in ops if op.startswith(("Build", "Pull", "Push", "Fetch", "Send", "Prewarm", "Apply",
                                                       "Start the head", "Restart the workers", "Stop the head"))], ops
    assert ("Reload sparkfleet-api-proxy (its config, the API key or its certificate changed)", "spark-a") in ops, ops
    assert {h: started_at(h, c) for h, c in (("spark-a", "sparkfleet-head"), ("spark-b", "sparkfleet-worker"))} == started
    assert code(f"curl -H 'Authorization: Bearer {new}'") == "200"
    assert code(f"curl -H 'Authorization: Bearer {old}'") == "401"
    # The engine's own key files an earlier sparkfleet wrote are gone, and the container has no key.
    assert on("spark-a", "ls /etc/sparkfleet/api-key.env /etc/sparkfleet/api-key.yaml 2>/dev/null || true").strip() == ""
    env = on("spark-a", "docker inspect --format '{{json .Config.Env}}' sparkfleet-head")
    assert "VLLM_API_KEY" not in env and new not in env and old not in env


def test_a_hand_stopped_worker_is_caught_and_the_pair_is_brought_back():
    # The watchdog paused, and the unit stopped (a container stopped alone comes back by Restart=always).
    pause_watchdogs()
    on("spark-b", "systemctl stop sparkfleet-worker")
    # The serving checks only (the failure looked for is theirs; the whole state is checked once the
    # deploy has brought the pair back, below): the rest would cost half a minute to say "passed".
    checks = state_checks(path="tests/state/test_serving.py")
    assert checks.returncode != 0
    assert "FAILED tests/state/test_serving.py::test_the_rank_container_runs_the_profile_image[ssh://spark-b]" in checks.output
    assert "spark-b: no container sparkfleet-worker" in checks.output or "spark-b: sparkfleet-worker is not active" in checks.output

    before = receipts()
    run = deploy(receipt=True)
    assert run.returncode == 0, run.output
    assert ("Restart the workers (workers first)", "spark-b") in run.changed()
    assert ("Start the head (every worker is up)", "spark-a") in run.changed()
    assert state_checks().returncode == 0

    # The restart left one new benchmark receipt on the head, measured through the API with the key.
    after = receipts()  # receipt_keep may have removed the oldest
    [new] = [name for name in after if name not in before]
    receipt = json.loads(on("spark-a", f"cat {RECEIPTS}/{new}"))
    assert (receipt["profile"], receipt["recipe_commit"]) == ("glm-5.3-flash-exl3", COMMITS["v1"])
    assert receipt["image_id"] == on("spark-a", f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}:{COMMITS['v1']}").strip()
    assert [f["concurrency"] for f in receipt["figures"]] == [1, 4]
    assert all(f["decode_tps_aggregate"] > 0 and f["ttft_ms"] > 0 for f in receipt["figures"])
    assert receipt["cold_start_s"] > 0  # measured (units started -> first token); no bound on it here
    assert f"kept in {RECEIPTS}/{new}" in run.output and "decode t/s aggregate" in run.output

    # Nothing more to do: the plan says so (a deploy that restarts nothing, and takes no receipt:
    # test_a_recipe_bump_..., at its end).
    planned = plan()
    assert planned.returncode == 0 and "  pair: nothing to do (serving)\n" in planned.output, planned.output


def test_status_shows_the_latest_receipt_against_the_previous_one_and_flags_a_drop():
    *_, older, newest = receipts()
    status = run_pyinfra("status.py")
    assert status.returncode == 0, status.output
    assert f"receipt   spark-a    receipt {json.loads(on('spark-a', f'cat {RECEIPTS}/{newest}'))['taken_at']}" in status.output
    assert "previous receipt " + json.loads(on("spark-a", f"cat {RECEIPTS}/{older}"))["taken_at"] in status.output
    # A previous receipt 10x faster than the latest (planted just before it): every figure is a drop.
    planted = newest.replace("Z.json", "Y.json")  # sorts between the two
    boost = ("import json,sys; r=json.load(sys.stdin); "
             "[f.update(decode_tps_per_request=f['decode_tps_per_request']*10, decode_tps_aggregate=f['decode_tps_aggregate']*10)"
             " for f in r['figures']]; json.dump(r, sys.stdout)")
    on("spark-a", f"python3 -c \"{boost}\" < {RECEIPTS}/{newest} > {RECEIPTS}/{planted}")
    try:
        flagged = run_pyinfra("status.py")
        assert flagged.returncode == 0, flagged.output
        assert "DROP at concurrency 1: decode t/s per request" in flagged.output
        assert "DROP at concurrency 4: decode t/s aggregate" in flagged.output and "threshold 10 %" in flagged.output
    finally:
        on("spark-a", f"rm -f {RECEIPTS}/{planted}")


def test_a_recipe_bump_stops_on_an_unpinned_default_until_pinned_then_ships_only_new_layers():
    v1, v2 = COMMITS["v1"], COMMITS["v2"]
    bump = ("--data", f"serving_recipe_commit={v2}")
    remove_v2_images()  # a lab this module ran on before holds v2: it is built and shipped again below

    # v2's start.sh flips CG_ESTIMATE (pinned by the profile) and KV_SLOTMAP_PIN (pinned nowhere).
    stopped = deploy(*bump)
    assert stopped.returncode != 0
    assert "CG_ESTIMATE: 0 -> 1 (pinned by sparkfleet to 0)" in stopped.output
    assert "KV_SLOTMAP_PIN: 0 -> 1 (NOT pinned)" in stopped.output
    assert not [op for op, _ in stopped.changed() if op.startswith(("Build", "Pull", "Restart", "Start"))]
    assert running_tag("spark-b", "sparkfleet-worker") == f"{IMAGE}:{v1}"
    assert '"id": "glm-5.3-flash"' in models()  # the pair still serves v1

    # Pinned in data, the bump proceeds: built once, only the new layer crosses, worker first.
    pinned = (*bump, "--data", 'serving_env_pins={"KV_SLOTMAP_PIN": "1"}')
    # `sparkfleet plan` first: the group's build, ship, warm and restart, and why; nothing changed.
    planned = plan(*pinned)
    assert planned.returncode == 2, planned.output
    assert (f"  pair: build {IMAGE}:{v2}; ship image -> spark-b; warm the kernel caches (prewarm); restart the group "
            f"(image {IMAGE}:{v2} is new or differs between nodes; ") in planned.output, planned.output
    assert "spark-b: /etc/sparkfleet/sparkfleet-worker.env changed" in planned.output
    assert running_tag("spark-b", "sparkfleet-worker") == f"{IMAGE}:{v1}"
    base_size = int(on("spark-a", f"docker image inspect --format '{{{{.Size}}}}' {IMAGE}:{v1}"))
    rx_before = fabric_rx_bytes("spark-b")
    run = deploy(*pinned)
    assert run.returncode == 0, run.output
    changed = run.changed()
    assert operations_mismatches(planned.output, changed) == [], planned.output  # it did what the plan said
    assert (f"Build {IMAGE}:{v2} on the head", "spark-a") in changed
    assert (f"Pull {IMAGE}:{v2} from the head", "spark-b") in changed
    assert f"image {IMAGE}:{v2} is new" in run.output  # the deploy says what changed
    shipped = fabric_rx_bytes("spark-b") - rx_before
    # v2 adds one small layer on top of v1's: the base layers (hundreds of MB) do not cross again.
    assert shipped < base_size / 20, f"{shipped} bytes crossed the fabric for a {base_size}-byte image"
    assert started_at("spark-b", "sparkfleet-worker") < started_at("spark-a", "sparkfleet-head")
    assert "KV_SLOTMAP_PIN=1" in on("spark-b", "cat /etc/sparkfleet/sparkfleet-worker.env")
    assert '"id": "glm-5.3-flash"' in models()

    assert plan(*pinned).returncode == 0  # the deploy did what the plan said, and nothing is left to do
    again = deploy(*pinned)
    assert again.returncode == 0 and again.changed() == [], again.output

    # Rollback: one command, back to v1's image (kept on every node), nothing rebuilt or pulled.
    back = run_rollback(*pinned)
    assert back.returncode == 0, back.output
    assert f"recipe {v2} -> {v1}" in back.output
    assert not [op for op, _ in back.changed() if op.startswith(("Build", "Pull"))], back.output
    assert running_tag("spark-b", "sparkfleet-worker") == f"{IMAGE}:{v1}"
    assert running_tag("spark-a", "sparkfleet-head") == f"{IMAGE}:{v1}"
    assert '"id": "glm-5.3-flash"' in models()

    # The data still says v1 without pins: a plain deploy settles there and the checks pass.
    plain = deploy()
    assert plain.returncode == 0, plain.output
    assert state_checks().returncode == 0
    # A deploy that restarts nothing takes no benchmark receipt.
    kept = receipts()
    unchanged = deploy(receipt=True)
    assert unchanged.changed() == [] and receipts() == kept, unchanged.output
    assert "Take the benchmark receipt" not in [op for op, _, result in unchanged.results() if result != "No changes"]


def run_pyinfra(entry, *extra):
    from tests.e2e.lab import BIN, INVENTORY, run

    return run([str(BIN / "pyinfra"), "-y", INVENTORY, entry, *extra])


def run_rollback(*extra):
    return run_pyinfra("rollback.py", *extra)


REGISTRY = "198.19.77.1:5000"  # the head's fabric address and docker_registry_port (the default)
MASTER_PORT = load_profile("glm-5.3-flash-exl3").master_port  # the head's rendezvous port, every rank dials it
HEALTH_LIMIT = 10  # serving_health_timeout_s's floor (sparkfleet/model/serving.py: ge=10)
BLOCK = "sfl_test_refuse"  # an nftables table of this test's own: sparkfleet's firewall never touches it


def refuse_outgoing(host: str, port: int) -> None:
    """Every new TCP connection `host` opens to `port` refused at once (its SYN answered by a reset:
    "connection refused", no timeout to wait out), as when the service there is down; connections
    already open are left alone (the serving pair's own, until the deploy restarts it). Docker's pulls
    and pushes and the engines' rendezvous run in the host's network namespace: its output hook sees them."""
    on(host, f"nft add table inet {BLOCK} && nft add chain inet {BLOCK} out "
             f"'{{ type filter hook output priority 0; policy accept; }}' && "
             f"nft add rule inet {BLOCK} out 'tcp dport {port} tcp flags & (syn | ack) == syn reject with tcp reset'")


def allow_outgoing(host: str) -> None:
    on(host, f"nft delete table inet {BLOCK} 2>/dev/null || true")


def watchdog(host: str) -> str:
    return on(host, "systemctl is-active sparkfleet-watchdog", check=False).strip()


def wait_models(timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while '"id": "glm-5.3-flash"' not in on("spark-a", f"{models_command()} || true", check=False):
        assert time.monotonic() < deadline, f"the pair did not serve within {timeout_s} s"
        time.sleep(1)


def test_a_health_wait_a_push_and_a_pull_that_fail_say_their_five_parts_and_a_rerun_lands_the_change():
    """Issue 45 item 5: each failure provoked on the node, fast (a refused connection; the one wait that
    can only time out, /health, at its floor), says the host, what was waited for, the log command
    (run as printed, on that node), the key and the next step. Four deploys and a restoring one:
    1. a changed rank unit restarts the pair (serving_ulimit_memlock: a docker option, in no compile
       key, so nothing else moves; a rotated key no longer restarts it), the worker refused the head's
       rendezvous port: /health never 200; the run had paused the watchdogs (step 7c) and says they
       stay paused, and they do;
    2. a change that needs a new image (v2, pinned as the bump above), the head's connections to its
       own registry refused: the push fails, after the build;
    3. the same, the worker's connections to the registry refused: the push passes, the pull fails,
       and the check the next step prints shows why;
    4. the same, nothing refused: v2 lands, and the watchdogs run again;
    then v1 again (finally, whatever failed), as the module's other tests expect."""
    v1, v2 = COMMITS["v1"], COMMITS["v2"]
    pinned = ("--data", f"serving_recipe_commit={v2}", "--data", 'serving_env_pins={"KV_SLOTMAP_PIN": "1"}')
    # A backstop only: refused connections fail in seconds; were docker to retry, 60 s, not an hour.
    backstop = ("--data", "image_push_timeout_s=60", "--data", "image_pull_timeout_s=60")
    head_at, worker_at = management_address("spark-a"), management_address("spark-b")
    assert [watchdog(h) for h in HOSTS] == ["active", "active"], "the watchdogs must run for step 1's pause"
    try:
        # 1. The head's /health.
        refuse_outgoing("spark-b", MASTER_PORT)
        try:
            unhealthy = deploy("--data", f"serving_health_timeout_s={HEALTH_LIMIT}", "--data", 'serving_ulimit_memlock="4194304"')
        finally:
            allow_outgoing("spark-b")
        assert unhealthy.returncode != 0, unhealthy.output
        assert ("Start the head (every worker is up)", "spark-a") in unhealthy.changed()
        health = unhealthy.failure("spark-a", "serving_health_timeout_s", form="block")
        assert health.what.startswith(f"/health not 200 after {HEALTH_LIMIT} s (last: "), health
        assert health.waited_for == f"the head's /health to answer 200 (up to {HEALTH_LIMIT} s)"
        assert health.log == f"ssh root@{head_at} 'journalctl -u sparkfleet-head -n 200 --no-pager'"
        assert f"raise serving_health_timeout_s (now {HEALTH_LIMIT})" in health.next_step, health.next_step
        read_failure_log(health)
        # It stopped between the watchdogs' pause and their start: it says so last, and it is so.
        assert "sparkfleet-watchdog stays paused on spark-a, spark-b: this deploy stopped it" in unhealthy.output, \
            unhealthy.output[-6000:]
        for host in HOSTS:
            assert f"    ssh root@{management_address(host)} 'systemctl status sparkfleet-watchdog'" in unhealthy.output
        assert [watchdog(h) for h in HOSTS] == ["inactive", "inactive"]
        wait_models()  # the worker, let through, joins the head: the pair serves again

        # 2. The push.
        remove_v2_images()  # built and shipped again (the bump above left v2 on both nodes)
        refuse_outgoing("spark-a", int(REGISTRY.rsplit(":", 1)[1]))
        try:
            started = time.monotonic()
            unpushed = deploy(*pinned, *backstop)
            took = time.monotonic() - started
        finally:
            allow_outgoing("spark-a")
        assert unpushed.returncode != 0, unpushed.output
        assert (f"Build {IMAGE}:{v2} on the head", "spark-a") in unpushed.changed()
        remote = f"{REGISTRY}/{IMAGE}:{v2}"
        pushing = unpushed.failure("spark-a", "docker_registry_port", form="block")
        assert pushing.what == f"pushing {remote} failed" and pushing.waited_for == f"docker push of {remote} to the head's registry"
        assert pushing.log == f"ssh root@{head_at} 'journalctl -u docker-registry -n 200 --no-pager'"
        assert f"listens on {REGISTRY} (ssh root@{head_at} 'systemctl status docker-registry')" in pushing.next_step
        read_failure_log(pushing)
        # Under the block, docker's words and the push's own line: refused, not stopped at its limit.
        line = unpushed.failure("spark-a", "docker_registry_port", form="line")
        assert line.waited_for == f'"Push {IMAGE}:{v2} to the fabric registry"' and line.what.startswith("failed (exit status")
        assert "connection refused" in unpushed.output
        assert not [op for op, _ in unpushed.changed() if op.startswith(("Pull", "Prewarm", "Restart", "Start"))
                    and not starts_in_background(op)]  # the build's start (step 2d) is no start of the pair
        assert "stays paused" not in unpushed.output  # it paused nothing (the images come before step 7c)
        print(f"\nrefused push: the deploy stopped after {took:.1f} s")

        # 3. The pull.
        refuse_outgoing("spark-b", int(REGISTRY.rsplit(":", 1)[1]))
        try:
            unpulled = deploy(*pinned, *backstop)
            pulling = unpulled.failure("spark-b", "docker_registry_port", form="block")
            reach = re.search(r"\((ssh root@\S+ 'curl -sS http://[^']+/v2/') answers \{\}\)", pulling.next_step)
            assert reach, pulling.next_step
            assert run_printed(reach[1], "spark-b").returncode != 0  # the check it prints shows the cause ...
        finally:
            allow_outgoing("spark-b")
        assert run_printed(reach[1], "spark-b").stdout.strip() == "{}"  # ... and its end
        assert unpulled.returncode != 0, unpulled.output
        changed = unpulled.changed()
        assert (f"Push {IMAGE}:{v2} to the fabric registry", "spark-a") in changed
        assert (f"Build {IMAGE}:{v2} on the head", "spark-a") not in changed  # the first run's build kept
        assert pulling.what.startswith(f"pulling {REGISTRY}/{IMAGE}@sha256:") and pulling.what.endswith(" failed")
        assert pulling.waited_for.startswith(f"docker pull of {REGISTRY}/{IMAGE}@sha256:")
        assert pulling.log == f"ssh root@{worker_at} 'journalctl -u docker -n 200 --no-pager'"
        assert f"(ssh root@{head_at} 'systemctl status docker-registry')" in pulling.next_step
        read_failure_log(pulling)
        line = unpulled.failure("spark-b", "docker_registry_port", form="line")
        assert line.waited_for == f'"Pull {IMAGE}:{v2} from the head"' and line.what.startswith("failed (exit status")
        # the pull ran in the background from its start (step 5) to the wait that failed (7d): nothing after
        assert not [op for op, _ in changed if op.startswith(("Prewarm", "Restart", "Start"))
                    and not starts_in_background(op)], changed
        assert running_tag("spark-b", "sparkfleet-worker") == f"{IMAGE}:{v1}"

        # 4. The re-run the next steps ask for lands the change.
        landed = deploy(*pinned)
        assert landed.returncode == 0, landed.output
        assert (f"Pull {IMAGE}:{v2} from the head", "spark-b") in landed.changed()
        assert (f"Build {IMAGE}:{v2} on the head", "spark-a") not in landed.changed()
        for host, container in (("spark-a", "sparkfleet-head"), ("spark-b", "sparkfleet-worker")):
            assert running_tag(host, container) == f"{IMAGE}:{v2}"
        assert '"id": "glm-5.3-flash"' in models()
        assert [watchdog(h) for h in HOSTS] == ["active", "active"]  # found stopped, started at its end
    finally:
        for host in HOSTS:
            allow_outgoing(host)
        # Back to v1 (from v2, KV_SLOTMAP_PIN 1 -> 0 unpinned: acknowledged, as test_lab_rollback.py does).
        back = deploy("--data", 'recipe_drift_acknowledged=["KV_SLOTMAP_PIN"]')
        assert back.returncode == 0, back.output
        for host, container in (("spark-a", "sparkfleet-head"), ("spark-b", "sparkfleet-worker")):
            assert running_tag(host, container) == f"{IMAGE}:{v1}"


def remove_v2_images():
    for host in HOSTS:
        on(host, f"docker image rm {IMAGE}:{COMMITS['v2']} {REGISTRY}/{IMAGE}:{COMMITS['v2']} >/dev/null 2>&1 || true")


def test_a_unit_of_the_other_role_is_removed():
    # As after a rank swap: the head still has a worker unit from its old role.
    on("spark-a", "cp /etc/systemd/system/sparkfleet-head.service /etc/systemd/system/sparkfleet-worker.service"
                  " && systemctl daemon-reload")
    run = deploy()
    assert run.returncode == 0, run.output
    assert run.changed() == [("Remove the unit of the other role", "spark-a")]
    assert on("spark-a", "test -e /etc/systemd/system/sparkfleet-worker.service || echo gone").strip() == "gone"
    # The units' checks: nothing but a unit file changed since the whole state last passed (above).
    assert state_checks(path="tests/state/test_serving.py").returncode == 0
