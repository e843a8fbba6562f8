"""roles/router as the deploy renders it: its data keys and their refusals, the backends it routes to,
its config and unit (no key anywhere), the firewall's router port, the pinned wheels."""
import hashlib
import json
import re
import tempfile
from pathlib import Path

import pytest

from sparkfleet.firewall_rules import rules_text
from roles.router.facts import RouterHost
from roles.router.node_config import (
    ROUTER_CONFIG, SFL_ROUTER, backends, config_text, key_holders, router_config, router_node, unit_text, venv_dir,
)
from sparkfleet.model.router import ROUTER_VERSIONS, RouterData
from roles.router.wheels import PLATFORMS, WHEELS
from sparkfleet.config import DATA_FIELDS, ConfigError, build_cluster
from tests.unit.test_fleet_config import twin_of
from tests.unit.helpers import SHARED, SSH, pair

REPO = Path(__file__).resolve().parents[2]

MGMT = "10.0.0.0/24"


def fleet_hosts(router="spark-b", **changes):
    """Two serving groups of two on back-to-back cables (g1: spark-a head, spark-b; g2: spark-c head,
    spark-d), the router on `router`; changes={"spark-c": {...}} changes one host's data."""
    rows = [("spark-a", "g1", 0, "10.77.77.1/30", "10.0.0.11"), ("spark-b", "g1", 1, "10.77.77.2/30", "10.0.0.12"),
            ("spark-c", "g2", 0, "10.77.78.1/30", "10.0.0.13"), ("spark-d", "g2", 1, "10.77.78.2/30", "10.0.0.14")]
    return [(name, {**SSH, **SHARED, "ssh_hostname": mgmt, "serving_group": group, "rank": rank,
                    "fabric_address": address, "fabric_twin_address": twin_of(address), "router_node": router,
                    **changes.get(name, {})})
            for name, group, rank, address, mgmt in rows]


def refused(hosts) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        build_cluster(hosts)
    return err.value


def test_every_router_key_is_a_data_key_with_a_description():
    assert {k for k in DATA_FIELDS if k.startswith("router_")} == set(RouterData.model_fields)
    assert all(f.description for f in RouterData.model_fields.values())
    node = build_cluster(pair()).head
    assert node.router_node is None and node.router_version == ROUTER_VERSIONS[-1]


def test_the_router_routes_to_the_head_of_every_group_serving_its_model_by_management_address():
    fleet = build_cluster(fleet_hosts())
    router = router_node(fleet)
    assert router.name == "spark-b"
    # over TLS (roles/tls), smg verifying each head with the fleet's bundle on the router node
    assert backends(fleet, router) == ["https://10.0.0.11:8000", "https://10.0.0.13:8000"]
    assert json.loads(config_text(fleet, router))["ca_file"] == "/etc/sparkfleet/tls/ca.crt"
    plain = build_cluster(fleet_hosts(**{n: {"tls_enabled": False, "tls_disabled_reason": "a test bench"}
                                         for n in ("spark-a", "spark-b", "spark-c", "spark-d")}))
    assert backends(plain, router_node(plain)) == ["http://10.0.0.11:8000", "http://10.0.0.13:8000"]
    assert json.loads(config_text(plain, router_node(plain)))["ca_file"] is None
    # one key for the fleet: the router group's head's, written to the other head and the router node
    source, targets = key_holders(fleet)
    assert source.name == "spark-a" and [n.name for n in targets] == ["spark-c", "spark-b"]


def test_a_group_serving_another_model_is_not_routed():
    other = {"serving_profile": "qwen3.8-flash-next"}
    fleet = build_cluster(fleet_hosts(**{"spark-c": other, "spark-d": other}))
    assert backends(fleet, router_node(fleet)) == ["https://10.0.0.11:8000"]


