"""Local users reach only what they own, tried on the lab's nodes (issue 43 item 4; docs/security.md,
"What a local user reaches"): on every node of the deployed pair, a user created there for the test
and a container on the host's network run as uid 65534 (from the image the node serves) try every
internal service the node can reach, its own and its peers', and each is refused, while root's own
connections and requests on the same node answer.

What is tried, from each node (the inventory's data, never literals):
  - the rendezvous port (the head; torch's store) on every address it listens on, as `ss` shows it:
    refused to the others; root is not tried there, since a bare connection to it is a rank that
    failed its hello (tests/state/test_firewall.py says why), and the pair serving through it is
    root's proof;
  - the registry (the head's fabric address, from either node), each node's rsync daemon, the
    speed-proof port and a port on each half's fabric address (what a rank's socket is: NCCL's,
    gloo's, vLLM's), the node's own and its peers': a root listener stands in on the last two for
    the test's time, as nothing listens there between proofs;
  - the engine's own port on the head;
  - with monitoring on, Prometheus and Alertmanager on the monitoring node.
The probe is tests/connect_probe.py, sent as `python3 -c` source: the node's python3 for root and
the created user (setpriv: that uid and gid, no supplementary groups), the served image's for the
container.
"""
import json
import shlex
from dataclasses import dataclass

from roles.monitoring.checks import monitoring_node
from sparkfleet.model.engine import unit_name
from sparkfleet.model.serving import node_profile
from tests.e2e.lab import REPO, on

PROBE = (REPO / "tests" / "connect_probe.py").read_text()
PROBE_USER = "sfl-localprobe"
CONTAINER_UID = 65534
TIMEOUT_S = 4
# A port on each half's fabric address, where a rank's own socket would be (the listener table's
# ephemeral/tcp rows): a root listener holds it for the test.
RANK_PORT = 47377
# Answers every connection with a line; runs until killed (at most LISTEN_S), then the test kills it.
LISTEN_S = 600
LISTENER = """
import json, socket, sys, threading
def serve(s):
    while True:
        c, _ = s.accept()
        c.sendall(b"sparkfleet\\n")
        c.close()
for host, port in json.loads(sys.argv[1]):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(16)
    threading.Thread(target=serve, args=(s,)).start()
"""
REACHED = ("answered", "open")


@dataclass(frozen=True)
class Service:
    what: str
    address: str
    port: int
    root_tries: bool = True  # root's own connection is tried (not on the rendezvous: see above)

    @property
    def target(self) -> list:
        return [self.address, self.port]


def listening_addresses(name: str, port: int) -> list[str]:
    """The local addresses `port` listens on at node `name` (ss), `*`-style wildcards as they are."""
    out = on(name, f"ss -Hltn 'sport = :{int(port)}' | awk '{{print $4}}'")
    return sorted({line.rsplit(":", 1)[0].strip("[]") for line in out.split()})


def services_from(cluster, node, monitoring: bool) -> list[Service]:
    """Every internal service `node` can reach: its own, and its peers' over the fabric."""
    head = cluster.head
    speed, rsync, registry = node.fabric_speed_port, node.fanout_rsync_port, head.docker_registry_port
    master = node_profile(head).master_port
    found = []
    if node.is_head:
        wildcard = {"0.0.0.0", "*", "::"}
        bound = listening_addresses(node.name, master)
        assert bound, f"{node.name}: nothing listens on the rendezvous port {master}; nothing to prove"
        addresses = (["127.0.0.1", node.fabric_ip, node.management_address] if wildcard & set(bound)
                     else bound)
        found += [Service("rendezvous", a, master, root_tries=False) for a in addresses]
        found.append(Service("the engine's own port", "127.0.0.1", node.api_proxy_engine_port))
    found.append(Service("the registry", head.fabric_ip, registry))
    for n in (node, *cluster.peers(node)):
        found.append(Service(f"{n.name}'s rsync daemon", n.fabric_ip, rsync))
        found.append(Service(f"{n.name}'s weights HTTP server", n.fabric_ip, n.fanout_http_port))
        found.append(Service(f"{n.name}'s speed-proof port", n.fabric_ip, speed))
        found += [Service(f"{n.name}'s socket on {half.netdev}", half.ip, RANK_PORT) for half in n.fabric_halves]
    monitor = monitoring_node(cluster)
    if monitoring and monitor is not None and monitor.name == node.name:
        found.append(Service("Prometheus", "127.0.0.1", node.monitoring_prometheus_port))
        if node.monitoring_alertmanager_enabled:
            found.append(Service("Alertmanager", "127.0.0.1", node.monitoring_alertmanager_port))
    return found


