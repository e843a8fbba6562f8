"""The real vLLM across the two lab hosts, from sparkfleet's own units: the deploy, its second run, the
state checks, a chat completion with the key, every route of the real app without it, the ranks on
the fabric, docs/first-pair.md's OpenAI-client example, the benchmark receipt, and the prewarm's
compile cache as production loads it.

One deploy (tests/real/conftest.py), then read-only checks of what it left; the drills that restart
the pair are tests/real/test_real_watchdog.py, after these.
"""
import datetime as dt
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from sparkfleet.model.api_proxy import OPEN_PATHS
from sparkfleet.progress import BYTES_FIGURE, read_progress
from tests.doc_examples import client_example
from tests.e2e.lab import CA_BUNDLE, HEAD, MANAGEMENT, REPO, WORKER, ca_file, on, state_checks, tls_context
from tests.state.test_serving import plain_ipv4
from tests.real.conftest import REAL_INVENTORY, SERVED, deploy

pytestmark = pytest.mark.lab

# HEAD, WORKER: the pair this process drives (tests/e2e/lab.py, SFL_LAB_PAIR)
API = f"https://{MANAGEMENT[HEAD]}:8000"  # the API proxy on the profile's port, as clients name it (TLS: roles/tls)
ENGINE = "http://127.0.0.1:18000"  # the head's engine itself (api_proxy_engine_port), root on the head only
KEY = "-K /etc/sparkfleet/api-key.curl"
FABRIC = {HEAD: "198.19.77.1", WORKER: "198.19.77.2"}


def post(url: str, body: dict, key: bool = True, timeout: int = 60) -> tuple[str, str]:
    """(status, body) of a JSON POST from the head (over TLS, verified with the head's bundle, to the API)."""
    verify = f"--cacert {CA_BUNDLE} " if url.startswith("https://") else ""
    out = on(HEAD, f"printf '%s' {shlex.quote(json.dumps(body))} | curl {verify}-sS -m {timeout} {KEY if key else ''} "
                   f"-H 'Content-Type: application/json' --data-binary @- -w '\\n%{{http_code}}' {url}")
    text, _, code = out.rpartition("\n")
    return code.strip(), text


def chat_body(max_tokens: int = 16) -> dict:
    # ignore_eos: a random model may emit its end-of-sequence token at any step (vLLM's sampling params)
    return {"model": SERVED, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}


PROGRESS_INTERVAL_S = 10  # lab/inventory_vllm_cpu.py's progress_interval_s
BYTES_STEPS = ("Build ", "Push ", "Pull ", "Fetch ", "Send ")  # roles/image, roles/weights: bytes and a rate
PHASE_STEPS = ("prewarm", "start of ")  # roles/kernel_cache, roles/serving: the engine's phase


