"""Four lab Sparks on a switched fabric as two serving groups of two (lab mode: no GPU, no RDMA).

Brought up by `make fleet-up` (`SFL_LAB_HOSTS=4 lab/lab.sh up`): spark-a..spark-d, each with its
enp1s0f0np0 on one bridge on the machine (sfl-fab0, the switch) and its twin enP2p1s0f0np0 on
another (sfl-fab1), so every first half is in one subnet, 198.19.78.0/24, every twin in 198.19.79.0/24. Group g1: spark-a (head), spark-b; group g2: spark-c (head), spark-d.
SSH settings and the netplan renderer are lab/inventory.py's; the group data is lab/group_data's.
"""
import runpy
from pathlib import Path

from sparkfleet.inventory import sparks

# lab/inventory.py's SSH settings and netplan renderer (the same lab state: key, known_hosts)
_ssh = runpy.run_path(str(Path(__file__).with_name("inventory.py")))["_ssh"]
# lab/pair.py MANAGEMENT (lab/lab.sh MGMT_IP): each host's address on the management bridge
_address = runpy.run_path(str(Path(__file__).with_name("pair.py")))["MANAGEMENT"]
# One endpoint for both groups: the router on spark-a (roles/router), its gate on port 8100 (TLS), behind the
# fleet's key.
# A dead worker is found by a request after vLLM's step timeout (the stand-in imitates it): 10 s
# here, not the profile's 1800, so the e2e sees its group leave routing within a minute.
_switch = {**_ssh, "fabric_topology": "switch", "router_node": "spark-a",
           "serving_env_pins": {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "10"}}

spark_hosts = sparks(
    __file__,
    ("spark-a", {**_switch, "ssh_hostname": _address["spark-a"], "serving_group": "g1", "rank": 0,
                 "fabric_address": "198.19.78.1/24",
                 "fabric_twin_address": "198.19.79.1/24"}),
    ("spark-b", {**_switch, "ssh_hostname": _address["spark-b"], "serving_group": "g1", "rank": 1,
                 "fabric_address": "198.19.78.2/24",
                 "fabric_twin_address": "198.19.79.2/24"}),
    ("spark-c", {**_switch, "ssh_hostname": _address["spark-c"], "serving_group": "g2", "rank": 0,
                 "fabric_address": "198.19.78.3/24",
                 "fabric_twin_address": "198.19.79.3/24"}),
    ("spark-d", {**_switch, "ssh_hostname": _address["spark-d"], "serving_group": "g2", "rank": 1,
                 "fabric_address": "198.19.78.4/24",
                 "fabric_twin_address": "198.19.79.4/24"}),
)
