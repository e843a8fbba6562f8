"""The two-Spark lab as a sparkfleet inventory (lab mode: no GPU, no RDMA).

Same schema as ../inventory.py; the lab's own group_data/all.py (beside this file) overrides the
GPU expectation and more. Brought up by `make lab-up`. The hosts are the pair SFL_LAB_PAIR names
(lab/pair.py: spark-a and spark-b unset; spark-c,spark-d on a four-host lab of two pairs), each with
its management address; both pairs have the same fabric addresses, each pair being a cable of its own.
Each host's netplan renderer is the one it runs (`SFL_LAB_RENDERER` at `lab.sh up`, remembered by
the lab per host): NetworkManager, as on DGX OS, unless it was brought up with systemd-networkd.
"""
import runpy
from pathlib import Path

from sparkfleet.inventory import sparks

_pair = runpy.run_path(str(Path(__file__).with_name("pair.py")))
_head, _worker = _pair["lab_pair"]()
_state = _pair["lab_state"]()
_ssh = {
    "ssh_user": "root",
    "ssh_key": f"{_state}/id_ed25519",
    "ssh_known_hosts_file": f"{_state}/known_hosts",
    "ssh_strict_host_key_checking": "yes",
    # the head's; each host below has its own (lab/inventory_fleet*.py take this one for all four)
    "netplan_renderer": _pair["renderer"](_head, _state),
}


def _host(name: str) -> dict:
    return {**_ssh, "netplan_renderer": _pair["renderer"](name, _state),
            "ssh_hostname": _pair["MANAGEMENT"][name]}


spark_hosts = sparks(
    __file__,
    (_head, {**_host(_head), "rank": 0, "fabric_address": "198.19.77.1/30", "fabric_twin_address": "198.19.77.5/30"}),
    (_worker, {**_host(_worker), "rank": 1, "fabric_address": "198.19.77.2/30", "fabric_twin_address": "198.19.77.6/30"}),
)
