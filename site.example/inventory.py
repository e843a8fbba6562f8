"""Your two DGX Sparks: the inventory of your site. Edit the addresses, then (from the checkout):
sparkfleet plan inventory.py, sparkfleet deploy inventory.py (the checkout's inventory.py reads this site:
site/ in the checkout, or $SPARKFLEET_SITE), or name this file itself: sparkfleet plan SITE/inventory.py

ssh_hostname is the management address (how this machine reaches the node): its IP address. The
router's backends, the scrape targets and the firewall name this address, so a name given here is
resolved once on this machine and pinned (the plan prints it), and an mDNS name (spark-a.local) is
refused: any host on the LAN can answer for it (docs/security.md). The 192.0.2.x below are
documentation addresses (RFC 5737): replace them with your nodes'. fabric_address is the node's
address on the CX7 link and fabric_twin_address its twin's (the port's second half), each half in a
subnet of its own. Rank 0 is the head.
Settings for every node: the shipped defaults are the checkout's group_data/all.py; yours go in
group_data/all.py beside this file, which pyinfra reads after the checkout's (the later wins).
Profiles of your own, or your changes to a shipped one: profiles/NAME.yaml beside this file.
"""
from sparkfleet.inventory import sparks

spark_hosts = sparks(
    __file__,
    ("spark-a", {"ssh_hostname": "192.0.2.11", "ssh_user": "root", "rank": 0, "fabric_address": "10.77.77.1/30",
                 "fabric_twin_address": "10.77.78.1/30"}),
    ("spark-b", {"ssh_hostname": "192.0.2.12", "ssh_user": "root", "rank": 1, "fabric_address": "10.77.77.2/30",
                 "fabric_twin_address": "10.77.78.2/30"}),
)
