"""Addresses, not names, where trust is decided (sparkfleet/addresses.py): each node's management address is
an IP literal, given or resolved once on the controller before any connection; an mDNS name is refused
unless data accepts its one resolution; several addresses or none are refused; what the router, Prometheus,
the exporters and the firewall are given is the address, and the plan prints it.

The controller's resolver is the `resolver` fixture (tests/unit/conftest.py): socket.getaddrinfo answering
from a table, no /etc/hosts or DNS involved; one test asks the real one for what needs no network."""
import re

import pytest

from roles.api_proxy.checks import config_text as proxy_config_text
from roles.firewall import checks as firewall_checks
from roles.monitoring.checks import (
    exporter_defaults_text, gpu_exporter_files, monitoring_node, prometheus_config_text, targets,
)
from roles.router.node_config import backends, config_text as router_config_text, router_node, unit_text
from sparkfleet import addresses
from sparkfleet.config import ConfigError, build_cluster
from sparkfleet.firewall_rules import rules_text
from tests.unit.helpers import DELETE, pair
from tests.unit.test_router_render import fleet_hosts
from tools.plan import management_lines

NODES = ("spark-a", "spark-b", "spark-c", "spark-d")
# Each node named in the inventory by a DNS name, and what the controller's resolver answers for it.
NAMES = {n: f"{n}.lan.example" for n in NODES}
ANSWERS = {f"{n}.lan.example": [f"192.168.1.{11 + i}"] for i, n in enumerate(NODES)}
IPV4 = re.compile(r"^\d+\.\d+\.\d+\.\d+$")


def problems(hosts) -> list:
    with pytest.raises(ConfigError) as err:
        build_cluster(hosts)
    return err.value.problems


def named_fleet(**changes):
    """fleet_hosts() (two groups, the router on spark-b, monitoring on) with every ssh_hostname a name."""
    return fleet_hosts(**{n: {"ssh_hostname": NAMES[n], **changes.get(n, {})} for n in NODES})


def test_an_address_given_is_the_management_address_and_nothing_is_resolved(resolver):
    asked = resolver({})
    cluster = build_cluster(pair())
    assert [(n.management_given, n.management_address, n.management_how) for n in cluster.nodes] == [
        ("10.0.0.11", "10.0.0.11", "given"), ("10.0.0.12", "10.0.0.12", "given")]
    assert asked == []
    assert addresses.plan_lines(cluster.nodes) == ["spark-a: 10.0.0.11 (given)", "spark-b: 10.0.0.12 (given)"]


def test_a_name_is_resolved_once_on_the_controller_and_its_address_pinned(resolver):
    asked = resolver(ANSWERS)
    fleet = build_cluster(named_fleet())
    node = fleet.node("spark-c")
    assert (node.management_given, node.management_address, node.management_how) == (
        "spark-c.lan.example", "192.168.1.13", "resolved on the controller")
    # The deploy builds the cluster again (validation, then fleet_from_state): the same answer, not asked again.
    again = build_cluster(named_fleet())
    assert again.node("spark-c").management_address == "192.168.1.13"
    assert sorted(asked) == sorted(ANSWERS)
    assert fleet.find("spark-c.lan.example") is node and fleet.find("192.168.1.13") is node


def test_a_later_answer_does_not_move_a_pinned_address(resolver):
    resolver(ANSWERS)
    build_cluster(named_fleet())
    resolver({**ANSWERS, "spark-a.lan.example": ["192.168.1.66"]})  # a spoofed answer after validation
    assert build_cluster(named_fleet()).node("spark-a").management_address == "192.168.1.11"


def test_without_ssh_hostname_the_inventory_name_is_resolved(resolver):
    asked = resolver({"spark-a": ["192.168.1.11"]})
    cluster = build_cluster(pair(**{"spark-a": {"ssh_hostname": DELETE}}))
    assert (cluster.node("spark-a").management_given, cluster.node("spark-a").management_address) == (
        "spark-a", "192.168.1.11")
    assert asked == ["spark-a"]


def test_every_rendered_config_names_addresses_only(resolver):
    resolver(ANSWERS)
    fleet = build_cluster(named_fleet())
    router = router_node(fleet)
    monitor = monitoring_node(fleet)
    assert backends(fleet, router) == ["https://192.168.1.11:8000", "https://192.168.1.13:8000"]
    scraped = [t["address"].rsplit(":", 1)[0] for job in targets(fleet).values() for t in job]
    assert scraped and all(IPV4.match(a) for a in scraped), scraped
    monitor_ip = firewall_checks.monitor_address(fleet)
    assert monitor_ip == fleet.node(monitor.name).management_address and IPV4.match(monitor_ip)
    rendered = {"router.json": router_config_text(fleet, router), "router unit": unit_text(fleet, router),
                "prometheus.yml": prometheus_config_text(fleet)}
    for n in fleet.nodes:
        group = fleet.group_of(n.name)
        rendered[f"{n.name} firewall"] = rules_text(group, n, "192.168.1.0/24", monitor_ip)
        rendered[f"{n.name} node exporter"] = exporter_defaults_text(n)
        rendered.update({f"{n.name} {path}": text for path, text in gpu_exporter_files(n).items()})
        if n.is_head:
            rendered[f"{n.name} api proxy"] = proxy_config_text(n)
        assert f"--web.listen-address={n.management_address}:" in exporter_defaults_text(n)
    for what, text in rendered.items():
        assert ".lan.example" not in text, f"{what} names a host by name"
    for n in fleet.nodes:
        assert f"ip saddr != {monitor_ip} drop" in rendered[f"{n.name} firewall"]
    assert "192.168.1.11:9100" in rendered["prometheus.yml"]


