"""roles/monitoring on the real vLLM pair (the tier's one deploy, tests/real/conftest.py): Debian's node
exporter on both hosts and Debian's Prometheus on the head (the monitoring node: no router), scraping
the real engine's /metrics through the API proxy's metrics port, every target over TLS (roles/tls: each
node's certificate; Prometheus verifies it with the fleet's bundle). Every target is up, every metric
the alert rules read has data in the live Prometheus, and the exporters answer the monitoring node
only, each over TLS with a certificate the fleet's CA signed for its node's address. Read-only: the rank-down drill that stops the worker is tests/real/test_real_watchdog.py.
"""
import json
from pathlib import Path
import re
import shlex
import time

import pytest
import yaml

from tests.e2e import local_users
from tests.e2e.lab import CA_BUNDLE, HEAD, MANAGEMENT, REPO, WORKER, on
from tests.real.test_real_pair import API, KEY, chat_body, post

pytestmark = pytest.mark.lab

# HEAD, WORKER: the pair this process drives (tests/e2e/lab.py, SFL_LAB_PAIR); their management addresses
MGMT = {HEAD: MANAGEMENT[HEAD], WORKER: MANAGEMENT[WORKER]}
PROMETHEUS = "http://127.0.0.1:9090"  # on the monitoring node's loopback only


def query(expr: str) -> list[dict]:
    """The live Prometheus' answer to an instant query (its HTTP API, from the monitoring node)."""
    out = on(HEAD, f"curl -fsS -m 10 {PROMETHEUS}/api/v1/query --data-urlencode {shlex.quote('query=' + expr)}")
    answer = json.loads(out)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def wait_for(expr: str, timeout: float = 60) -> list[dict]:
    """The first non-empty answer to `expr` within `timeout` seconds (a scrape interval is 5 s here)."""
    deadline = time.monotonic() + timeout
    while True:
        result = query(expr)
        if result or time.monotonic() > deadline:
            return result
        time.sleep(2)


def wait_scraped(times: int = 2, timeout: float = 60) -> None:
    """Until Prometheus has scraped every target `times` times from now on (a rate over what just ran
    needs two samples after it): a state, not a time (a loaded machine scrapes late). The window counted
    is whole seconds since this call, so no sample before it is counted."""
    began = time.monotonic()
    while True:
        window = int(time.monotonic() - began)
        if window >= 1:
            counts = query(f"min(count_over_time(up[{window}s]))")
            if counts and float(counts[0]["value"][1]) >= times:
                return
        assert time.monotonic() - began < timeout, f"Prometheus did not scrape every target {times} times in {timeout} s"
        time.sleep(1)


def test_prometheus_scrapes_every_target_and_all_are_up(real_deploy):
    result = wait_for('count(up == 1) == 3')
    up = {(r["metric"]["job"], r["metric"]["node"]): r["value"][1] for r in query("up")}
    assert up == {("node", HEAD): "1", ("node", WORKER): "1", ("engine", HEAD): "1"}, (up, result)
    # each scraped over https, its certificate verified (a refused one would be down, with Go's x509 reason)
    targets = json.loads(on(HEAD, f"curl -fsS -m 10 {PROMETHEUS}/api/v1/targets"))["data"]["activeTargets"]
    assert sorted(t["scrapeUrl"] for t in targets) == [
        f"https://{MGMT[HEAD]}:9100/metrics", f"https://{MGMT[HEAD]}:9400/metrics",
        f"https://{MGMT[WORKER]}:9100/metrics"], targets
    assert [t["lastError"] for t in targets] == ["", "", ""], targets
    # Prometheus listens on the head's loopback alone
    assert on(HEAD, "ss -Hltn 'sport = :9090' | awk '{print $4}'").split() == ["127.0.0.1:9090"]


