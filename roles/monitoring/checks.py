"""roles/monitoring: every file the monitoring stack runs from, rendered from data and the fleet, and
the facts the role reads (which versions are installed; on the monitoring node, before the firewall,
whether the user Prometheus runs as exists).

- Every node: the OS's node exporter on its management address (sparkfleet/model/monitoring.py
  says which collectors and why), and a textfile of sparkfleet's own facts beside it. With TLS on,
  over TLS with the node's certificate (roles/tls's copy, EXPORTER_PEM), as its exporter-toolkit web
  configuration says (web_config_text); a GPU node's dcgm-exporter the same.
- Each serving group's head: the API proxy serves the engine's own `/metrics` on
  `monitoring_engine_metrics_port` (roles/api_proxy renders that frontend; this module says the port).
- The monitoring node: the OS's Prometheus on 127.0.0.1, its targets from the fleet (over https,
  verified with the fleet's trust bundle, SCRAPE_CA, with TLS on), sparkfleet's alert rules
  (templates/etc/prometheus/sparkfleet.rules.yml.j2; their tests: tests/unit/alerts).
The metric names the rules read are the engine's own at the pinned version (vLLM 0.33.0,
vllm/v1/metrics/loggers.py: vllm:num_requests_running, vllm:num_requests_waiting,
vllm:kv_cache_usage_perc, vllm:generation_tokens (a counter: _total), vllm:time_to_first_token_seconds)
and node_exporter's (1.5-1.7: node_memory_MemAvailable_bytes, node_network_mtu_bytes,
node_systemd_unit_state, node_systemd_unit_start_time_seconds).
"""
import shlex

import yaml
from pyinfra.api import FactBase

from sparkfleet.model.engine import HEAD_UNIT, SGLANG_METRICS, WORKER_UNIT
from sparkfleet.model.monitoring import (
    GPU_EXPORTER_FIELDS, SECRETS_DIR, TEXTFILE_DIR, metric_label, monitoring_node_name, receivers_on_node, secret_path,
)
from sparkfleet.model.serving import SFL_GID, node_profile
from sparkfleet.model.tls import EXPORTER_GROUP, EXPORTER_PEM, EXPORTER_TLS_DIR, EXPORTER_WEB_CONFIG, SCRAPE_CA, exporter_tls
from sparkfleet.render import render

EXPORTER_PACKAGE, PROMETHEUS_PACKAGE = "prometheus-node-exporter", "prometheus"
ALERTMANAGER_PACKAGE = "prometheus-alertmanager"
# The packages whose installed versions the role reads, every node the same fact (one read).
PACKAGES = (EXPORTER_PACKAGE, PROMETHEUS_PACKAGE, ALERTMANAGER_PACKAGE)
EXPORTER_UNIT, PROMETHEUS_UNIT, ALERTMANAGER_UNIT = "prometheus-node-exporter", "prometheus", "prometheus-alertmanager"
EXPORTER_DEFAULTS, PROMETHEUS_DEFAULTS = "/etc/default/prometheus-node-exporter", "/etc/default/prometheus"
ALERTMANAGER_DEFAULTS = "/etc/default/prometheus-alertmanager"
PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
RULES = "/etc/prometheus/sparkfleet.rules.yml"
PROMETHEUS_DATA = "/var/lib/prometheus/metrics2"
# Debian's and Ubuntu's paths (the package's unit runs `prometheus-alertmanager $ARGS` as prometheus).
ALERTMANAGER_CONFIG = "/etc/prometheus/alertmanager.yml"
ALERTMANAGER_DATA = "/var/lib/prometheus/alertmanager"
TEXTFILE = f"{TEXTFILE_DIR}/sparkfleet.prom"
# The units whose state and start time the systemd collector reports: the engine's and the watchdog's.
UNITS_PATTERN = "sparkfleet-.+[.]service"
ENGINE_UNITS = f"{HEAD_UNIT}|{WORKER_UNIT}"


