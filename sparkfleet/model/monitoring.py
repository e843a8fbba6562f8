"""Data of roles/monitoring: what is scraped, by whom, and what fires.

Part of sparkfleet/config.py's NodeConfig. Every node runs the OS's node exporter; each serving
group's head exposes its engine's own `/metrics` through the API proxy on a port of its own; one
node of the fleet (`monitoring_node`) runs the OS's Prometheus with scrape targets rendered from the
inventory and sparkfleet's alert rules. The exporters answer the monitoring node only (the firewall);
Prometheus listens on the monitoring node's loopback.

The package versions are upstream versions: the deploy installs the OS's build of exactly that
version, and on a node whose package sources offer another it stops before installing, naming the
versions offered (roles/monitoring/checks.py). The defaults are DGX OS 7's (Ubuntu 24.04's archive).
"""
from pydantic import BaseModel, Field

from sparkfleet.refusal import Problem, shared_key_problems
from sparkfleet.values import path_problem

# The monitoring stack is the fleet's: one Prometheus, one set of rules, one scrape interval.
MONITORING_KEYS = (
    "monitoring_enabled", "monitoring_node", "monitoring_node_exporter_version", "monitoring_node_exporter_port",
    "monitoring_node_exporter_collectors", "monitoring_engine_metrics_port", "monitoring_prometheus_version",
    "monitoring_prometheus_port", "monitoring_scrape_interval_s", "monitoring_retention",
    "monitoring_remote_write_url", "monitoring_remote_write_username", "monitoring_remote_write_password_file",
    "monitoring_remote_write_credentials_file", "monitoring_alert_rank_down_for_s", "monitoring_alert_fabric_for_s", "monitoring_alert_memory_headroom_gib",
    "monitoring_alert_kv_cache_usage", "monitoring_alert_kv_cache_for_s", "monitoring_alert_ttft_factor",
    "monitoring_alert_ttft_for_s",
    "monitoring_alert_stall_for_s", "monitoring_gpu_exporter_image", "monitoring_gpu_exporter_port",
    "monitoring_alert_gpu_clock_mhz", "monitoring_alert_gpu_busy_percent", "monitoring_alert_gpu_throttle_for_s",
    "monitoring_alertmanager_enabled", "monitoring_alertmanager_version", "monitoring_alertmanager_port",
    "monitoring_alertmanager_receivers", "monitoring_alertmanager_group_wait_s",
    "monitoring_alertmanager_group_interval_s", "monitoring_alertmanager_repeat_interval_s",
    "monitoring_fingerprint_interval_s", "monitoring_alert_fabric_link_mbits", "monitoring_alert_memory_pressure",
    "monitoring_alert_memory_pressure_for_s",
)

# node_exporter's collectors this job reads (each is `--collector.<name>`; every other is off):
# meminfo (unified memory: NVML reports none on GB10), pressure (PSI: memory stalls before the freeze),
# netdev and netclass (fabric throughput, MTU, link speed and carrier), hwmon and thermal_zone
# (temperatures), systemd (sparkfleet's units only), textfile (sparkfleet's own facts), cpu, loadavg,
# filesystem (the data directory's disk). Names as node_exporter 1.5-1.7 spell them.
DEFAULT_COLLECTORS = ("meminfo", "pressure", "netdev", "netclass", "hwmon", "thermal_zone", "systemd", "textfile",
                      "cpu", "loadavg", "filesystem")
