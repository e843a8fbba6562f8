"""roles/monitoring as the deploy renders it: the alert rules under `promtool test rules` (promtool from
the OS's prometheus package, tests/unit/promtool.sh), the scrape targets from the fleet, the
exporters' arguments and textfile, the firewall's exporter rule, the version picker run against a
package source, and the data's refusals."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkfleet.firewall_rules import rules_text as firewall_rules
from roles.monitoring.checks import (
    alertmanager_config_text, alertmanager_defaults_text, exporter_defaults_text, HELD_POLICY, POLICY_RC, held_packages, install_command, live_queries, monitoring_node, prometheus_config_text, prometheus_defaults_text,
    rules_text, targets, textfile_text, to_install, upstream_version,
)
from sparkfleet.config import build_cluster
from sparkfleet.model.engine import SGLANG_METRICS
from tests.unit.helpers import capture
from tests.unit.test_router_render import MGMT, fleet_hosts, refused

REPO = Path(__file__).resolve().parents[2]
ALERT_TESTS = Path(__file__).with_name("alerts") / "sparkfleet.test.yml"


def fleet(router="spark-b", **changes):
    return build_cluster(fleet_hosts(router=router, **changes))


def test_the_alert_rules_pass_their_promtool_unit_tests(promtool, tmp_path):
    """Each alert fires on the series of the failure it stands for and stays quiet on its look-alike
    (tests/unit/alerts/sparkfleet.test.yml), with the thresholds group_data sets."""
    (tmp_path / "sparkfleet.rules.yml").write_text(rules_text(fleet()))
    shutil.copy(ALERT_TESTS, tmp_path)
    check = subprocess.run([promtool, "check", "rules", "sparkfleet.rules.yml"], cwd=tmp_path, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run([promtool, "test", "rules", ALERT_TESTS.name], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_alert_has_a_unit_test_that_fires_it():
    alerts = [r["alert"] for g in yaml.safe_load(rules_text(fleet()))["groups"] for r in g["rules"]]
    cases = [case for t in yaml.safe_load(ALERT_TESTS.read_text())["tests"] for case in t.get("alert_rule_test", [])]
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    assert [a for a in alerts if a not in fires] == [], "alerts no case of tests/unit/alerts sees firing"


def test_a_threshold_from_data_moves_the_alert(promtool, tmp_path):
    """The rules follow data: with 2 GiB of headroom, the case the tests expect to fire at 4 GiB does not."""
    low = fleet(**{n: {"monitoring_alert_memory_headroom_gib": 2.0} for n in ("spark-a", "spark-b", "spark-c", "spark-d")})
    assert "node_memory_MemAvailable_bytes < 2147483648" in rules_text(low)
    (tmp_path / "sparkfleet.rules.yml").write_text(rules_text(low))
    shutil.copy(ALERT_TESTS, tmp_path)
    run = subprocess.run([promtool, "test", "rules", ALERT_TESTS.name], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 1 and "SparkfleetMemoryLow" in run.stdout + run.stderr, run.stdout


def test_the_memory_pressure_bar_and_its_duration_come_from_data(promtool, tmp_path):
    """With 95 % for 45 s, the 90 % stall the tests expect to fire does not: the rule reads data."""
    high = fleet(**{n: {"monitoring_alert_memory_pressure": 0.95, "monitoring_alert_memory_pressure_for_s": 45}
                    for n in ("spark-a", "spark-b", "spark-c", "spark-d")})
    [rule] = [r for g in yaml.safe_load(rules_text(high))["groups"] for r in g["rules"]
              if r["alert"] == "SparkfleetMemoryPressure"]
    assert rule["expr"] == "rate(node_pressure_memory_stalled_seconds_total[1m]) > 0.95" and rule["for"] == "45s"
    (tmp_path / "sparkfleet.rules.yml").write_text(rules_text(high))
    shutil.copy(ALERT_TESTS, tmp_path)
    run = subprocess.run([promtool, "test", "rules", ALERT_TESTS.name], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 1 and "SparkfleetMemoryPressure" in run.stdout + run.stderr, run.stdout


def test_the_prometheus_config_scrapes_every_node_and_every_head_from_the_inventory(promtool, tmp_path):
    f = fleet()
    jobs = targets(f)
    assert [t["address"] for t in jobs["node"]] == ["10.0.0.11:9100", "10.0.0.12:9100", "10.0.0.13:9100",
                                                     "10.0.0.14:9100"]
    assert [(t["address"], t["group"], t["rank"]) for t in jobs["engine"]] == [("10.0.0.11:9400", "g1", "0"),
                                                                              ("10.0.0.13:9400", "g2", "0")]
    text = prometheus_config_text(f)
    # promtool reads the config as Prometheus would, the rules file beside it
    (tmp_path / "sparkfleet.rules.yml").write_text(rules_text(f))
    (tmp_path / "prometheus.yml").write_text(text.replace("/etc/prometheus/sparkfleet.rules.yml", "sparkfleet.rules.yml"))
    run = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "remote_write" not in text
    url = "https://prom.example:9090/api/v1/write"
    remote = fleet(**{n: {"monitoring_remote_write_url": url} for n in ("spark-a", "spark-b", "spark-c", "spark-d")})
    assert f'url: "{url}"' in prometheus_config_text(remote)


def test_the_monitoring_node_is_data_s_else_the_router_s_else_the_first_head():
    assert monitoring_node(fleet(router="spark-d")).name == "spark-d"
    assert monitoring_node(fleet(router=None)).name == "spark-a"
    named = fleet(**{n: {"monitoring_node": "spark-c"} for n in ("spark-a", "spark-b", "spark-c", "spark-d")})
    assert monitoring_node(named).name == "spark-c"
    off = fleet(**{n: {"monitoring_enabled": False} for n in ("spark-a", "spark-b", "spark-c", "spark-d")})
    assert monitoring_node(off) is None


def test_prometheus_listens_on_loopback_and_keeps_what_data_says():
    args = prometheus_defaults_text(fleet().node("spark-b"))
    assert "--web.listen-address=127.0.0.1:9090" in args and "--storage.tsdb.retention.time=30d" in args


def test_the_exporter_runs_only_the_collectors_data_names(promtool, tmp_path):
    node = fleet().node("spark-a")
    args = re.search(r'^ARGS="(.*)"$', exporter_defaults_text(node), re.M).group(1).split()
    assert "--collector.disable-defaults" in args
    assert sorted(a.split(".", 1)[1] for a in args if re.fullmatch(r"--collector\.[a-z_]+", a)) == sorted(
        node.monitoring_node_exporter_collectors)
    assert "--collector.systemd.unit-include=sparkfleet-.+[.]service" in args
    # sparkfleet's textfile is valid exposition text (promtool lints it as the collector would read it)
    text = textfile_text(fleet(), node)
    run = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert 'sparkfleet_fabric_mtu_wanted_bytes{device="enp1s0f0np0"} 9000' in text
    assert 'group="g1",rank="0"' in text


def test_the_firewall_admits_the_monitoring_node_alone_to_the_exporters():
    f = fleet()
    g1 = f.groups["g1"]
    head = firewall_rules(g1, f.node("spark-a"), MGMT, "10.0.0.12")
    # a GPU node's GPU exporter (9401) too
    assert "tcp dport { 9100, 9400, 9401 } ip saddr != 10.0.0.12 drop" in head
    assert "tcp dport { 9100, 9400, 9401 } meta nfproto ipv6 drop" in head
    worker = firewall_rules(g1, f.node("spark-b"), MGMT, "10.0.0.12")
    assert "tcp dport { 9100, 9401 } ip saddr != 10.0.0.12 drop" in worker
    assert "9100" not in firewall_rules(g1, f.node("spark-b"), MGMT, None)
    # without a GPU, no GPU exporter port
    cpu = fleet(**{n: {"gpu_expected": False} for n in ("spark-a", "spark-b", "spark-c", "spark-d")})
    assert "tcp dport { 9100 } ip saddr != 10.0.0.12 drop" in firewall_rules(
        cpu.groups["g1"], cpu.node("spark-b"), MGMT, "10.0.0.12")


@pytest.mark.parametrize("debian, upstream", [
    ("1.7.0-1ubuntu0.3", "1.7.0"), ("2.42.0+ds-5+deb12u1", "2.42.0"), ("1:2.45.3+ds-2build1", "2.45.3"),
    ("1.5.0~rc1-1", "1.5.0"), ("", ""),
])
def test_the_upstream_version_of_a_debian_version(debian, upstream):
    assert upstream_version(debian) == upstream


def _fake_apt(tmp_path, offered: dict[str, list[str]]) -> dict:
    """apt-get and apt-cache on PATH, answering as a package source that offers `offered` {package: versions};
    apt-get install records what it was asked for and what policy-rc.d says to a start and a restart of
    each package's unit (as deb-systemd-invoke asks it) while it runs. POLICY_RC points into tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    madison = "".join(f'{p}) printf "%s\\n" ' + " ".join(f"' {p} | {v} | http://deb.example bookworm/main amd64 Packages'"
                                                       for v in versions) + " ;; "
                      for p, versions in offered.items())
    (bin_dir / "apt-cache").write_text(f'#!/bin/sh\ncase "$2" in {madison} esac\n')
    policy = tmp_path / "policy-rc.d"
    (bin_dir / "apt-get").write_text(
        f"#!/bin/sh\n[ \"$1\" = update ] && exit 0\necho \"$@\" > {tmp_path}/installed\n"
        f"for a in \"$@\"; do case $a in -*|*::*) ;; *=*) u=${{a%%=*}}.service; "
        f"for act in start restart; do {policy} $u $act; echo \"$u $act $?\" >> {tmp_path}/policy; done ;; esac; done\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _install(tmp_path, wanted: dict[str, str], env: dict) -> subprocess.CompletedProcess:
    command = install_command(wanted).replace(POLICY_RC, str(tmp_path / "policy-rc.d"))
    return subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True)


