"""The two-Spark lab as a sparkfleet inventory (lab mode: no GPU, no RDMA).

Same schema as ../inventory.py; the lab's own group_data/all.py (beside this file) overrides the
GPU expectation and more. Brought up by `make lab-up`. The netplan renderer is the one the lab's
hosts run (`SFL_LAB_RENDERER` at `lab.sh up`, remembered by the lab): NetworkManager, as on DGX OS,
unless the lab was brought up with systemd-networkd.
"""
import os
from pathlib import Path

from sparkfleet.inventory import sparks

_state = os.environ.get("SFL_LAB_STATE", "/var/lib/sparkfleet-lab")
_ssh = {
    "ssh_user": "root",
    "ssh_key": f"{_state}/id_ed25519",
    "ssh_known_hosts_file": f"{_state}/known_hosts",
    "ssh_strict_host_key_checking": "yes",
}
_renderer_file = Path(_state, "run", "renderer")
_renderer = _renderer_file.read_text().strip() if _renderer_file.exists() else "NetworkManager"
_ssh["netplan_renderer"] = "networkd" if _renderer == "networkd" else "NetworkManager"

spark_hosts = sparks(
    __file__,
    ("spark-a", {**_ssh, "ssh_hostname": "198.18.0.11", "rank": 0, "fabric_address": "198.19.77.1/30",
                 "fabric_twin_address": "198.19.77.5/30"}),
    ("spark-b", {**_ssh, "ssh_hostname": "198.18.0.12", "rank": 1, "fabric_address": "198.19.77.2/30",
                 "fabric_twin_address": "198.19.77.6/30"}),
)
