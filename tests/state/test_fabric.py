"""The CX7 fabric as the inventory declares it, checked on the machines themselves."""
import json

from roles.fabric.checks import netplan_text
from roles.fabric.others import FabricConfigs, netconfig_problems, other_configs, renderer_in_effect
from roles.fabric.schema import NETPLAN_FILE


def test_fabric_netdev_is_up_with_the_inventory_address_and_mtu(host, node):
    [link] = json.loads(host.check_output(f"ip -j addr show dev {node.fabric_netdev}"))
    ipv4 = [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"]
    assert "UP" in link["flags"], f"{node.name}: {node.fabric_netdev} is down"
    assert link["mtu"] == node.fabric_mtu, f"{node.name}: {node.fabric_netdev} mtu {link['mtu']}, want {node.fabric_mtu}"
    assert ipv4 == [str(node.fabric_address)], f"{node.name}: {node.fabric_netdev} has {ipv4}, want {node.fabric_address}"


def test_netplan_drop_in_is_root_only_and_as_rendered(host, node):
    drop_in = host.file(NETPLAN_FILE)
    assert drop_in.exists, f"{node.name}: {NETPLAN_FILE} missing"
    assert drop_in.user == "root" and drop_in.mode == 0o600, f"{node.name}: {NETPLAN_FILE} mode {drop_in.mode:o}"
    assert drop_in.content_string == netplan_text(node), f"{node.name}: {NETPLAN_FILE} differs from the data"


def test_jumbo_frames_reach_every_peer_unfragmented(host, node, cluster):
    for peer in cluster.peers(node):
        cmd = f"ping -M do -s {node.ping_payload} -c 3 -i 0.2 -W 2 -q {peer.fabric_ip}"
        result = host.run(cmd)
        assert result.rc == 0, f"{node.name} -> {peer.name} ({peer.fabric_ip}): `{cmd}` failed: {result.stdout}{result.stderr}"


def test_no_default_route_uses_the_fabric(host, node):
    for family in ("-4", "-6"):
        routes = json.loads(host.check_output(f"ip -j {family} route show default") or "[]")
        via_fabric = [r for r in routes if r.get("dev") == node.fabric_netdev]
        assert not via_fabric, f"{node.name}: default route over {node.fabric_netdev}: {via_fabric}"


def test_nothing_else_configures_the_fabric_netdev(host, node):
    """No second netplan file, NetworkManager connection or systemd-networkd file binds the netdev
    (they fight at the next reboot), and the renderer the data names is the one running."""
    facts = FabricConfigs().process(host.check_output(FabricConfigs().command(node.fabric_netdev)).splitlines())
    problems = netconfig_problems(node, facts, other_configs(facts, node.fabric_netdev))
    assert not problems, "; ".join(problems) + f" ({renderer_in_effect(facts)})"