def test_the_config_names_the_key_file_and_the_unit_runs_the_pinned_venv_with_no_secret():
    fleet = build_cluster(fleet_hosts(**{n: {"router_health_check_interval_s": 7} for n in
                                         ("spark-a", "spark-b", "spark-c", "spark-d")}))
    router = router_node(fleet)
    config = json.loads(config_text(fleet, router))
    assert config == router_config(fleet, router)
    # smg on loopback, behind the gate on router_port (roles/router/gate.py)
    assert (config["listen_host"], config["port"]) == ("127.0.0.1", 18100)
    assert config["key_file"] == "/etc/sparkfleet/api-key"  # the gate's; smg is given none with TLS on:
    # it presents the router hop's own client certificate, not the node's (which the gate serves and the
    # exporters' copy holds)
    assert config["client_cert_file"] == "/etc/sparkfleet/tls/router-hop.pem"
    assert config["control_key_file"] == "/etc/sparkfleet/router-control-key"  # the control plane's own key
    assert config["health_check_interval_s"] == 7
    assert (config["metrics_host"], config["metrics_port"]) == ("127.0.0.1", 29000)  # smg's default: every address
    assert config["health_check_endpoint"] == "/health"
    unit = unit_text(fleet, router)
    assert unit.startswith("# Managed by sparkfleet (roles/router)")
    [exec_start] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_start == f"ExecStart={venv_dir('1.13.0')}/bin/python {SFL_ROUTER} run {ROUTER_CONFIG}"
    assert "api_key" not in unit.lower().replace("api key", "") and "Environment=PYTHONUNBUFFERED=1" in unit
    assert not any(line.startswith(("EnvironmentFile", "Environment=SMG", "Environment=API")) for line in unit.splitlines())


def test_the_routers_gate_checks_the_key_over_tls_in_front_of_smg_on_loopback_and_removes_the_key():
    from roles.router.gate import gate_config_text, gate_unit_text
    from tests.unit.test_templates import check_golden

    fleet = build_cluster(fleet_hosts())
    router = router_node(fleet)
    check_golden("fleet-router-proxy.cfg", gate_config_text(router))
    check_golden("fleet-sparkfleet-router-proxy.service", gate_unit_text(router))
    text = gate_config_text(router)
    assert "bind 0.0.0.0:8100 ssl crt /etc/sparkfleet/tls/api.pem ssl-min-ver TLSv1.2\n" in text
    assert "acl keyed req.hdr(authorization) -m str -f /etc/sparkfleet/api-key.haproxy" in text
    assert "server smg 127.0.0.1:18100" in text and "http-request del-header authorization" in text
    # TLS off (with its reason): plain HTTP, and smg is given the key (no client certificate): it goes through
    plain = build_cluster(fleet_hosts(**{n: {"tls_enabled": False, "tls_disabled_reason": "a test bench"}
                                         for n in ("spark-a", "spark-b", "spark-c", "spark-d")}))
    plain_text = gate_config_text(router_node(plain))
    assert "bind 0.0.0.0:8100\n" in plain_text and "del-header" not in plain_text
    assert json.loads(config_text(plain, router_node(plain)))["client_cert_file"] is None


def test_each_routed_head_admits_the_router_hop_from_the_router_node_only():
    from roles.api_proxy.checks import config_text as proxy_config
    from roles.router.node_config import router_of

    fleet = build_cluster(fleet_hosts(**{"spark-c": {"serving_profile": "qwen3.8-flash-next"},
                                         "spark-d": {"serving_profile": "qwen3.8-flash-next"}}))
    g1_head, g2_head = fleet.node("spark-a"), fleet.node("spark-c")
    assert router_of(fleet, g1_head).name == "spark-b" and router_of(fleet, g2_head) is None  # g2 is not routed
    text = proxy_config(g1_head, router_of(fleet, g1_head))
    assert "ca-file /etc/sparkfleet/tls/ca.crt verify optional" in text
    # the router hop's CN (no node's certificate bears it), from the router node's address
    assert ("acl hop_name ssl_c_s_dn(CN) -m str sparkfleet-router-hop\n" in text and "acl hop_src src 10.0.0.12" in text
            and "unless keyed || hop_cert hop_name hop_src || open_1_path open_1_method" in text)
    assert "hop_" not in proxy_config(g2_head, None) and "verify" not in proxy_config(g2_head, None)


