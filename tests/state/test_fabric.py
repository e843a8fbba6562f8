"""The CX7 fabric as the inventory declares it, checked on the machines themselves."""
import json

from roles.fabric.checks import netplan_text
from roles.fabric.facts import ping_command
from sparkfleet.fabric_others import FabricConfigs, netconfig_problems, other_configs, renderer_in_effect
from sparkfleet.model.fabric import NETPLAN_FILE


def test_fabric_netdev_is_up_with_the_inventory_address_and_mtu(host, node):
    """Each half of the port (the first, and the twin when data names it)."""
    problems = []
    for half in node.fabric_halves:
        [link] = json.loads(host.check_output(f"ip -j addr show dev {half.netdev}"))
        ipv4 = [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"]
        if "UP" not in link["flags"]:
            problems.append(f"{node.name}: {half.netdev} is down")
        if link["mtu"] != node.fabric_mtu:
            problems.append(f"{node.name}: {half.netdev} mtu {link['mtu']}, want {node.fabric_mtu}")
        if ipv4 != [str(half.address)]:
            problems.append(f"{node.name}: {half.netdev} has {ipv4}, want {half.address}")
    assert not problems, "; ".join(problems)


def test_netplan_drop_in_is_root_only_and_as_rendered(host, node):
    drop_in = host.file(NETPLAN_FILE)
    assert drop_in.exists, f"{node.name}: {NETPLAN_FILE} missing"
    assert drop_in.user == "root" and drop_in.mode == 0o600, f"{node.name}: {NETPLAN_FILE} mode {drop_in.mode:o}"
    assert drop_in.content_string == netplan_text(node), f"{node.name}: {NETPLAN_FILE} differs from the data"


def test_jumbo_frames_reach_every_peer_unfragmented(host, node, cluster):
    """Over each half: to the peer's address on the same half, with the deploy's own ping (its prepare's fact)."""
    failures = []
    for peer in cluster.peers(node):
        for mine, theirs in zip(node.fabric_halves, peer.fabric_halves):
            cmd = ping_command(str(theirs.ip), node.ping_payload)
            result = host.run(cmd)
            if result.rc != 0:
                failures.append(f"{node.name} -> {peer.name} ({theirs.ip}) over {mine.netdev}: `{cmd}` failed: "
                                f"{result.stdout}{result.stderr}")
    assert not failures, "\n".join(failures)


def test_each_halfs_peer_is_reached_through_that_half(host, node, cluster):
    """The kernel routes each peer address out of its own half (a subnet per half: one subnet on two
    netdevs would send the twin's traffic out of the first)."""
    for peer in cluster.peers(node):
        for mine, theirs in zip(node.fabric_halves, peer.fabric_halves):
            [route] = json.loads(host.check_output(f"ip -j route get {theirs.ip}"))
            assert route.get("dev") == mine.netdev and route.get("prefsrc") == mine.ip, (
                f"{node.name}: {theirs.ip} ({peer.name}) is routed {route}, want dev {mine.netdev} src {mine.ip}")


def test_no_default_route_uses_the_fabric(host, node):
    for family in ("-4", "-6"):
        routes = json.loads(host.check_output(f"ip -j {family} route show default") or "[]")
        netdevs = {h.netdev for h in node.fabric_halves}
        via_fabric = [r for r in routes if r.get("dev") in netdevs]
        assert not via_fabric, f"{node.name}: default route over the fabric ({', '.join(sorted(netdevs))}): {via_fabric}"


def test_nothing_else_configures_the_fabric_netdev(host, node):
    """No second netplan file, NetworkManager connection or systemd-networkd file binds either half
    (they fight at the next reboot), and the renderer the data names is the one running."""
    command = FabricConfigs().command(node.fabric_netdev, node.fabric_twin_netdev)
    facts = FabricConfigs().process(host.check_output(command).splitlines())
    problems = netconfig_problems(node, facts, other_configs(facts, tuple(h.netdev for h in node.fabric_halves)))
    assert not problems, "; ".join(problems) + f" ({renderer_in_effect(facts)})"