def assert_progress(output: str, changed: list[tuple[str, str]]) -> None:
    """The first deploy's long steps printed their progress while they ran (sparkfleet/progress.py,
    docs/deploy.md#progress-of-long-steps): each step that took at least an interval a done line and,
    before it, a line per interval or so (bytes and a rate, or the engine's phase with /health); none
    failed; and the prewarm, which this deploy always runs (conftest.py removes the caches) and which
    takes ~80 s here, is among them. Only the done lines decide which steps must show progress: how
    long the build or the push take depends on docker's layer cache, and on the machine's load."""
    steps = read_progress(output)
    tail = output[-8000:]
    for (host, step), seen in steps.items():
        done, ticks = seen["done"], seen["ticks"]
        assert done is not None, f"{host}: {step}: progress lines {ticks} but no done line:\n{tail}"
        took, failed = done
        assert not failed, f"{host}: {step}: done (failed) in a deploy that succeeded:\n{tail}"
        # at least one line per two intervals (a step of 10-19 s may end before its first probe answers;
        # each probe's own time under the CI's load stretches the spacing); none for a step that ran in the
        # background and ended before the deploy waited for it (the head's fetch: its own duration alone)
        assert len(ticks) >= (0 if seen.get("background") else took // (2 * PROGRESS_INTERVAL_S)), (host, step, done, ticks)
        assert [s for s, _ in ticks] == sorted(s for s, _ in ticks) and all(s <= took for s, _ in ticks), (host, step, ticks)
        if step.startswith(BYTES_STEPS):
            assert all(BYTES_FIGURE.match(what) for _, what in ticks), (host, step, ticks)
        elif step.startswith(PHASE_STEPS):
            assert all("(/health: " in what for _, what in ticks), (host, step, ticks)
        else:
            raise AssertionError(f"{host}: {step}: progress from a step sparkfleet/progress.py does not know")
    if not os.environ.get("SFL_REAL_KEEP_CACHES"):  # conftest.py: then the deploy changes nothing
        assert (HEAD, "prewarm") in steps, f"the prewarm printed no progress ({sorted(steps)}):\n{tail}"
    # The weights, when this deploy moved them (a fresh lab: tiny-llama is the real pair's alone), at the
    # inventory's uplink pace (~14 s each way): the fetch and the worker's pull following it, both started
    # in the background before the image's build (roles/weights/background.py), each either printed bytes
    # and a rate (the deploy waited for it) or, having ended while the image was built and shipped, its
    # done line with its own time.
    for op, host in changed:
        if op.startswith(("Fetch sparkfleet-lab/tiny-llama ", "Send sparkfleet-lab/tiny-llama ")):
            seen = steps.get((host, op))
            background = seen and seen.get("background") and seen["done"]
            assert seen and (seen["ticks"] or background), f"{host}: {op}: no progress line ({sorted(steps)}):\n{tail}"
            print(f"\n  {host}: {op}: " + (f"in the background, done in {seen['done'][0]} s" if not seen["ticks"]
                                           else f"{seen['ticks'][-1][1]}, done in {seen['done'][0]} s"))


def test_the_real_pair_deploys_and_a_second_deploy_changes_nothing(real_deploy):
    run, _ = real_deploy
    assert "sparkfleet serving lab-vllm-cpu" in run.output
    # the engine's own KV-cache size was read and checked against max_model_len (roles/guards/kv_budget.py)
    assert "engine KV cache 131072 tokens >= max_model_len 8192" in run.output, run.output[-5000:]
    # step 7a: the image's own vLLM judged both ranks before the prewarm stopped anything, named its version
    assert re.search(r"engine proof: pair: vLLM 0\.32\.0\+cpu \(in sparkfleet-lab/vllm-cpu:\w+\) judged 2 distinct "
                     r"rank command line\(s\), \d+ routes: accepted", run.output), run.output[-8000:]
    assert "pair engine: vLLM " in run.output  # the plan's line: the version, and which proof judges it
    assert_progress(run.output, run.changed())
    again = deploy(inventory=REAL_INVENTORY)
    assert again.returncode == 0 and again.changed() == [], again.output[-8000:]


def test_the_worker_pulled_the_weights_as_they_landed_on_the_head(real_deploy):
    """Issue 44 item 2 on the fresh pair: the head's fetch (the lab's uplink, 320 KiB/s) listed what it
    had landed, the worker's pull followed that list and held files before the fetch ended, then
    finished against the head's manifest; the head's list ends `done`, naming the manifest's files."""
    from roles.fanout.sfl_files import parse_manifest

    model, weights = "sparkfleet-lab/tiny-llama", "/var/lib/sparkfleet/models"
    log = on(WORKER, f"cat /var/lib/sparkfleet/logs/weights-pull-{model.replace('/', '--')}.log")
    during = [int(n) for n in re.findall(r"following the head's fetch \(running\): (\d+) file\(s\) landed", log)]
    assert during and max(during) >= 1, log[-3000:]  # pulled while the head still fetched
    assert re.search(r"verified \d+ files against the head's manifest", log), log[-3000:]
    header, landed = parse_manifest(on(HEAD, f"cat {weights}/{model}.landed"))
    _, manifest = parse_manifest(on(HEAD, f"cat {weights}/{model}.manifest"))
    assert header["fetch"] == "done" and landed == manifest
    assert on(WORKER, f"cat {weights}/{model}.manifest") == on(HEAD, f"cat {weights}/{model}.manifest")


def test_a_flag_the_image_s_engine_refuses_stops_the_deploy_before_the_pair_stops_and_it_keeps_answering(real_deploy):
    """Step 7a with the real engine: `--disable-log-requests` is a flag of vLLM 0.33.0's parser (the parity
    snapshot's version) and not of 0.32.0's, the version the lab image ships. The deploy stops at the
    in-image proof, quoting vLLM's own message with the group, the rank and the data key; the pair is
    never stopped (the head's container is the same one, and /health answers 200 throughout)."""
    import threading
    import urllib.request

    started = on(HEAD, "docker inspect --format '{{.State.StartedAt}}' sparkfleet-head").strip()
    codes, done = [], threading.Event()

    context = tls_context()  # the fleet's CA, fetched from the head as a client does

    def poll():  # the API proxy's open path, from the management network, every second
        while not done.is_set():
            try:
                with urllib.request.urlopen(f"{API}/health", timeout=5, context=context) as reply:
                    codes.append(reply.status)
            except Exception as err:  # noqa: BLE001: any failure to answer is what this test looks for
                codes.append(repr(err))
            done.wait(1)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        run = deploy("--data", 'serving_extra_args=["--disable-log-requests"]', inventory=REAL_INVENTORY)
    finally:
        done.set()
        poller.join()
    assert run.returncode != 0, run.output[-5000:]
    assert "engine proof: refused before the pair is stopped" in run.output, run.output[-5000:]
    assert re.search(rf"pair rank 0 \({HEAD}\): --disable-log-requests: vLLM 0\.32\.0\+cpu \(in [^)]+\) refuses it: "
                     r"unrecognized arguments: --disable-log-requests; change serving_extra_args", run.output), run.output[-5000:]
    assert codes and set(codes) == {200}, codes
    assert on(HEAD, "docker inspect --format '{{.State.StartedAt}}' sparkfleet-head").strip() == started
    # (the next deploy of the unchanged data: tests/real/test_real_version_bump.py's fixed bump, after its own refusal)


def test_the_collective_ran_in_the_real_image_across_both_ranks_before_the_engine_started(real_deploy):
    """roles/fabric_speed step 7e with the real image: all_gather over gloo between the two hosts, in
    the image the engine runs, with each rank's own environment; the figure is held to the floor in
    lab/inventory_vllm_cpu.py and lands in both nodes' records, and the deploy says why it ran."""
    run, _ = real_deploy
    changed = set(run.changed())
    assert ("Prove the fabric's speed: all_gather across the group in the serving image", HEAD) in changed, run.output[-8000:]
    assert ("Prove the fabric's speed: all_gather across the group in the serving image", WORKER) not in changed
    assert "pair proves the fabric's speed: " in run.output  # the plan said why
    log = re.search(r"fabric speed: all_gather \(gloo, 64 MiB, 2 ranks\): busbw ([0-9.]+) GB/s", run.output)
    assert log, run.output[-8000:]
    records = {h: json.loads(on(h, "cat /var/lib/sparkfleet/fabric-speed.json")) for h in (HEAD, WORKER)}
    assert records[HEAD] == records[WORKER] and records[HEAD]["passed"] is True, records
    (gather,) = [f for f in records[HEAD]["figures"] if f["test"] == "all_gather"]
    # every element of both ranks' blocks arrived; torch is the image's own (lab/recipe/vllm-cpu)
    assert (gather["backend"], gather["world"], gather["wrong"], gather["torch"]) == ("gloo", 2, 0, "2.13.0+cpu"), gather
    assert gather["bytes"] == 64 * 2**20 and gather["busbw_gbytes"] >= 0.05, gather
    assert [f["test"] for f in records[HEAD]["figures"]].count("iperf3") == 2  # the link's two halves first
    # no rank's runner is left behind, on either host
    for h in (HEAD, WORKER):
        assert on(h, "docker ps -aq --filter name=^sparkfleet-fabric-speed$").strip() == "", h
    print(f"  real collective: all_gather over gloo, 64 MiB, 2 ranks: busbw {gather['busbw_gbytes']:.3f} GB/s")


def test_the_state_checks_pass_against_the_real_engine(real_deploy):
    checks = state_checks(inventory=REAL_INVENTORY)
    assert checks.returncode == 0, checks.output[-8000:]


def test_both_units_run_the_real_vllm_not_a_stand_in(real_deploy):
    for host, unit in ((HEAD, "sparkfleet-head"), (WORKER, "sparkfleet-worker")):
        assert on(host, f"systemctl is-active {unit}").strip() == "active"
        version = on(host, f"docker exec {unit} /opt/vllm/bin/python -c 'import importlib.metadata as m; "
                           f"print(m.version(\"vllm-cpu\"), m.version(\"vllm\"))'").split()
        assert version == ["0.32.0", "0.32.0+cpu"], version
        assert on(host, f"docker exec {unit} sh -c 'test -e /usr/local/bin/vllm && echo stand-in || echo none'").strip() == "none"
    cmd = json.loads(on(WORKER, "docker inspect --format '{{json .Config.Cmd}}' sparkfleet-worker"))
    assert cmd[:2] == ["vllm", "serve"] and "--headless" in cmd and cmd[cmd.index("--node-rank") + 1] == "1"


def test_a_chat_completion_with_the_key_returns_tokens_from_both_ranks(real_deploy):
    code, text = post(f"{API}/v1/chat/completions", chat_body(16))
    assert code == "200", text
    reply = json.loads(text)
    assert reply["model"] == SERVED and reply["usage"]["completion_tokens"] == 16, reply
    assert reply["choices"][0]["message"]["content"], reply
    # TP 2: every step ran on both ranks, which meet on the fabric (gloo on enp1s0f0np0, MTU 9000):
    # the worker's engine holds TCP connections to the head's fabric address, none to its management one.
    # (torch's sockets are dual-stack: an IPv4 peer shows IPv4-mapped, [::ffff:a.b.c.d]:port.)
    peers = [[plain_ipv4(e) for e in line.split()[-2:]] for line in on(WORKER, "ss -Htn state established").splitlines()]
    to_head = [(local, peer) for local, peer in peers if peer.startswith(FABRIC[HEAD] + ":")]
    assert len(to_head) >= 2, f"the worker's engine has no connections to the head's fabric address: {peers}"
    assert all(local.startswith(FABRIC[WORKER] + ":") for local, _ in to_head), to_head
    # (the head's Prometheus scraping the worker's node exporter, roles/monitoring, is the head's connection
    # to the worker's port 9100, not the engine's)
    assert not [p for p in peers if p[1].startswith(f"{MANAGEMENT[HEAD]}:") and not p[1].endswith(":22")
                and not p[0].endswith(":9100")], peers
    assert on(WORKER, "ip -o link show enp1s0f0np0").split("mtu ")[1].split()[0] == "9000"


def test_the_first_pair_doc_s_client_example_gets_a_completion_from_the_real_pair(real_deploy, tmp_path):
    """docs/first-pair.md's OpenAI-client example, run as the page tells a user to (`python`, the
    official `openai` client pyproject.toml pins, the four variables it exports, the key copied from
    the head into a 0600 file): the API proxy on the head's management address answers it with text
    from the served model. No deploy of its own: the pair real_deploy left."""
    key_file = tmp_path / "api-key"
    descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # 0600 before the key is in it
    with os.fdopen(descriptor, "w") as out:
        out.write(on(HEAD, "cat /etc/sparkfleet/api-key"))
    script = tmp_path / "client.py"
    script.write_text(client_example())
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}  # reached directly
    env.update(SPARKFLEET_API_URL=f"{API}/v1",  # the head's ssh_hostname, the profile's port
               SPARKFLEET_MODEL=SERVED, SPARKFLEET_API_KEY_FILE=str(key_file), SPARKFLEET_CA_FILE=str(ca_file()))
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-5000:]
    model, _, text = run.stdout.partition("\n")
    assert model == SERVED, run.stdout
    assert text.strip(), f"the completion has no text: {run.stdout!r}"