def test_the_installer_takes_the_os_build_of_each_pinned_version_in_one_transaction(tmp_path):
    env = _fake_apt(tmp_path, {"prometheus": ["2.45.3+ds-2build1", "2.42.0+ds-5+deb12u1"],
                               "prometheus-node-exporter": ["1.5.0-1+b13"]})
    run = _install(tmp_path, {"prometheus-node-exporter": "1.5.0", "prometheus": "2.42.0"}, env)
    assert run.returncode == 0, run.stderr
    asked = (tmp_path / "installed").read_text()
    assert "prometheus=2.42.0+ds-5+deb12u1" in asked and "prometheus-node-exporter=1.5.0-1+b13" in asked
    assert "--no-install-recommends" in asked and "--force-confold" in asked


def test_the_installer_holds_the_packages_start_alone_while_it_runs_and_removes_its_policy(tmp_path):
    """While apt installs, policy-rc.d refuses (101) a fresh install's start of these units and allows an
    upgrade's restart; afterwards it is gone. A policy a killed run left is replaced, a node's own kept."""
    env = _fake_apt(tmp_path, {"prometheus": ["2.42.0+ds-5+deb12u1"], "prometheus-node-exporter": ["1.5.0-1"]})
    assert _install(tmp_path, {"prometheus-node-exporter": "1.5.0", "prometheus": "2.42.0"}, env).returncode == 0
    said = (tmp_path / "policy").read_text().splitlines()
    assert said == ["prometheus-node-exporter.service start 101", "prometheus-node-exporter.service restart 0",
                    "prometheus.service start 101", "prometheus.service restart 0"], said
    assert not (tmp_path / "policy-rc.d").exists()
    # the policy holds these names alone
    policy = tmp_path / "held"
    policy.write_text(HELD_POLICY)
    policy.chmod(0o755)
    assert [subprocess.run([policy, unit, "start"]).returncode
            for unit in ("prometheus", "prometheus-alertmanager.service", "haproxy.service", "ssh")] == [101, 101, 0, 0]
    # a copy a killed run left behind is replaced and removed; the node's own policy-rc.d stays as it was
    (tmp_path / "policy").unlink()
    (tmp_path / "policy-rc.d").write_text(HELD_POLICY)
    (tmp_path / "policy-rc.d").chmod(0o755)
    assert _install(tmp_path, {"prometheus": "2.42.0"}, env).returncode == 0
    assert not (tmp_path / "policy-rc.d").exists()
    own = "#!/bin/sh\nexit 0\n"
    (tmp_path / "policy-rc.d").write_text(own)
    (tmp_path / "policy-rc.d").chmod(0o755)
    assert _install(tmp_path, {"prometheus": "2.42.0"}, env).returncode == 0
    assert (tmp_path / "policy-rc.d").read_text() == own
    assert (tmp_path / "policy").read_text().splitlines()[-2:] == ["prometheus.service start 0",
                                                                   "prometheus.service restart 0"]