# What each alert reads, as live series: a rule whose metric never has data could never fire.
READS = {
    "SparkfleetTargetDown": ['up{job="engine"}', 'up{job="node"}'],
    "SparkfleetRankDown": ['node_systemd_unit_state{name="sparkfleet-head.service", state="active"}',
                           'node_systemd_unit_state{name="sparkfleet-worker.service", state="active"}'],
    "SparkfleetGroupStalled": ["vllm:num_requests_waiting", "vllm:generation_tokens_total"],
    "SparkfleetMemoryLow": ["node_memory_MemAvailable_bytes"],
    "SparkfleetMemoryPressure": ["node_pressure_memory_stalled_seconds_total"],
    "SparkfleetKvCacheFull": ["vllm:kv_cache_usage_perc"],
    "SparkfleetFabricMtu": ['node_network_mtu_bytes{device="enp1s0f0np0"}', "sparkfleet_fabric_mtu_wanted_bytes"],
    "SparkfleetFabricDown": ['node_network_up{device="enp1s0f0np0"}', "sparkfleet_fabric_mtu_wanted_bytes"],
    "SparkfleetFabricSlow": ['node_network_speed_bytes{device="enp1s0f0np0"}',
                             "sparkfleet_fabric_link_speed_wanted_bytes"],
    "SparkfleetTtftRegression": ["vllm:time_to_first_token_seconds_bucket", "sparkfleet_receipt_ttft_seconds"],
    "SparkfleetEngineRestarted": ['node_systemd_unit_start_time_seconds{name="sparkfleet-head.service"}'],
    # the head's watchdog's textfile (its state, rewritten at every save)
    "SparkfleetWatchdogRestarted": ["sparkfleet_watchdog_restarts_total"],
    "SparkfleetWatchdogGaveUp": ["sparkfleet_watchdog_gave_up"],
}
# Alerts whose metrics the lab cannot have, and where they are proven instead.
NOT_IN_THE_LAB = {
    # RDMA nodes only (sparkfleet-gid-metrics.timer, sfl_gid.sh at each start): the lab has no RDMA.
    "SparkfleetGidMoved": "tests/unit/test_gid_at_start.py feeds sfl_gid.sh's own textfiles to the rendered rule",
    # GPU nodes only (dcgm-exporter, job gpu): the lab has no GPU.
    "SparkfleetGpuThrottled": "tests/unit/alerts/sparkfleet.test.yml, on series labelled as dcgm-exporter labels them",
}


def test_every_metric_the_alert_rules_read_has_data_in_the_live_prometheus(real_deploy):
    rules = yaml.safe_load(on(HEAD, "cat /etc/prometheus/sparkfleet.rules.yml"))
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert set(alerts) == set(READS) | set(NOT_IN_THE_LAB), "every alert's metrics are listed here"
    assert not query("sparkfleet_rdma_gid_index_at_start"), "the lab has no RDMA, yet a GID index is on record"
    # a completion, so that the engine's token counter has moved
    code, text = post(f"{API}/v1/chat/completions", chat_body(8))
    assert code == "200", text
    empty = [f"{alert}: {selector}" for alert, selectors in READS.items() for selector in selectors
             if not wait_for(selector, timeout=30)]
    assert not empty, f"no live data for: {empty}"
    for alert, selectors in READS.items():  # each selector's metric is one the rule names
        for selector in selectors:
            assert selector.split("{")[0] in alerts[alert], (alert, selector)
    # and the rules evaluate: none of them fires on the healthy pair
    firing = [a["labels"]["alertname"] for a in json.loads(on(HEAD, f"curl -fsS {PROMETHEUS}/api/v1/alerts"))["data"]
              ["alerts"] if a["state"] == "firing" and a["labels"]["alertname"] != "SparkfleetEngineRestarted"]
    assert firing == [], firing
    # both ranks' facts, from sparkfleet's textfile
    info = {r["metric"]["node"]: r["metric"] for r in query("sparkfleet_node_info")}
    assert {n: (m["group"], m["rank"], m["engine"]) for n, m in info.items()} == {
        HEAD: ("pair", "0", "vllm"), WORKER: ("pair", "1", "vllm")}, info
    # and each node's fingerprint now: the image its engine container runs, the same on both ranks
    prints = {r["metric"]["node"]: r["metric"] for r in wait_for("sparkfleet_fingerprint_info")}
    assert set(prints) == {HEAD, WORKER}, prints
    for node, unit in ((HEAD, "sparkfleet-head"), (WORKER, "sparkfleet-worker")):
        assert prints[node]["image_id"] == on(node, f"docker inspect --format '{{{{.Image}}}}' {unit}").strip(), prints
        assert prints[node]["kernel"] and prints[node]["docker"], prints[node]
    assert prints[HEAD]["image_id"] == prints[WORKER]["image_id"], prints  # one image shipped to both