def routes_of_the_real_app() -> list[tuple[str, str]]:
    """Every (method, path) the real app registers for the head's command line (tests/real/routes_in_image.py)."""
    cmd = on(HEAD, "docker inspect --format '{{json .Config.Cmd}}' sparkfleet-head").strip()
    image = on(HEAD, "docker inspect --format '{{.Config.Image}}' sparkfleet-head").strip()
    script = (REPO / "tests" / "real" / "routes_in_image.py").read_text()
    out = on(HEAD, f"docker run --rm --network none --env-file /etc/sparkfleet/sparkfleet-head.env --entrypoint "
                   f"/opt/vllm/bin/python {shlex.quote(image)} -c {shlex.quote(script)} {shlex.quote(cmd)} 2>/dev/null")
    table = json.loads(out.strip().splitlines()[-1])
    assert table["version"].startswith("0.32.0"), table["version"]
    return [tuple(r) for r in table["routes"]]


def test_without_the_key_every_route_of_the_real_app_answers_401_and_invocations_would_not(real_deploy):
    routes = routes_of_the_real_app()
    assert ("POST", "/invocations") in routes and ("POST", "/v1/chat/completions") in routes, routes
    # The engine itself (root on the head: the firewall's output chain lets nobody else reach its
    # port) holds no key (issue 43 item 7): POST /invocations and /v1/chat/completions run without one
    # (its own check, were it given the key, would guard only /v1, /v2, /inference and /cohere:
    # vllm/entrypoints/serve/middleware/authenticate.py). The API proxy is the check.
    for path in ("/invocations", "/v1/chat/completions"):
        code, text = post(f"{ENGINE}{path}", chat_body(4), key=False)
        assert code == "200" and json.loads(text)["usage"]["completion_tokens"] == 4, (path, code, text)
    # Through the API proxy every route answers 401 without the key, but OPEN_PATHS.
    probes = []
    for method, path in routes:
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        probes.append(f"echo \"{method} {path} $(curl --cacert {CA_BUNDLE} -s -o /dev/null -m 10 -X {method} "
                      f"-w '%{{http_code}}' {API}{shlex.quote(concrete)})\"")
    answers = [line.rsplit(" ", 1) for line in on(HEAD, "; ".join(probes)).splitlines()]
    assert len(answers) == len(routes)
    for route, code in answers:
        method, path = route.split(" ", 1)
        expected = "200" if method in OPEN_PATHS.get(path, ()) else "401"
        assert code == expected, f"{route}: {code} through the proxy without the key (expected {expected})"
    code, text = post(f"{API}/invocations", chat_body(4), key=True)
    assert code == "200", text  # with the key the route serves through the proxy


