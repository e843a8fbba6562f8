"""Your two DGX Sparks: the inventory of your site. Edit the addresses, then (from the checkout):
sparkfleet plan inventory.py, sparkfleet deploy inventory.py (the checkout's inventory.py reads this site:
site/ in the checkout, or $SPARKFLEET_SITE), or name this file itself: sparkfleet plan SITE/inventory.py

ssh_hostname is the management address (how this machine reaches the node); fabric_address is
the node's address on the CX7 link and fabric_twin_address its twin's (the port's second half), each
half in a subnet of its own. Rank 0 is the head.
Settings for every node: the shipped defaults are the checkout's group_data/all.py; yours go in
group_data/all.py beside this file, which pyinfra reads after the checkout's (the later wins).
Profiles of your own, or your changes to a shipped one: profiles/NAME.yaml beside this file.
"""
from sparkfleet.inventory import sparks

spark_hosts = sparks(
    __file__,
    ("spark-a", {"ssh_hostname": "spark-a.local", "ssh_user": "root", "rank": 0, "fabric_address": "10.77.77.1/30",
                 "fabric_twin_address": "10.77.78.1/30"}),
    ("spark-b", {"ssh_hostname": "spark-b.local", "ssh_user": "root", "rank": 1, "fabric_address": "10.77.77.2/30",
                 "fabric_twin_address": "10.77.78.2/30"}),
)