def test_the_installer_stops_naming_the_versions_offered(tmp_path):
    env = _fake_apt(tmp_path, {"prometheus": ["2.45.3+ds-2build1"], "prometheus-node-exporter": ["1.5.0-1"]})
    run = _install(tmp_path, {"prometheus-node-exporter": "1.5.0", "prometheus": "2.42.0"}, env)
    assert run.returncode == 1
    assert "prometheus 2.42.0 is not offered" in run.stderr and "2.45.3+ds-2build1" in run.stderr
    assert not (tmp_path / "installed").exists() and not (tmp_path / "policy-rc.d").exists()


def test_the_packages_a_node_runs_and_those_step_4c_installs():
    f = alerting()
    monitor = monitoring_node(f)
    assert monitor.name == "spark-b"  # the router node
    node = f.node("spark-b")
    wanted = held_packages(node, monitor)
    assert wanted == {"prometheus-node-exporter": node.monitoring_node_exporter_version,
                      "prometheus": node.monitoring_prometheus_version,
                      "prometheus-alertmanager": node.monitoring_alertmanager_version}
    assert held_packages(f.node("spark-c"), monitor) == {"prometheus-node-exporter": node.monitoring_node_exporter_version}
    assert "prometheus-alertmanager" not in held_packages(fleet().node("spark-b"), monitoring_node(fleet()))
    # installed at the pinned upstream version (any Debian revision): nothing; another or none: installed
    at_pin = {"prometheus-node-exporter": f"{node.monitoring_node_exporter_version}-1ubuntu0.3",
              "prometheus": f"1:{node.monitoring_prometheus_version}+ds-2build1", "prometheus-alertmanager": "0.1.0-1"}
    assert to_install(wanted, at_pin) == {"prometheus-alertmanager": node.monitoring_alertmanager_version}
    assert to_install(wanted, {}) == wanted


def test_monitoring_data_is_the_fleet_s_and_refused_naming_host_key_and_allowed_values():
    err = refused(fleet_hosts(**{"spark-c": {"monitoring_scrape_interval_s": 30}}))
    assert any("key 'monitoring_scrape_interval_s' differs between nodes" in p for p in err.problems)
    every = ("spark-a", "spark-b", "spark-c", "spark-d")
    err = refused(fleet_hosts(**{n: {"monitoring_node_exporter_collectors": ["meminfo", "gpu"]} for n in every}))
    assert any("'gpu'" in p and "allowed: meminfo" in p for p in err.problems)
    err = refused(fleet_hosts(**{n: {"monitoring_node": "spark-z"} for n in every}))
    assert any("key 'monitoring_node' = 'spark-z' is not a node of the inventory; allowed: spark-a" in p
               for p in err.problems)
    err = refused(fleet_hosts(**{n: {"monitoring_engine_metrics_port": 9100} for n in every}))
    assert any("the monitoring ports must differ" in p for p in err.problems)