def monitoring_node(fleet):
    """The NodeConfig of the node that runs Prometheus, or None (monitoring off)."""
    name = monitoring_node_name(list(fleet.nodes))
    return fleet.node(name) if name else None


def exporter_defaults_text(node) -> str:
    return render("monitoring", EXPORTER_DEFAULTS, node=node, textfile_dir=TEXTFILE_DIR, units=UNITS_PATTERN,
                  web_config=EXPORTER_WEB_CONFIG if exporter_tls(node) else None)


def web_config_text(node) -> str | None:
    """The exporters' web configuration (exporter-toolkit's: the node exporter's --web.config.file,
    dcgm-exporter's --web-config-file): TLS with the node's certificate; None with TLS off (plain HTTP)."""
    if not exporter_tls(node):
        return None
    return render("monitoring", EXPORTER_WEB_CONFIG, pem=EXPORTER_PEM, group=EXPORTER_GROUP)


def prometheus_defaults_text(node) -> str:
    return render("monitoring", PROMETHEUS_DEFAULTS, node=node, config=PROMETHEUS_CONFIG, data=PROMETHEUS_DATA)


def targets(fleet) -> dict[str, list[dict]]:
    """Scrape jobs -> their targets, each with the labels the rules and the dashboard group by:
    `node` every node's exporter, `engine` every group's head (the engine's own /metrics), `gpu` every
    GPU node's dcgm-exporter (a job only when the fleet has a GPU node)."""
    jobs: dict[str, list[dict]] = {"node": [], "engine": [], "gpu": []}
    for n in sorted(fleet.nodes, key=lambda n: (n.serving_group, n.rank)):
        labels = {"node": n.name, "group": n.serving_group, "rank": str(n.rank)}
        jobs["node"].append({"address": f"{n.management_address}:{n.monitoring_node_exporter_port}", **labels})
        if n.is_head:
            jobs["engine"].append({"address": f"{n.management_address}:{n.monitoring_engine_metrics_port}", **labels})
        if n.gpu_expected:
            jobs["gpu"].append({"address": f"{n.management_address}:{n.monitoring_gpu_exporter_port}", **labels})
    return {job: t for job, t in jobs.items() if t or job != "gpu"}


def prometheus_config_text(fleet) -> str:
    first = fleet.nodes[0]
    return render("monitoring", PROMETHEUS_CONFIG, node=first, jobs=targets(fleet), rules=RULES, secrets_dir=SECRETS_DIR,
                  tls_ca=SCRAPE_CA if first.tls_enabled else None,
                  remote_write_password_file=secret_path("remote_write.password_file"),
                  remote_write_credentials_file=secret_path("remote_write.credentials_file"))


def alertmanager_defaults_text(node) -> str:
    return render("monitoring", ALERTMANAGER_DEFAULTS, node=node, config=ALERTMANAGER_CONFIG, data=ALERTMANAGER_DATA)


def alertmanager_config_text(node) -> str:
    """Alertmanager's configuration: one route that sends every alert, grouped by alert and serving
    group, to each receiver data names (a route per receiver, each `continue`s to the next)."""
    receivers = yaml.safe_dump(receivers_on_node(node.monitoring_alertmanager_receivers), default_flow_style=False,
                               sort_keys=True)
    names = [r["name"] for r in node.monitoring_alertmanager_receivers]
    return render("monitoring", ALERTMANAGER_CONFIG, node=node, names=names,
                  receivers=receivers.rstrip("\n").splitlines())


def fabric_netdevs(fleet) -> list[str]:
    return sorted({h.netdev for n in fleet.nodes for h in n.fabric_halves})


def rules_text(fleet) -> str:
    first = fleet.nodes[0]
    return render("monitoring", RULES, node=first, fabric_devices="|".join(fabric_netdevs(fleet)),
                  fabric_mtu=first.fabric_mtu, engine_units=ENGINE_UNITS,
                  headroom_bytes=int(first.monitoring_alert_memory_headroom_gib * 2**30))