def test_the_router_port_is_opened_to_the_api_networks_on_the_router_node_only():
    fleet = build_cluster(fleet_hosts())
    g1 = fleet.groups["g1"]
    worker = rules_text(g1, fleet.node("spark-b"), MGMT)
    assert "tcp dport 8100 ip saddr { 10.0.0.0/24 } accept" in worker and "tcp dport 8100 drop" in worker
    assert "8000" not in worker
    head = rules_text(g1, fleet.node("spark-a"), MGMT)
    assert "8100" not in head and "tcp dport 8000 ip saddr { 10.0.0.0/24 } accept" in head


def test_without_a_router_the_firewall_renders_as_before():
    c = build_cluster(pair())
    text = rules_text(c, c.head, MGMT)
    assert text.count("# The API: the allowed networks only.") == 1
    assert re.findall(r"tcp dport (\d+) ip saddr", text) == ["8000"]


def test_a_router_node_that_is_not_in_the_inventory_is_refused_naming_host_key_and_allowed_values():
    err = refused(fleet_hosts(router="spark-z"))
    [p] = err.problems
    assert p.key == "router_node" and p.hosts == ("spark-a", "spark-b", "spark-c", "spark-d")
    assert "key 'router_node' = 'spark-z' is not a node of the inventory; allowed: spark-a, spark-b, spark-c, spark-d" in str(err)


def test_router_settings_must_be_the_same_on_every_node():
    err = refused(fleet_hosts(**{"spark-d": {"router_port": 9000}}))
    assert [p.key for p in err.problems] == ["router_port"]
    assert "key 'router_port' differs between nodes" in str(err) and "spark-d=9000" in str(err)


def test_a_router_port_taken_on_the_router_node_is_refused():
    hosts = fleet_hosts(router="spark-a", **{n: {"router_port": 8000} for n in ("spark-a", "spark-b", "spark-c", "spark-d")})
    err = refused(hosts)
    assert [p.key for p in err.problems] == ["router_port"]
    assert "key 'router_port' = 8000 is also profile glm-5.3-flash-exl3's port on spark-a" in str(err)
    rsync = {n: {"router_port": 873} for n in ("spark-a", "spark-b", "spark-c", "spark-d")}
    assert "is also fanout_rsync_port on spark-b" in str(refused(fleet_hosts(**rsync)))
    metrics = {n: {"router_metrics_port": 8100} for n in ("spark-a", "spark-b", "spark-c", "spark-d")}
    err = refused(fleet_hosts(**metrics))
    assert [p.key for p in err.problems] == ["router_metrics_port"] and "is also router_port" in str(err)


def test_behind_a_router_the_fleet_names_one_key_file():
    err = refused(fleet_hosts(**{"spark-c": {"serving_api_key_file": "/etc/sparkfleet/other-key"}}))
    assert [p.key for p in err.problems] == ["serving_api_key_file"]
    assert "the fleet has one API key, the router group's head's" in str(err)
    build_cluster(fleet_hosts(router=None, **{"spark-c": {"serving_api_key_file": "/etc/sparkfleet/other-key"}}))


def test_an_unpinned_version_is_refused_before_connecting():
    err = refused(fleet_hosts(**{n: {"router_version": "1.12.0"} for n in ("spark-a", "spark-b", "spark-c", "spark-d")}))
    assert "router_version" in str(err) and "'1.13.0'" in str(err)


def test_every_pinned_version_has_a_wheel_per_architecture_with_a_sha256():
    assert set(WHEELS) == set(ROUTER_VERSIONS)
    for version, arches in WHEELS.items():
        assert set(arches) == set(PLATFORMS) == {"x86_64", "aarch64"}
        for arch, (name, digest) in arches.items():
            assert name.startswith(f"smg-{version}-cp38-abi3-") and arch in name and re.fullmatch("[0-9a-f]{64}", digest)