@pytest.mark.parametrize("tool, package, key", [
    ("promtool", "prometheus", "monitoring_prometheus_version"),
    ("amtool", "prometheus-alertmanager", "monitoring_alertmanager_version"),
    ("prometheus", "prometheus", "monitoring_prometheus_version"),
    ("prometheus-node-exporter", "prometheus-node-exporter", "monitoring_node_exporter_version")])
def test_the_lab_pins_the_promtool_and_amtool_it_tests_with(tool, package, key):
    """promtool.sh's versions are the lab's Prometheus, Alertmanager and node exporter (what is tested is
    what the lab runs)."""
    script = (REPO / "tests/unit/promtool.sh").read_text()
    lab = (REPO / "lab/group_data/all.py").read_text()
    assert re.search(rf"^  {tool}\) PACKAGE={package} VERSION=(\S+) ;;$", script, re.M).group(1) == re.search(
        rf'^{key} = "(\S+)"$', lab, re.M).group(1)


def test_the_doctor_names_a_monitoring_port_held_by_the_wrong_program_or_open_beyond_loopback():
    from roles.monitoring.checks import listener_problems
    f = fleet(router=None)
    head = f.node("spark-a")
    good = [("0.0.0.0", 9100, "prometheus-node"), ("0.0.0.0", 9400, "haproxy"), ("127.0.0.1", 9090, "prometheus"),
            ("10.0.0.11", 9401, "dcgm-exporter")]
    assert listener_problems(head, "spark-a", good) == []
    assert listener_problems(f.node("spark-b"), "spark-a", good[:1] + [("10.0.0.12", 9401, "dcgm-exporter")]) == []
    # a GPU node whose GPU exporter does not run
    assert listener_problems(f.node("spark-b"), "spark-a", good[:1]) == [
        "spark-b: port 9401 is held by nothing; want only dcgm-exporter (roles/monitoring: deploy)"]
    wide = good[:2] + good[3:] + [("0.0.0.0", 9090, "prometheus")]
    assert listener_problems(head, "spark-a", wide) == [
        "spark-a: port 9090 (Prometheus) is held by prometheus on 0.0.0.0; want only prometheus on 127.0.0.1"]
    assert listener_problems(head, "spark-a", good[1:]) == [
        "spark-a: port 9100 is held by nothing; want only prometheus-node (roles/monitoring: deploy)"]
    assert listener_problems(head, None, []) == []


def test_the_receipt_s_figures_become_valid_textfile_metrics(promtool):
    from roles.receipt.receipt import receipt_metrics_text

    receipt = {"taken_at": "2026-12-03T10:00:00Z", "figures": [
        {"concurrency": 1, "ttft_ms": 120.5, "decode_tps_per_request": 30.1},
        {"concurrency": 4, "ttft_ms": None, "decode_tps_per_request": 21.0}]}
    text = receipt_metrics_text(receipt)
    run = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert 'sparkfleet_receipt_ttft_seconds{concurrency="1"} 0.120500' in text
    assert 'concurrency="4"} 21.0' in text and 'sparkfleet_receipt_ttft_seconds{concurrency="4"}' not in text
    assert "sparkfleet_receipt_timestamp_seconds 1796292000" in text


def test_status_s_live_line_reads_prometheus_answers_and_shows_the_group_s_alerts():
    from roles.monitoring.checks import LiveFigures, live_line

    def answer(value):
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [] if value is None else
                                                           [{"metric": {}, "value": [1796292000, value]}]}})

    alerts = json.dumps({"status": "success", "data": {"alerts": [
        {"labels": {"alertname": "SparkfleetRankDown", "group": "g1", "node": "spark-b"}, "state": "firing"},
        {"labels": {"alertname": "SparkfleetKvCacheFull", "group": "g2"}, "state": "firing"},
        {"labels": {"alertname": "SparkfleetMemoryLow", "group": "g1", "node": "spark-a"}, "state": "pending"}]}})
    output = [f"tokens_s\t{answer('12.34')}", f"running\t{answer('2')}", f"waiting\t{answer('0')}",
              f"kv\t{answer('0.25')}", f"ttft_p50\t{answer('NaN')}", f"ttft_p95\t{answer(None)}", f"alerts\t{alerts}"]
    live = LiveFigures().process(output)
    assert live["figures"] == {"tokens_s": 12.34, "running": 2.0, "waiting": 0.0, "kv": 0.25, "ttft_p50": None,
                               "ttft_p95": None}
    assert live_line(live, "g1") == ("12.3 tokens/s, 2 running, 0 waiting, KV 25%, TTFT p50 - s p95 - s (5 min); "
                                     "firing: SparkfleetRankDown (spark-b)")
    assert live_line(live, "g2").endswith("firing: SparkfleetKvCacheFull")
    trickle = LiveFigures().process([f"tokens_s\t{answer('0.0533')}", f"alerts\t{alerts}"])
    assert live_line(trickle, "g1").startswith("0.053 tokens/s, - running")  # not 0.0
    idle = LiveFigures().process([f"tokens_s\t{answer('0')}", f"alerts\t{alerts}"])
    assert live_line(idle, "g1").startswith("0 tokens/s,")
    down = LiveFigures().process(["tokens_s\t{}", "alerts\t{}"])
    assert live_line(down, "g1") == "no figures: Prometheus did not answer"
    assert live_line(None, "g1") == "monitoring off, or its node not in this run"