def textfile_text(fleet, node) -> str:
    """sparkfleet's facts of this node, for the node exporter's textfile collector."""
    try:
        profile = node_profile(fleet.group_of(node.name).head)
        served = {"profile": profile.name, "engine": profile.engine, "model": profile.model}
    except Exception:  # a profile that does not load is refused by the serving checks first
        served = {"profile": "", "engine": "", "model": ""}
    info = {"group": node.serving_group, "rank": str(node.rank), "recipe_commit": node.serving_recipe_commit or "", **served}
    labels = ",".join(f'{k}="{metric_label(v)}"' for k, v in info.items())
    lines = [
        "# HELP sparkfleet_node_info What sparkfleet deployed on this node (its serving group, rank, profile, commit).",
        "# TYPE sparkfleet_node_info gauge",
        f"sparkfleet_node_info{{{labels}}} 1",
        "# HELP sparkfleet_fabric_mtu_wanted_bytes The MTU data sets on each half of the fabric port.",
        "# TYPE sparkfleet_fabric_mtu_wanted_bytes gauge",
    ]
    lines += [f'sparkfleet_fabric_mtu_wanted_bytes{{device="{metric_label(h.netdev)}"}} {node.fabric_mtu}'
              for h in node.fabric_halves]
    lines += ["# HELP sparkfleet_fabric_link_speed_wanted_bytes The link speed each half of the fabric port must "
              "reach (monitoring_alert_fabric_link_mbits), in bytes/s as node_network_speed_bytes reports it.",
              "# TYPE sparkfleet_fabric_link_speed_wanted_bytes gauge"]
    lines += [f'sparkfleet_fabric_link_speed_wanted_bytes{{device="{metric_label(h.netdev)}"}} '
              f'{node.monitoring_alert_fabric_link_mbits * 125000}' for h in node.fabric_halves]
    return "\n".join(lines) + "\n"


# On an RDMA node: a timer reads each half's RoCE v2 GID index again every scrape interval, for the
# textfile collector (sfl_gid.sh --now); each rank's start wrote the index it started with
# (templates/serving_unit.j2). SparkfleetGidMoved compares them.
GID_METRICS_UNIT = "sparkfleet-gid-metrics"


def gid_metrics_files(node) -> dict[str, str]:
    """{path: text} of the GID-index timer and its service on `node`; none without an RDMA device."""
    halves = [h for h in node.fabric_halves if h.hca]
    if not halves:
        return {}
    base = f"/etc/systemd/system/{GID_METRICS_UNIT}"
    return {
        f"{base}.service": render("monitoring", f"{base}.service", textfile_dir=TEXTFILE_DIR, halves=halves,
                                  gid_script=SFL_GID),
        f"{base}.timer": render("monitoring", f"{base}.timer", interval_s=node.monitoring_scrape_interval_s),
    }


# On a GPU node: NVIDIA's dcgm-exporter in a container under systemd, reading the fields GB10 reports.
GPU_EXPORTER_UNIT = "sparkfleet-gpu-exporter"
GPU_EXPORTER_COUNTERS = "/etc/sparkfleet/dcgm-counters.csv"
GPU_EXPORTER_PROGRAM = "dcgm-exporter"  # the process name `ss -p` shows


def gpu_exporter_files(node) -> dict[str, str]:
    """{path: text} of the GPU exporter's counters file and unit on `node`; none on a node without a GPU."""
    if not node.gpu_expected:
        return {}
    unit = f"/etc/systemd/system/{GPU_EXPORTER_UNIT}.service"
    return {
        GPU_EXPORTER_COUNTERS: render("monitoring", GPU_EXPORTER_COUNTERS, fields=GPU_EXPORTER_FIELDS),
        unit: render("monitoring", unit, node=node, container=GPU_EXPORTER_UNIT, counters=GPU_EXPORTER_COUNTERS,
                     address=node.management_address, firewall_enabled=node.firewall_enabled,
                     web_config=EXPORTER_WEB_CONFIG if exporter_tls(node) else None, tls_dir=EXPORTER_TLS_DIR),
    }