def test_the_router_host_fact_reads_arch_venv_version_unit_and_the_control_keys_state():
    fact = RouterHost()
    assert fact.process(["arch=aarch64", "venv=no", "installed=", "unit=no", "gate_unit=yes", "hop_pem=no",
                         "control=missing"]) == {
        "arch": "aarch64", "venv": False, "installed": None, "unit": False, "gate_unit": True, "hop_pem": False,
        "control_key": "missing"}
    assert fact.process(["arch=x86_64", "venv=yes", "installed=1.13.0", "unit=yes"])["installed"] == "1.13.0"
    command = fact.command(venv="/usr/local/lib/sparkfleet/router-smg-1.13.0", unit_path="/x.service",
                           hop_pem="/nonexistent/tls/router-hop.pem", gate_unit_path="/y.service")
    assert "uname -m" in command and "/etc/sparkfleet/router-control-key" in command
    # the state is read here for real: nothing at the path on this machine (no router), never the key
    import subprocess

    done = subprocess.run(["sh", "-c", command.replace("/etc/sparkfleet/router-control-key", "/nonexistent/k")],
                          capture_output=True, text=True)
    found = fact.process(done.stdout.splitlines())
    assert found["control_key"] == "missing" and found["hop_pem"] is False
    # the router hop's certificate left on a node (or only its pending key, from an issue that stopped)
    for left in ("router-hop.pem", "router-hop.pem.key.new"):
        with tempfile.TemporaryDirectory() as d:
            Path(d, left).write_text("x")
            done = subprocess.run(["sh", "-c", command.replace("/nonexistent/tls", d)], capture_output=True, text=True)
            assert fact.process(done.stdout.splitlines())["hop_pem"] is True, left


def test_a_control_key_file_the_router_must_not_use_is_refused_naming_the_node_and_the_path():
    from roles.serving.api_key import KEY_TEXT
    from sparkfleet.keyfiles import problem

    why = problem("spark-b", "the router's control-plane key file", "/etc/sparkfleet/router-control-key",
                  "unreadable it is a directory, not a regular file", KEY_TEXT)
    assert why == ("spark-b: the router's control-plane key file /etc/sparkfleet/router-control-key exists but cannot "
                   "be read: it is a directory, not a regular file. A key is generated only when the file does not "
                   "exist; fix or remove it. Nothing was changed.")


# ------------------------------------------------------------------ the fleet's one key (fleet_key.py)

class KeyHost:
    """A node as fleet_key reads it: its key file's content (sparkfleet/keyfiles.py's read command, run
    here on a real file) and sha1 (Sha1File). content None: nothing at the path; a directory: a path
    that exists and cannot be read."""

    current_deploy_kwargs = None  # what pyinfra's global arguments read of a Host (keyfiles.connector_arguments)

    def __init__(self, name, content=None):
        from types import SimpleNamespace

        from pyinfra.api import Config

        self.name, self.content = name, content
        self.state, self.data = SimpleNamespace(config=Config()), SimpleNamespace()

    def run_shell_command(self, command, **arguments):
        import subprocess
        import tempfile

        from pyinfra.connectors.util import CommandOutput, OutputLine

        from sparkfleet.keyfiles import read_command

        with tempfile.TemporaryDirectory() as tmp:
            path = f"{tmp}/api-key"
            if self.content == "a directory":
                Path(path).mkdir()
            elif self.content is not None:
                Path(path).write_bytes(self.content)
            assert command.get_raw_value() == read_command("/etc/sparkfleet/api-key")
            done = subprocess.run(["sh", "-c", read_command(path)], capture_output=True, text=True)
        lines = [OutputLine("stdout", x) for x in done.stdout.splitlines()]
        lines += [OutputLine("stderr", x.replace(path, "/etc/sparkfleet/api-key")) for x in done.stderr.splitlines()]
        return done.returncode == 0, CommandOutput(lines)

    def get_fact(self, cls, path):
        import hashlib

        assert cls.__name__ == "Sha1File" and path == "/etc/sparkfleet/api-key"
        return None if self.content is None else hashlib.sha1(self.content).hexdigest()


def key_state(fleet, contents):
    from types import SimpleNamespace

    hosts = {n.name: KeyHost(n.name, contents.get(n.name)) for n in fleet.nodes}
    state = SimpleNamespace(inventory=SimpleNamespace(get_host=hosts.__getitem__))
    state._sparkfleet_cluster, state._sparkfleet_groups = fleet, fleet.groups
    return state


FRESH = b"f" * 64  # what the composer (tools/plan.py) hands decide for a key generated now