def test_the_real_engine_serves_with_no_capability_no_new_privileges_and_no_key(real_deploy):
    """Issue 43 item 7 with the real vLLM (vllm-cpu 0.32.0): both ranks' containers dropped every
    capability and set no-new-privileges, every process of each shows it as the kernel holds it, the
    pair served this module's completions so, and neither engine logged a refused permission."""
    for host, unit in ((HEAD, "sparkfleet-head"), (WORKER, "sparkfleet-worker")):
        caps = on(host, f"docker inspect --format '{{{{json .HostConfig.CapDrop}}}} {{{{json .HostConfig.CapAdd}}}} "
                        f"{{{{json .HostConfig.SecurityOpt}}}}' {unit}").split()
        assert caps[0] == '["ALL"]' and caps[1] == "null" and "no-new-privileges" in caps[2], (host, caps)
        pids = on(host, f"docker top {unit} -eo pid").split()[1:]
        assert len(pids) >= 2, (host, pids)  # docker-init and the engine, at least
        for pid in pids:
            status = on(host, f"grep -E '^(CapEff|CapBnd|CapPrm|NoNewPrivs):' /proc/{pid}/status").split()
            assert status == ["CapPrm:", "0000000000000000", "CapEff:", "0000000000000000", "CapBnd:",
                              "0000000000000000", "NoNewPrivs:", "1"], (host, pid, status)
        env = on(host, f"docker inspect --format '{{{{json .Config.Env}}}}' {unit}")
        assert "VLLM_API_KEY" not in env, host
        # EACCES and EPERM as Python and C print them; NUMA memory policy excepted: Docker's seccomp
        # profile refused set_mempolicy and mbind before the capabilities went too (no SYS_NICE in
        # Docker's default set), so libnuma's complaint, if the CPU build prints one, is not new.
        journal = on(host, f"journalctl -u {unit} --no-pager -o cat | tail -n 5000").splitlines()
        refused = [line for line in journal if ("PermissionError" in line or "Permission denied" in line
                                                or "Operation not permitted" in line)
                   and not re.search(r"mempolicy|mbind|migrate_pages", line)]
        assert not refused, (host, refused[:5])


