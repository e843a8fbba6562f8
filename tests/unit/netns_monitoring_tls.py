"""A monitored pair's TLS listeners, run for real in a network and mount namespace of its own, with the
files the deploy renders and roles/tls's own commands (tests/unit/test_monitoring_tls.py).

Run as root by the test inside `unshare -n -m` (both gone when this ends: the machine's /etc, links and
ports are never touched); reads its spec as JSON on stdin (the programs' paths, a work directory) and
prints what it saw as JSON. It builds the two nodes as a deploy leaves them, as far as one namespace can:
  - /etc under an overlay whose changes die with the namespace; the user prometheus made by the command
    roles/monitoring's user step runs (the packages' postinst line);
  - both management addresses (10.0.0.11, spark-a: the head and the monitoring node; 10.0.0.12, spark-b:
    the worker) on loopback; spark-b's /etc/sparkfleet and /etc/prometheus are directories of its own,
    bound over those paths in a mount namespace of its own for every command and daemon of spark-b, so
    each node has its own key at the real paths, and only the CSR and the certificate cross, as in a
    deploy;
  - roles/tls's verdict taken from the facts its own fact command reads on each node (state_command),
    and executed as roles/tls/tasks.py executes it: the CA made on spark-a, each node's key and CSR on
    that node, signed on spark-a, installed on the node, the exporters' copy, the bundles;
  - roles/monitoring's files as the deploy renders them (the exporters' web configuration, the node
    exporter's arguments, prometheus.yml and the rules), roles/api_proxy's config for spark-a;
  - the real daemons: the OS's node exporter on each node as user prometheus (the OS's unit runs it so)
    with the rendered arguments; HAProxy with the rendered config (its metrics frontend on 9400) in front
    of a stand-in engine serving /metrics; the OS's Prometheus as user prometheus with the rendered
    config, scraping all three over TLS;
  - then spark-b as this branch's first design left a router node (its one certificate with clientAuth
    besides, the exporters' copy of it) made the router node: its certificate issued again for serverAuth
    alone, the exporters' copy following it, the router hop's client certificate issued in its own
    root-only file that user prometheus cannot read, and Prometheus scraping spark-b still.
"""
import base64
import dataclasses
import http.server
import json
import shlex
import shutil
import subprocess
import tempfile
import sys
import threading
import time
import urllib.error
import urllib.request
import ssl
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from roles.api_proxy.checks import config_path, config_text, key_pattern_file  # noqa: E402
from roles.monitoring.checks import (  # noqa: E402
    PROMETHEUS_CONFIG, RULES, exporter_defaults_text, prometheus_config_text, prometheus_defaults_text, rules_text,
    web_config_text,
)
from roles.tls import checks as tls  # noqa: E402
from sparkfleet.config import build_cluster  # noqa: E402
from sparkfleet.keyfiles import write_command  # noqa: E402
from sparkfleet.model.monitoring import PROMETHEUS_ADDUSER, PROMETHEUS_USER  # noqa: E402
from sparkfleet.model.tls import (  # noqa: E402
    EXPORTER_GROUP, EXPORTER_PEM, EXPORTER_WEB_CONFIG, SCRAPE_CA, ca_bundle_path, proxy_pem_path, tls_dir,
)
from tests.unit.helpers import pair  # noqa: E402

DATA = {"monitoring_scrape_interval_s": 5, "gpu_expected": False}
ENGINE_METRICS = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
OWN = ("/etc/sparkfleet", "/etc/prometheus")  # spark-b's own, bound over these paths in its commands


