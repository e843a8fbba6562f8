"""roles/fingerprint on the machines: every node reads the same on every must-match field, read by
the deploy's own fact command (so this checks the machines, and the command on them)."""
from roles.fingerprint.checks import mismatches, must_match, table
from roles.fingerprint.facts import Fingerprint, parse_fingerprint
from sparkfleet.model.serving import node_profile


def test_every_node_matches_on_every_must_match_field(cluster, node_hosts):
    prints = {}
    for node in cluster.nodes:
        if node.name in node_hosts:
            profile = node_profile(node)
            command = Fingerprint().command(netdev=node.fabric_netdev, ref=profile.image_ref, engine=profile.engine)
            prints[node.name] = parse_fingerprint(node_hosts[node.name].check_output(command).splitlines())
    fields = must_match(cluster.nodes)
    differ = mismatches(prints, fields)
    assert not differ, f"the nodes differ on {', '.join(differ)}:\n{table(prints, differ, fields)}"
    assert all(fp["kernel"] and fp["image_id"] for fp in prints.values()), f"unread:\n{table(prints, [], fields)}"