def test_the_benchmark_receipt_was_taken_with_llama_benchy_against_the_real_engine(real_deploy):
    run, _ = real_deploy
    name = on(HEAD, "ls -t /var/lib/sparkfleet/receipts/lab-vllm-cpu/ | head -1").strip()
    receipt = json.loads(on(HEAD, f"cat /var/lib/sparkfleet/receipts/lab-vllm-cpu/{name}"))
    assert receipt["profile"] == "lab-vllm-cpu" and receipt["tool"].startswith("llama-benchy ")
    assert receipt["image_id"] == on(HEAD, "docker inspect --format '{{.Image}}' sparkfleet-head").strip()
    assert [f["concurrency"] for f in receipt["figures"]] == [1, 4]
    assert all(f["decode_tps_aggregate"] > 0 and f["ttft_ms"] > 0 for f in receipt["figures"]), receipt["figures"]
    assert receipt["cold_start_s"] > 0
    # the fabric's figures of the proof this deploy ran, as the head's record holds them
    record = json.loads(on(HEAD, "cat /var/lib/sparkfleet/fabric-speed.json"))
    assert receipt["fabric_speed"] == record["figures"] and {f["test"] for f in record["figures"]} == {
        "iperf3", "all_gather"}, (receipt["fabric_speed"], record)
    print(f"\n  receipt of the real pair: cold start {receipt['cold_start_s']} s; "
          + "; ".join(f"c{f['concurrency']}: TTFT {f['ttft_ms']} ms, {f['decode_tps_aggregate']} tok/s" for f in receipt["figures"]))


