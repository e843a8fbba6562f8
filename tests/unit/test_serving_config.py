"""Serving data: profiles validate, pairs agree on one profile, a group's TP x PP is its node count,
the GID is picked per rank."""
import pytest
import yaml

from sparkfleet.roce_gid import ipv4_mapped_gid, parse_gids, pick_gid_index
from sparkfleet.model.serving import load_profile, profile_names
from sparkfleet.config import ConfigError, build_cluster
from tests.unit.helpers import group, pair
from tests.unit.test_serving_render import PP_VARIANT, PROFILES, group_cluster, parallel_variants


def test_every_shipped_profile_validates():
    assert "glm-5.3-flash-exl3" in profile_names()
    for name in profile_names():
        assert load_profile(name).name == name


def test_unknown_profile_is_refused_naming_host_key_and_choices():
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**{n: {"serving_profile": "nope"} for n in ("spark-a", "spark-b")}))
    [msg] = err.value.problems
    assert "key 'serving_profile' = 'nope'" in msg and "glm-5.3-flash-exl3" in msg


def test_profile_differing_between_nodes_is_refused():
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**{"spark-b": {"serving_recipe_commit": "abcdef1"}}))
    assert "key 'serving_recipe_commit' differs between nodes" in err.value.problems[0]


def test_recipe_commit_must_be_a_commit():
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**{n: {"serving_recipe_commit": "main"} for n in ("spark-a", "spark-b")}))
    assert err.value.problems[0].startswith("spark-a: key 'serving_recipe_commit' = 'main'")


def test_tensor_parallel_size_must_match_the_node_count():
    with pytest.raises(ConfigError) as err:
        build_cluster(group(3))
    assert "tensor_parallel_size 2 x pipeline_parallel_size 1 = 2 ranks but 3 nodes" in err.value.problems[0]


def test_tp_times_pp_must_be_the_groups_node_count():
    """Four nodes: TP 2 x PP 2 is a group of four; the shipped TP 2 x PP 1 names both sizes, their
    product and the node count."""
    with parallel_variants():
        for profile in PROFILES:
            c = group_cluster("spark", profile + PP_VARIANT)
            assert [n.rank for n in c.nodes] == [0, 1, 2, 3]
    with pytest.raises(ConfigError) as err:
        build_cluster(group(4))
    [msg] = err.value.problems
    assert "key 'serving_profile' = 'glm-5.3-flash-exl3': tensor_parallel_size 2 x pipeline_parallel_size 1 = " \
           "2 ranks but 4 nodes (one GB10 GPU per node: TP x PP must equal the node count; " in msg


def test_the_groups_parallelism_in_data_replaces_the_profiles():
    """Four nodes serve the pair's profile at TP 2 x PP 2 set in data; every rank renders it; a node
    of the group with another size is refused naming the key."""
    from sparkfleet.model.engine import engine_args
    from sparkfleet.model.serving import node_profile

    sizes = {"serving_tensor_parallel_size": 2, "serving_pipeline_parallel_size": 2}
    c = build_cluster(group(4, **{n: sizes for n in ("spark-a", "spark-b", "spark-c", "spark-d")}))
    for n in c.nodes:
        args = engine_args(node_profile(n), c, n)
        at = args.index("--pipeline-parallel-size")
        assert args[at + 1] == "2" and args[args.index("--tensor-parallel-size") + 1] == "2"
        assert args[args.index("--nnodes") + 1] == "4"
    with pytest.raises(ConfigError) as err:
        build_cluster(group(4, **{n: sizes for n in ("spark-a", "spark-b", "spark-c")},
                            **{"spark-d": {"serving_tensor_parallel_size": 4}}))
    assert any("key 'serving_tensor_parallel_size' differs between nodes" in m for m in err.value.problems)


def test_pipeline_parallel_size_is_required_in_a_profile(tmp_path, monkeypatch):
    """Pinned in every profile like tensor_parallel_size: no profile relies on PP 1 unsaid."""
    import sparkfleet.model.serving as schema

    data = yaml.safe_load((schema.PROFILES_DIR / "deepseek-v4-flash.yaml").read_text())
    del data["pipeline_parallel_size"]
    (tmp_path / "nopp.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(schema, "PROFILES_DIR", tmp_path)
    with pytest.raises(ValueError, match="pipeline_parallel_size is required"):
        load_profile("nopp")


def test_empty_env_value_is_refused(tmp_path, monkeypatch):
    import yaml

    import sparkfleet.model.serving as schema

    data = yaml.safe_load((schema.PROFILES_DIR / "glm-5.3-flash-exl3.yaml").read_text())
    data["env"]["NCCL_IB_GID_INDEX"] = ""
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(schema, "PROFILES_DIR", tmp_path)
    with pytest.raises(ValueError, match="NCCL_IB_GID_INDEX"):
        load_profile("broken")


def gid_table(rows):
    return parse_gids([f"{i}\t{t}\t{n}\t{g}" for i, t, n, g in rows])


LINK_LOCAL = "fe80:0000:0000:0000:0e42:a1ff:fe5b:7d2c"


@pytest.mark.parametrize("index", [3, 4, 5])
def test_roce_v2_gid_of_the_fabric_address_is_picked(index):
    mapped = ipv4_mapped_gid("10.77.77.2")
    rows = [
        (0, "IB/RoCE v1", "enp1s0f0np0", LINK_LOCAL),
        (1, "RoCE v2", "enp1s0f0np0", LINK_LOCAL),
        (2, "IB/RoCE v1", "enp1s0f0np0", mapped),
    ]
    rows += [(i, "RoCE v2", "enP2p1s0f0np0", ipv4_mapped_gid("10.99.0.2")) for i in range(3, index)]
    rows.append((index, "RoCE v2", "enp1s0f0np0", mapped))
    assert pick_gid_index(gid_table(rows), "10.77.77.2", "enp1s0f0np0") == index


def test_no_roce_v2_gid_gives_none():
    rows = [(0, "IB/RoCE v1", "enp1s0f0np0", LINK_LOCAL), (2, "IB/RoCE v1", "enp1s0f0np0", ipv4_mapped_gid("10.77.77.2"))]
    assert pick_gid_index(gid_table(rows), "10.77.77.2", "enp1s0f0np0") is None


def test_ipv4_mapped_gid_is_written_as_sysfs_writes_it():
    assert ipv4_mapped_gid("10.77.77.2") == "0000:0000:0000:0000:0000:ffff:0a4d:4d02"


def test_an_empty_pin_in_data_is_refused_naming_host_and_key():
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**{n: {"serving_env_pins": {"NCCL_IB_GID_INDEX": ""}} for n in ("spark-a", "spark-b")}))
    assert err.value.problems[0].startswith("spark-a: key 'serving_env_pins'") and "NCCL_IB_GID_INDEX" in err.value.problems[0]
