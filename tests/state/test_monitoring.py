"""roles/monitoring, checked on the machines: the OS's node exporter at the pinned version running with
the arguments data renders, sparkfleet's textfile; with TLS on, every exporter of the node serving the
node's certificate (roles/tls's copy, root:prometheus 0640) and nothing in plain HTTP; on the monitoring
node, Prometheus at its pinned version with the rendered targets and rules, on loopback, scraping every
target over https, and Alertmanager when data turns it on.
With monitoring off (the stand-in lab),
there is nothing of it to check."""
import json

import pytest

from roles.monitoring.checks import (
    ALERTMANAGER_CONFIG, ALERTMANAGER_DEFAULTS, ALERTMANAGER_PACKAGE, ALERTMANAGER_UNIT, alertmanager_config_text,
    alertmanager_defaults_text, EXPORTER_DEFAULTS, EXPORTER_PACKAGE, GID_METRICS_UNIT, GPU_EXPORTER_UNIT, PROMETHEUS_CONFIG, PROMETHEUS_PACKAGE, RULES, TEXTFILE,
    exporter_defaults_text, gid_metrics_files, gpu_exporter_files, monitoring_node, prometheus_config_text, rules_text, textfile_text, upstream_version,
)
from sparkfleet.model.monitoring import SECRETS_DIR, secret_files
from sparkfleet.model.tls import EXPORTER_PEM, EXPORTER_WEB_CONFIG, SCRAPE_CA, ca_bundle_path, exporter_tls, proxy_pem_path

FINGERPRINT = "openssl x509 -noout -fingerprint -sha256 -in"


@pytest.fixture
def monitored(node, cluster):
    if not node.monitoring_enabled:
        pytest.skip(f"{node.name}: monitoring_enabled is false")
    return node


def test_the_node_exporter_runs_the_pinned_version_with_the_rendered_arguments(host, monitored, cluster):
    package = host.package(EXPORTER_PACKAGE)
    assert package.is_installed, f"{monitored.name}: {EXPORTER_PACKAGE} not installed"
    assert upstream_version(package.version) == monitored.monitoring_node_exporter_version, package.version
    assert host.file(EXPORTER_DEFAULTS).content_string == exporter_defaults_text(monitored)
    assert host.service("prometheus-node-exporter").is_running and host.service("prometheus-node-exporter").is_enabled
    # the running process has the arguments the file gives (a file never re-read would prove nothing)
    cmdline = host.check_output("tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value prometheus-node-exporter)/cmdline")
    assert "--collector.disable-defaults" in cmdline and f":{monitored.monitoring_node_exporter_port}" in cmdline
    assert host.file(TEXTFILE).content_string == textfile_text(cluster, monitored)


def served_fingerprint(host, node, port: int) -> str:
    """The SHA-256 fingerprint of the certificate `port` on the node's management address serves, verified
    against the node's bundle for that address ('' when it does not verify)."""
    bundle, address = ca_bundle_path(node), node.management_address
    out = host.run(f"openssl s_client -connect {address}:{port} -CAfile {bundle} -verify_return_error "
                   f"-verify_ip {address} </dev/null 2>/dev/null | {FINGERPRINT} /dev/stdin")
    return out.stdout.strip() if out.rc == 0 else ""


def test_with_tls_every_exporter_of_the_node_serves_its_certificate_and_no_plain_http(host, monitored):
    """Issue 43 item 1: the node exporter (and a head's engine /metrics, a GPU node's GPU exporter) speak
    TLS with the node's one certificate, from the fleet's CA for its management address; the exporters'
    copy of it is the node's PEM, root:prometheus 0640, and their web configuration the rendered one."""
    from roles.monitoring.checks import web_config_text

    if not exporter_tls(monitored):
        pytest.skip(f"{monitored.name}: tls_enabled is false")
    web = host.file(EXPORTER_WEB_CONFIG)
    assert web.content_string == web_config_text(monitored)
    assert (web.user, web.group, web.mode) == ("root", "prometheus", 0o640)
    copy = host.file(EXPORTER_PEM)
    assert (copy.user, copy.group, copy.mode) == ("root", "prometheus", 0o640), f"{monitored.name}: {EXPORTER_PEM}"
    assert host.run(f"cmp -s {proxy_pem_path(monitored)} {EXPORTER_PEM}").rc == 0, \
        f"{monitored.name}: the exporters' copy is not the node's certificate"
    cmdline = host.check_output("tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value prometheus-node-exporter)/cmdline")
    assert f"--web.config.file={EXPORTER_WEB_CONFIG}" in cmdline, cmdline
    want = host.check_output(f"{FINGERPRINT} {proxy_pem_path(monitored)}")
    ports = [monitored.monitoring_node_exporter_port] + [monitored.monitoring_engine_metrics_port] * monitored.is_head \
        + [monitored.monitoring_gpu_exporter_port] * bool(gpu_exporter_files(monitored))
    for port in ports:
        assert served_fingerprint(host, monitored, port) == want, f"{monitored.name}:{port} serves another certificate"
        plain = host.run(f"curl -s -o /dev/null -w '%{{http_code}}' -m 5 http://{monitored.management_address}:{port}/metrics")
        assert plain.stdout.strip() != "200", f"{monitored.name}:{port} answers plain HTTP"