KNOWN_COLLECTORS = DEFAULT_COLLECTORS + ("diskstats", "vmstat", "time", "uname", "stat", "processes", "nvme")
# The node exporter's textfile directory (named in its arguments): roles/monitoring writes
# sparkfleet.prom there, roles/receipt sparkfleet-receipt.prom on a head, the fingerprint, GID, fabric
# speed and watchdog writers theirs. Not the OS's default /var/lib/prometheus/node-exporter: the
# packages' postinst chowns /var/lib/prometheus to the prometheus user (Debian 12's
# prometheus-node-exporter 1.5.0-1+b6), who could rename that directory and plant a symlink where root
# writes (issue 43 item 5). Every directory of this one, from / down, is root's alone
# (sparkfleet/root_paths.py checks it where it is made).
TEXTFILE_DIR = "/var/lib/sparkfleet/textfile"
RECEIPT_TEXTFILE = f"{TEXTFILE_DIR}/sparkfleet-receipt.prom"
# Each node's watchdog rewrites it with every state it saves (roles/watchdog/sfl_watch.py metrics_text).
WATCHDOG_TEXTFILE = f"{TEXTFILE_DIR}/sparkfleet-watchdog.prom"
# The GPU exporter's fields on a GPU node (gpu_expected): NVIDIA's dcgm-exporter, the exporter NVIDIA
# keeps, with the DCGM fields that report live values on GB10 and nothing else. Not recorded by this
# project (it has no Spark); as reported from Sparks by others:
# - domenkogler/homelab docs/observability.md (HD-379, measured 2026-09-16): dcgm-exporter
#   3.3.5-3.4.1-ubuntu22.04 (arm64) run live on a Spark, driver 580.178.04, emits 13 series: GPU_UTIL
#   (88-90 % under load), GPU_TEMP (46-58 C), POWER_USAGE (10.25-38.9 W), TOTAL_ENERGY_CONSUMPTION, SM_CLOCK
#   (2411-2509 MHz), XID_ERRORS and PCIE_REPLAY_COUNTER live; MEMORY_TEMP a bogus 0; MEM_COPY_UTIL,
#   ENC/DEC_UTIL, NVLINK_BANDWIDTH_TOTAL and VGPU_LICENSE_STATUS always 0; FB_*, MEM_CLOCK and every
#   DCGM_FI_PROF_* not emitted (the exporter logs "Not collecting DCP metrics: This request is serviced by
#   a module of DCGM that is not currently loaded").
# - rwlove/home-ops PR #13238 (2026-07-24, driver 580.142, a 4.x exporter) agrees on the working and the
#   dead ones; KhoiMinh47/Chatbot-AI-Local (dcgm-exporter 4.4.2-4.7.0, driver 580.142) logged the same
#   DCP line and the label set tests/unit/alerts/sparkfleet.test.yml uses.
# Both reports are kept as tests/unit/fixtures/captures/dcgm_*, and tests/unit/test_monitoring.py holds this
# list to them. Unified memory comes from the node exporter's meminfo instead. (field, Prometheus type,
# help) as dcgm-exporter's counters file spells them (etc/default-counters.csv at 3.3.5-3.4.1).
GPU_EXPORTER_FIELDS = (
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
)
# A receiver's integrations, as Alertmanager names them (config/config.go, Receiver: each a list under
# `<name>_configs`): the ones Debian 12's 0.25.0 accepts (its amtool check-config, tried one by one);
# msteams_configs is not among them, so it is not offered.
ALERTMANAGER_INTEGRATIONS = ("discord", "email", "opsgenie", "pagerduty", "pushover", "slack", "sns", "telegram",
                             "victorops", "webex", "webhook", "wechat")
# A receiver's settings whose value is a secret, per integration, each -> the setting Alertmanager reads it
# from a file with instead and the first release that has that setting; None: no release sparkfleet
# installs (Debian 12's 0.25.0, Ubuntu 24.04's 0.26.0) reads it from a file. From Alertmanager's
# config/notifiers.go at v0.25.0 and v0.26.0 (0.26.0 added webhook url_file, pushover user_key_file and
# token_file, telegram bot_token_file), the 0.25.0 forms each run through Debian 12's amtool
# (tests/unit/test_monitoring.py). A webhook's `url` is a secret when it carries a token: its query is
# refused (sparkfleet/grammar.py), a token in its path cannot be told apart, so the docs ask for url_file.
ALERTMANAGER_SECRETS = {
    "discord": {"webhook_url": None},
    "email": {"auth_password": ("auth_password_file", "0.25.0"), "auth_secret": None},
    "opsgenie": {"api_key": ("api_key_file", "0.25.0")},
    "pagerduty": {"routing_key": ("routing_key_file", "0.25.0"), "service_key": ("service_key_file", "0.25.0")},
    "pushover": {"user_key": ("user_key_file", "0.26.0"), "token": ("token_file", "0.26.0")},
    "slack": {"api_url": ("api_url_file", "0.25.0")},
    "sns": {},  # its sigv4's secret_key: SIGV4_SECRETS
    "telegram": {"bot_token": ("bot_token_file", "0.26.0")},
    "victorops": {"api_key": ("api_key_file", "0.25.0")},
    "webex": {},  # its token: http_config.authorization.credentials_file
    "webhook": {"url": ("url_file", "0.26.0")},
    "wechat": {"api_secret": None},
}
# Every integration's http_config (prometheus/common config/http_config.go, v0.38.0 as Alertmanager 0.25.0's
# go.mod names it to v0.44.0 as 0.26.0's): dotted setting -> its file form (None: inline only). bearer_token
# is deprecated there in favour of authorization; its file form is the same header, so authorization's is
# asked for. proxy_connect_header's values (Header, config/config.go at v0.39.0) have no file form.
HTTP_CONFIG_SECRETS = {
    "basic_auth.password": "basic_auth.password_file", "authorization.credentials": "authorization.credentials_file",
    "oauth2.client_secret": "oauth2.client_secret_file", "bearer_token": "authorization.credentials_file",
    "proxy_connect_header": None,
}
# The file settings of an http_config sparkfleet copies from the controller (the same http_config.go): the
# credentials' forms above, bearer_token's own (deprecated, still read) and the TLS files.
TLS_FILES = ("tls_config.ca_file", "tls_config.cert_file", "tls_config.key_file")
HTTP_CONFIG_FILES = ("authorization.credentials_file", "basic_auth.password_file", "oauth2.client_secret_file",
                     "bearer_token_file", *TLS_FILES)