def test_the_fabric_speed_proof_s_figures_are_in_the_live_prometheus(real_deploy):
    """The deploy's speed proof (iperf3 per half, all_gather over gloo in the real image) as the head's
    textfile metrics: the same figures its record on the node holds, scraped."""
    from roles.fabric_speed.checks import RECORD_NAME

    record = json.loads(on(HEAD, f"cat $(find /var/lib/sparkfleet -name {RECORD_NAME} | head -n 1)"))
    links = {(r["metric"]["test"], r["metric"]["link"]): float(r["value"][1])
             for r in wait_for('sparkfleet_fabric_speed_gbits{group="pair"}')}
    assert links == {(f["test"], f["link"]): f["gbits"] for f in record["figures"] if "gbits" in f}, (links, record)
    assert len(links) == 2 and all(g > 0 for g in links.values()), links  # both halves, each its own figure
    (busbw,) = query('sparkfleet_fabric_speed_busbw_gbytes{group="pair", test="all_gather"}')
    assert busbw["metric"]["node"] == HEAD and busbw["metric"]["backend"] == "gloo", busbw
    assert float(busbw["value"][1]) == next(f["busbw_gbytes"] for f in record["figures"] if f["test"] == "all_gather")


def test_the_engine_s_metrics_port_serves_metrics_alone_and_the_exporters_answer_the_monitoring_node_only(real_deploy):
    verify = f"--cacert {CA_BUNDLE}"  # the fleet's bundle on the head (the monitoring node)
    metrics = on(HEAD, f"curl -sS -m 10 {verify} https://{MGMT[HEAD]}:9400/metrics")
    assert re.search(r"^vllm:num_requests_running\{", metrics, re.M), metrics[:2000]
    # nothing else of the engine through that port, with or without the key
    for path in ("/v1/models", "/invocations", "/health"):
        code = on(HEAD, f"curl -s -o /dev/null -w '%{{http_code}}' -m 10 {KEY} {verify} https://{MGMT[HEAD]}:9400{path}")
        assert code == "404", (path, code)
    # the worker (not the monitoring node) reaches neither the head's exporter nor its engine's metrics;
    # the monitoring node reaches the worker's exporter
    for port in (9100, 9400):
        code = on(WORKER, f"curl -s -o /dev/null -w '%{{http_code}}' -m 3 -k https://{MGMT[HEAD]}:{port}/metrics",
                  check=False)
        assert code == "000", f"{WORKER} reached {HEAD}:{port} ({code})"
    assert "node_memory_MemAvailable_bytes" in on(HEAD, f"curl -fsS -m 10 {verify} https://{MGMT[WORKER]}:9100/metrics")
    # the lab machine itself (on the management bridge, 198.18.0.1) is no monitoring node either
    code = urllib_code(f"http://{MGMT[WORKER]}:9100/metrics")
    assert code is None, f"the lab machine reached {WORKER}'s exporter ({code})"


def test_every_exporter_speaks_tls_only_with_a_certificate_the_fleets_ca_signed_for_its_node(real_deploy):
    """Issue 43 item 1's done-when for the monitoring listeners, from the one host on the management
    network they answer (the monitoring node; the firewall drops everyone else, above): each port speaks
    TLS with a certificate that chains to the fleet's CA and names its node's address, the same the
    node's other listeners serve, and answers no plain HTTP."""
    fingerprint = "openssl x509 -noout -fingerprint -sha256"
    for node, port in ((HEAD, 9100), (HEAD, 9400), (WORKER, 9100)):
        address = MGMT[node]
        verified = on(HEAD, f"openssl s_client -connect {address}:{port} -CAfile {CA_BUNDLE} -verify_return_error "
                            f"-verify_ip {address} </dev/null 2>&1", check=False)
        assert "Verify return code: 0 (ok)" in verified, (node, port, verified[-1500:])
        served = on(HEAD, f"openssl s_client -connect {address}:{port} </dev/null 2>/dev/null | {fingerprint}").strip()
        assert served == on(node, f"{fingerprint} -in /etc/sparkfleet/tls/api.pem").strip(), (node, port)
        plain = on(HEAD, f"curl -s -o /dev/null -w '%{{http_code}}' -m 5 http://{address}:{port}/metrics", check=False)
        assert plain.strip() != "200", f"{node}:{port} answers plain HTTP ({plain})"