def test_an_rdma_node_s_gid_index_is_a_metric_now_and_as_its_engine_started(host, monitored):
    """The timer that reads each RDMA half's GID index (SparkfleetGidMoved), as rendered and running,
    and both metrics of each half on the node: now, and as the rank's last start found it."""
    files = gid_metrics_files(monitored)
    if not files:
        pytest.skip(f"{monitored.name}: no RDMA device (the lab)")
    for path, text in files.items():
        assert host.file(path).content_string == text, f"{monitored.name}: {path} is not the rendered one"
    timer = host.service(f"{GID_METRICS_UNIT}.timer")
    assert timer.is_running and timer.is_enabled, f"{monitored.name}: {GID_METRICS_UNIT}.timer not running and enabled"
    for half in (h for h in monitored.fabric_halves if h.hca):
        for name in (f"sparkfleet-gid-{half.hca}.prom", f"sparkfleet-gid-start-{half.hca}.prom"):
            assert host.file(f"{TEXTFILE.rsplit('/', 1)[0]}/{name}").exists, f"{monitored.name}: no {name}"


def test_a_gpu_node_s_gpu_exporter_runs_as_rendered_and_reports_the_gpu(host, monitored):
    """dcgm-exporter (SparkfleetGpuThrottled, the GPU panels) as rendered, running, and answering with
    the GPU's SM clock and utilization: a real scrape from the node, on its management address."""
    files = gpu_exporter_files(monitored)
    if not files:
        pytest.skip(f"{monitored.name}: no GPU (the lab)")
    for path, text in files.items():
        assert host.file(path).content_string == text, f"{monitored.name}: {path} is not the rendered one"
    unit = host.service(f"{GPU_EXPORTER_UNIT}.service")
    assert unit.is_running and unit.is_enabled, f"{monitored.name}: {GPU_EXPORTER_UNIT} not running and enabled"
    scheme, verify = ("https", f"--cacert {ca_bundle_path(monitored)} ") if exporter_tls(monitored) else ("http", "")
    scrape = host.check_output(f"curl -fsS -m 10 {verify}{scheme}://{monitored.management_address}:"
                               f"{monitored.monitoring_gpu_exporter_port}/metrics")
    for name in ("DCGM_FI_DEV_SM_CLOCK{", "DCGM_FI_DEV_GPU_UTIL{", "DCGM_FI_DEV_POWER_USAGE{"):
        assert name in scrape, f"{monitored.name}: the GPU exporter reports no {name[:-1]}"