def key_plan(fleet, contents):
    """The fleet key's verdict as step 1b takes it: the facts pass's read, then the pure decide."""
    from roles.router.fleet_key import decide, key_facts

    return decide(fleet, key_facts(key_state(fleet, contents), fleet), FRESH)


def test_the_router_groups_heads_key_is_written_where_it_differs_and_only_there():
    from sparkfleet.decided import FleetDecision
    from sparkfleet.plan_types import FleetPlan

    fleet = build_cluster(fleet_hosts())
    key = b"a" * 64
    found = key_plan(fleet, {"spark-a": key, "spark-c": b"c" * 64})
    assert found.source == "spark-a" and found.key == key and not found.generated
    assert found.writes == {"spark-c": "/etc/sparkfleet/api-key", "spark-b": "/etc/sparkfleet/api-key"}
    decision = FleetDecision(summary=FleetPlan(), key=found)
    assert decision.key_written_on("spark-c") and decision.key_written_on("spark-b")
    assert not decision.key_written_on("spark-a")
    assert key.decode() not in repr(found) and key.decode() not in repr(decision)
    same = key_plan(fleet, {"spark-a": key, "spark-b": key, "spark-c": key})
    assert same.writes == {} and not FleetDecision(summary=FleetPlan(), key=same).key_written_on("spark-c")


def test_on_the_first_deploy_the_controller_generates_the_fleets_key_and_writes_it_to_every_target():
    fleet = build_cluster(fleet_hosts())
    found = key_plan(fleet, {})
    assert found.key == FRESH and found.generated
    assert set(found.writes) == {"spark-a", "spark-b", "spark-c"}


def test_no_router_or_a_named_key_file_that_is_absent_plans_nothing():
    assert key_plan(build_cluster(fleet_hosts(router=None)), {"spark-a": b"a" * 64}) is None
    named = {n: {"serving_api_key_file": "/etc/sparkfleet/api-key"} for n in ("spark-a", "spark-b", "spark-c", "spark-d")}
    assert key_plan(build_cluster(fleet_hosts(**named)), {}) is None  # roles/serving refuses it at prepare


def test_the_fleet_keys_verdict_is_a_pure_function_of_what_the_facts_pass_read():
    """decide reads no node: the same facts give the same verdict, and the key is in no printed field."""
    from dataclasses import asdict

    from roles.router.fleet_key import KeyFacts, decide
    from tools.plan import fleet_plan
    from sparkfleet.verdicts import RoutingPlan

    fleet = build_cluster(fleet_hosts())
    key = b"b" * 64
    facts = KeyFacts(source=key, sha1={"spark-b": hashlib.sha1(key).hexdigest(), "spark-c": None})
    assert decide(fleet, facts, FRESH) == decide(fleet, facts, b"e" * 64)
    found = decide(fleet, facts, FRESH)
    assert found.writes == {"spark-c": "/etc/sparkfleet/api-key"}
    printed = fleet_plan(["g1", "g2"], RoutingPlan(router="spark-b", note="not running; it starts with every group "
                                                                              "(step 12)"), found)
    assert printed.router_lines() == [
        "--> sparkfleet router on spark-b: not running; it starts with every group (step 12)",
        "    the fleet's API key (spark-a's) written into the key file of: spark-c"]
    assert key.decode() not in repr(asdict(printed)) and key.decode() not in repr(facts)


def test_a_source_key_file_that_exists_but_cannot_be_read_stops_the_run_and_is_never_replaced():
    """Only a key file with nothing at its path is absent: a new fleet key would restart every group
    and lock out every client."""
    from pyinfra.api.exceptions import DeployError

    from roles.router.fleet_key import key_facts

    fleet = build_cluster(fleet_hosts())
    with pytest.raises(DeployError) as err:
        key_facts(key_state(fleet, {"spark-a": "a directory", "spark-b": b"a" * 64}), fleet)
    assert str(err.value).startswith("spark-a: /etc/sparkfleet/api-key exists but cannot be read: it is a directory, "
                                     "not a regular file; it is the fleet's API key"), err.value
    assert "Nothing was changed" in str(err.value)