def test_an_mdns_name_is_refused_before_it_is_resolved(resolver):
    asked = resolver({"spark-b.local": ["192.168.1.12"]})
    [msg] = problems(pair(**{"spark-b": {"ssh_hostname": "spark-b.local"}}))
    assert msg.startswith("spark-b: key 'ssh_hostname' = 'spark-b.local' is an mDNS name: any host on the LAN can "
                          "answer for it")
    assert msg.key == "ssh_hostname" and "management_resolve_mdns_once = True" in msg.fix
    assert asked == []
    [msg] = problems(pair(**{"spark-b": {"ssh_hostname": "SPARK-B.LOCAL."}}))  # the same name, spelt otherwise
    assert "is an mDNS name" in msg


def test_an_mdns_name_accepted_in_data_is_resolved_once_with_strict_host_keys(resolver):
    asked = resolver({"spark-b.local": ["192.168.1.12"]})
    accepted = {"ssh_hostname": "spark-b.local", "management_resolve_mdns_once": True}
    node = build_cluster(pair(**{"spark-b": accepted})).node("spark-b")  # helpers.SSH: strict host key checking
    assert (node.management_address, node.management_how) == ("192.168.1.12", "resolved on the controller")
    assert addresses.plan_lines([node]) == ["spark-b: spark-b.local -> 192.168.1.12 (resolved on the controller)"]
    assert asked == ["spark-b.local"]
    [msg] = problems(pair(**{"spark-b": {**accepted, "ssh_strict_host_key_checking": DELETE}}))
    assert msg.startswith("spark-b: key 'management_resolve_mdns_once' = True for the mDNS name 'spark-b.local' with "
                          "ssh_strict_host_key_checking \"not set: pyinfra's default 'accept-new'\"")
    assert msg.key == "management_resolve_mdns_once"


def test_a_name_with_several_addresses_or_none_is_refused_naming_what_it_resolved_to(resolver):
    resolver({"spark-b.lan.example": ["192.168.1.12", "192.168.7.12"]})
    [msg] = problems(pair(**{"spark-b": {"ssh_hostname": "spark-b.lan.example"}}))
    assert msg.startswith("spark-b: key 'ssh_hostname' = 'spark-b.lan.example' resolves on the controller to "
                          "192.168.1.12, 192.168.7.12: allowed one IPv4 address (which machine it names is not decided)")
    [msg] = problems(pair(**{"spark-b": {"ssh_hostname": "spark-b.gone.example"}}))
    assert msg.startswith("spark-b: key 'ssh_hostname' = 'spark-b.gone.example' resolves on the controller to no IPv4 "
                          "address: allowed one IPv4 address (the controller cannot resolve it)")
    assert msg.key == "ssh_hostname" and msg.fix == "give the node's management IPv4 address as ssh_hostname"


def test_two_names_of_one_machine_and_a_name_on_the_fabric_are_refused(resolver):
    resolver({"one.lan.example": ["192.168.1.11"], "two.lan.example": ["192.168.1.11"],
              "fabric.lan.example": ["10.77.77.1"]})
    [msg] = problems(pair(**{"spark-a": {"ssh_hostname": "one.lan.example"},
                             "spark-b": {"ssh_hostname": "two.lan.example"}}))
    assert msg.startswith("spark-a, spark-b: key 'ssh_hostname' = '192.168.1.11' (port 22) on 2 nodes (spark-a: "
                          "one.lan.example, spark-b: two.lan.example resolved to it on the controller)")
    [msg] = problems(pair(**{"spark-b": {"ssh_hostname": "fabric.lan.example"}}))
    assert msg.startswith("spark-b: key 'ssh_hostname' = 'fabric.lan.example' (resolved to 10.77.77.1 on the "
                          "controller) is spark-a's fabric_address")


def test_a_connector_name_is_refused_and_local_is_the_controller(resolver):
    asked = resolver({})
    [msg] = problems(pair(**{"spark-b": {"ssh_hostname": "@docker/ubuntu"}}))
    assert msg.startswith("spark-b: key 'ssh_hostname' = '@docker/ubuntu' is a pyinfra connector name")
    hosts = [("@local" if name == "spark-a" else name, {k: v for k, v in data.items() if k != "ssh_hostname"}
              if name == "spark-a" else data) for name, data in pair()]
    node = build_cluster(hosts).node("@local")
    assert (node.management_address, node.management_how) == ("127.0.0.1", addresses.CONNECTOR)
    assert asked == []


def test_the_plan_prints_every_nodes_address_and_how_it_was_decided(resolver):
    resolver(ANSWERS)
    fleet = build_cluster(named_fleet(**{"spark-d": {"ssh_hostname": "10.0.0.14"}}))
    lines = management_lines(fleet)
    assert lines[0].startswith("--> sparkfleet management addresses")
    assert lines[1:] == ["    spark-a: spark-a.lan.example -> 192.168.1.11 (resolved on the controller)",
                         "    spark-b: spark-b.lan.example -> 192.168.1.12 (resolved on the controller)",
                         "    spark-c: spark-c.lan.example -> 192.168.1.13 (resolved on the controller)",
                         "    spark-d: 10.0.0.14 (given)"]


def test_the_real_resolver_asks_ipv4_and_folds_duplicates():
    """socket.getaddrinfo itself, on what needs no network: a literal, and a reserved name (RFC 6761 .invalid)."""
    assert addresses.ipv4_addresses("127.0.0.1") == ("127.0.0.1",)
    assert addresses.ipv4_addresses("sparkfleet-test.invalid") == ()
    assert addresses.is_mdns("spark-a.local") and addresses.is_mdns("Spark-A.Local.")
    assert not addresses.is_mdns("spark-a.localdomain") and not addresses.is_mdns("local.example")
