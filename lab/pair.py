"""Which pair of the lab's hosts a process drives (SFL_LAB_PAIR), and the netplan renderer lab/lab.sh
remembers for each host.

lab/lab.sh cables spark-a <-> spark-b (the two-host lab) and, with four hosts as pairs
(SFL_LAB_HOSTS=4 SFL_LAB_FABRIC=pairs), spark-c <-> spark-d too, each pair on a cable of its own:
`make test` runs tests/e2e and tests/state on the first pair while tests/real runs on the second
(SFL_LAB_PAIR=spark-c,spark-d). Unset, a process drives spark-a and spark-b, as before there were two
pairs. Read by lab/inventory.py (and so by every inventory built on it) and tests/e2e/lab.py.
"""
import os
from pathlib import Path

VARIABLE = "SFL_LAB_PAIR"
# lab/lab.sh FAB_PAIRS: the hosts cabled to each other, head first
PAIRS = (("spark-a", "spark-b"), ("spark-c", "spark-d"))
# lab/lab.sh MGMT_IP: each host's address on the management bridge (sfl-mgmt0, 198.18.0.1)
MANAGEMENT = {"spark-a": "198.18.0.11", "spark-b": "198.18.0.12", "spark-c": "198.18.0.13", "spark-d": "198.18.0.14"}


def lab_pair(environ=os.environ) -> tuple[str, str]:
    """(head, worker) of the pair SFL_LAB_PAIR names ("spark-c,spark-d"); spark-a, spark-b unset."""
    given = environ.get(VARIABLE, "").strip()
    if not given:
        return PAIRS[0]
    pair = tuple(name.strip() for name in given.split(","))
    if pair not in PAIRS:
        raise ValueError(f"{VARIABLE}={given!r}: must be one of "
                         + " or ".join(",".join(p) for p in PAIRS) + " (head first: the hosts lab/lab.sh cables together)")
    return pair


def lab_state(environ=os.environ) -> Path:
    return Path(environ.get("SFL_LAB_STATE", "/var/lib/sparkfleet-lab"))


def renderer(host: str, state: Path) -> str:
    """The netplan renderer lab.sh brought `host` up with (SFL_LAB_RENDERER at `lab.sh up`, per host):
    NetworkManager, as on DGX OS, unless it runs systemd-networkd. (A lab brought up before the renderer
    was per host has one file for every host.)"""
    for path in (state / "run" / f"renderer-{host}", state / "run" / "renderer"):
        if path.exists():
            return "networkd" if path.read_text().strip() == "networkd" else "NetworkManager"
    return "NetworkManager"