def sh(argv, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    run = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
    if check and run.returncode != 0:
        raise SystemExit(f"{argv}: exit {run.returncode}: {run.stderr.strip()[-800:]}")
    return run


class Nodes:
    def __init__(self, work: Path, fleet):
        self.work, self.fleet = work, fleet
        self.a, self.b = fleet.head, fleet.workers[0]
        self.own = {d: work / "spark-b" / d.strip("/").replace("/", "-") for d in OWN}

    def argv(self, node, argv: list[str]) -> list[str]:
        """`argv` as run on `node`: on spark-b, in a mount namespace with its own directories bound."""
        if node.name == self.a.name:
            return argv
        binds = " && ".join(f"mount --bind {shlex.quote(str(src))} {dst}" for dst, src in self.own.items())
        return ["unshare", "-m", "sh", "-c", f"{binds} && exec \"$@\"", "sh", *argv]

    def on(self, node, command: str, stdin: str | None = None, check: bool = True) -> str:
        return sh(self.argv(node, ["sh", "-c", command]), stdin, check).stdout

    def path(self, node, path: str) -> Path:
        """Where `path` of `node` is, seen from this (spark-a's) view."""
        for d, src in self.own.items():
            if node.name != self.a.name and path.startswith(d + "/"):
                return src / path[len(d) + 1:]
        return Path(path)


def setup(work: Path) -> None:
    for d in ("upper", "overlay-work"):
        (work / d).mkdir()
    sh(["mount", "-t", "overlay", "overlay", "-o",
        f"lowerdir=/etc,upperdir={work}/upper,workdir={work}/overlay-work", "/etc"])
    sh(["ip", "link", "set", "lo", "up"])
    for address in ("10.0.0.11", "10.0.0.12"):
        sh(["ip", "addr", "add", f"{address}/32", "dev", "lo"])
    for d in OWN:
        Path(d).mkdir(mode=0o700, exist_ok=True)


def facts(nodes: Nodes) -> dict:
    a, b = nodes.a, nodes.b
    read = {a.name: nodes.on(a, tls.state_command(a, ca=True, scrape_ca=True)),
            b.name: nodes.on(b, tls.state_command(b, ca=False))}
    return {name: tls.TlsState().process(out.splitlines()) for name, out in read.items()}


def execute(nodes: Nodes, plan) -> None:
    """roles/tls/tasks.py's operations for `plan`, each on the node it names, in its order."""
    a = nodes.a
    if plan.create_ca:
        nodes.on(a, tls.create_ca_command(a, a.tls_ca_days, tls.ca_subject(a)))
    for node in (nodes.a, nodes.b):
        if node.name in plan.issue:
            cert = nodes.on(a, tls.sign_command(a, node, node.tls_cert_days), nodes.on(node, tls.csr_command(node)))
            nodes.on(node, tls.install_command(node), cert)
        if node.name in plan.hop:
            hop = tls.hop_cert(node)
            cert = nodes.on(a, tls.sign_command(a, node, node.tls_cert_days, hop), nodes.on(node, tls.csr_command(node, hop)))
            nodes.on(node, tls.install_command(node, hop), cert)
        if node.name in plan.exporter_pem:
            nodes.on(node, tls.exporter_pem_command(node))
        if node.name in plan.bundle:  # write_bundle's steps
            ca_pem = nodes.path(a, tls.ca_cert_path(a)).read_bytes()
            text = base64.b64encode(tls.bundle_text(ca_pem, plan.site_cas)).decode()
            nodes.on(node, f"umask 077; install -d -m 0700 {tls_dir(node)}")
            nodes.on(node, write_command(ca_bundle_path(node), "root", "0644"), text)
            if node.name == a.name:  # the monitoring node: Prometheus' copy
                nodes.on(node, tls.exporter_tls_dir_command())
                nodes.on(node, write_command(SCRAPE_CA, "root", "0644"), text)


def put(path: Path, text: str, group: str = "root", mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    sh(["chown", f"root:{group}", str(path)])
    path.chmod(mode)


def args_of(defaults: str) -> list[str]:
    """The ARGS="..." line of an /etc/default file, as the OS's unit passes them: systemd's EnvironmentFile
    value, split on whitespace by the unit's `$ARGS`."""
    line = next(l for l in defaults.splitlines() if l.startswith("ARGS="))
    return shlex.split(line[len("ARGS="):])[0].split()


def as_prometheus(argv: list[str]) -> list[str]:
    """As the OS's units run it: User=prometheus, with that user's groups."""
    return ["setpriv", f"--reuid={PROMETHEUS_USER}", f"--regid={PROMETHEUS_USER}", "--init-groups", *argv]


def engine() -> None:
    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = ENGINE_METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 18000), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def wait_port(address: str, port: int) -> None:
    import socket

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((address, port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on {address}:{port}")


def targets() -> list[dict]:
    with urllib.request.urlopen("http://127.0.0.1:9090/api/v1/targets", timeout=5) as r:
        active = json.load(r)["data"]["activeTargets"]
    return sorted(({"job": t["labels"]["job"], "node": t["labels"]["node"], "url": t["scrapeUrl"],
                    "health": t["health"], "error": t["lastError"]} for t in active), key=lambda t: (t["job"], t["node"]))


def wait_targets(want, timeout: float = 60) -> list[dict]:
    """Prometheus' targets once `want(targets)` holds (each scraped since), or as they are at `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            seen = targets()
        except (OSError, KeyError, ValueError):
            seen = []
        if (seen and want(seen)) or time.monotonic() > deadline:
            return seen
        time.sleep(1)


def fetch(url: str, ca: str | None) -> str:
    """`url`'s status (and for 200 its first metric line), verified with the bundle `ca`; plain HTTP for http://."""
    context = ssl.create_default_context(cafile=ca) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as r:
            return f"{r.status} " + next((l for l in r.read().decode().splitlines() if not l.startswith("#")), "")
    except urllib.error.HTTPError as e:
        return str(e.code)
    except (urllib.error.URLError, OSError) as e:
        return f"error: {getattr(e, 'reason', e)}"


def reads(user: str, path: str, nodes=None, node=None) -> bool:
    """`user` can read `path` (on `node` of `nodes`: in its mount namespace; else here, spark-a's view)."""
    argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "cat", path]
    return sh(nodes.argv(node, argv) if nodes else argv, check=False).returncode == 0


def main() -> None:
    spec = json.load(sys.stdin)
    work = Path(spec["work"])
    setup(work)
    fleet = build_cluster(pair(**{"spark-a": DATA, "spark-b": DATA}))
    nodes = Nodes(work, fleet)
    a, b = nodes.a, nodes.b
    for src in nodes.own.values():
        src.mkdir(parents=True, mode=0o700)
    sh(["sh", "-c", f"getent passwd {PROMETHEUS_USER} >/dev/null || {PROMETHEUS_ADDUSER}"])  # step 3a
    out: dict = {}

    first = tls.decide(fleet, facts(nodes))  # step 1b's verdict, on the bare pair
    out["first"] = {"create_ca": first.create_ca, "issue": sorted(first.issue), "exporter_pem": first.exporter_pem,
                    "bundle": first.bundle, "problems": list(first.problems)}
    execute(nodes, first)  # step 7b1
    out["second"] = tls.decide(fleet, facts(nodes)).changes

    # step 7b2 and 12b's files, as rendered
    for node in (a, b):
        put(nodes.path(node, EXPORTER_WEB_CONFIG), web_config_text(node), EXPORTER_GROUP, 0o640)
    put(Path(PROMETHEUS_CONFIG), prometheus_config_text(fleet), PROMETHEUS_USER, 0o640)
    put(Path(RULES), rules_text(fleet))
    put(Path(key_pattern_file(a)), "Bearer unit-test-key-0123456789abcdef\n", mode=0o600)
    put(Path(config_path(a)), config_text(a), mode=0o600)
    out["modes"] = {p: sh(["stat", "-c", "%U:%G %a", p]).stdout.strip()
                    for p in (EXPORTER_PEM, EXPORTER_WEB_CONFIG, SCRAPE_CA, EXPORTER_PEM.rsplit("/", 1)[0])}
    out["reads"] = {f"{user} {what}": reads(user, path) for user, what, path in (
        (PROMETHEUS_USER, "exporter copy", EXPORTER_PEM), (PROMETHEUS_USER, "node PEM", proxy_pem_path(a)),
        ("nobody", "exporter copy", EXPORTER_PEM), (PROMETHEUS_USER, "scrape CA", SCRAPE_CA))}

    engine()
    daemons = [subprocess.Popen([spec["haproxy"], "-W", "-f", config_path(a)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)]
    logs = work / "logs"
    logs.mkdir()

    def exporter(node) -> subprocess.Popen:
        argv = as_prometheus([spec["node_exporter"], *args_of(exporter_defaults_text(node))])
        with open(logs / f"node-exporter-{node.name}.log", "a") as log:
            return subprocess.Popen(nodes.argv(node, argv), stdout=log, stderr=subprocess.STDOUT)

    exporters = {node.name: exporter(node) for node in (a, b)}

    def restart(node) -> None:
        """roles/monitoring's restart of the node exporter (its certificate changed): Prometheus keeps its
        connections open, and only a new connection reads the certificate again."""
        exporters[node.name].terminate()
        exporters[node.name].wait(10)
        exporters[node.name] = exporter(node)
        wait_port(node.management_address, node.monitoring_node_exporter_port)

    # Prometheus' data directory where its user can reach it (the test's work directory is under root's
    # 0700 pytest directory); removed at the end
    data = Path(tempfile.mkdtemp(prefix="sfl-prometheus-", dir="/tmp"))
    sh(["chown", f"{PROMETHEUS_USER}:{PROMETHEUS_USER}", str(data)])
    prom_args = [f"--storage.tsdb.path={data}/" if x.startswith("--storage.tsdb.path=") else x
                 for x in args_of(prometheus_defaults_text(a))]
    with open(logs / "prometheus.log", "w") as log:
        daemons.append(subprocess.Popen(as_prometheus([spec["prometheus"], *prom_args]), stdout=log,
                                        stderr=subprocess.STDOUT))
    try:
        for address, port in (("10.0.0.11", 9100), ("10.0.0.12", 9100), ("10.0.0.11", 9400), ("127.0.0.1", 9090)):
            wait_port(address, port)
        bundle = str(nodes.path(a, ca_bundle_path(a)))
        out["fetch"] = {url: fetch(url, bundle) for url in (
            "https://10.0.0.11:9100/metrics", "http://10.0.0.11:9100/metrics", "https://10.0.0.12:9100/metrics",
            "https://10.0.0.11:9400/metrics", "http://10.0.0.11:9400/metrics", "https://10.0.0.11:9400/v1/models")}
        out["up"] = wait_targets(lambda ts: len(ts) == 3 and all(t["health"] == "up" for t in ts))

        # spark-b's exporters' copy replaced by a certificate that is not its own, and the exporter restarted:
        # Prometheus refuses it at the next scrape; the plan copies the node's back, and the exporter
        # restarted serves it. Spark-a's certificate (another address), then one for spark-b's own address
        # from another CA (made by roles/tls's commands elsewhere).
        stranger = b.model_copy(update={"serving_dir": str(work / "stranger")})
        nodes.on(a, tls.create_ca_command(stranger, 30, "another CA"))
        nodes.on(a, tls.install_command(stranger),
                 nodes.on(a, tls.sign_command(stranger, stranger, 30), nodes.on(a, tls.csr_command(stranger))))
        out["wrong"], out["repair"] = {}, {}
        for why, pem in (("another address", nodes.path(a, EXPORTER_PEM)), ("another CA", Path(proxy_pem_path(stranger)))):
            nodes.path(b, EXPORTER_PEM).write_bytes(pem.read_bytes())
            restart(b)
            seen = wait_targets(lambda ts: any(t["node"] == b.name and t["health"] == "down" for t in ts))
            out["wrong"][why] = next(t for t in seen if t["node"] == b.name)
            repair = tls.decide(fleet, facts(nodes))
            out["repair"][why] = {"exporter_pem": repair.exporter_pem, "issue": sorted(repair.issue),
                                  "bundle": repair.bundle}
            execute(nodes, repair)
            if b.name in repair.exporter_pem:
                restart(b)
            out["repaired"] = wait_targets(lambda ts: all(t["health"] == "up" and not t["error"] for t in ts))

        # spark-b as this branch's first design left a router node: its one certificate with clientAuth besides
        # serverAuth (then smg's client certificate), and the exporters' copy of it, served.
        first_design = dataclasses.replace(tls.node_cert(b), usage=("serverAuth", "clientAuth"))
        nodes.on(b, tls.install_command(b, first_design),
                 nodes.on(a, tls.sign_command(a, b, 365, first_design), nodes.on(b, tls.csr_command(b, first_design))))
        nodes.on(b, tls.exporter_pem_command(b))
        restart(b)
        # spark-b made the router node (issue 43 item 3; Prometheus stays on spark-a): its certificate is issued
        # again for serverAuth alone, the exporters' copy follows it, and the router hop's client certificate
        # (smg's: clientAuth only) is issued into its own file, which nothing copies.
        routed = Nodes(work, build_cluster(pair(**{n: {**DATA, "router_node": "spark-b", "monitoring_node": "spark-a"}
                                                   for n in ("spark-a", "spark-b")})))
        plan = tls.decide(routed.fleet, facts(routed))
        out["router"] = {"issue": plan.issue, "hop": plan.hop, "exporter_pem": plan.exporter_pem, "bundle": plan.bundle}
        execute(routed, plan)
        restart(b)  # roles/monitoring: the node's certificate is new (the plan's exporter copy)
        copy, bundle_b = nodes.path(b, EXPORTER_PEM), nodes.path(b, ca_bundle_path(b))
        hop_pem = tls.hop_cert(routed.b).pem
        out["router_eku"] = {what: sh(["openssl", "x509", "-in", str(path), "-noout", "-ext", "extendedKeyUsage"]).stdout.split("\n")[1].strip()
                             for what, path in (("exporter copy", copy), ("hop", nodes.path(b, hop_pem)))}
        out["router_verify"] = {purpose: sh(["openssl", "verify", "-purpose", purpose, "-CAfile", str(bundle_b),
                                             "-verify_ip", b.management_address, str(copy)], check=False).returncode
                                for purpose in ("sslserver", "sslclient")}
        out["router_modes"] = {what: nodes.on(b, f"stat -c '%U:%G %a' {path}").strip() for what, path in (
            ("hop", hop_pem), ("exporter copy", EXPORTER_PEM), ("tls dir", tls_dir(b)))}
        out["router_reads"] = {what: reads(PROMETHEUS_USER, path, nodes, b) for what, path in (
            ("exporter copy", EXPORTER_PEM), ("hop", hop_pem), ("node PEM", proxy_pem_path(b)))}
        out["router_copy_is_node_pem"] = nodes.path(b, EXPORTER_PEM).read_bytes() == nodes.path(b, proxy_pem_path(b)).read_bytes()
        served_b = sh(["sh", "-c", "openssl s_client -connect 10.0.0.12:9100 </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha256"]).stdout
        out["router_served"] = served_b == sh(["openssl", "x509", "-in", str(copy), "-noout", "-fingerprint", "-sha256"]).stdout
        out["router_up"] = wait_targets(lambda ts: len(ts) == 3 and all(t["health"] == "up" and not t["error"] for t in ts))
        out["last"] = tls.decide(routed.fleet, facts(routed)).changes
    finally:
        for d in [*daemons, *exporters.values()]:
            d.terminate()
        for d in [*daemons, *exporters.values()]:
            try:
                d.wait(10)
            except subprocess.TimeoutExpired:
                d.kill()
        shutil.rmtree(data, ignore_errors=True)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