def test_the_dashboard_s_every_panel_is_drawn_and_an_empty_one_says_so():
    from tools.dashboard_plot import DASHBOARD, fetch, svg

    dashboard = json.loads(DASHBOARD.read_text())
    asked = []

    def query_range(expr, start, end, step):
        asked.append(expr)
        if "hwmon" in expr or "DCGM_FI_" in expr:  # a machine without sensors, a node without a GPU
            return []
        return [{"metric": {"group": "pair", "node": "spark-a", "rank": "0", "device": "enp1s0f0np0"},
                 "values": [[start, "1"], [start + step, "NaN"], [end, "3"]]}]

    panels = fetch(query_range, {"$group": ".*", "$fabric": "enp1s0f0np0"}, 1000.0, 1600.0, 60, dashboard)
    assert len(panels) == len(dashboard["panels"]) and all("$" not in e for e in asked)
    assert sum(len(p["targets"]) for p in dashboard["panels"]) == len(asked)
    drawn = svg(panels, "t")
    assert drawn.count("<polyline") == sum(len(p["series"]) for p in panels) and drawn.count(">no data<") == 3
    first = panels[0]["series"][0]
    assert first[0] == "pair running" and first[1] == [(1000.0, 1.0), (1600.0, 3.0)]  # NaN dropped


# A group's engine figures as vLLM names them, and the same as SGLang does (SGLANG_METRICS).
VLLM_SERIES = {"vllm:num_requests_running": "2x40", "vllm:num_requests_waiting": "3x40",
               "vllm:generation_tokens_total": "0+10x40", "vllm:kv_cache_usage_perc": "0.5x40",
               'vllm:time_to_first_token_seconds_bucket{le="1.0"}': "0+4x40",
               'vllm:time_to_first_token_seconds_bucket{le="+Inf"}': "0+4x40",
               'vllm:inter_token_latency_seconds_bucket{le="0.1"}': "0+40x40",
               'vllm:inter_token_latency_seconds_bucket{le="+Inf"}': "0+40x40"}
ENGINE_SERIES = {
    "vllm": VLLM_SERIES,
    "sglang": {SGLANG_METRICS[s.split("{")[0]] + s[len(s.split("{")[0]):]: v for s, v in VLLM_SERIES.items()},
}


