"""roles/firewall: the nftables table rendered from data (one table, SSH never matched), and its
validation before any connection."""
import shutil
import subprocess

import pytest

from roles.firewall.checks import management_problem
from sparkfleet.firewall_facts import ManagementSubnet
from sparkfleet.firewall_rules import api_networks, digest, rules_text
from sparkfleet.config import ConfigError, build_cluster
from tests.unit.helpers import pair

MGMT = "10.0.0.0/24"


def both(**data):
    return build_cluster(pair(**{n: data for n in ("spark-a", "spark-b")}))


def rules(text: str) -> list[str]:
    return [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]


def test_the_head_opens_the_api_to_the_management_subnet_and_the_fabric_services_to_the_peer_only():
    c = both()
    text = rules(rules_text(c, c.head, MGMT))
    assert text[:3] == ["table inet sparkfleet", "delete table inet sparkfleet", "table inet sparkfleet {"]
    assert 'ip daddr 10.77.77.1 iifname != "enp1s0f0np0" drop' in text
    assert 'iifname "enp1s0f0np0" ip saddr != { 10.77.77.2 } drop' in text
    # Both halves of the port are the fabric, each admitting the peer's address on that half only.
    assert 'ip daddr 10.77.78.1 iifname != "enP2p1s0f0np0" drop' in text
    assert 'iifname "enP2p1s0f0np0" ip saddr != { 10.77.78.2 } drop' in text
    assert 'iifname "enP2p1s0f0np0" meta nfproto ipv6 drop' in text
    assert 'tcp dport { 873, 5000, 8874, 29501, 29510 } iifname != { "enp1s0f0np0", "enP2p1s0f0np0" } drop' in text
    assert text.index("tcp dport 8000 ip saddr { 10.0.0.0/24 } accept") < text.index("tcp dport 8000 drop")
    assert "policy accept;" in text[4]  # drops only what it names
    worker = rules(rules_text(c, c.workers[0], MGMT))
    assert not any("8000" in l for l in worker) and 'ip daddr 10.77.77.2 iifname != "enp1s0f0np0" drop' in worker


def test_ssh_is_never_matched_and_no_other_table_is_named():
    c = both(fanout_rsync_port=8873, docker_registry_port=5001)
    for node in c.nodes:
        text = rules_text(c, node, MGMT)
        assert " 22" not in text.replace("29501", "") and "ssh" not in text.lower().replace("ssh is never", "")
        tables = {l.split("{")[0].strip() for l in text.splitlines() if l.lstrip().startswith(("table ", "delete table"))}
        assert tables == {"table inet sparkfleet", "delete table inet sparkfleet"}
        assert "flush ruleset" not in text


def test_the_allowed_networks_come_from_data_else_the_management_subnet():
    c = both(firewall_api_allowed_networks=["192.168.10.0/24", "10.1.2.3/32"])
    assert api_networks(c.head, MGMT) == ["192.168.10.0/24", "10.1.2.3/32"]
    assert "tcp dport 8000 ip saddr { 192.168.10.0/24, 10.1.2.3/32 } accept" in rules_text(c, c.head, MGMT)
    c = both()
    assert api_networks(c.head, MGMT) == [MGMT]
    assert "set firewall_api_allowed_networks" in management_problem(c.head, "")
    assert management_problem(both(firewall_api_allowed_networks=[]).head, "") is None


def test_a_bad_network_is_refused_before_connecting():
    with pytest.raises(ConfigError) as err:
        both(firewall_api_allowed_networks=["10.0.0.1/24"])
    assert "firewall_api_allowed_networks" in str(err.value) and "Input is not a valid IPv4 network" in str(err.value)


def test_the_marker_changes_only_when_the_rules_do():
    c = both()
    assert digest(c, c.head, MGMT) == digest(c, c.head, MGMT)
    assert digest(c, c.head, MGMT) != digest(c, c.head, "10.9.0.0/16")
    assert f'comment "sparkfleet {digest(c, c.head, MGMT)}"' in rules_text(c, c.head, MGMT)