def test_the_fleet_key_is_written_through_stdin_never_files_put_and_is_in_no_operation_argument():
    """files.put with --diff prints what it uploads (and the file's current content): the key task
    must not use it; the write's operation carries only the path."""
    import ast

    source = (REPO / "roles/router/key_tasks.py").read_text()
    calls = {node.func.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute)}
    assert "put" not in calls and "call" in calls


def test_the_doctor_names_a_router_port_not_held_by_the_gate_and_smg_beyond_loopback():
    from roles.api_proxy.checks import Listeners
    from roles.router.gate import gate_listener_problems

    router = router_node(build_cluster(fleet_hosts()))
    ss = ['LISTEN 0 4096 0.0.0.0:8100 0.0.0.0:* users:(("haproxy",pid=41,fd=6))',
          'LISTEN 0 128 127.0.0.1:18100 0.0.0.0:* users:(("python",pid=77,fd=12))']
    assert gate_listener_problems(router, Listeners().process(ss), True) == []
    assert "sparkfleet-router-proxy is not running" in gate_listener_problems(router, Listeners().process(ss), False)[0]
    # a router deployed before the gate: smg itself on the router port, every address
    old = Listeners().process(['LISTEN 0 128 0.0.0.0:8100 0.0.0.0:* users:(("python",pid=77,fd=12))'])
    assert gate_listener_problems(router, old, False)[1] == (
        "spark-b: port 8100 (the router) is held by python on 0.0.0.0; want only haproxy on 0.0.0.0")
    exposed = Listeners().process([ss[0], 'LISTEN 0 128 0.0.0.0:18100 0.0.0.0:* users:(("python",pid=77,fd=12))'])
    assert gate_listener_problems(router, exposed, True) == [
        "spark-b: smg's port 18100 listens beyond loopback (python on 0.0.0.0): reachable without the gate's key check"]


ROUTER_FACTS = {"arch": "x86_64", "venv": True, "installed": ROUTER_VERSIONS[-1], "unit": True, "gate_unit": True,
                "control_key": "ok", "hop_pem": True}
GATE_RELOAD = "Reload sparkfleet-router-proxy (its config, the API key or the node's certificate changed)"
RESTART = ("Restart sparkfleet-router (its program, config, unit, installation, a key, the heads' CA or its client "
           "certificate changed)")
DERIVED = "Write the fleet key's root-only derived files on the router node (the gate's pattern file)"


def router_run(monkeypatch, fleet, changed=(), key_state="ok", tls=None, others=None):
    """roles/router/tasks.py on every node of `fleet` as the deploy declares it (tests/unit/test_watchdog_deploy.py's
    recorders): the router node's facts ROUTER_FACTS, its key state `key_state`; the other nodes' RouterHost
    `others` (none installed by default). Returns (the Deploy, what changed)."""
    from sparkfleet import decided
    from tests.unit.test_watchdog_deploy import Deploy, FakeHost

    router = getattr(router_node(fleet), "name", None)

    def get_fact(self, cls, **kwargs):
        if cls.__name__ == "RouterHost":
            return ROUTER_FACTS if self.name == router else (others or {**ROUTER_FACTS, "unit": False, "gate_unit": False,
                                                                        "hop_pem": False})
        return {"ApiKeyState": key_state}.get(cls.__name__)

    monkeypatch.setattr(FakeHost, "get_fact", get_fact)
    deploy = Deploy(monkeypatch, fleet, None, changed=changed)
    decided.install(deploy.state, {}, decided.FleetDecision(summary=None, key=None, tls=tls))
    return deploy, deploy.run(includes=("roles/router/tasks.py",))


