"""Serving groups in the inventory: several groups in one fleet, each validated as a pair is; a
two-node inventory without groups is one group, 'pair', unchanged."""
import pytest
from pyinfra.context import ctx_host

from sparkfleet.config import ConfigError, build_cluster
from sparkfleet.inventory import cluster_from_state, fleet_from_state, load_cluster
from sparkfleet.once import active_hosts, once_per_run
from tests.unit.helpers import SHARED, SSH


def node(name, group, rank, address, mgmt, **extra):
    return name, {**SSH, **SHARED, "ssh_hostname": mgmt, "serving_group": group, "rank": rank,
                  "fabric_address": address, "fabric_twin_address": twin_of(address), **extra}


def twin_of(address: str) -> str:
    """The twin's address of a test node: the first half's in 10.177.0.0/16 for 10.77.0.0/16."""
    return address.replace("10.77.", "10.177.", 1)


def two_pairs(topology="back-to-back", **changes):
    """Two serving groups of two: g1 = spark-a (head), spark-b; g2 = spark-c (head), spark-d."""
    if topology == "switch":
        addresses = ["10.77.0.1/24", "10.77.0.2/24", "10.77.0.3/24", "10.77.0.4/24"]
    else:
        addresses = ["10.77.77.1/30", "10.77.77.2/30", "10.77.78.1/30", "10.77.78.2/30"]
    hosts = [
        node("spark-a", "g1", 0, addresses[0], "10.0.0.11", fabric_topology=topology),
        node("spark-b", "g1", 1, addresses[1], "10.0.0.12", fabric_topology=topology),
        node("spark-c", "g2", 0, addresses[2], "10.0.0.13", fabric_topology=topology),
        node("spark-d", "g2", 1, addresses[3], "10.0.0.14", fabric_topology=topology),
    ]
    return [(name, {**data, **changes.get(name, {})}) for name, data in hosts]


def problems(hosts) -> list[str]:
    with pytest.raises(ConfigError) as err:
        build_cluster(hosts)
    return err.value.problems


@pytest.mark.parametrize("topology", ["back-to-back", "switch"])
def test_two_groups_of_two_build_with_a_head_each(topology):
    fleet = build_cluster(two_pairs(topology))
    assert list(fleet.groups) == ["g1", "g2"]
    assert [fleet.groups[g].head.name for g in fleet.groups] == ["spark-a", "spark-c"]
    assert [n.name for n in fleet.groups["g2"].workers] == ["spark-d"]
    assert fleet.group_of("spark-d").group == "g2"
    assert [p.name for p in fleet.groups["g1"].peers(fleet.node("spark-a"))] == ["spark-b"]


def test_a_fleet_of_several_groups_has_no_single_head():
    with pytest.raises(ValueError, match="2 serving groups has no single head"):
        build_cluster(two_pairs()).head


def test_an_inventory_without_groups_is_one_group_named_pair():
    cluster = load_cluster("lab/inventory.py")
    assert list(cluster.groups) == ["pair"]
    assert cluster.head.name == "spark-a" and cluster.groups["pair"].head.name == "spark-a"


def test_ranks_are_checked_per_group_naming_it():
    msgs = problems(two_pairs(**{"spark-d": {"rank": 0}}))
    assert any("spark-c, spark-d: serving group 'g2': key 'rank' = 0 on 2 nodes" in m for m in msgs), msgs
    assert not any("'g1'" in m for m in msgs)


def test_a_group_of_one_node_is_refused_naming_the_group_and_the_key():
    hosts = two_pairs("switch", **{"spark-d": {"serving_group": "g3", "rank": 0}})
    msgs = problems(hosts)
    assert any("spark-d: serving group 'g3': a serving group needs at least 2 nodes" in m for m in msgs), msgs


def test_a_group_name_that_is_not_a_name_is_refused():
    [msg] = problems(two_pairs(**{"spark-a": {"serving_group": "G 1"}}))
    assert "spark-a: key 'serving_group' = 'G 1'" in msg


def test_back_to_back_joins_two_nodes_only():
    hosts = two_pairs(**{"spark-c": {"serving_group": "g1", "rank": 2, "fabric_address": "10.77.77.3/29"}})
    hosts = [(n, {**d, "fabric_address": d["fabric_address"].replace("/30", "/29")} if d["serving_group"] == "g1" else d)
             for n, d in hosts if n != "spark-d"]
    msgs = problems(hosts)
    assert any("key 'fabric_topology' = 'back-to-back' with 3 nodes" in m and "'switch'" in m for m in msgs), msgs


