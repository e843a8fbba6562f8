"""The lab pair end to end: serving through the stand-in, repair after a hand-stopped container (and
the benchmark receipt that restart leaves, shown by `make status`), and a recipe bump that rebuilds
once, ships only new layers over the fabric, restarts worker-first.

Runs after test_lab_fabric.py (same lab, pair already deployed by it).
"""

import json
import secrets

import pytest

from tests.e2e.lab import REPO, deploy, fabric_rx_bytes, on, pause_watchdogs, plan, run, running_tag, state_checks
from tests.e2e.plan_conformance import operations_mismatches

pytestmark = pytest.mark.lab

COMMITS = dict(line.split() for line in (REPO / "lab/recipe/COMMITS").read_text().splitlines() if line.strip())
IMAGE = "sparkfleet/glm-5.3-flash-exl3"
RECEIPTS = "/var/lib/sparkfleet/receipts/glm-5.3-flash-exl3"


def receipts() -> list[str]:
    """The head's receipt files of the lab's profile, oldest first."""
    return sorted(on("spark-a", f"ls -1 {RECEIPTS} 2>/dev/null || true").split())


def models() -> str:
    return on("spark-a", "curl -K /etc/sparkfleet/api-key.curl -fsS -m 10 http://127.0.0.1:8000/v1/models")


def started_at(host: str, container: str) -> str:
    return on(host, f"docker inspect --format '{{{{.State.StartedAt}}}}' {container}").strip()


@pytest.fixture(scope="module", autouse=True)
def serving_pair():
    run = deploy()
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
    assert secrets_seen >= 4, "the head's key and its derived files were held against the bundle"
    bundle = capture.load(out)
    assert {h: bool(r) for h, r in bundle["nodes"].items()} == {"spark-a": True, "spark-b": True}
    assert replay_plan(bundle, "lab/inventory.py")["pair"].summary.actions() == []


def code(command: str) -> str:
    return on("spark-a", f"{command} -sS -m 10 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:8000/v1/models")


def test_the_api_needs_the_key_and_a_new_key_restarts_the_head_with_it():
    assert code("curl") == "401" and code("curl -K /etc/sparkfleet/api-key.curl") == "200"
    # A key file anyone may read stops the deploy at prepare, naming owner and mode; nothing changes.
    on("spark-a", "chmod 0644 /etc/sparkfleet/api-key")
    refused = deploy()
    on("spark-a", "chmod 0600 /etc/sparkfleet/api-key")
    assert refused.returncode != 0
    assert "serving_api_key_file /etc/sparkfleet/api-key is owned by root with mode 644" in refused.output
    assert "Traceback" not in refused.output
    # A new key (the operator rotates it): the head restarts with it; the old one is refused.
    old = on("spark-a", "cat /etc/sparkfleet/api-key").strip()
    new = f"rotated-key-{secrets.token_hex(12)}"  # new on every run, on a lab used before too
    on("spark-a", f"printf '%s\\n' {new} > /etc/sparkfleet/api-key")
    run = deploy()
    assert run.returncode == 0, run.output
    assert "the API key is new or changed" in run.output
    assert old not in run.output and new not in run.output
    assert "/etc/sparkfleet/api-key on spark-a (root-only" in run.output
    # No more than a rotation needs: the derived key files, then the pair restarted once (a TP pair
    # restarts as one); nothing built, shipped, fetched, warmed or re-firewalled.
    ops = run.changed()
    assert not [op for op, _ in ops if op.startswith(("Build", "Pull", "Push", "Fetch", "Send", "Prewarm", "Apply"))], ops
    assert [h for op, h in ops if op == "Start the head (every worker is up)"] == ["spark-a"], ops
    assert code(f"curl -H 'Authorization: Bearer {new}'") == "200"
    assert code(f"curl -H 'Authorization: Bearer {old}'") == "401"


def test_a_hand_stopped_worker_is_caught_and_the_pair_is_brought_back():
    # The watchdog paused, and the unit stopped (a container stopped alone comes back by Restart=always).
    pause_watchdogs()
    on("spark-b", "systemctl stop sparkfleet-worker")
    checks = state_checks()
    assert checks.returncode != 0
    assert "FAILED tests/state/test_serving.py::test_the_rank_container_runs_the_profile_image[ssh://spark-b]" in checks.output
    assert "spark-b: no container sparkfleet-worker" in checks.output or "spark-b: sparkfleet-worker is not active" in checks.output

    before = receipts()
    run = deploy()
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
    unchanged = deploy()
    assert unchanged.changed() == [] and receipts() == kept, unchanged.output
    assert "Take the benchmark receipt" not in [op for op, _, result in unchanged.results() if result != "No changes"]


def run_pyinfra(entry, *extra):
    from tests.e2e.lab import BIN, INVENTORY, run

    return run([str(BIN / "pyinfra"), "-y", INVENTORY, entry, *extra])


def run_rollback(*extra):
    return run_pyinfra("rollback.py", *extra)


def test_a_unit_of_the_other_role_is_removed():
    # As after a rank swap: the head still has a worker unit from its old role.
    on("spark-a", "cp /etc/systemd/system/sparkfleet-head.service /etc/systemd/system/sparkfleet-worker.service"
                  " && systemctl daemon-reload")
    run = deploy()
    assert run.returncode == 0, run.output
    assert run.changed() == [("Remove the unit of the other role", "spark-a")]
    assert on("spark-a", "test -e /etc/systemd/system/sparkfleet-worker.service || echo gone").strip() == "gone"
    assert state_checks().returncode == 0