@pytest.mark.parametrize("engine", list(ENGINE_SERIES))
def test_every_engine_panel_and_status_figure_has_data_for_a_group_of_either_engine(promtool, tmp_path, engine):
    """Each dashboard expression and each `make status` figure that reads an engine's metrics gives
    the group one series whether the group runs vLLM or SGLang (given only that engine's series, as
    Prometheus scrapes them), under promtool."""
    from tools.dashboard_plot import DASHBOARD

    group = "q1"
    exprs = [t["expr"].replace("$group", group) for p in json.loads(DASHBOARD.read_text())["panels"]
             for t in p["targets"] if "vllm:" in t["expr"]]
    exprs += [e for e in live_queries(group).values()]
    assert exprs and all("sglang:" in e for e in exprs), [e for e in exprs if "sglang:" not in e]

    def series(name_labels: str) -> str:
        name, _, labels = name_labels.partition("{")
        extra = f'group="{group}", node="spark-a", job="engine"'
        return f"{name}{{{labels[:-1] + ', ' if labels else ''}{extra}}}"
    case = {"rule_files": [], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [{"series": series(s), "values": v} for s, v in ENGINE_SERIES[engine].items()],
        "promql_expr_test": [{"expr": f"count({e})", "eval_time": "9m", "exp_samples": [{"labels": "{}", "value": 1}]}
                             for e in exprs],
    }]}
    (tmp_path / "engine.test.yml").write_text(yaml.safe_dump(case))
    run = subprocess.run([promtool, "test", "rules", "engine.test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_gpu_node_runs_nvidia_s_dcgm_exporter_with_gb10_s_fields_for_the_monitoring_node_only():
    """roles/monitoring step 5: on a GPU node, dcgm-exporter at the pinned image on the host's network
    (the firewall's input rules apply to it) on the management address, reading exactly the fields
    recorded as live on GB10; Prometheus scrapes it as job gpu. No GPU: no unit, no job."""
    from roles.monitoring.checks import GPU_EXPORTER_COUNTERS, gpu_exporter_files
    from sparkfleet.model.monitoring import GPU_EXPORTER_FIELDS
    from sparkfleet.model.tls import EXPORTER_TLS_DIR, EXPORTER_WEB_CONFIG
    f = fleet(router=None)
    files = gpu_exporter_files(f.node("spark-b"))
    unit = files["/etc/systemd/system/sparkfleet-gpu-exporter.service"]
    run = re.search(r"^ExecStart=(.*?)(?<!\\)$", unit.replace("\\\n", " "), re.M).group(1).split()
    assert run[:3] == ["/usr/bin/docker", "run", "--rm"]
    assert "--network" in run and run[run.index("--network") + 1] == "host"
    # By digest (a tag re-pushed cannot change it), the one NVIDIA's GPU Operator pairs with the tag.
    image = run.index("nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.1-ubuntu22.04"
                      "@sha256:ecb867c5787e44f1889b257e6c03b07748689a7b293c8f1affb1d4cb449b235c")
    assert run[image + 1:] == ["--collectors", GPU_EXPORTER_COUNTERS, "--address", "10.0.0.12:9401",
                               "--collect-interval", "15000", "--web-config-file", EXPORTER_WEB_CONFIG]
    # over TLS (dcgm-exporter 3.3.5-3.4.1's --web-config-file, exporter-toolkit v0.11.0): the node exporter's web
    # configuration and the node's certificate, their directory mounted read-only; with TLS off, plain HTTP
    assert f"{EXPORTER_TLS_DIR}:{EXPORTER_TLS_DIR}:ro" in run
    plain = fleet(router=None, **{n: {"tls_enabled": False, "tls_disabled_reason": "a test"}
                                  for n in ("spark-a", "spark-b", "spark-c", "spark-d")})
    plain_unit = gpu_exporter_files(plain.node("spark-b"))["/etc/systemd/system/sparkfleet-gpu-exporter.service"]
    assert "--web-config-file" not in plain_unit and EXPORTER_TLS_DIR not in plain_unit
    # The least privilege NVIDIA documents (root, Docker's default capabilities, nothing added), read-only,
    # no exec gaining a capability, the entrypoint's setcap off.
    options = run[:image]
    assert "--read-only" in options and "--security-opt=no-new-privileges" in options and "NO_SETCAP=1" in options
    assert not [w for w in options if w.startswith(("--cap-add", "--privileged", "--user", "-p", "--publish"))], options
    assert "SYS_ADMIN" not in " ".join(run)
    assert "After=sparkfleet-firewall.service" in unit
    fields = [line.split(",")[0] for line in files[GPU_EXPORTER_COUNTERS].splitlines()
              if line and not line.startswith("#")]
    assert fields == [name for name, _, _ in GPU_EXPORTER_FIELDS]
    assert not any(n.startswith(("DCGM_FI_DEV_FB_", "DCGM_FI_PROF_")) or n == "DCGM_FI_DEV_MEMORY_TEMP" for n in fields)
    jobs = targets(f)
    assert [t["address"] for t in jobs["gpu"]] == ["10.0.0.11:9401", "10.0.0.12:9401", "10.0.0.13:9401", "10.0.0.14:9401"]
    cpu = fleet(router=None, **{n: {"gpu_expected": False} for n in ("spark-a", "spark-b", "spark-c", "spark-d")})
    assert gpu_exporter_files(cpu.node("spark-b")) == {}
    assert "gpu" not in targets(cpu) and "job_name: gpu" not in prometheus_config_text(cpu)
    assert "job_name: gpu" in prometheus_config_text(f)


DIGEST = "sha256:ecb867c5787e44f1889b257e6c03b07748689a7b293c8f1affb1d4cb449b235c"


def test_the_gpu_exporter_image_ships_pinned_by_digest_and_the_key_takes_a_digest():
    """monitoring_gpu_exporter_image: the shipped default (the model's and group_data's) is a digest;
    the key takes `name@sha256:<64 hex>` and `name:tag@sha256:<64 hex>` as Docker does, a tag alone
    still, and refuses a digest that is not sha256 and 64 lower-case hex digits or a reference with
    neither, naming both hosts, the key and what to write."""
    from roles.monitoring.checks import gpu_exporter_files
    from sparkfleet.config import ConfigError
    from sparkfleet.model.monitoring import GPU_EXPORTER_IMAGE, MonitoringData
    from tests.unit.helpers import pair

    assert GPU_EXPORTER_IMAGE.endswith("@" + DIGEST)
    assert MonitoringData.model_fields["monitoring_gpu_exporter_image"].default == GPU_EXPORTER_IMAGE
    assert build_cluster(pair()).head.monitoring_gpu_exporter_image == GPU_EXPORTER_IMAGE  # group_data's too
    for value in ("nvcr.io/nvidia/k8s/dcgm-exporter@" + DIGEST, GPU_EXPORTER_IMAGE,
                  "registry.example:5000/nvidia/dcgm-exporter@" + DIGEST,
                  "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.1-ubuntu22.04"):
        data = {"monitoring_gpu_exporter_image": value}
        c = build_cluster(pair(**{"spark-a": data, "spark-b": data}))
        unit = gpu_exporter_files(c.node("spark-b"))["/etc/systemd/system/sparkfleet-gpu-exporter.service"]
        assert f" {value} \\\n" in unit  # one word of the docker command, as given
    for value in ("nvcr.io/nvidia/k8s/dcgm-exporter@sha256:" + "a" * 63,  # one digit short
                  "nvcr.io/nvidia/k8s/dcgm-exporter@sha256:" + "A" * 64,  # upper case
                  "nvcr.io/nvidia/k8s/dcgm-exporter@sha512:" + "a" * 128,
                  "nvcr.io/nvidia/k8s/dcgm-exporter@" + "a" * 64,  # no algorithm
                  "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5@sha256:",
                  "@" + DIGEST,  # no name
                  "nvcr.io/nvidia/k8s/dcgm-exporter"):  # neither tag nor digest
        data = {"monitoring_gpu_exporter_image": value}
        with pytest.raises(ConfigError) as err:
            build_cluster(pair(**{"spark-a": data, "spark-b": data}))
        text = str(err.value)
        for host in ("spark-a", "spark-b"):
            assert f"{host}: key 'monitoring_gpu_exporter_image' = {value!r}: not a Docker image reference" in text, text
        assert "@sha256:<64 hex>" in text and "pinned by its digest" in text, text


def short(name: str) -> str:
    """A DCGM field as the captures name it, without the DCGM_FI_DEV_ / DCGM_FI_PROF_ prefix."""
    return re.sub(r"^DCGM_FI_(DEV|PROF)_", "", name)


def test_the_gpu_exporter_s_fields_are_the_ones_sparks_report_live_and_none_they_report_dead():
    """GPU_EXPORTER_FIELDS against two Spark owners' live scrapes (captures/dcgm_*): domenkogler's table
    of the 13 series dcgm-exporter 3.3.5-3.4.1 emits on GB10 (each marked worth wiring or not) and rwlove's
    list of working and dead fields under load (driver 580.142)."""
    from sparkfleet.model.monitoring import GPU_EXPORTER_FIELDS
    fields = {short(name) for name, kind, _ in GPU_EXPORTER_FIELDS if kind != "label"}
    summary = capture("dcgm_domenkogler_observability_summary.txt")
    wired, dead = set(), set()
    for row in summary.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 2 or "`" not in cells[0]:
            continue
        names = {short(n) for n in re.findall(r"`([A-Z_]+)`", cells[0])}
        (wired if cells[1].lstrip("*").startswith("yes") else dead if cells[1].startswith("**no**") else set()).update(names)
    assert fields == wired, (fields, wired)  # every series worth wiring, and nothing else
    assert not fields & dead
    assert 'DCGM_FI_DRIVER_VERSION="580.178.04"' in summary  # the label field, on every series
    assert ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version") in GPU_EXPORTER_FIELDS
    verified = capture("dcgm_rwlove_home_ops_pr13238.txt")
    working = set(re.findall(r"`([A-Z_]+)`", verified.split("**Working:**")[1].split("\n")[0]))
    still_dead = set(re.findall(r"`([A-Z_*]+)`", verified.split("**Still dead:**")[1].split("\n")[0]))
    assert working and working <= fields, working - fields
    assert still_dead and not any(f == d or (d.endswith("*") and f.startswith(d[:-1])) for f in fields for d in still_dead)


def test_the_alert_case_s_gpu_labels_are_a_spark_s():
    """The throttle case's series carry the PCI bus ID and model nvidia-smi shows for a Spark's GB10
    (captures/smi_table_obrienlabs_spark7d19.txt and the table in docker_info_runtimes_text.txt)."""
    cases = ALERT_TESTS.read_text()
    for name in ("smi_table_obrienlabs_spark7d19.txt", "docker_info_runtimes_text.txt"):
        [(model, bus)] = re.findall(r"^\|\s+0\s+(NVIDIA GB10)\s+\S+\s+\|\s+(\S+)\s", capture(name), re.M)
        assert f'pci_bus_id="{bus}", modelName="{model}"' in cases


EVERY = ("spark-a", "spark-b", "spark-c", "spark-d")
WEBHOOK = {"name": "ops", "webhook_configs": [{"url": "http://10.0.0.5:5001/hook", "send_resolved": True}]}


def alerting(receivers=(WEBHOOK,), router="spark-b", **more):
    data = {"monitoring_alertmanager_enabled": True, "monitoring_alertmanager_receivers": list(receivers), **more}
    return fleet(router=router, **{n: data for n in EVERY})


def test_alertmanager_s_configuration_sends_every_alert_to_each_receiver_and_amtool_accepts_it(amtool, tmp_path):
    """The rendered configuration is what the OS's Alertmanager reads (amtool check-config, Debian 12's
    0.25.0 as the lab runs), each receiver data names is routed every alert, with data's timings."""
    pager = {"name": "pager", "pagerduty_configs": [{"routing_key_file": "/etc/prometheus/pagerduty-key"}]}
    f = alerting((WEBHOOK, pager), monitoring_alertmanager_group_wait_s=7, monitoring_alertmanager_repeat_interval_s=3600)
    text = alertmanager_config_text(monitoring_node(f))
    (tmp_path / "alertmanager.yml").write_text(text)
    run = subprocess.run([amtool, "check-config", "alertmanager.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    config = yaml.safe_load(text)
    assert [r["receiver"] for r in config["route"]["routes"]] == ["ops", "pager"]
    assert all(r["continue"] for r in config["route"]["routes"]) and "matchers" not in str(config["route"])
    # each *_file names the monitoring node's copy of the controller's file (tests/unit/test_monitoring_secrets.py)
    assert config["receivers"] == [WEBHOOK, {"name": "pager", "pagerduty_configs": [
        {"routing_key_file": "/etc/prometheus/secrets/pager.pagerduty_configs.0.routing_key_file"}]}]
    assert (config["route"]["group_wait"], config["route"]["repeat_interval"]) == ("7s", "3600s")
    # amtool refuses what Alertmanager would: the test above is not one that passes anything
    (tmp_path / "bad.yml").write_text(text.replace("webhook_configs", "webhok_configs"))
    bad = subprocess.run([amtool, "check-config", "bad.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode != 0


def test_prometheus_sends_alerts_to_alertmanager_on_loopback_only_when_it_is_on(promtool, tmp_path):
    on, off = alerting(), fleet()
    assert "alerting:" not in prometheus_config_text(off)
    text = prometheus_config_text(on)
    assert yaml.safe_load(text)["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]}
    (tmp_path / "sparkfleet.rules.yml").write_text(rules_text(on))
    (tmp_path / "prometheus.yml").write_text(text.replace("/etc/prometheus/sparkfleet.rules.yml", "sparkfleet.rules.yml"))
    run = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    # loopback, no gossip port (its default 0.0.0.0:9094), data's port
    args = re.search(r'^ARGS="(.*)"$', alertmanager_defaults_text(monitoring_node(on)), re.M).group(1).split(" ")
    assert "--web.listen-address=127.0.0.1:9093" in args and "--cluster.listen-address=" in args
    assert "--config.file=/etc/prometheus/alertmanager.yml" in args


def test_alertmanager_receivers_are_refused_naming_the_key_and_the_allowed_integrations():
    def problems(receivers, **more):
        data = {"monitoring_alertmanager_enabled": True, "monitoring_alertmanager_receivers": receivers, **more}
        return refused(fleet_hosts(**{n: data for n in EVERY})).problems

    assert any("key 'monitoring_alertmanager_receivers' is empty while monitoring_alertmanager_enabled is true" in p
               for p in problems([]))
    typo = problems([{"name": "ops", "webhok_configs": [{"url": "http://x/"}]}])
    assert any("entry 0 ('ops') has 'webhok_configs'; allowed: name, discord_configs, email_configs" in p for p in typo)
    assert any("entry 0 ('ops') has no integration" in p for p in typo)
    assert any("the name 'ops' is used twice" in p for p in problems([WEBHOOK, WEBHOOK]))
    assert any("entry 0 has no name" in p for p in problems([{"webhook_configs": [{"url": "http://x/"}]}]))
    assert any("webhook_configs must be a non-empty list" in p for p in problems([{"name": "a", "webhook_configs": {}}]))
    assert any("the monitoring ports must differ" in p for p in problems([WEBHOOK], monitoring_alertmanager_port=9090))
    # a secret never in data: the *_file form Alertmanager reads instead, or why there is none
    slack = {"name": "chat", "slack_configs": [{"api_url": "https://hooks.slack.com/services/T0/B0/xyz", "channel": "#a"}]}
    err = refused(fleet_hosts(**{n: {"monitoring_alertmanager_enabled": True, "monitoring_alertmanager_receivers": [slack]}
                                 for n in EVERY}))
    secret = [p for p in err.problems if "slack_configs[0].api_url is a secret in data" in p]
    assert secret and secret[0].fix.endswith("name that file in slack_configs[0].api_url_file: the deploy copies it "
                                             "to the monitoring node") and "xyz" not in str(err), err
    hook = {"name": "h", "webhook_configs": [{"url": "http://x/", "http_config": {"authorization": {"credentials": "t"}}}]}
    assert any("webhook_configs[0].http_config.authorization.credentials is a secret" in p for p in problems([hook]))
    tg = {"name": "t", "telegram_configs": [{"bot_token": "t", "chat_id": 1}]}
    assert any(p.fix.startswith("Alertmanager 0.25.0 reads it inline only") for p in
               problems([tg], monitoring_alertmanager_version="0.25.0") if "bot_token" in p)
    # off, its receivers are not read
    fleet(**{n: {"monitoring_alertmanager_receivers": [{"bad": 1}]} for n in EVERY})


def test_the_doctor_names_alertmanager_beyond_loopback_or_with_its_cluster_port_open():
    from roles.monitoring.checks import listener_problems
    f = alerting(router=None)
    head = f.node("spark-a")
    good = [("0.0.0.0", 9100, "prometheus-node"), ("0.0.0.0", 9400, "haproxy"), ("127.0.0.1", 9090, "prometheus"),
            ("10.0.0.11", 9401, "dcgm-exporter"), ("127.0.0.1", 9093, "prometheus-aler")]
    assert listener_problems(head, "spark-a", good) == []
    assert listener_problems(head, "spark-a", good + [("0.0.0.0", 9094, "prometheus-aler")]) == [
        "spark-a: Alertmanager's sockets are prometheus-aler on 0.0.0.0:9094, prometheus-aler on 127.0.0.1:9093; "
        "want only prometheus-aler on 127.0.0.1:9093"]
    assert listener_problems(head, "spark-a", good[:4]) == [
        "spark-a: Alertmanager's sockets are nothing; want only prometheus-aler on 127.0.0.1:9093"]
    # off: not asked for
    assert listener_problems(fleet(router=None).node("spark-a"), "spark-a", good[:4]) == []