# vLLM 0.32.0 on CPU compiles with torch.compile's inductor directly, at the engine's warm-up
# (vllm/v1/worker/cpu_model_runner.py, between these two lines), into TORCHINDUCTOR_CACHE_DIR, which
# the kernel-cache generation holds (sparkfleet/model/kernel_cache.py).
WARMUP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d) \[cpu_model_runner\.py:\d+\] Warming up (model for the compilation|done)")


def warmup_seconds(lines) -> float:
    """Seconds from the last 'Warming up model for the compilation' to the 'Warming up done' after it."""
    start = took = None
    for line in lines:
        if m := WARMUP.search(line):
            at = dt.datetime.strptime(m.group(1), "%m-%d %H:%M:%S")
            if m.group(2) == "done" and start is not None:
                took = (at - start).total_seconds()
            else:
                start = at
    assert took is not None, "no warm-up in the log"
    return took


def generation_files(host: str) -> tuple[list[str], list[str]]:
    """(files in the served generation's manifest, files on disk there now)."""
    gen = on(host, "readlink /var/lib/sparkfleet/kernel-cache/current").strip()
    manifest = [line.split("\t")[2] for line in on(host, f"cat /var/lib/sparkfleet/kernel-cache/{gen}.manifest").splitlines()
                if line and not line.startswith("#")]
    disk = on(host, f"cd /var/lib/sparkfleet/kernel-cache/{gen} && find . -type f -printf '%P\\n'").split()
    return sorted(manifest), sorted(disk)


def test_production_loads_the_compile_cache_the_prewarm_wrote_on_both_ranks(real_deploy):
    """The prewarm compiled (cold), the merge made its generation identical on both ranks, and
    production started on it without compiling anything: not one file added to the generation on
    either rank (a kernel whose key differed between the prewarm and production, e.g. by a setting
    the prewarm changed, would be compiled and written there), and its warm-up was shorter."""
    run, _ = real_deploy
    listed = {}
    for host, unit in ((HEAD, "sparkfleet-head"), (WORKER, "sparkfleet-worker")):
        manifest, disk = generation_files(host)
        assert [f for f in manifest if f.startswith("inductor/")], manifest  # the prewarm compiled into it
        assert disk == manifest, f"{host}: production wrote to the prewarmed generation: {sorted(set(disk) - set(manifest))}"
        listed[host] = manifest
        prewarm = [line for line in run.output.splitlines() if f"[{host}] prewarm engine: " in line]
        journal = on(host, f"journalctl -u {unit} -o cat --no-pager --since @{int(real_deploy[1]) - 900}").splitlines()
        cold, warm = warmup_seconds(prewarm), warmup_seconds(journal)
        print(f"\n  {host}: warm-up (torch.compile) in the prewarm {cold:.0f} s, in production {warm:.0f} s")
        assert warm < cold, (cold, warm)
    assert listed[HEAD] == listed[WORKER]  # the merge: every rank has every rank's kernels
