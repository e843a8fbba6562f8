"""Four lab Sparks on a switched fabric as ONE serving group of four (lab mode: no GPU, no RDMA).

The hosts, addresses and fabric of lab/inventory_fleet.py (`make fleet-up`), in one group "fleet":
spark-a (head, rank 0), spark-b, spark-c, spark-d (ranks 1..3). SSH settings and the netplan
renderer are lab/inventory.py's; the group data is lab/group_data's.
"""
import runpy
from pathlib import Path

from sparkfleet.inventory import sparks

# lab/inventory.py's SSH settings and netplan renderer (the same lab state: key, known_hosts)
_ssh = runpy.run_path(str(Path(__file__).with_name("inventory.py")))["_ssh"]
# lab/pair.py MANAGEMENT (lab/lab.sh MGMT_IP): each host's address on the management bridge
_address = runpy.run_path(str(Path(__file__).with_name("pair.py")))["MANAGEMENT"]
# The lab's profile (a pair's: TP 2) served by four ranks at TP 2 x PP 2: the group's parallelism.
_switch = {**_ssh, "fabric_topology": "switch", "serving_group": "fleet",
           "serving_tensor_parallel_size": 2, "serving_pipeline_parallel_size": 2}

spark_hosts = sparks(
    __file__,
    ("spark-a", {**_switch, "ssh_hostname": _address["spark-a"], "rank": 0, "fabric_address": "198.19.78.1/24",
                 "fabric_twin_address": "198.19.79.1/24"}),
    ("spark-b", {**_switch, "ssh_hostname": _address["spark-b"], "rank": 1, "fabric_address": "198.19.78.2/24",
                 "fabric_twin_address": "198.19.79.2/24"}),
    ("spark-c", {**_switch, "ssh_hostname": _address["spark-c"], "rank": 2, "fabric_address": "198.19.78.3/24",
                 "fabric_twin_address": "198.19.79.3/24"}),
    ("spark-d", {**_switch, "ssh_hostname": _address["spark-d"], "rank": 3, "fabric_address": "198.19.78.4/24",
                 "fabric_twin_address": "198.19.79.4/24"}),
)