# sns_configs' sigv4 (prometheus/common sigv4/sigv4_config.go at sigv4/v0.1.0): secret_key inline only.
SIGV4_SECRETS = {"sigv4.secret_key": None}
# Each file form a release lacks: setting -> the first release that reads it (above).
FILE_SETTING_SINCE = {f: since for settings in ALERTMANAGER_SECRETS.values() for f, since in
                      (v for v in settings.values() if v)}
# The monitoring node's directory of the secrets data names (root:prometheus 0750, each file 0640: the
# Debian and Ubuntu packages run Prometheus and Alertmanager as user prometheus). Each `*_file` of a
# receiver, and the remote write's password and credentials files, name a root-only file on the
# controller; the deploy writes its bytes here and the rendered configuration names the copy.
SECRETS_DIR = "/etc/prometheus/secrets"
# The user Prometheus and Alertmanager run as (the Debian and Ubuntu packages' units). The firewall's
# output chain names it on the monitoring node, so it exists before the firewall: roles/monitoring's
# user_tasks.py makes it when absent, with the command the packages' postinst runs (PROMETHEUS_ADDUSER).
PROMETHEUS_USER = "prometheus"
# Debian 12's prometheus 2.42.0+ds-5+deb12u1, prometheus-alertmanager 0.25.0-1+b4 and
# prometheus-node-exporter 1.5.0-1+b6 postinst, `configure`, each the same line: made by it first, the
# user is the one each package's postinst would have made, and that postinst keeps it.
PROMETHEUS_ADDUSER = ("adduser --quiet --system --home /var/lib/prometheus --no-create-home --group "
                      f"--gecos 'Prometheus daemon' {PROMETHEUS_USER}")
RETENTION = r"^[0-9]+(d|h|w|y)$"
UPSTREAM_VERSION = r"^[0-9]+\.[0-9]+\.[0-9]+$"