def test_the_monitoring_node_runs_prometheus_with_the_rendered_targets_and_rules(host, monitored, cluster):
    if monitoring_node(cluster).name != monitored.name:
        pytest.skip(f"{monitored.name} is not the monitoring node")
    package = host.package(PROMETHEUS_PACKAGE)
    assert upstream_version(package.version) == monitored.monitoring_prometheus_version, package.version
    config = host.file(PROMETHEUS_CONFIG)
    assert config.content_string == prometheus_config_text(cluster)
    # root and the daemon's group only (issue 43 item 6): the remote write's credentials are named there
    assert (config.user, config.group, config.mode) == ("root", "prometheus", 0o640)
    secrets = host.file(SECRETS_DIR)
    assert secrets.is_directory and (secrets.user, secrets.group, secrets.mode) == ("root", "prometheus", 0o750)
    for path in secret_files(monitored):  # each copy of a controller's secret: root:prometheus 0640
        copy = host.file(path)
        assert (copy.user, copy.group, copy.mode) == ("root", "prometheus", 0o640), path
    assert host.file(RULES).content_string == rules_text(cluster)
    assert host.service("prometheus").is_running and host.service("prometheus").is_enabled
    assert host.socket(f"tcp://127.0.0.1:{monitored.monitoring_prometheus_port}").is_listening
    assert not host.socket(f"tcp://0.0.0.0:{monitored.monitoring_prometheus_port}").is_listening
    if monitored.tls_enabled:
        # every target over https, verified with Prometheus' copy of the node's bundle; none refused for its
        # certificate (a target still starting may be down for another reason: the real tier waits for up)
        assert host.run(f"cmp -s {ca_bundle_path(monitored)} {SCRAPE_CA}").rc == 0, f"{SCRAPE_CA} is not the bundle"
        answer = json.loads(host.check_output(f"curl -fsS -m 10 http://127.0.0.1:{monitored.monitoring_prometheus_port}"
                                              "/api/v1/targets"))
        active = answer["data"]["activeTargets"]
        assert active and all(t["scrapeUrl"].startswith("https://") for t in active), active
        assert not [t for t in active if "x509" in t["lastError"] or "tls" in t["lastError"].lower()], active


def test_the_monitoring_node_runs_alertmanager_on_loopback_with_the_receivers_root_and_its_group_only(host, monitored,
                                                                                                    cluster):
    if monitoring_node(cluster).name != monitored.name or not monitored.monitoring_alertmanager_enabled:
        pytest.skip(f"{monitored.name} runs no Alertmanager")
    package = host.package(ALERTMANAGER_PACKAGE)
    assert upstream_version(package.version) == monitored.monitoring_alertmanager_version, package.version
    assert host.file(ALERTMANAGER_DEFAULTS).content_string == alertmanager_defaults_text(monitored)
    config = host.file(ALERTMANAGER_CONFIG)
    assert config.content_string == alertmanager_config_text(monitored)
    assert (config.user, config.group, config.mode) == ("root", "prometheus", 0o640)  # a receiver's URL is a secret
    unit = host.service(f"{ALERTMANAGER_UNIT}.service")
    assert unit.is_running and unit.is_enabled
    # loopback alone, and no cluster (gossip) port: every socket of the process
    pid = host.check_output(f"systemctl show -p MainPID --value {ALERTMANAGER_UNIT}")
    sockets = host.check_output(f"ss -Htulnp | grep -F 'pid={int(pid)},' | awk '{{print $1, $5}}'").split("\n")
    assert sockets == [f"tcp 127.0.0.1:{monitored.monitoring_alertmanager_port}"], sockets
    # Prometheus has found it (its API: the Alertmanagers it sends to)
    answer = host.check_output(f"curl -fsS -m 10 http://127.0.0.1:{monitored.monitoring_prometheus_port}"
                               "/api/v1/alertmanagers")
    assert f'"url":"http://127.0.0.1:{monitored.monitoring_alertmanager_port}/api/v2/alerts"' in answer, answer


def test_every_node_writes_its_fingerprint_now_for_the_image_its_engine_runs(host, monitored):
    """sparkfleet-fingerprint-metrics (roles/fingerprint) as rendered and running, and the textfile it
    wrote naming the image the node's engine container runs now."""
    from roles.fingerprint.checks import METRICS_TEXTFILE, METRICS_UNIT, metrics_files
    from sparkfleet.model.engine import unit_name

    for path, text in metrics_files(monitored).items():
        assert host.file(path).content_string == text, f"{monitored.name}: {path} is not the rendered one"
    timer = host.service(f"{METRICS_UNIT}.timer")
    assert timer.is_running and timer.is_enabled, f"{monitored.name}: {METRICS_UNIT}.timer not running and enabled"
    host.run_test(f"systemctl start {METRICS_UNIT}.service")  # now, not at the timer's next turn
    image = host.check_output(f"docker inspect --format '{{{{.Image}}}}' {unit_name(monitored)}")
    text = host.file(METRICS_TEXTFILE).content_string
    assert f'image_id="{image}"' in text and f'kernel="{host.check_output("uname -r")}"' in text, text
