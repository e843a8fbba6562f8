"""roles/host: the logind drop-in renders the data's RemoveIPC, with the managed-by header."""
import configparser

import pytest

from sparkfleet.model.host import LOGIND_DROP_IN
from sparkfleet.config import ConfigError, build_cluster
from sparkfleet.render import render
from tests.unit.helpers import pair


def logind_conf(**data) -> configparser.ConfigParser:
    node = build_cluster(pair(**{n: data for n in ("spark-a", "spark-b")})).node("spark-b")
    text = render("host", LOGIND_DROP_IN, node=node)
    assert text.startswith("# Managed by sparkfleet (roles/host)")
    parsed = configparser.ConfigParser()
    parsed.read_string(text)
    return parsed


def test_remove_ipc_is_off_by_default_and_follows_data():
    assert logind_conf()["Login"]["RemoveIPC"] == "no"
    assert logind_conf(host_logind_remove_ipc=True)["Login"]["RemoveIPC"] == "yes"


def test_remove_ipc_takes_a_boolean_only():
    with pytest.raises(ConfigError, match="host_logind_remove_ipc"):
        build_cluster(pair(**{n: {"host_logind_remove_ipc": "no"} for n in ("spark-a", "spark-b")}))