def start_listeners(cluster) -> dict[str, str]:
    """On every node, a root listener on the speed-proof port of its fabric address and on RANK_PORT of
    each half's: node -> its pid."""
    pids = {}
    for n in cluster.nodes:
        pairs = [[n.fabric_ip, n.fabric_speed_port]] + [[h.ip, RANK_PORT] for h in n.fabric_halves]
        cmd = (f"setsid timeout {LISTEN_S} python3 -c {shlex.quote(LISTENER)} {shlex.quote(json.dumps(pairs))} "
               f">/dev/null 2>&1 </dev/null & echo $!")
        pids[n.name] = on(n.name, cmd).strip()
    for n in cluster.nodes:  # listening before anything is tried
        on(n.name, f"for i in $(seq 50); do ss -Hltn 'sport = :{RANK_PORT}' | grep -q . && exit 0; sleep 0.1; done; "
                   "exit 1")
    return pids


def stop_listeners(pids: dict[str, str]) -> None:
    for name, pid in pids.items():
        if pid.isdigit():
            on(name, f"kill {pid} 2>/dev/null; true", check=False)


def probe_command(targets: list[list], prefix: str = "python3") -> str:
    return f"{prefix} -c {shlex.quote(PROBE)} {TIMEOUT_S} {shlex.quote(json.dumps(targets))}"


def probe(node, services: list[Service], how: str) -> dict[str, str]:
    """What each service gave `how` ('root', 'user', 'container') on `node`: 'what (address:port)' -> result."""
    targets = [s.target for s in services]
    if how == "root":
        command = probe_command(targets)
    elif how == "user":
        command = probe_command(targets, f"setpriv --reuid=$(id -u {PROBE_USER}) --regid=$(id -g {PROBE_USER}) "
                                         "--clear-groups python3")
    else:  # the image the node serves, present on it: its container's
        image = on(node.name, f"docker inspect --format '{{{{.Image}}}}' {shlex.quote(unit_name(node))}").strip()
        command = probe_command(targets, f"docker run --rm --network host --user {CONTAINER_UID}:{CONTAINER_UID} "
                                         f"--entrypoint python3 {shlex.quote(image)}")
    results = json.loads(on(node.name, command).strip().splitlines()[-1])
    return {f"{s.what} ({s.address}:{s.port})": r for s, r in zip(services, results)}


def check_every_node(cluster, monitoring: bool) -> list[str]:
    """On every node: root reaches every service it tries, the created user and the container none.
    Returns one line per node of what was tried (for the test's output); raises AssertionError naming
    every service that answered whom it should not, or refused root."""
    pids = start_listeners(cluster)
    for n in cluster.nodes:
        on(n.name, f"id -u {PROBE_USER} >/dev/null 2>&1 || useradd --system --user-group --no-create-home "
                   f"--shell /usr/sbin/nologin {PROBE_USER}")
    problems, tried = [], []
    try:
        for n in cluster.nodes:
            services = services_from(cluster, n, monitoring)
            root = probe(n, [s for s in services if s.root_tries], "root")
            problems += [f"{n.name}: root -> {what}: {r}" for what, r in root.items() if r not in REACHED]
            for how in ("user", "container"):
                got = probe(n, services, how)
                problems += [f"{n.name}: {how} -> {what}: {r}, want refused" for what, r in got.items()
                             if r != "refused"]
            tried.append(f"{n.name}: {len(services)} services ({', '.join(sorted({s.what for s in services}))})")
    finally:
        stop_listeners(pids)
        for n in cluster.nodes:
            on(n.name, f"userdel {PROBE_USER} 2>/dev/null; true", check=False)
    assert not problems, "\n".join(problems)
    return tried


def root_requests(cluster, monitoring: bool) -> dict[str, str]:
    """Root's own requests on the head, each service's own protocol: the registry's API, an rsync
    module list, the weights' HTTP server, Prometheus' and Alertmanager's readiness (with monitoring):
    what -> the answer."""
    head = cluster.head
    out = {
        "registry /v2/": on(head.name, f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}' "
                                        f"http://{head.fabric_ip}:{head.docker_registry_port}/v2/").strip(),
        "rsync weights module": "ok" if on(head.name, f"rsync --list-only --port={head.fanout_rsync_port} "
                                                      f"rsync://{head.fabric_ip}/weights/ >/dev/null && echo ok",
                                           check=False).strip() == "ok" else "failed",
        # A worker's weights pull asks the head's HTTP server for a manifest; a path that is none: 404.
        "weights HTTP server": on(head.name, f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}' "
                                             f"http://{head.fabric_ip}:{head.fanout_http_port}/no-such-model.manifest").strip(),
    }
    monitor = monitoring_node(cluster)
    if monitoring and monitor is not None:
        out["Prometheus /-/ready"] = on(monitor.name, f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}' "
                                                      f"http://127.0.0.1:{monitor.monitoring_prometheus_port}/-/ready").strip()
        if monitor.monitoring_alertmanager_enabled:
            out["Alertmanager /-/ready"] = on(monitor.name, f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}' "
                                                            f"http://127.0.0.1:{monitor.monitoring_alertmanager_port}/-/ready").strip()
    return out