def test_every_listening_socket_of_both_hosts_is_a_row_of_the_listener_table(real_deploy):
    """docs/security.md's listener table against `ss -ltnup` on each host (tests/listeners.py): every
    socket is a row of that host's roles, and every fixed port a row requires there is held. Before the
    drills below (their webhook catcher is a test's own listener)."""
    from sparkfleet.inventory import load_cluster
    from tests.listeners import check_host
    from tests.real.conftest import REAL_INVENTORY

    cluster = load_cluster(REPO / REAL_INVENTORY, cwd=str(REPO))
    found = {host: check_host(on(host, "ss -ltnup"), cluster, host) for host in (HEAD, WORKER)}
    assert not any(found.values()), "\n".join(f"{h}:\n{d}" for h, d in found.items() if d)


def urllib_code(url: str):
    """The HTTP status `url` answers from this machine, or None when it is not reached."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:  # refused, dropped or timed out: not reached
        return None


def test_make_status_shows_the_live_figures_from_prometheus(real_deploy):
    """status.py's `live` row: the group's tokens/s, queue, KV cache and TTFT over 5 minutes from the
    monitoring node's Prometheus (the completions above and the receipt's load are in its window)."""
    from tests.e2e.lab import BIN, run
    from tests.real.conftest import REAL_INVENTORY

    load_like_the_receipt(rounds=1)
    # Two scrapes after the load before asking (a rate needs both): make test of 36ec875 asked at once and
    # read 0.0 tokens/s, the load not yet scraped and the deploy's receipt already out of the 5 min window.
    wait_scraped(2)
    status = run([str(BIN / "pyinfra"), "-y", REAL_INVENTORY, "status.py"])
    assert status.returncode == 0, status.output[-4000:]
    live = [line for line in status.output.splitlines() if " live " in line]
    assert len(live) == 1, status.output[-4000:]
    m = re.search(r"([0-9.]+) tokens/s, (\d+) running, (\d+) waiting, KV (\d+)%, TTFT p50 ([0-9.]+) s p95 ([0-9.]+) s",
                  live[0])
    assert m, live[0]
    assert float(m[1]) > 0 and float(m[6]) >= float(m[5]) > 0, live[0]


def load_like_the_receipt(rounds: int = 2, concurrency: int = 4, prompt_tokens: int = 512) -> None:
    """The receipt's load shape through the API on the head: `concurrency` requests at once of
    `prompt_tokens` random token ids each (the tiny model's vocabulary; vLLM's prefix cache would
    serve a repeated prompt without computing it), `rounds` times."""
    import random

    for _ in range(rounds):
        calls = []
        for _ in range(concurrency):
            body = json.dumps({"model": "tiny-llama", "prompt": [random.randrange(300, 2000) for _ in range(prompt_tokens)],
                               "max_tokens": 4})
            calls.append(f"(printf '%s' {shlex.quote(body)} | curl -fsS -o /dev/null -m 120 {KEY} "
                         f"-H 'Content-Type: application/json' --data-binary @- {API}/v1/completions) &")
        on(HEAD, " ".join(calls) + " wait")


def wait_firing(alertname: str, timeout: float, **labels) -> float:
    """Seconds until `alertname` (with those labels) fires in the live Prometheus; AssertionError after `timeout`."""
    since = time.monotonic()
    while True:
        alerts = json.loads(on(HEAD, f"curl -fsS -m 10 {PROMETHEUS}/api/v1/alerts"))["data"]["alerts"]
        if [a for a in alerts if a["labels"]["alertname"] == alertname and a["state"] == "firing"
                and all(a["labels"].get(k) == v for k, v in labels.items())]:
            return time.monotonic() - since
        assert time.monotonic() - since < timeout, f"{alertname} {labels} did not fire within {timeout} s: {alerts}"
        time.sleep(2)


# A webhook receiver on the monitoring node's loopback, where lab/inventory_vllm_cpu.py's Alertmanager
# sends every alert: each POST's body, one JSON a line, appended to a file the test reads.
WEBHOOK_CATCHER = """
import http.server, sys
class Catch(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with open(sys.argv[1], "ab") as f:
            f.write(body.replace(b"\\n", b" ") + b"\\n")
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), Catch).serve_forever()
"""
CATCHER_UNIT, CAUGHT = "sfl-test-alert-webhook", "/run/sfl-test-alert-webhook.jsonl"


def start_webhook_catcher() -> None:
    """The catcher, on the port of the webhook the deployed Alertmanager's configuration names."""
    from urllib.parse import urlsplit

    from roles.monitoring.checks import ALERTMANAGER_CONFIG

    receivers = yaml.safe_load(on(HEAD, f"cat {ALERTMANAGER_CONFIG}"))["receivers"]
    port = urlsplit(receivers[0]["webhook_configs"][0]["url"]).port
    on(HEAD, f"rm -f {CAUGHT}; systemd-run --quiet --unit {CATCHER_UNIT} --collect python3 -c "
             f"{shlex.quote(WEBHOOK_CATCHER)} {CAUGHT} {port} && "
             f"for i in $(seq 50); do ss -Hltn 'sport = :{port}' | grep -q . && exit 0; sleep 0.1; done; exit 1")


