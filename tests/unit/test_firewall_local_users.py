"""Local users reach only what they own (issue 43 item 4): roles/firewall's output chain refuses every
user but root the fabric's services (rendezvous, registry, rsync, speed proof) on any of the node's
addresses and every fabric address of the group, and every user but root and prometheus Prometheus'
and Alertmanager's ports on the monitoring node; roles/monitoring makes that user before the firewall
names it. The rules as rendered, then loaded for real in a network namespace and tried as root and as
other users (tests/unit/netns_firewall.py)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.firewall_rules import rules_text
from sparkfleet.model.monitoring import PROMETHEUS_ADDUSER, PROMETHEUS_USER
from tests.unit.test_firewall import MGMT, both, rules

RECEIVERS = [{"name": "team", "webhook_configs": [{"url": "https://alerts.example.com/hook"}]}]
FABRIC = "tcp dport { 873, 5000, 8874, 29501, 29510 }"
ADDRESSES = "ip daddr { 10.77.77.1, 10.77.77.2, 10.77.78.1, 10.77.78.2 }"


def monitored(**data):
    return both(monitoring_enabled=True, monitoring_alertmanager_enabled=True,
                monitoring_alertmanager_receivers=RECEIVERS, **data)


def output_chain(text: str) -> list[str]:
    lines = rules(text)
    start = lines.index("chain output {")
    return lines[start + 2:lines.index("}", start)]


def test_every_node_refuses_other_users_the_fabric_services_on_its_own_addresses_and_every_fabric_address():
    c = both()
    for node in c.nodes:  # the worker too: its rsync daemon, its ranks' sockets, the head's over the fabric
        chain = output_chain(rules_text(c, node, MGMT))
        assert f"fib daddr type local {FABRIC} ct state new meta skuid != {{ root }} reject with tcp reset" in chain
        assert (f"{ADDRESSES} ct state new meta skuid != {{ root }} meta l4proto tcp reject with tcp reset" in chain)
        assert f"{ADDRESSES} ct state new meta skuid != {{ root }} reject" in chain
    # the engine's port stays the head's, root's and the proxy's
    assert 'oif "lo" tcp dport 18000 meta skuid != { root, haproxy } reject with tcp reset' in output_chain(
        rules_text(c, c.head, MGMT))
    assert not any("18000" in line for line in output_chain(rules_text(c, c.workers[0], MGMT)))
    # loopback stays accepted on input: what a local user reaches is the output chain's
    assert 'iif "lo" accept' in rules(rules_text(c, c.head, MGMT))[5]


def test_a_port_of_one_half_names_its_one_address_per_node():
    from tests.unit.helpers import ONE_HALF, pair
    from sparkfleet.config import build_cluster

    c = build_cluster(pair(**{"spark-a": ONE_HALF, "spark-b": ONE_HALF}))
    chain = output_chain(rules_text(c, c.head, MGMT))
    assert "ip daddr { 10.77.77.1, 10.77.77.2 } ct state new meta skuid != { root } reject" in chain


def test_prometheus_and_alertmanager_admit_root_and_their_own_user_on_the_monitoring_node_only():
    c = monitored()
    monitor = c.head.management_address  # the first group's head, by default
    want = "fib daddr type local tcp dport { 9090, 9093 } ct state new meta skuid != { root, prometheus } reject with tcp reset"
    assert want in output_chain(rules_text(c, c.head, MGMT, monitor))
    assert not any("9090" in line for line in output_chain(rules_text(c, c.workers[0], MGMT, monitor)))
    # Alertmanager off: Prometheus' port alone
    alone = both(monitoring_alertmanager_enabled=False)
    assert ("fib daddr type local tcp dport { 9090 } ct state new meta skuid != { root, prometheus } reject with tcp "
            "reset") in output_chain(rules_text(alone, alone.head, MGMT, monitor))
    # the monitoring node elsewhere: the worker gets the rule, the head does not
    elsewhere = monitored(monitoring_node="spark-b")
    worker = elsewhere.node("spark-b")
    assert want in output_chain(rules_text(elsewhere, worker, MGMT, worker.management_address))
    assert not any("9090" in line for line in output_chain(rules_text(elsewhere, elsewhere.head, MGMT,
                                                                           worker.management_address)))
    # monitoring off: no rule names the user (it may not exist)
    off = both(monitoring_enabled=False)
    assert PROMETHEUS_USER not in rules_text(off, off.head, MGMT, None)


# --- The rules loaded for real, and tried as each user ----------------------------------------------

SYSTEM_PYTHON = "/usr/bin/python3"  # readable by every user (the test's own interpreter may be under /root)
NEEDED = ("nft", "unshare", "nsenter", "setpriv", "adduser", "ip")


def netns(spec: dict) -> dict:
    """tests/unit/netns_firewall.py in a network and mount namespace of its own, as root."""
    missing = [tool for tool in NEEDED if not shutil.which(tool)] + (
        [] if Path(SYSTEM_PYTHON).exists() else [SYSTEM_PYTHON])
    if missing:
        pytest.skip(f"not on this machine: {', '.join(missing)}")
    driver = Path(__file__).with_name("netns_firewall.py")
    run = subprocess.run(["unshare", "-n", "-m", sys.executable, str(driver)], input=json.dumps(spec),
                         capture_output=True, text=True, timeout=120)
    if run.returncode != 0 and "Operation not permitted" in run.stderr:
        pytest.skip(f"no network namespace here: {run.stderr.strip()}")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_in_a_namespace_every_other_user_is_refused_every_internal_service_and_root_and_their_owners_are_not(tmp_path):
    c = monitored()
    head, worker = c.head, c.workers[0]
    fabric, twin = head.fabric_halves[0].ip, head.fabric_halves[1].ip
    peer_fabric = worker.fabric_halves[0].ip
    management = head.management_address
    # What listens on a head, as the listener table has it (docs/security.md): the rendezvous on every
    # address (both families), the registry, rsync, the weights' HTTP server and speed proof on the
    # fabric address, a collective's socket on each half's, the engine on loopback, Prometheus and
    # Alertmanager on loopback; and a port nothing internal uses (a user's own service), to show the
    # rules refuse only what they name.
    rendezvous = [["127.0.0.1", 29501], ["::1", 29501], [fabric, 29501], [management, 29501]]
    services = [[fabric, 5000], [fabric, 873], [fabric, 8874], [fabric, 29510], [fabric, 40001], [twin, 40002]]
    engine, monitoring, own = [["127.0.0.1", 18000]], [["127.0.0.1", 9090], ["127.0.0.1", 9093]], [["127.0.0.1", 8080]]
    peer = [[peer_fabric, 40003]]  # a socket of the peer's rank on its fabric address
    internal = rendezvous + services + peer
    spec = {
        "workdir": str(tmp_path), "python": SYSTEM_PYTHON, "adduser": PROMETHEUS_ADDUSER, "package_users": ["haproxy"],
        "rules": rules_text(c, head, MGMT, management),
        "links": [{"name": h.netdev, "address": str(h.address), "peer_address": str(p.address)}
                  for h, p in zip(head.fabric_halves, worker.fabric_halves)],
        "management": f"{management}/24",
        "listen": [["::", 29501]] + [t for t in services + engine + monitoring + own],
        # the registry runs as its own user (Debian's docker-registry): its answers to the peers pass
        "listen_as": [["nobody", fabric, 5001]],
        "peer_listen": peer,
        "probes": [
            {"user": "root", "targets": internal + engine + monitoring + own},
            {"user": "nobody", "targets": internal + engine + monitoring + own},
            {"user": PROMETHEUS_USER, "targets": internal + engine + monitoring},
            {"user": "haproxy", "targets": engine + monitoring + [[fabric, 873]]},
            {"user": "root", "in_peer": True, "targets": [[fabric, 5001], [fabric, 873]]},
        ],
    }
    got = netns(spec)
    root, nobody, prometheus, haproxy, from_peer = got["probes"]
    every = internal + engine + monitoring + own

    def named(targets, results):
        return {f"{h}:{p}": r for (h, p), r in zip(targets, results)}

    assert set(root) == {"answered"}, named(every, root)
    # nobody: refused at once on every internal service, on every address it listens on; its own port answers
    assert named(every, nobody) == {**{f"{h}:{p}": "refused" for h, p in internal + engine + monitoring},
                                    "127.0.0.1:8080": "answered"}, got["table"]
    # prometheus: its own daemons, nothing of the fabric's or the engine's
    assert named(internal + engine + monitoring, prometheus) == {
        **{f"{h}:{p}": "refused" for h, p in internal + engine}, "127.0.0.1:9090": "answered",
        "127.0.0.1:9093": "answered"}
    # the proxy's user: the engine's port only
    assert haproxy == ["answered", "refused", "refused", "refused"]
    # the peer reaches the fabric's services, and a daemon running as its own user answers it
    assert from_peer == ["answered", "answered"]


def test_the_prometheus_user_is_made_before_the_firewall_where_it_is_named_only_when_absent(monkeypatch):
    """On the monitoring node for the firewall; with TLS on, on every node too (roles/tls gives the
    exporters' copy of the certificate to its group at step 7b1, before the packages make it)."""
    from roles.monitoring.checks import UserPresent
    from tests.unit.test_watchdog_deploy import Deploy, FakeHost

    def declared(c, present):
        asked = []

        def get_fact(self, cls, **kwargs):
            asked.append((self.name, cls.__name__, kwargs))
            return present

        monkeypatch.setattr(FakeHost, "get_fact", get_fact)
        deploy = Deploy(monkeypatch, c, None)
        deploy.run(("roles/monitoring/user_tasks.py",))
        return [(o.name, c.nodes[h].name, o.kwargs["commands"]) for *_k, h, o in deploy.ops], asked

    plain = {"tls_enabled": False, "tls_disabled_reason": "a test"}
    made, asked = declared(monitored(**plain), present=False)
    assert made == [(f"Create the user {PROMETHEUS_USER} (the firewall names it; its packages keep it)", "spark-a",
                     [PROMETHEUS_ADDUSER])]
    assert asked == [("spark-a", UserPresent.__name__, {"user": PROMETHEUS_USER})]
    assert declared(monitored(**plain), present=True)[0] == []
    assert declared(monitored(monitoring_node="spark-b", **plain), present=False)[0][0][1] == "spark-b"
    assert declared(monitored(firewall_enabled=False, **plain), present=False) == ([], [])
    assert declared(both(monitoring_enabled=False), present=False) == ([], [])
    # TLS on (the default): every node's exporters read the certificate through the group
    assert [(n, h) for n, h, _ in declared(monitored(), present=False)[0]] == [
        (f"Create the user {PROMETHEUS_USER} (the firewall and the exporters' certificate name it; its packages keep "
         "it)", "spark-a"),
        (f"Create the user {PROMETHEUS_USER} (the exporters' certificate names it; its packages keep it)", "spark-b")]
    assert declared(monitored(), present=True)[0] == []
    assert len(declared(monitored(firewall_enabled=False), present=False)[0]) == 2


def test_the_user_step_runs_the_packages_postinst_line_and_that_line_run_again_keeps_the_user(tmp_path):
    """Debian 12's prometheus, prometheus-alertmanager and prometheus-node-exporter postinst run this
    line at `configure` (PROMETHEUS_ADDUSER): run first by the step, then again as the package's
    postinst would, it succeeds both times and leaves one system user with the package's home; nft
    then resolves the name in the monitoring node's rules. In a mount namespace over an overlay of /etc."""
    if not all(shutil.which(t) for t in ("unshare", "adduser", "nft")):
        pytest.skip("unshare, adduser or nft is not on this machine")
    c = monitored()
    (tmp_path / "rules.nft").write_text(rules_text(c, c.head, MGMT, c.head.management_address))
    for d in ("u", "w"):
        (tmp_path / d).mkdir()
    script = (f"mount -t overlay overlay -o lowerdir=/etc,upperdir={tmp_path}/u,workdir={tmp_path}/w /etc && "
              "(getent passwd haproxy >/dev/null || adduser --quiet --system --group --no-create-home haproxy) && "
              f"{PROMETHEUS_ADDUSER} && {PROMETHEUS_ADDUSER} && getent passwd {PROMETHEUS_USER} && "
              f"getent group {PROMETHEUS_USER} && nft -c -f {tmp_path}/rules.nft && echo checked")
    before = subprocess.run(["getent", "passwd", PROMETHEUS_USER], capture_output=True, text=True).stdout
    run = subprocess.run(["unshare", "-n", "-m", "sh", "-c", script], capture_output=True, text=True)
    if run.returncode != 0 and "Operation not permitted" in run.stderr:
        pytest.skip(f"no mount namespace here: {run.stderr.strip()}")
    assert run.returncode == 0, run.stderr
    user, group, checked = run.stdout.splitlines()
    name, _, uid, gid, gecos, home, shell = user.split(":")
    assert (name, home, shell) == (PROMETHEUS_USER, "/var/lib/prometheus", "/usr/sbin/nologin")
    assert gecos.startswith("Prometheus daemon") and int(uid) < 1000  # a system user, as the package's
    assert group.split(":")[::2] == [PROMETHEUS_USER, gid]  # its own group
    assert checked == "checked"
    # the machine's own /etc untouched
    assert subprocess.run(["getent", "passwd", PROMETHEUS_USER], capture_output=True, text=True).stdout == before


def test_on_the_router_node_smgs_port_admits_root_and_the_gate_only(tmp_path):
    """smg answers some routes without a key and, with TLS on, holds none: on the router node (here a worker,
    spark-b) its loopback port admits root (sfl_router.py's admin calls) and the gate's user, haproxy;
    anyone else goes through the gate on router_port like the LAN. The rules loaded in a namespace."""
    from sparkfleet.config import build_cluster
    from tests.unit.test_router_render import fleet_hosts

    fleet = build_cluster(fleet_hosts())
    router = fleet.node("spark-b")
    group, head = fleet.group_of("spark-b"), fleet.node("spark-a")
    text = rules_text(group, router, MGMT)
    assert 'oif "lo" tcp dport 18100 meta skuid != { root, haproxy } reject with tcp reset' in output_chain(text)
    assert "18100" not in rules_text(group, head, MGMT)
    smg, gate, own = [["127.0.0.1", 18100]], [["127.0.0.1", 8100]], [["127.0.0.1", 8080]]
    spec = {
        "workdir": str(tmp_path), "python": SYSTEM_PYTHON, "adduser": PROMETHEUS_ADDUSER, "package_users": ["haproxy"],
        "rules": text,
        "links": [{"name": r.netdev, "address": str(r.address), "peer_address": str(h.address)}
                  for r, h in zip(router.fabric_halves, head.fabric_halves)],
        "management": f"{router.management_address}/24",
        "listen": smg + gate + own, "listen_as": [], "peer_listen": [],
        "probes": [{"user": user, "targets": smg + gate + own} for user in ("root", "haproxy", "nobody")],
    }
    root, haproxy, nobody = netns(spec)["probes"]
    assert root == haproxy == ["answered", "answered", "answered"]
    assert nobody == ["refused", "answered", "answered"]  # the gate answers anyone (and checks the key)