def upstream_version(debian_version: str) -> str:
    """'1:2.42.0+ds-5+deb12u1' -> '2.42.0': no epoch, nothing from the first '+', '-' or '~'."""
    text = debian_version.split(":", 1)[-1]
    for sep in "+-~":
        text = text.split(sep, 1)[0]
    return text


# The packages' services held from starting while they are installed (step 4c): a policy-rc.d that
# forbids `start` to deb-systemd-invoke and invoke-rc.d (Debian policy 9.3.3; bookworm's
# /usr/bin/deb-systemd-invoke asks it before every systemctl call) for these units alone, so no exporter
# listens in cleartext and no Prometheus scrapes with the package's defaults before step 12b has written
# sparkfleet's files and started them. A fresh install's postinst starts (debhelper: `start`); an
# upgrade's restarts (`restart`, allowed: its service runs with the files an earlier deploy wrote). Only
# these names, so a copy a killed run left behind holds nothing else (the next install replaces it); a
# policy-rc.d of the node's own is left alone, and its policy decides.
POLICY_RC = "/usr/sbin/policy-rc.d"
POLICY_MARK = "# sparkfleet: prometheus* not started until step 12b (roles/monitoring/checks.py install_command)"
HELD_POLICY = (f"#!/bin/sh\n{POLICY_MARK}\n"
               'case "$1" in prometheus|prometheus[.-]*) case " $2 " in *" start "*) exit 101 ;; esac ;; esac\n'
               "exit 0\n")


def install_command(wanted: dict[str, str]) -> str:
    """One apt transaction: the OS's build of upstream version v of each package p of `wanted` {p: v} (no
    recommends; files already there kept: confold), their services held from starting (HELD_POLICY);
    or a failure naming, for the first package whose version the node's package sources do not offer,
    the versions they offer. Nothing is installed then."""
    lines = ["export DEBIAN_FRONTEND=noninteractive; apt-get update -qq >/dev/null || exit 1; want=''"]
    for package, version in wanted.items():
        p, v = shlex.quote(package), shlex.quote(version)
        lines.append(
            f"offered=$(apt-cache madison {p} | awk -F'|' '{{gsub(/ /, \"\", $2); print $2}}'); full=''; "
            f"for o in $offered; do u=${{o#*:}}; u=${{u%%[-+~]*}}; [ \"$u\" = {v} ] && {{ full=$o; break; }}; done; "
            f"if [ -z \"$full\" ]; then echo \"{package} {version} is not offered by this node's package sources "
            f"(offered: $(echo $offered)); set its monitoring_*_version to one of them\" >&2; exit 1; fi; "
            f"want=\"$want {p}=$full\"")
    policy = shlex.quote(POLICY_RC)
    lines.append(
        f"if [ -e {policy} ] && grep -qxF {shlex.quote(POLICY_MARK)} {policy}; then rm -f {policy}; fi; "
        f"if [ ! -e {policy} ]; then trap 'rm -f {policy}' EXIT; trap 'exit 1' HUP INT TERM; "
        f"printf %s {shlex.quote(HELD_POLICY)} > {policy} && chmod 0755 {policy} || exit 1; fi")
    lines.append("apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-confdef "
                 "-o Dpkg::Options::=--force-confold $want")
    return "\n".join(lines)


def held_packages(node, monitor) -> dict[str, str]:
    """{package: pinned upstream version} of the monitoring packages `node` runs: the exporter on every node;
    Prometheus, and Alertmanager when data enables it, on the monitoring node `monitor`."""
    wanted = {EXPORTER_PACKAGE: node.monitoring_node_exporter_version}
    if node.name == monitor.name:
        wanted[PROMETHEUS_PACKAGE] = node.monitoring_prometheus_version
        if node.monitoring_alertmanager_enabled:
            wanted[ALERTMANAGER_PACKAGE] = node.monitoring_alertmanager_version
    return wanted


