"""The config model: every invariant, valid and invalid; every error names host, key and value."""
import pytest

from sparkfleet.config import ConfigError, build_cluster
from tests.unit.helpers import DELETE, SHARED, SSH, pair


def problems(hosts) -> list[str]:
    with pytest.raises(ConfigError) as err:
        build_cluster(hosts)
    return err.value.problems


def test_valid_pair_builds_with_head_and_worker():
    cluster = build_cluster(pair())
    assert cluster.head.name == "spark-a"
    assert [w.name for w in cluster.workers] == ["spark-b"]
    assert cluster.node("spark-b").fabric_ip == "10.77.77.2"
    assert cluster.node("spark-b").ping_payload == 8972
    assert cluster.node("spark-a").management_address == "10.0.0.11"
    assert [p.name for p in cluster.peers(cluster.head)] == ["spark-b"]


def test_defaults_fill_keys_not_given():
    fabric = ("fabric_netdev", "fabric_mtu", "netplan_renderer", "rdma_hca", "fabric_twin_netdev", "rdma_twin_hca",
              "fabric_twin_address")
    hosts = [(n, {k: v for k, v in d.items() if k not in fabric}) for n, d in pair()]
    node = build_cluster(hosts).node("spark-a")
    assert (node.fabric_netdev, node.fabric_mtu, node.netplan_renderer, node.rdma_hca) == (
        "enp1s0f0np0", 9000, "NetworkManager", None)
    # The schema's own defaults are one half, no RDMA; group_data/all.py names the DGX Spark's twins.
    assert (node.fabric_twin_netdev, node.rdma_twin_hca, [h.netdev for h in node.fabric_halves]) == (
        None, None, ["enp1s0f0np0"])
    assert node.gpu_expected is True


def test_management_address_falls_back_to_the_name_resolved_on_the_controller(resolver):
    resolver({"spark-a": ["192.168.1.11"]})
    hosts = pair(**{"spark-a": {"ssh_hostname": DELETE}})
    node = build_cluster(hosts).node("spark-a")
    assert (node.management_given, node.management_address) == ("spark-a", "192.168.1.11")


def test_ranks_are_sorted_whatever_the_inventory_order():
    cluster = build_cluster(list(reversed(pair())))
    assert [n.rank for n in cluster.nodes] == [0, 1]


def test_two_rank_zero_nodes_are_refused_naming_both():
    [msg] = problems(pair(**{"spark-b": {"rank": 0}}))
    assert "spark-a, spark-b" in msg and "'rank'" in msg and "exactly one node must have rank 0" in msg


def test_no_rank_zero_is_refused():
    msgs = problems(pair(**{"spark-a": {"rank": 2}}))
    assert any("rank 0 on 0 nodes" in m or "= 0 on 0 nodes" in m for m in msgs)
    assert any(m.startswith("spark-a: key 'rank' = 2") and "0..1" in m for m in msgs)


def test_rank_gap_is_refused_naming_host_and_missing_rank():
    hosts = pair(**{"spark-c": {**SSH, **SHARED, "ssh_hostname": "10.0.0.13", "rank": 3, "fabric_address": "10.77.77.3/29",
                                "fabric_twin_address": "10.77.78.3/29"}})
    hosts = [(n, {**d, "fabric_address": d["fabric_address"].replace("/30", "/29"),
                  "fabric_twin_address": d["fabric_twin_address"].replace("/30", "/29"), "fabric_topology": "switch"})
             for n, d in hosts]
    [msg] = problems(hosts)
    assert msg.startswith("spark-c: key 'rank' = 3") and "missing: 2" in msg


def test_duplicate_worker_rank_is_refused():
    hosts = pair(**{"spark-c": {**SSH, **SHARED, "ssh_hostname": "10.0.0.13", "rank": 1, "fabric_address": "10.77.77.3/29",
                                "fabric_twin_address": "10.77.78.3/29"}})
    hosts = [(n, {**d, "fabric_address": d["fabric_address"].replace("/30", "/29"),
                  "fabric_twin_address": d["fabric_twin_address"].replace("/30", "/29")}) for n, d in hosts]
    msgs = problems(hosts)
    assert any("spark-b, spark-c: key 'rank' = 1 on 2 nodes" in m for m in msgs)


def test_negative_rank_is_refused_by_the_schema():
    [msg] = problems(pair(**{"spark-b": {"rank": -1}}))
    assert msg.startswith("spark-b: key 'rank' = -1") and "greater than or equal to 0" in msg