def wait_notified(alertname: str, status: str, timeout: float, **labels) -> float:
    """Seconds until Alertmanager's webhook delivered `alertname` (with those labels) as `status`
    ("firing" or "resolved") to the catcher; AssertionError after `timeout`."""
    since = time.monotonic()
    while True:
        bodies = [json.loads(line) for line in on(HEAD, f"cat {CAUGHT} 2>/dev/null || true").splitlines() if line]
        if [a for b in bodies for a in b["alerts"] if a["labels"].get("alertname") == alertname
                and a["status"] == status and all(a["labels"].get(k) == v for k, v in labels.items())]:
            return time.monotonic() - since
        assert time.monotonic() - since < timeout, (f"Alertmanager delivered no {status} {alertname} {labels} "
                                                    f"within {timeout} s: {bodies}")
        time.sleep(2)


def test_the_fabric_and_ttft_drills_fire_their_alerts_in_the_live_prometheus(real_deploy, capsys):
    """Two faults at once, each with its own alert: the twin half of the worker's fabric port set to MTU
    1500 by hand -> SparkfleetFabricMtu for that netdev; the receipt's own load shape, then a receipt
    10x faster than the pair's p95 under that load planted on the head -> SparkfleetTtftRegression.
    The planted receipt is scaled to what the pair measures now, not to the deploy's receipt: that one
    was taken while the unit and parity tiers share this machine's two cores, and in the CI run of
    75b3b32 the pair's p95 under this load stayed below twice a tenth of it for 120 s (a bar the
    machine's speed set, not the pair's behaviour). Both put
    back after: the MTU to 9000, the textfile to the deploy's receipt (tests/real/test_real_pair.py's
    second deploy then changes nothing). Alertmanager delivers the fabric's alert to the webhook data
    names, firing, and resolved once the MTU is back."""
    from roles.receipt.receipt import receipt_metrics_text
    from sparkfleet.model.monitoring import RECEIPT_TEXTFILE

    twin = "enP2p1s0f0np0"  # the half the engine's gloo does not use: the pair serves on
    newest = on(HEAD, "ls -1 /var/lib/sparkfleet/receipts/lab-vllm-cpu/*.json | sort | tail -n 1").strip()
    receipt = json.loads(on(HEAD, f"cat {shlex.quote(newest)}"))
    assert [f["ttft_ms"] for f in receipt["figures"] if f["ttft_ms"]], receipt["figures"]
    real = receipt_metrics_text(receipt)
    assert on(HEAD, f"cat {RECEIPT_TEXTFILE}") == real  # the deploy's receipt step wrote it
    start_webhook_catcher()
    try:
        on(WORKER, f"ip link set dev {twin} mtu 1500")
        load_like_the_receipt()
        # the rule's left side, as it reads now: the pair's p95 over the window the load is in
        live = wait_for(f'histogram_quantile(0.95, sum by (group, le) '
                        f'(rate(vllm:time_to_first_token_seconds_bucket{{group="pair"}}[10m]))) > 0', timeout=30)
        assert live, "no TTFT p95 in the live Prometheus after the load"
        p95_ms = float(live[0]["value"][1]) * 1000
        slowest = max(f["ttft_ms"] for f in receipt["figures"] if f["ttft_ms"])
        planted = {**receipt, "figures": [{**f, "ttft_ms": f["ttft_ms"] * p95_ms / 10 / slowest if f["ttft_ms"] else None}
                                          for f in receipt["figures"]]}
        on(HEAD, f"printf '%s' {shlex.quote(receipt_metrics_text(planted))} > {RECEIPT_TEXTFILE}.tmp && "
                 f"mv {RECEIPT_TEXTFILE}.tmp {RECEIPT_TEXTFILE}")
        ttft = wait_firing("SparkfleetTtftRegression", 120, group="pair")
        mtu = wait_firing("SparkfleetFabricMtu", 120, node=WORKER, device=twin)
        delivered = wait_notified("SparkfleetFabricMtu", "firing", 60, node=WORKER, device=twin)
        on(WORKER, f"ip link set dev {twin} mtu 9000")
        resolved = wait_notified("SparkfleetFabricMtu", "resolved", 90, node=WORKER, device=twin)
    finally:
        on(WORKER, f"ip link set dev {twin} mtu 9000")
        on(HEAD, f"printf '%s' {shlex.quote(real)} > {RECEIPT_TEXTFILE}.tmp && mv {RECEIPT_TEXTFILE}.tmp {RECEIPT_TEXTFILE}")
        on(HEAD, f"systemctl stop {CATCHER_UNIT} 2>/dev/null; rm -f {CAUGHT}")
    with capsys.disabled():
        print(f"\n  monitoring drills: p95 {p95_ms:.0f} ms under the load (the deploy's receipt: {slowest:.0f} ms); "
              f"SparkfleetTtftRegression firing {ttft:.0f} s after a receipt of {p95_ms / 10:.0f} ms was planted; "
              f"SparkfleetFabricMtu firing by {mtu:.0f} s later (for: 15 s, scrape every 5 s); Alertmanager's webhook "
              f"had it {delivered:.0f} s after that, and its resolution {resolved:.0f} s after the MTU was put back")


