"""Serving data: profiles validate, pairs agree on one profile, the GID is picked per rank."""
import pytest

from roles.serving.facts import ipv4_mapped_gid, parse_gids, pick_gid_index
from roles.serving.schema import load_profile, profile_names
from sparkfleet.config import ConfigError, build_cluster
from tests.unit.helpers import pair


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
    from tests.unit.helpers import SHARED, SSH

    hosts = pair(**{"spark-c": {**SSH, **SHARED, "rank": 2, "fabric_address": "10.77.77.3/29"}})
    hosts = [(n, {**d, "fabric_address": d["fabric_address"].replace("/30", "/29")}) for n, d in hosts]
    with pytest.raises(ConfigError) as err:
        build_cluster(hosts)
    assert "tensor_parallel_size 2 but 3 nodes" in err.value.problems[0]


def test_empty_env_value_is_refused(tmp_path, monkeypatch):
    import yaml

    import roles.serving.schema as schema

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