def test_the_management_subnet_fact_reads_the_connected_prefix():
    assert ManagementSubnet().process(["198.18.0.11/24"]) == "198.18.0.0/24"
    assert ManagementSubnet().process([]) == ""
    assert "SSH_CONNECTION" in ManagementSubnet().command("10.0.0.11")


@pytest.mark.skipif(not shutil.which("nft") or not shutil.which("unshare"), reason="nft not installed here")
def test_nft_accepts_the_rendered_tables_and_applies_them_twice(tmp_path):
    c = both()
    for node in c.nodes:
        path = tmp_path / f"{node.name}.nft"
        path.write_text(rules_text(c, node, MGMT))
        # In a network namespace of its own: the machine's ruleset is never touched.
        run = subprocess.run(["unshare", "-n", "sh", "-c", f"nft -c -f {path} && nft -f {path} && nft -f {path} && "
                              "nft list tables"], capture_output=True, text=True)
        if run.returncode != 0 and "Operation not permitted" in run.stderr:
            pytest.skip("no permission for a network namespace here")
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == ["table", "inet", "sparkfleet"]


# --- The firewall in the boot order, and after nftables.service (issue 23) -------------------------

def listening_units(c) -> dict[str, str]:
    """{unit: text} of every unit that listens, as the roles render them for the pair's head (the
    router on the head as well)."""
    from roles.api_proxy.checks import unit_text as proxy_unit
    from sparkfleet.model.image import REGISTRY_DROPIN
    from roles.router.node_config import unit_text as router_unit
    from roles.serving.checks import rendered_files, unit_path
    from sparkfleet.render import render

    head = c.head
    return {
        "sparkfleet-rsyncd": render("fanout", "/etc/systemd/system/sparkfleet-rsyncd.service", node=head, firewall_enabled=head.firewall_enabled),
        "sparkfleet-fanout-http": render("fanout", "/etc/systemd/system/sparkfleet-fanout-http.service", node=head,
                                         sfl_files="/usr/local/libexec/sparkfleet/sfl_files.py",
                                         firewall_enabled=head.firewall_enabled, fabric_network=head.fabric_address.network),
        "docker-registry (drop-in)": render("image", REGISTRY_DROPIN, firewall_enabled=head.firewall_enabled),
        "sparkfleet-head": rendered_files(c, head, 3)[unit_path(head)][0],
        "sparkfleet-worker": rendered_files(c, c.workers[0], 3)[unit_path(c.workers[0])][0],
        "sparkfleet-router": router_unit(c, head),
        "sparkfleet-api-proxy": proxy_unit(head),
    }


def unit_section(text: str) -> list[str]:
    section, out = None, []
    for line in text.splitlines():
        if line.startswith("["):
            section = line
        elif section == "[Unit]" and line and not line.startswith("#"):
            out.append(line)
    return out


def test_every_unit_that_listens_starts_after_the_firewall_and_requires_it():
    units = listening_units(both(router_node="spark-a"))
    for name, text in units.items():
        lines = unit_section(text)
        assert "After=sparkfleet-firewall.service" in lines, f"{name}: {lines}"
        assert "Requires=sparkfleet-firewall.service" in lines, f"{name}: {lines}"
    # firewall_enabled false: there is no firewall unit to require.
    for name, text in listening_units(both(router_node="spark-a", firewall_enabled=False)).items():
        assert "sparkfleet-firewall" not in text, name


def test_a_restart_or_reload_of_nftables_loads_the_table_again_and_restarts_nothing():
    from roles.firewall.checks import nftables_dropin_text, rules_path, unit_text

    head = both().head
    dropin = nftables_dropin_text(head)
    service = [l for l in dropin.splitlines() if l and not l.startswith("#")]
    assert service == ["[Service]", f"ExecStartPost=/usr/sbin/nft -f {rules_path(head)}",
                       f"ExecReload=/usr/sbin/nft -f {rules_path(head)}"]
    # Not PartOf nftables.service: its restart would restart every unit that requires the firewall.
    assert "PartOf" not in "".join(unit_section(unit_text(head)))