class MonitoringData(BaseModel):
    monitoring_enabled: bool = Field(
        True, description="the node exporter on every node, the engine's `/metrics` on each head (through the API "
        "proxy, for the monitoring node only) and Prometheus with sparkfleet's alerts on `monitoring_node`; false: "
        "none of it is installed or opened (what an earlier deploy installed stays, its ports closed)"
    )
    monitoring_node: str | None = Field(
        None, description="the inventory name of the node that runs Prometheus; none: `router_node` when there is "
        "one, else the first serving group's head. The exporters admit its management address only (an IP "
        "address: `ssh_hostname`, or the one address it resolved to on the controller; no node resolves it)"
    )
    monitoring_node_exporter_version: str = Field(
        "1.7.0", pattern=UPSTREAM_VERSION,
        description="upstream version of the OS's `prometheus-node-exporter` package (Ubuntu 24.04: 1.7.0; "
        "Debian 12: 1.5.0); the OS's build of exactly this version is installed; when the node's package sources offer another, the "
        "deploy stops before installing, naming the versions offered"
    )
    monitoring_node_exporter_port: int = Field(
        9100, ge=1024, le=65535, description="the node exporter's port on every node, on its management address only "
        "(roles/monitoring's --web.listen-address; the firewall admits the monitoring node only)"
    )
    monitoring_node_exporter_collectors: list[str] = Field(
        list(DEFAULT_COLLECTORS), min_length=1,
        description="the node exporter's collectors (every other is off): " + ", ".join(DEFAULT_COLLECTORS)
        + "; also allowed: " + ", ".join(KNOWN_COLLECTORS[len(DEFAULT_COLLECTORS):])
    )
    monitoring_engine_metrics_port: int = Field(
        9400, ge=1024, le=65535, description="on each head, the engine's own `/metrics` and nothing else (the API "
        "proxy, without the key; the firewall admits the monitoring node only)"
    )
    monitoring_prometheus_version: str = Field(
        "2.45.3", pattern=UPSTREAM_VERSION,
        description="upstream version of the OS's `prometheus` package (Ubuntu 24.04: 2.45.3; Debian 12: 2.42.0); "
        "the deploy stops before installing when the OS offers another"
    )
    monitoring_prometheus_port: int = Field(
        9090, ge=1024, le=65535, description="Prometheus' port, on the monitoring node's 127.0.0.1 only (query it "
        "there, or through an SSH tunnel; `make status` does)"
    )
    monitoring_scrape_interval_s: int = Field(15, ge=5, le=300, description="seconds between two scrapes of a target")
    monitoring_retention: str = Field(
        "30d", pattern=RETENTION, description="how long Prometheus keeps samples (`--storage.tsdb.retention.time`)"
    )
    monitoring_remote_write_url: str | None = Field(
        None, description="also send every sample to this Prometheus (`remote_write`), e.g. the team's own: an "
        "https URL without credentials or query (sparkfleet/grammar.py: the samples and any credentials go over TLS "
        "only); none: kept on the monitoring node only"
    )
    monitoring_remote_write_username: str | None = Field(
        None, description="the remote write's basic-auth user (`basic_auth.username`; Prometheus 2.42-2.45 read it "
        "inline only, so it is no secret); its password in `monitoring_remote_write_password_file`"
    )
    monitoring_remote_write_password_file: str | None = Field(
        None, description="root-only file on the controller (yours, mode 0600) with the remote write's basic-auth "
        "password; the deploy copies it to the monitoring node (/etc/prometheus/secrets, 0640 root:prometheus) and "
        "prometheus.yml names the copy (`basic_auth.password_file`), never the password"
    )
    monitoring_remote_write_credentials_file: str | None = Field(
        None, description="root-only file on the controller (yours, mode 0600) with the remote write's bearer token, "
        "sent as `Authorization: Bearer` (`authorization.credentials_file`); copied as "
        "`monitoring_remote_write_password_file` is. Not with a password: Prometheus takes one of the two"
    )
    monitoring_alert_rank_down_for_s: int = Field(
        60, ge=0, description="a node's exporter or a head's engine target not answering this long fires "
        "`SparkfleetTargetDown`; a rank's engine unit not active this long, `SparkfleetRankDown`"
    )
    monitoring_alert_fabric_for_s: int = Field(
        60, ge=0, description="a fabric netdev with the wrong MTU, down, or linked below "
        "`monitoring_alert_fabric_link_mbits` this long fires `SparkfleetFabricMtu`, `SparkfleetFabricDown` or "
        "`SparkfleetFabricSlow`; an RDMA half's RoCE v2 GID index moved this long, `SparkfleetGidMoved`"
    )
    monitoring_alert_fabric_link_mbits: int = Field(
        200000, ge=1000, description="`SparkfleetFabricSlow` fires when a fabric netdev links below this many Mbit/s "
        "(ethtool's Speed, the kernel's /sys/class/net/<netdev>/speed) for `monitoring_alert_fabric_for_s`: both halves "
        "of a DGX Spark's CX7 port link at 200000 on a DAC cable; 100000 is a cable or switch port that negotiated "
        "down (dgx-spark-playbooks' multi-Spark guide pins the switch port to 200G then)"
    )
    monitoring_alert_memory_headroom_gib: float = Field(
        8.0, ge=0, description="`SparkfleetMemoryLow` fires when a node's MemAvailable falls below this: a Spark "
        "whose unified memory runs out freezes without an OOM kill"
    )
    monitoring_alert_memory_pressure: float = Field(
        0.6, gt=0, le=1, description="`SparkfleetMemoryPressure` fires when the share of time in which every "
        "task that needed memory waited for it (PSI `full` of /proc/pressure/memory, the kernel's "
        "Documentation/accounting/psi.rst; node_exporter's pressure collector exports its total as "
        "`node_pressure_memory_stalled_seconds_total`, collector/pressure_linux.go at 1.5.0 and 1.7.0 alike, so the share "
        "is its rate over a minute) stays above this "
        "for `monitoring_alert_memory_pressure_for_s`: reclaim stalling the whole node, which comes before a "
        "Spark's freeze. 0.6 for 30 s is systemd-oomd's own bar for acting on memory pressure (oomd.conf(5): "
        "DefaultMemoryPressureLimit=60% of a 10 s window in which all tasks were delayed, for "
        "DefaultMemoryPressureDurationSec=30s); no field figure of a Spark's PSI before its freeze was found: "
        "lower it to be warned earlier"
    )
    monitoring_alert_memory_pressure_for_s: int = Field(
        30, ge=0, description="see `monitoring_alert_memory_pressure` (systemd-oomd's 30 s)"
    )
    monitoring_alert_kv_cache_usage: float = Field(
        0.95, gt=0, le=1, description="`SparkfleetKvCacheFull` fires when the engine's KV cache usage stays above "
        "this fraction for `monitoring_alert_kv_cache_for_s`"
    )
    monitoring_alert_kv_cache_for_s: int = Field(300, ge=0, description="see `monitoring_alert_kv_cache_usage`")
    monitoring_alert_ttft_factor: float = Field(
        2.0, gt=1, description="`SparkfleetTtftRegression` fires when the engine's time to first token p95 over 10 "
        "minutes exceeds the last benchmark receipt's by this factor"
    )
    monitoring_alert_ttft_for_s: int = Field(
        600, ge=0, description="see `monitoring_alert_ttft_factor`: how long the p95 stays above before it fires"
    )
    monitoring_gpu_exporter_image: str = Field(
        "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.1-ubuntu22.04",
        description="on a GPU node (`gpu_expected`), NVIDIA's dcgm-exporter as this image (a Docker reference with its "
        "tag, distribution/reference's grammar; the release reported live "
        "on a Spark, docs/monitoring.md), under systemd as `sparkfleet-gpu-exporter`, with the DCGM fields that report on GB10 only "
        "(docs/monitoring.md)"
    )
    monitoring_gpu_exporter_port: int = Field(
        9401, ge=1024, le=65535, description="the GPU exporter's port on a GPU node's management address (the "
        "firewall admits the monitoring node only)"
    )
    monitoring_alert_gpu_clock_mhz: int = Field(
        1400, ge=100, description="`SparkfleetGpuThrottled` fires when a busy GPU's SM clock stays below this: a "
        "GB10 under load runs at 2400-2500 MHz, one capped by its power supply (USB-PD) or by heat at 500-850 MHz; "
        "1400 is spark-gpu-throttle-check's threshold"
    )
    monitoring_alert_gpu_busy_percent: int = Field(
        80, ge=1, le=100, description="see `monitoring_alert_gpu_clock_mhz`: the GPU counts as busy at this "
        "utilization or more (an idle GPU's low clock is no throttling)"
    )
    monitoring_alert_gpu_throttle_for_s: int = Field(
        120, ge=0, description="see `monitoring_alert_gpu_clock_mhz`: how long the clock stays low while busy"
    )
    monitoring_alertmanager_enabled: bool = Field(
        False, description="the OS's Alertmanager on `monitoring_node` (127.0.0.1 only, its cluster listener off), "
        "Prometheus sends it every alert and it notifies `monitoring_alertmanager_receivers`; false: alerts are seen "
        "in Prometheus and `make status` only (an Alertmanager an earlier deploy installed stays, unused)"
    )
    monitoring_alertmanager_version: str = Field(
        "0.26.0", pattern=UPSTREAM_VERSION,
        description="upstream version of the OS's `prometheus-alertmanager` package (Ubuntu 24.04: 0.26.0; Debian 12: "
        "0.25.0); the deploy stops before installing when the OS offers another"
    )
    monitoring_alertmanager_port: int = Field(
        9093, ge=1024, le=65535, description="Alertmanager's port, on the monitoring node's 127.0.0.1 only"
    )
    monitoring_alertmanager_receivers: list[dict] = Field(
        [], description="where alerts go: Alertmanager's own receiver entries, each a `name` and one or more "
        "`<integration>_configs` lists (" + ", ".join(ALERTMANAGER_INTEGRATIONS) + "), e.g. `{\"name\": \"ops\", "
        "\"webhook_configs\": [{\"url\": \"http://10.0.0.5:5001/\"}]}`; every alert, firing and resolved, goes to "
        "each receiver. No secret in data: a key, a password, a token or a tokened URL goes in a root-only file on the "
        "controller (yours, mode 0600) named by the setting's `*_file` form (`api_url_file`, `auth_password_file`, "
        "`routing_key_file`, `service_key_file`, `api_key_file`, `http_config.authorization.credentials_file`, "
        "`http_config.basic_auth.password_file`; from Alertmanager 0.26.0 also `url_file`, `user_key_file`, "
        "`token_file`, `bot_token_file`); the deploy copies each to the monitoring node (/etc/prometheus/secrets, 0640 "
        "root:prometheus) and the configuration names the copy. An inline secret, `bearer_token`, a URL with a "
        "user, password or query, and a setting the pinned release reads inline only are refused. Written to "
        "/etc/prometheus/alertmanager.yml (0640 root:prometheus), checked by amtool"
    )
    monitoring_alertmanager_group_wait_s: int = Field(
        30, ge=0, description="Alertmanager waits this long after an alert first fires before it notifies, so "
        "that alert firing on several nodes of one serving group goes out in one message"
    )
    monitoring_alertmanager_group_interval_s: int = Field(
        300, ge=1, description="after a notification, the next about new alerts of the same group waits this long"
    )
    monitoring_alertmanager_repeat_interval_s: int = Field(
        14400, ge=60, description="an alert still firing is notified again after this long"
    )
    monitoring_fingerprint_interval_s: int = Field(
        60, ge=5, le=3600, description="every node writes its fingerprint (kernel, GPU driver, CX7 firmware, Docker, "
        "the image its engine container runs, that image's engine and NCCL) as `sparkfleet_fingerprint_info` this "
        "often (`sparkfleet-fingerprint-metrics.timer`, roles/fingerprint)"
    )
    monitoring_alert_stall_for_s: int = Field(
        300, ge=60, description="`SparkfleetGroupStalled` fires when requests have waited this long and no token "
        "was generated (the hang `/health` does not see)"
    )