def test_duplicate_fabric_address_is_refused():
    [msg] = problems(pair(**{"spark-b": {"fabric_address": "10.77.77.1/30"}}))
    assert "spark-a, spark-b: key 'fabric_address' = 10.77.77.1" in msg and "unique" in msg


def test_fabric_addresses_in_two_subnets_are_refused():
    [msg] = problems(pair(**{"spark-b": {"fabric_address": "10.77.79.2/30"}}))
    assert "'fabric_address'" in msg and "one subnet" in msg
    assert "spark-a in 10.77.77.0/30" in msg and "spark-b in 10.77.79.0/30" in msg


def test_network_address_is_refused():
    [msg] = problems(pair(**{"spark-b": {"fabric_address": "10.77.77.0/30"}}))
    assert msg.startswith("spark-b: key 'fabric_address' = 10.77.77.0/30") and "network or broadcast" in msg


def test_malformed_fabric_address_is_refused():
    [msg] = problems(pair(**{"spark-b": {"fabric_address": "10.77.77.300/30"}}))
    assert msg.startswith("spark-b: key 'fabric_address' = '10.77.77.300/30'")


def test_missing_fabric_address_is_refused():
    [msg] = problems(pair(**{"spark-b": {"fabric_address": DELETE}}))
    assert msg.startswith("spark-b: key 'fabric_address' is required")


def test_mtu_other_than_9000_needs_a_reason():
    hosts = pair(**{"spark-a": {"fabric_mtu": 1500}, "spark-b": {"fabric_mtu": 1500}})
    msgs = problems(hosts)
    assert len(msgs) == 2
    assert msgs[0].startswith("spark-a: key 'fabric_mtu' = 1500") and "fabric_mtu_reason" in msgs[0]


def test_mtu_other_than_9000_is_accepted_with_a_reason():
    reason = {"fabric_mtu": 4200, "fabric_mtu_reason": "switch in the path tops out at 4200"}
    cluster = build_cluster(pair(**{"spark-a": reason, "spark-b": reason}))
    assert {n.fabric_mtu for n in cluster.nodes} == {4200}


def test_mtu_differing_between_nodes_is_refused():
    reason = {"fabric_mtu": 4200, "fabric_mtu_reason": "on purpose"}
    [msg] = problems(pair(**{"spark-b": reason}))
    assert "'fabric_mtu' differs" in msg and "spark-a=9000" in msg and "spark-b=4200" in msg


def test_mtu_out_of_range_is_refused():
    [msg] = problems(pair(**{"spark-b": {"fabric_mtu": 100000, "fabric_mtu_reason": "x"}}))
    assert msg.startswith("spark-b: key 'fabric_mtu' = 100000") and "9216" in msg


def test_unknown_key_is_refused_naming_host_key_and_allowed_keys():
    [msg] = problems(pair(**{"spark-b": {"fabirc_mtu": 9000}}))
    assert msg.startswith("spark-b: unknown key 'fabirc_mtu' = 9000")
    assert "fabric_mtu" in msg and "netplan_renderer" in msg and "rank" in msg


def test_bad_renderer_names_the_allowed_values():
    [msg] = problems(pair(**{"spark-a": {"netplan_renderer": "ifupdown"}}))
    assert msg.startswith("spark-a: key 'netplan_renderer' = 'ifupdown'")
    assert "'NetworkManager' or 'networkd'" in msg


def test_derived_keys_cannot_be_set():
    [msg] = problems(pair(**{"spark-a": {"management_address": "1.2.3.4"}}))
    assert msg.startswith("spark-a: key 'management_address' is derived")


def test_pyinfra_keys_pass_through():
    cluster = build_cluster(pair(**{"spark-a": {"_sudo": True, "ssh_port": 2222}}))
    assert cluster.node("spark-a").rank == 0


def test_single_node_is_refused():
    [msg] = problems(pair()[:1])
    assert msg.startswith("spark-a: a serving group needs at least 2 nodes (found 1: spark-a)")


def test_every_problem_is_reported_at_once():
    msgs = problems(pair(**{"spark-a": {"bogus": 1}, "spark-b": {"netplan_renderer": "x"}}))
    assert [m.split(":")[0] for m in msgs] == ["spark-a", "spark-b"]


def test_as_data_is_plain_and_complete():
    data = build_cluster(pair()).as_data()
    assert list(data) == ["spark-a", "spark-b"]
    assert data["spark-b"]["fabric_address"] == "10.77.77.2/30"
    assert list(data["spark-a"])[:3] == ["name", "rank", "management_address"]