def to_install(wanted: dict[str, str], installed: dict[str, str]) -> dict[str, str]:
    """The packages of `wanted` whose installed upstream version (the fact at prepare) is another or none:
    step 4c installs them, and step 12b starts (or restarts) their services once its files are written."""
    return {p: v for p, v in wanted.items() if upstream_version(installed.get(p, "")) != v}


class InstalledVersions(FactBase):
    """Package name -> its installed Debian version ('' when not installed), for the given packages."""

    def command(self, packages: tuple[str, ...]) -> str:
        return " ; ".join(f"printf '%s %s\\n' {shlex.quote(p)} \"$(dpkg-query -W -f '${{Status}}|${{Version}}' "
                          f"{shlex.quote(p)} 2>/dev/null | sed -n 's/^install ok installed|//p')\"" for p in packages)

    def process(self, output):
        found = {}
        for line in output:
            name, _, version = line.strip().partition(" ")
            if name:
                found[name] = version.strip()
        return found


class UserPresent(FactBase):
    """Whether the local user `user` exists (`getent passwd`: /etc/passwd or any other source NSS reads)."""

    def command(self, user: str) -> str:
        return f"if getent passwd {shlex.quote(user)} >/dev/null; then echo present; else echo absent; fi"

    def process(self, output):
        return "".join(output).strip() == "present"


# The process names `ss -p` shows (the kernel's comm: 15 characters at most).
EXPORTER_PROGRAM, PROMETHEUS_PROGRAM, PROXY_PROGRAM = "prometheus-node", "prometheus", "haproxy"
ALERTMANAGER_PROGRAM = ALERTMANAGER_UNIT[:15]


def listener_problems(node, monitor_name: str | None, sockets) -> list[str]:
    """The doctor's monitoring listeners: the exporter's port held by the node exporter (its firewall
    rule admits the monitoring node only), a head's metrics port by the API proxy, Prometheus on the
    monitoring node's loopback alone, and Alertmanager (when on) there too, with no other socket (its
    cluster listener, 0.0.0.0:9094 by default, off). `sockets`: roles/api_proxy's Listeners fact."""
    if monitor_name is None:
        return []
    wanted = {node.monitoring_node_exporter_port: EXPORTER_PROGRAM}
    if node.is_head:
        wanted[node.monitoring_engine_metrics_port] = PROXY_PROGRAM
    if node.gpu_expected:
        wanted[node.monitoring_gpu_exporter_port] = GPU_EXPORTER_PROGRAM
    problems = []
    for port, program in sorted(wanted.items()):
        held = {p for a, pt, p in sockets if pt == port}
        if held != {program}:
            problems.append(f"{node.name}: port {port} is held by {', '.join(sorted(held)) or 'nothing'}; want only "
                            f"{program} (roles/monitoring: deploy)")
    if node.name == monitor_name:
        prom = sorted((a, p) for a, pt, p in sockets if pt == node.monitoring_prometheus_port)
        if prom != [("127.0.0.1", PROMETHEUS_PROGRAM)]:
            found = ", ".join(f"{p} on {a}" for a, p in prom) or "nothing"
            problems.append(f"{node.name}: port {node.monitoring_prometheus_port} (Prometheus) is held by {found}; want "
                            f"only {PROMETHEUS_PROGRAM} on 127.0.0.1")
        if node.monitoring_alertmanager_enabled:
            port = node.monitoring_alertmanager_port
            want = [("127.0.0.1", port, ALERTMANAGER_PROGRAM)]
            held = sorted((a, pt, p) for a, pt, p in sockets if pt == port or p == ALERTMANAGER_PROGRAM)
            if held != want:
                found = ", ".join(f"{p} on {a}:{pt}" for a, pt, p in held) or "nothing"
                problems.append(f"{node.name}: Alertmanager's sockets are {found}; want only {ALERTMANAGER_PROGRAM} "
                                f"on 127.0.0.1:{port}")
    return problems