def metric_label(value) -> str:
    """A label's value as the textfile collector's exposition format writes it (\\, " and newline escaped)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def monitoring_node_name(nodes) -> str | None:
    """The node that runs Prometheus: data's, else the router node, else the first group's head."""
    if not nodes or not nodes[0].monitoring_enabled:
        return None
    first = nodes[0]
    if first.monitoring_node:
        return first.monitoring_node
    if first.router_node:
        return first.router_node
    heads = sorted((n for n in nodes if n.rank == 0), key=lambda n: (n.serving_group, n.name))
    return heads[0].name if heads else None


def monitoring_problems(nodes) -> list[Problem]:
    """One monitoring stack per fleet: the same monitoring_* settings on every node, a monitoring node
    of the inventory, known collectors, ports that differ."""
    problems = shared_key_problems(nodes, MONITORING_KEYS, "the fleet has one monitoring stack")
    names = [n.name for n in nodes]
    if problems or not nodes or not nodes[0].monitoring_enabled:
        return problems
    first = nodes[0]
    unknown = [c for c in first.monitoring_node_exporter_collectors if c not in KNOWN_COLLECTORS]
    if unknown:
        problems.append(Problem(
            f"key 'monitoring_node_exporter_collectors' names {', '.join(map(repr, unknown))}; allowed: "
            f"{', '.join(KNOWN_COLLECTORS)}", names, key="monitoring_node_exporter_collectors",
            fix="remove it, or name one of the allowed collectors"))
    ports = {"monitoring_node_exporter_port": first.monitoring_node_exporter_port,
             "monitoring_engine_metrics_port": first.monitoring_engine_metrics_port,
             "monitoring_prometheus_port": first.monitoring_prometheus_port,
             "monitoring_gpu_exporter_port": first.monitoring_gpu_exporter_port}
    if first.monitoring_alertmanager_enabled:
        ports["monitoring_alertmanager_port"] = first.monitoring_alertmanager_port
    if len(set(ports.values())) < len(ports):
        problems.append(Problem(
            f"the monitoring ports must differ ({', '.join(f'{k}={v}' for k, v in ports.items())})", names,
            key="monitoring_engine_metrics_port", fix="give each its own port"))
    problems += alertmanager_problems(first, names)
    problems += remote_write_problems(first, names)
    wanted = monitoring_node_name(nodes)
    monitor = next((n for n in nodes if n.name == wanted), None)
    if monitor is None and wanted != first.router_node:  # a router_node not in the inventory: router_problems
        problems.append(Problem(
            f"key 'monitoring_node' = {wanted!r} is not a node of the inventory; allowed: {', '.join(sorted(names))} "
            "(or none: the router node, else the first head)", names, key="monitoring_node",
            fix="name one of the inventory's nodes"))
    return problems


def alertmanager_problems(first, names) -> list[Problem]:
    """Receivers Alertmanager would refuse, or none for an Alertmanager that is on: each entry a unique
    `name` and at least one known `<integration>_configs` list, nothing else."""
    if not first.monitoring_alertmanager_enabled:
        return []
    key = "monitoring_alertmanager_receivers"
    allowed = ", ".join(f"{i}_configs" for i in ALERTMANAGER_INTEGRATIONS)
    receivers = first.monitoring_alertmanager_receivers
    if not receivers:
        return [Problem(f"key '{key}' is empty while monitoring_alertmanager_enabled is true: Alertmanager would "
                        "notify nobody", names, key=key,
                        fix="name at least one receiver, or set monitoring_alertmanager_enabled false")]
    problems, seen = [], set()
    for i, r in enumerate(receivers):
        name = r.get("name")
        where = f"key '{key}' entry {i}" + (f" ({name!r})" if isinstance(name, str) else "")
        if not isinstance(name, str) or not name.strip():
            problems.append(Problem(f"{where} has no name", names, key=key, fix="give it a `name`"))
        elif name in seen:
            problems.append(Problem(f"{where}: the name {name!r} is used twice", names, key=key,
                                    fix="give each receiver its own name"))
        seen.add(name)
        unknown = [k for k in r if k != "name" and k.removesuffix("_configs") not in ALERTMANAGER_INTEGRATIONS]
        if unknown:
            problems.append(Problem(f"{where} has {', '.join(map(repr, unknown))}; allowed: name, {allowed}", names,
                                    key=key, fix="remove it, or name one of the allowed integrations"))
        lists = [k for k in r if k != "name" and k not in unknown]
        if not lists:
            problems.append(Problem(f"{where} has no integration; allowed: {allowed}", names, key=key,
                                    fix="add one, e.g. webhook_configs: [{url: ...}]"))
        for k in lists:
            if not isinstance(r[k], list) or not r[k] or not all(isinstance(c, dict) for c in r[k]):
                problems.append(Problem(f"{where}: {k} must be a non-empty list of settings", names, key=key,
                                        fix=f"e.g. {k}: [{{...}}], as Alertmanager's configuration names them"))
        for k in lists:
            for j, c in enumerate(r[k] if isinstance(r[k], list) else []):
                if isinstance(c, dict):
                    problems += _secret_problems(first, names, where, f"{k}[{j}]", k.removesuffix("_configs"), c)
        problems += _file_path_problems(names, where, {k: r[k] for k in lists})
    return problems


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _secret_problems(first, names, where, at, integration, config) -> list[Problem]:
    """One integration's settings that hold a secret inline, and file forms its pinned release lacks."""
    key, version = "monitoring_alertmanager_receivers", first.monitoring_alertmanager_version
    found = []

    def refuse(setting, instead, why=""):
        what = f"{where}: {at}.{setting} is a secret in data (the inventory, its repository, `make config`){why}"
        if instead:
            fix = (f"put it in a root-only file on the controller (chmod 0600) and name that file in {at}.{instead}: "
                   f"the deploy copies it to the monitoring node")
        else:
            fix = (f"Alertmanager {version} reads it inline only: send to a webhook_configs relay that holds it "
                   "instead")
        found.append(Problem(what, names, key=key, fix=fix))

    for setting, form in ALERTMANAGER_SECRETS.get(integration, {}).items():
        if setting not in config or setting == "url":  # a webhook's url: its query and user (sparkfleet/grammar.py)
            continue
        if form and _release(version) < _release(form[1]):
            refuse(setting, None, f"; {form[0]} first came in Alertmanager {form[1]}")
        else:
            refuse(setting, form and form[0])
    known = _file_forms(integration) | set(TLS_FILES) | {f"http_config.{f}" for f in HTTP_CONFIG_FILES}
    for setting, _ in file_settings(config):
        if setting not in known:
            found.append(Problem(
                f"{where}: {at}.{setting} is no file setting sparkfleet knows of {integration}_configs", names, key=key,
                fix=f"use one of {', '.join(sorted(known))} (Alertmanager's config/notifiers.go, prometheus/common's "
                    "http_config.go), or send to a webhook_configs relay that holds the secret"))
            continue
        since = FILE_SETTING_SINCE.get(setting)
        if since and _release(version) < _release(since):
            found.append(Problem(
                f"{where}: {at}.{setting} is not read by Alertmanager {version} (monitoring_alertmanager_version); "
                f"it first came in {since}", names, key=key,
                fix=f"set monitoring_alertmanager_version to {since} or later where the OS offers it, or send to a "
                    "webhook_configs relay that holds the secret"))
    nested = {"http_config": HTTP_CONFIG_SECRETS, "sigv4": {k.split(".", 1)[1]: v for k, v in SIGV4_SECRETS.items()}}
    for section, secrets in nested.items():
        tree = config.get(section)
        if not isinstance(tree, dict):
            continue
        for dotted, instead in secrets.items():
            parent, _, leaf = dotted.rpartition(".")
            holder = tree.get(parent) if parent else tree
            if isinstance(holder, dict) and leaf in holder:
                refuse(f"{section}.{dotted}", instead and f"{section}.{instead}")
    return found