def test_numbers_and_booleans_written_as_text_are_refused_not_converted():
    msgs = problems(pair(**{"spark-b": {"fabric_mtu": "9000", "gpu_expected": "false", "guard_min_headroom_gib": "1.5"}}))
    assert any(m.startswith("spark-b: key 'fabric_mtu' = '9000': Input should be a valid integer") for m in msgs)
    assert any(m.startswith("spark-b: key 'gpu_expected' = 'false': Input should be a valid boolean") for m in msgs)
    assert any(m.startswith("spark-b: key 'guard_min_headroom_gib' = '1.5'") for m in msgs)
    assert {m.fix for m in msgs} >= {"write it as 9000 without quotes", "write it as 1.5 without quotes"}


def test_an_integer_is_a_number_but_a_boolean_is_not():
    assert build_cluster(pair(**{"spark-b": {"guard_min_headroom_gib": 2}})).node("spark-b").guard_min_headroom_gib == 2.0
    [msg] = problems(pair(**{"spark-b": {"rank": True}}))
    assert msg.startswith("spark-b: key 'rank' = True: Input should be a valid integer")


def test_two_nodes_on_one_management_address_are_refused_naming_both():
    [msg] = problems(pair(**{"spark-b": {"ssh_hostname": "10.0.0.11"}}))
    assert msg.startswith("spark-a, spark-b: key 'ssh_hostname' = '10.0.0.11' (port 22) on 2 nodes")


def test_one_management_address_on_two_ports_is_two_machines():
    cluster = build_cluster(pair(**{"spark-a": {"ssh_port": 2201}, "spark-b": {"ssh_hostname": "10.0.0.11", "ssh_port": 2202}}))
    assert [n.management_address for n in cluster.nodes] == ["10.0.0.11", "10.0.0.11"]


def test_a_management_address_on_the_fabric_is_refused():
    [msg] = problems(pair(**{"spark-b": {"ssh_hostname": "10.77.77.1"}}))
    assert msg.startswith("spark-b: key 'ssh_hostname' = 10.77.77.1 is spark-a's fabric_address")
    [msg] = problems(pair(**{"spark-b": {"ssh_hostname": "10.77.77.3"}}))
    assert msg.startswith("spark-b: key 'ssh_hostname' = 10.77.77.3 is in the fabric subnet 10.77.77.0/30")


def test_a_management_address_that_is_another_nodes_name_is_refused():
    [msg] = problems(pair(**{"spark-a": {"ssh_hostname": "spark-b"}}))
    assert msg.startswith("spark-a: key 'ssh_hostname' = 'spark-b' is the name of node spark-b")


def test_two_services_on_one_port_of_the_head_are_refused():
    [msg] = problems(pair(**{n: {"fanout_rsync_port": 5000} for n in ("spark-a", "spark-b")}))
    assert msg.startswith("spark-a: port 5000 is both docker_registry_port and fanout_rsync_port")
    assert msg.fix == "set docker_registry_port to a free port"
    [msg] = problems(pair(**{n: {"fanout_http_port": 873} for n in ("spark-a", "spark-b")}))
    assert msg.startswith("spark-a: port 873 is both fanout_rsync_port and fanout_http_port")


def test_the_license_gate_needs_only_data():
    [msg] = problems(pair(**{n: {"deployment_purpose": "production"} for n in ("spark-a", "spark-b")}))
    assert msg.startswith("spark-a: key 'deployment_purpose' = 'production': license: profile glm-5.3-flash-exl3")
    assert msg.key == "deployment_purpose"


def test_settings_refused_on_a_rank_need_only_data(monkeypatch):
    """The guards' refused_settings runs on every rank's rendered command line before connecting (today
    the renderer itself refuses what data could add; the guard stays the last word)."""
    import sparkfleet.config as config  # the name the data-only guards call

    render = config.engine_args
    monkeypatch.setattr(config, "engine_args",
                        lambda p, c, n: [a if a != "mp" else "ray" for a in render(p, c, n)])
    msgs = problems(pair())
    assert [m.split(":")[0] for m in msgs] == ["spark-a", "spark-b"]
    assert msgs[0].startswith("spark-a: --distributed-executor-backend ray: Ray's memory monitor killed the head")
    assert build_cluster(pair(**{n: {"allow_ray_backend": True} for n in ("spark-a", "spark-b")})).head.allow_ray_backend