def live_queries(group: str) -> dict[str, str]:
    """`make status`'s live figures of one serving group, as PromQL over the last 5 minutes. A group
    runs one engine: each figure reads vLLM's name `or` SGLang's (SGLANG_METRICS)."""
    g = f'group="{group}"'

    def either(name: str, rate: bool = False) -> str:
        one = [f"{n}{{{g}}}" for n in (name, SGLANG_METRICS[name])]
        return " or ".join(f"rate({s}[5m])" if rate else s for s in one)
    ttft = f"sum by (le) ({either('vllm:time_to_first_token_seconds_bucket', rate=True)})"
    return {
        "tokens_s": f"sum({either('vllm:generation_tokens_total', rate=True)})",
        "running": f"sum({either('vllm:num_requests_running')})",
        "waiting": f"sum({either('vllm:num_requests_waiting')})",
        "kv": f"max({either('vllm:kv_cache_usage_perc')})",
        "ttft_p50": f"histogram_quantile(0.5, {ttft})",
        "ttft_p95": f"histogram_quantile(0.95, {ttft})",
    }


class LiveFigures(FactBase):
    """The monitoring node's Prometheus, asked for a group's live figures and every firing alert:
    {"figures": {name: float or None}, "alerts": [(alertname, group, node), ...], "error": text or None}."""

    def command(self, group: str, port: int) -> str:
        base = f"http://127.0.0.1:{int(port)}/api/v1"
        asks = [f"printf '%s\\t' {shlex.quote(name)}; curl -fsS -m 5 {base}/query --data-urlencode "
                f"{shlex.quote('query=' + expr)} || printf '{{}}'; echo" for name, expr in live_queries(group).items()]
        return "; ".join(asks + [f"printf 'alerts\\t'; curl -fsS -m 5 {base}/alerts || printf '{{}}'; echo"])

    def process(self, output):
        import json

        figures, alerts, error = {}, [], None
        for line in output:
            name, _, body = line.partition("\t")
            try:
                answer = json.loads(body or "{}")
            except ValueError:
                answer = {}
            if answer.get("status") != "success":
                error = "Prometheus did not answer"
                continue
            if name == "alerts":
                alerts = sorted({(a["labels"].get("alertname", "?"), a["labels"].get("group", ""),
                                  a["labels"].get("node", "")) for a in answer["data"]["alerts"]
                                 if a.get("state") == "firing"})
            else:
                result = answer["data"]["result"]
                try:
                    value = float(result[0]["value"][1]) if result else None
                except (KeyError, IndexError, ValueError):
                    value = None
                figures[name] = None if value is None or value != value else value  # NaN: no requests
        return {"figures": figures, "alerts": alerts, "error": error}


def live_line(live: dict | None, group: str) -> str:
    """One status line: tokens/s, queue, KV %, TTFT p50/p95 over 5 minutes, the group's firing alerts
    (and those of no group)."""
    if live is None:
        return "monitoring off, or its node not in this run"
    if live.get("error") and not live.get("figures"):
        return f"no figures: {live['error']}"
    f = live.get("figures") or {}

    def num(key, fmt):
        return "-" if f.get(key) is None else fmt.format(f[key])

    # Below 1 token/s two significant digits, so a trickle is no 0.0: 16 tokens in 5 minutes are 0.053
    # (make test of 2100f72 printed such a window as "0.0 tokens/s").
    rate = "{:.1f}" if (f.get("tokens_s") or 0) >= 1 else "{:.2g}"
    text = (f"{num('tokens_s', rate)} tokens/s, {num('running', '{:.0f}')} running, {num('waiting', '{:.0f}')} "
            f"waiting, KV {num('kv', '{:.0%}')}, TTFT p50 {num('ttft_p50', '{:.3f}')} s p95 {num('ttft_p95', '{:.3f}')} s "
            "(5 min)")
    alerts = [name + (f" ({node})" if node else "") for name, g, node in live.get("alerts") or [] if g in ("", group)]
    return text + ("; firing: " + ", ".join(alerts) if alerts else "; no alert firing")