def _file_forms(integration: str) -> set[str]:
    return {v[0] for v in ALERTMANAGER_SECRETS.get(integration, {}).values() if v}


def _file_path_problems(names, where, tree) -> list[Problem]:
    """Every `*_file` setting names a file on the controller: an absolute path."""
    found = []
    for at, value in file_settings(tree):
        why = path_problem(value) if isinstance(value, str) else "must be a path"
        if why:
            found.append(Problem(f"{where}: {at} = {value!r} {why}", names, key="monitoring_alertmanager_receivers",
                                 fix="name the root-only file on the controller by its absolute path"))
    return found


def file_settings(tree, path="") -> list[tuple[str, object]]:
    """(where, value) of every `*_file` setting in `tree` (a receiver's integrations), in order."""
    found = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            here = f"{path}.{k}" if path else str(k)
            if isinstance(k, str) and k.endswith("_file") and not isinstance(v, (dict, list)):
                found.append((here, v))
            else:
                found += file_settings(v, here)
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            found += file_settings(v, f"{path}[{i}]")
    return found


def remote_write_problems(first, names) -> list[Problem]:
    """The remote write's credentials: each in a file, a user with its password, one kind of credential, and
    a URL to send them to."""
    user, password, token = (first.monitoring_remote_write_username, first.monitoring_remote_write_password_file,
                             first.monitoring_remote_write_credentials_file)
    problems = []
    for key, value in (("monitoring_remote_write_password_file", password),
                       ("monitoring_remote_write_credentials_file", token)):
        why = value is not None and path_problem(value)
        if why:
            problems.append(Problem(f"key '{key}' = {value!r}: {why}", names, key=key,
                                    fix="name the root-only file on the controller by its absolute path"))
    if (user is None) != (password is None):
        key = "monitoring_remote_write_password_file" if user else "monitoring_remote_write_username"
        problems.append(Problem(f"key '{key}' is not set while "
                                f"{'monitoring_remote_write_username' if user else 'monitoring_remote_write_password_file'}"
                                " is: basic auth takes both", names, key=key, fix="set both, or neither"))
    if token is not None and (user is not None or password is not None):
        problems.append(Problem("keys 'monitoring_remote_write_credentials_file' and monitoring_remote_write_username/"
                                "password_file are both set: Prometheus takes one of basic_auth and authorization",
                                names, key="monitoring_remote_write_credentials_file",
                                fix="keep the bearer token file or the user and its password file"))
    if first.monitoring_remote_write_url is None and (user or password or token):
        problems.append(Problem("monitoring_remote_write credentials are set but key 'monitoring_remote_write_url' is "
                                "not: there is nowhere to send them", names, key="monitoring_remote_write_url",
                                fix="set monitoring_remote_write_url (https), or remove the credentials"))
    return problems