@pytest.mark.parametrize("live, want, found", [
    ("", "sparkfleet " + "a" * 40, "the nftables table inet sparkfleet is missing"),
    ("sparkfleet " + "b" * 40, "sparkfleet " + "a" * 40, "is not the one data renders"),
    ("sparkfleet " + "a" * 40, "sparkfleet " + "a" * 40, None),
])
def test_the_doctor_row_names_a_missing_or_stale_table(live, want, found):
    from roles.firewall.checks import table_problems

    node = both().head
    problems = table_problems(node, live, want)
    assert (problems == []) if found is None else (found in problems[0] and problems[0].startswith("spark-a: "))
    assert table_problems(both(firewall_enabled=False).head, "", want) == []


def test_a_port_of_one_half_filters_that_netdev_alone():
    from tests.unit.helpers import ONE_HALF, pair
    from sparkfleet.config import build_cluster

    c = build_cluster(pair(**{"spark-a": ONE_HALF, "spark-b": ONE_HALF}))
    text = rules(rules_text(c, c.head, MGMT))
    assert 'tcp dport { 873, 5000, 8874, 29501, 29510 } iifname != "enp1s0f0np0" drop' in text
    assert not any("enP2p1s0f0np0" in line for line in text)


# --- The verdict, taken once at step 1b (roles/firewall/checks.py decide; issue 42) ------------------

from pyinfra.api.exceptions import DeployError  # noqa: E402

from roles.firewall import checks as firewall_checks  # noqa: E402
from roles.firewall.checks import FirewallFacts  # noqa: E402
from sparkfleet.firewall_rules import wanted_marker_of  # noqa: E402

# The lab pair's subnet as its ManagementSubnet fact read it (tests/unit/fixtures/capture-lab.json).
LAB_SUBNET = ManagementSubnet().process(["198.18.0.11/24"])


def read(c, live=None, subnet=LAB_SUBNET, monitor=None, nft=True):
    """Each node's firewall facts: its live table the one data renders unless `live` says (node -> marker)."""
    live = live or {}
    return {n.name: FirewallFacts(live=live.get(n.name, wanted_marker_of(c, n, subnet, monitor)), subnet=subnet,
                                  monitor=monitor, nft=nft) for n in c.nodes}


def test_the_wanted_marker_is_the_one_the_rendered_rules_carry_and_a_live_table_that_is_it_stays():
    c = both()
    plans = firewall_checks.decide(read(c), c)
    for node in c.nodes:
        plan = plans[node.name]
        assert plan.want in rules_text(c, node, LAB_SUBNET) and plan.want == f"sparkfleet {digest(c, node, LAB_SUBNET)}"
        assert not (plan.apply or plan.remove or plan.install_nft) and plan.problem is None
    assert firewall_checks.summary(plans) == "" and firewall_checks.refusal(plans) is None


def test_a_missing_or_other_table_is_applied_and_named_in_the_plans_line_and_nft_installed_where_absent():
    c = both()
    plans = firewall_checks.decide(read(c, live={"spark-a": "", "spark-b": "sparkfleet " + "f" * 40}, nft=False), c)
    assert plans["spark-a"].apply and plans["spark-b"].apply and all(p.install_nft for p in plans.values())
    assert firewall_checks.summary(plans) == ("applied on spark-a (no table live); applied on spark-b (the live "
                                              "table is not the rendered one)")
    fresh = firewall_checks.decide(read(c, live={"spark-a": "", "spark-b": ""}), c)
    assert firewall_checks.summary(fresh) == "applied on spark-a, spark-b (no table live)"


def test_with_the_firewall_off_only_a_live_table_is_removed():
    c = both(firewall_enabled=False)
    plans = firewall_checks.decide({"spark-a": FirewallFacts(live="sparkfleet " + "1" * 40),
                                    "spark-b": FirewallFacts(live="")}, c)
    assert plans["spark-a"].remove and not plans["spark-a"].apply and plans["spark-a"].changes
    assert not plans["spark-b"].changes and plans["spark-b"].want == ""
    assert firewall_checks.summary(plans) == "removed on spark-a (firewall_enabled is false)"