DASHBOARD = REPO / "roles/monitoring/files/grafana/sparkfleet-dashboard.json"


def test_every_panel_of_the_dashboard_shows_data_from_the_live_prometheus(real_deploy):
    """Each PromQL expression of the dashboard, its variables as Grafana's `All` sets them, returns
    series from the lab's Prometheus (a panel that draws nothing on a serving pair is a broken panel)."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "group", "fabric"}
    values = {"$group": ".*", "$fabric": "enp1s0f0np0|enP2p1s0f0np0"}
    load_like_the_receipt(rounds=1)  # the latency histograms have requests in their window
    # A machine without hardware sensors (this one's VM has no /sys/class/hwmon) gives its lab hosts
    # none: the temperature panel can only draw on one that has them.
    sensors = on(HEAD, "ls /sys/class/hwmon 2>/dev/null | wc -l").strip() != "0"
    empty = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            if "node_hwmon_" in expr and not sensors:
                continue
            if "DCGM_FI_" in expr:  # GPU nodes only (dcgm-exporter): the lab has none
                assert not query(expr.replace("$group", ".*")), f"the lab has no GPU, yet {expr} has data"
                continue
            for name, value in values.items():
                expr = expr.replace(name, value)
            if not wait_for(expr, timeout=20):
                empty.append(f"{panel['title']}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def query_range(expr: str, start: float, end: float, step: float) -> list[dict]:
    out = on(HEAD, f"curl -fsS -m 20 {PROMETHEUS}/api/v1/query_range --data-urlencode {shlex.quote('query=' + expr)} "
                   f"--data-urlencode start={start:.0f} --data-urlencode end={end:.0f} --data-urlencode step={step:.0f}")
    answer = json.loads(out)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_the_dashboard_is_drawn_from_the_live_prometheus(real_deploy, tmp_path):
    """tools/dashboard_plot.py draws every panel from the tier's Prometheus over the tier so far; each
    panel has a line (but the temperature panel on a machine without sensors, and the GPU panels: the
    lab has no GPU). SFL_DASHBOARD_PICTURE=PATH
    keeps the picture there (docs/images/dashboard.svg, the README's, was drawn so)."""
    import os

    from tools.dashboard_plot import fetch, svg

    load_like_the_receipt(rounds=1)  # requests in the window, whatever ran before this test
    wait_scraped(2)  # two scrapes after them: a rate needs both
    end = float(on(HEAD, "date +%s"))
    start = max(real_deploy[1] - 300, end - 3600)
    panels = fetch(query_range, {"$group": ".*", "$fabric": "enp1s0f0np0|enP2p1s0f0np0"}, start, end, 15)
    sensors = on(HEAD, "ls /sys/class/hwmon 2>/dev/null | wc -l").strip() != "0"
    gpu = {"GPU power, per rank", "GPU SM clock and utilization, per rank"}
    blank = [p["title"] for p in panels if not p["series"] and p["title"] not in gpu
             and (sensors or p["title"] != "Temperatures, per rank")]
    assert not blank, f"panels drawn without a line: {blank}"
    assert not [p["title"] for p in panels if p["title"] in gpu and p["series"]], "the lab has no GPU, yet a GPU panel drew"
    picture = svg(panels, "sparkfleet: the lab's real vLLM pair, from its Prometheus")
    assert picture.count("<polyline") >= len(panels) - 1 - len(gpu)
    path = Path(os.environ.get("SFL_DASHBOARD_PICTURE") or tmp_path / "dashboard.svg")
    path.write_text(picture)


def test_a_local_user_and_a_host_network_container_reach_neither_prometheus_nor_alertmanager_nor_the_fabric(real_deploy):
    """Issue 43 item 4 with monitoring on (the stand-in pair's part: tests/e2e/test_lab_firewall.py): on
    both hosts of the real pair, a user created for the test and a container of the served vLLM image
    run as uid 65534 on the host's network are refused Prometheus and Alertmanager on the head, the
    real engine's rendezvous, the registry, the rsync daemons, the speed-proof ports and the fabric
    addresses; root's connections answer there and its requests get their answers; Prometheus, whose
    user the firewall admits, still sends its alerts to Alertmanager (its own status says so)."""
    from sparkfleet.inventory import load_cluster
    from tests.real.conftest import REAL_INVENTORY

    cluster = load_cluster(REAL_INVENTORY)
    tried = local_users.check_every_node(cluster, monitoring=True)
    assert any("Prometheus" in line and "Alertmanager" in line for line in tried), tried
    answers = local_users.root_requests(cluster, monitoring=True)
    assert answers == {"registry /v2/": "200", "rsync weights module": "ok", "weights HTTP server": "404",
                       "Prometheus /-/ready": "200", "Alertmanager /-/ready": "200"}, answers
    # Prometheus (user prometheus) reaches Alertmanager through the output chain: its own counters (it
    # does not scrape itself) say every notification went (the drills above sent some) and none failed.
    counters = {}
    for line in on(HEAD, f"curl -fsS -m 10 {PROMETHEUS}/metrics").splitlines():
        if line.startswith(("prometheus_notifications_sent_total{", "prometheus_notifications_errors_total{")):
            counters[line.split("{")[0]] = counters.get(line.split("{")[0], 0) + float(line.rsplit(" ", 1)[1])
    assert counters.get("prometheus_notifications_sent_total", 0) > 0, counters
    assert counters.get("prometheus_notifications_errors_total") == 0, counters