def test_back_to_back_links_need_a_subnet_each():
    hosts = two_pairs(**{"spark-c": {"fabric_address": "10.77.77.5/29"}, "spark-d": {"fabric_address": "10.77.77.6/29"},
                         "spark-a": {"fabric_address": "10.77.77.1/29"}, "spark-b": {"fabric_address": "10.77.77.2/29"}})
    [msg] = problems(hosts)
    assert "subnet 10.77.77.0/29 is used by the back-to-back links of serving groups g1, g2" in msg


def test_a_group_on_a_switch_is_in_one_subnet():
    msgs = problems(two_pairs("switch", **{"spark-d": {"fabric_address": "10.77.9.4/24"}}))
    assert any("serving group 'g2': key 'fabric_address': the nodes of a group on the switch must be in one subnet"
               in m for m in msgs), msgs


def test_the_topology_is_one_for_the_fleet():
    msgs = problems(two_pairs("switch", **{"spark-d": {"fabric_topology": "back-to-back"}}))
    assert any("key 'fabric_topology' differs between nodes" in m and "'back-to-back', 'switch'" in m for m in msgs)


def test_an_unknown_topology_is_refused_naming_the_allowed_values():
    [msg] = problems(two_pairs(**{"spark-a": {"fabric_topology": "ring"}}))
    assert "spark-a: key 'fabric_topology' = 'ring'" in msg and "'back-to-back'" in msg and "'switch'" in msg


def test_fabric_addresses_are_unique_across_groups():
    msgs = problems(two_pairs("switch", **{"spark-c": {"fabric_address": "10.77.0.1/24"}}))
    assert any("spark-a, spark-c: key 'fabric_address' = 10.77.0.1" in m for m in msgs), msgs


class _Host:
    def __init__(self, name, data):
        self.name, self._data = name, data

    @property
    def data(self):
        from types import SimpleNamespace
        return SimpleNamespace(dict=lambda: dict(self._data))


class _Inventory(list):
    def get_active_hosts(self):
        return list(self)


class _State:
    def __init__(self, hosts):
        self.inventory = _Inventory(_Host(n, d) for n, d in hosts)


def test_inside_a_deploy_each_host_sees_its_own_group_and_decides_for_it():
    state = _State(two_pairs("switch"))
    seen = {}
    for h in state.inventory:
        with ctx_host.use(h):
            cluster = cluster_from_state(state)
            seen[h.name] = (cluster.group, cluster.head.name, [x.name for x in active_hosts(state)],
                            once_per_run(state, "verdict", lambda: cluster.head.name))
    assert seen == {
        "spark-a": ("g1", "spark-a", ["spark-a", "spark-b"], "spark-a"),
        "spark-b": ("g1", "spark-a", ["spark-a", "spark-b"], "spark-a"),
        "spark-c": ("g2", "spark-c", ["spark-c", "spark-d"], "spark-c"),
        "spark-d": ("g2", "spark-c", ["spark-c", "spark-d"], "spark-c"),
    }
    assert fleet_from_state(state).group is None and len(fleet_from_state(state).nodes) == 4


def test_every_problem_of_each_nodes_data_is_listed_and_checks_across_nodes_follow_once_they_pass():
    """What the docs say of a refusal ("every problem of each node's data"): problems of different nodes'
    own data come in one refusal, and the checks across nodes (two heads in g2 here) run only once every
    node's own data is valid, so fixing the first refusal can show the next."""
    bad = two_pairs(**{"spark-a": {"fabric_mtu": "9000"}, "spark-b": {"fabric_mtuu": 9000},
                       "spark-d": {"rank": 0}})
    first = problems(bad)
    assert any(m.startswith("spark-a: key 'fabric_mtu'") for m in first), first
    assert any(m.startswith("spark-b: unknown key 'fabric_mtuu'") for m in first), first
    assert not any("'rank' = 0 on 2 nodes" in m for m in first), first
    bad[0][1]["fabric_mtu"], _ = 9000, bad[1][1].pop("fabric_mtuu")
    assert any("spark-c, spark-d: serving group 'g2': key 'rank' = 0 on 2 nodes" in m for m in problems(bad))