def test_the_router_node_declares_smg_before_its_gate_and_an_unchanged_run_changes_nothing(monkeypatch):
    from sparkfleet.verdicts import TlsPlan

    fleet = build_cluster(fleet_hosts())  # the router on spark-b, a worker
    assert router_run(monkeypatch, fleet)[1] == []
    # the key file changed (its derived files stale): they are written and the gate reloads; smg is not restarted
    assert router_run(monkeypatch, fleet, key_state="stale")[1] == [(DERIVED, "spark-b"), (GATE_RELOAD, "spark-b")]
    # a new certificate for the router node (roles/tls, step 7b1): the gate reloads (it serves it); smg does not
    # present it, and is not restarted
    issued = TlsPlan(enabled=True, ca_node="spark-a", issue={"spark-b": ("no certificate yet",)})
    assert router_run(monkeypatch, fleet, tls=issued)[1] == [(GATE_RELOAD, "spark-b")]
    # a new router hop's client certificate: smg restarts (it reads it at start), the gate does not reload
    hop = TlsPlan(enabled=True, ca_node="spark-a", hop={"spark-b": ("no certificate yet",)})
    assert [name for name, _ in router_run(monkeypatch, fleet, tls=hop)[1]] == [RESTART, "The router's routing (2 group(s))"]
    # smg moves to loopback before the gate takes router_port: its restart is declared before the gate runs
    deploy, done = router_run(monkeypatch, fleet, changed={f"Write {ROUTER_CONFIG}",
                                                           "Write /etc/sparkfleet/router-proxy.cfg"})
    names = [o.name for *_k, h, o in sorted(deploy.ops, key=lambda x: x[:4]) if fleet.nodes[h].name == "spark-b"]
    assert names.index(RESTART) < names.index("Run sparkfleet-router-proxy, at boot too")
    assert ("Check /etc/sparkfleet/router-proxy.cfg with HAProxy", "spark-b") in done and (GATE_RELOAD, "spark-b") in done
    # a node that ran the router before: both units and their configs removed
    left = {**ROUTER_FACTS, "unit": False, "gate_unit": True, "hop_pem": False}
    removed = [d for d in router_run(monkeypatch, fleet, others=left)[1] if d[1] != "spark-b"]
    assert removed == [("Remove sparkfleet-router and sparkfleet-router-proxy (router_node is spark-b)", n)
                       for n in ("spark-a", "spark-c", "spark-d")]


def test_the_router_hops_certificate_is_removed_from_a_node_no_longer_the_router_node_and_with_tls_off(monkeypatch):
    """The router hop's client certificate and key stay on the router node alone, with TLS on: a node that was
    the router node (the router moved, or there is none now) has them removed after its router stopped, and
    with TLS off the router node's are removed too (smg presents the key)."""
    fleet = build_cluster(fleet_hosts())
    hop = "/etc/sparkfleet/tls/router-hop.pem"
    gone = ("Remove the router hop's client certificate and key (/etc/sparkfleet/tls/router-hop.pem; router_node is "
            "{router})")
    # the router moved to spark-b: spark-a ran it before, its units and the hop's files are removed, in that order
    was_router = {**ROUTER_FACTS, "hop_pem": True}
    deploy, done = router_run(monkeypatch, fleet, others=was_router)
    on_a = [name for name, h in done if h == "spark-a"]
    assert on_a == ["Remove sparkfleet-router and sparkfleet-router-proxy (router_node is spark-b)",
                    gone.format(router="spark-b")]
    assert deploy.op(gone.format(router="spark-b"), "spark-a").kwargs["commands"] == [
        f"rm -f {hop} {hop}.new {hop}.crt.new {hop}.key.new"]
    # only the files left (a run that stopped between the hop's issue and the router's start elsewhere)
    only_files = {**ROUTER_FACTS, "unit": False, "gate_unit": False, "hop_pem": True}
    assert [h for name, h in router_run(monkeypatch, fleet, others=only_files)[1]
            if name == gone.format(router="spark-b")] == ["spark-a", "spark-c", "spark-d"]
    # no router any more: every node that holds them has them removed
    none = build_cluster(fleet_hosts(router=None))
    assert (gone.format(router="none"), "spark-b") in router_run(monkeypatch, none, others=was_router)[1]
    # TLS off: the router node keeps no client certificate
    plain = build_cluster(fleet_hosts(**{n: {"tls_enabled": False, "tls_disabled_reason": "a test bench"}
                                         for n in ("spark-a", "spark-b", "spark-c", "spark-d")}))
    assert ("Remove the router hop's client certificate (/etc/sparkfleet/tls/router-hop.pem): TLS is off, smg presents "
            "the key", "spark-b") in router_run(monkeypatch, plain)[1]
    # TLS on, the router node's: kept
    assert not [name for name, _ in router_run(monkeypatch, fleet)[1] if "router hop" in name]