def test_a_subnet_that_cannot_be_read_or_a_monitor_address_not_ipv4_is_refused_with_the_steps_own_message():
    c = both()
    plans = firewall_checks.decide(read(c, subnet=""), c)
    assert [plans[n].problem for n in ("spark-a", "spark-b")] == [management_problem(n, "") for n in c.nodes]
    refused = firewall_checks.refusal(plans)
    assert isinstance(refused, DeployError) and str(refused) == "\n".join(management_problem(n, "") for n in c.nodes)
    assert str(refused).startswith("spark-a: the management subnet could not be read")
    # allowed networks in data: the subnet is not needed
    assert firewall_checks.refusal(firewall_checks.decide(read(both(firewall_api_allowed_networks=[]), subnet=""),
                                                          both(firewall_api_allowed_networks=[]))) is None
    # The monitoring node's address is the one validation pinned on the controller, never a node's own
    # resolution; the exporters' rule admits IPv4 only, so an IPv6 management address is refused.
    watched = both(monitoring_enabled=True, monitoring_node="spark-b")
    assert firewall_checks.monitor_address(watched) == "10.0.0.12"
    assert firewall_checks.refusal(firewall_checks.decide(read(watched, monitor="10.0.0.12"), watched)) is None
    watching = {"monitoring_enabled": True, "monitoring_node": "spark-b"}
    six = build_cluster(pair(**{"spark-a": watching, "spark-b": {**watching, "ssh_hostname": "fd00::12"}}))
    monitor = firewall_checks.monitor_address(six)
    unresolved = firewall_checks.decide(read(six, monitor=monitor), six)
    assert unresolved["spark-a"].problem == firewall_checks.monitor_problem(six.head, six, "fd00::12")
    assert "the monitoring node spark-b's management address 'fd00::12' is not an IPv4 address" in unresolved["spark-a"].problem


# --- roles/firewall/tasks.py executes its node's slice --------------------------------------------

FIREWALL_TASKS = ("roles/firewall/tasks.py",)
APPLY = "Apply the nftables table inet sparkfleet (one transaction)"
REMOVE = "Remove the nftables table inet sparkfleet (firewall_enabled is false)"


def declared(monkeypatch, c, plans):
    """The operations roles/firewall/tasks.py declares per host for `plans` (the decided slice), as
    test_watchdog_deploy's recorder sees them: (name, host)."""
    from tests.unit.test_watchdog_deploy import Deploy

    deploy = Deploy(monkeypatch, c, None, firewall=plans)
    deploy.run(FIREWALL_TASKS)
    return [(o.name, c.nodes[h].name) for *_k, h, o in deploy.ops]


def test_the_step_applies_the_table_only_where_the_plan_says_and_reads_no_fact(monkeypatch):
    from tests.unit.test_watchdog_deploy import FakeHost

    asked = []
    monkeypatch.setattr(FakeHost, "get_fact", lambda self, cls, **kw: asked.append(cls.__name__))
    c = both()
    settled = declared(monkeypatch, c, firewall_checks.decide(read(c), c))
    assert not any(name in (APPLY, REMOVE, "Install nftables") for name, _ in settled)
    assert ("Write /etc/sparkfleet/firewall.nft", "spark-a") in settled
    moving = declared(monkeypatch, c, firewall_checks.decide(read(c, live={"spark-b": ""}, nft=False), c))
    assert [h for name, h in moving if name == APPLY] == ["spark-b"]
    assert [h for name, h in moving if name == "Install nftables"] == ["spark-a", "spark-b"]
    assert {"Which", "LiveMarker", "ManagementSubnet", "Ipv4Of"}.isdisjoint(asked), asked
    off = both(firewall_enabled=False)
    gone = declared(monkeypatch, off, firewall_checks.decide({"spark-a": FirewallFacts(live=""),
                                                              "spark-b": FirewallFacts(live="sparkfleet " + "1" * 40)}, off))
    assert gone == [(REMOVE, "spark-b")]