def secret_path(where: str) -> str:
    """The monitoring node's copy of a secret data names at `where` (`ops.webhook_configs[0].url_file`)."""
    return f"{SECRETS_DIR}/" + where.replace("[", ".").replace("]", "")


def secret_files(node) -> dict[str, tuple[str, str]]:
    """{path on the monitoring node: (the data key and setting, the controller's file)} of every secret data
    names for the monitoring stack (the remote write's; the receivers' when Alertmanager is on)."""
    found = {}
    for setting in ("password_file", "credentials_file"):
        value = getattr(node, f"monitoring_remote_write_{setting}")
        if value and node.monitoring_remote_write_url:
            found[secret_path(f"remote_write.{setting}")] = (f"monitoring_remote_write_{setting}", value)
    if node.monitoring_alertmanager_enabled:
        for r in node.monitoring_alertmanager_receivers:
            integrations = {k: v for k, v in r.items() if k != "name"}
            for at, value in file_settings(integrations, r["name"]):
                found[secret_path(at)] = (f"monitoring_alertmanager_receivers {at}", value)
    return found


def receivers_on_node(receivers: list[dict]) -> list[dict]:
    """The receivers as the monitoring node's Alertmanager reads them: each `*_file` naming its copy there."""
    def copy(tree, path):
        if isinstance(tree, dict):
            return {k: secret_path(f"{path}.{k}") if isinstance(k, str) and k.endswith("_file")
                    and not isinstance(v, (dict, list)) else copy(v, f"{path}.{k}") for k, v in tree.items()}
        if isinstance(tree, list):
            return [copy(v, f"{path}[{i}]") for i, v in enumerate(tree)]
        return tree
    return [{k: (v if k == "name" else copy(v, f"{r['name']}.{k}")) for k, v in r.items()} for r in receivers]
