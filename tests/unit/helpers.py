"""Builders for unit tests: node data as an inventory would give it."""
import copy
from pathlib import Path

SSH = {"ssh_user": "root", "ssh_key": "/tmp/key", "ssh_strict_host_key_checking": "yes"}

SHARED = {
    "fabric_netdev": "enp1s0f0np0",
    "fabric_twin_netdev": "enP2p1s0f0np0",
    "fabric_mtu": 9000,
    "netplan_renderer": "NetworkManager",
    "rdma_hca": "rocep1s0f0",
    "rdma_twin_hca": "roceP2p1s0f0",
    # As group_data/all.py: the shipped profile's drafter is non-commercial (the license gate runs
    # with the data checks, before any connection).
    "deployment_purpose": "research",
    "drafter_license_acknowledged": "CC-BY-NC-ND-4.0",
}


# A site's choice on the shipped profile's drafter licence: the shipped defaults make none (they refuse
# that profile until a site does), so a valid site in these tests makes it, as a user's must.
LICENSE_ACKNOWLEDGED = {"drafter_license_acknowledged": "CC-BY-NC-ND-4.0"}
LICENSE_CHOICE = 'drafter_license_acknowledged = "CC-BY-NC-ND-4.0"\n'
SITE_EXAMPLE = Path(__file__).resolve().parents[2] / "site.example"


def write_site_data(site: Path, text: str = LICENSE_CHOICE) -> Path:
    """The site's group_data/all.py (beside its inventory: pyinfra reads it after the checkout's)."""
    (site / "group_data").mkdir(parents=True, exist_ok=True)
    path = site / "group_data" / "all.py"
    path.write_text(text)
    return path


def example_site(site: Path, choice: str = LICENSE_CHOICE) -> Path:
    """A copy of the tracked site.example at `site`, as a user makes theirs (cp -r), with `choice`
    added to its group_data/all.py; returns its inventory file."""
    import shutil

    shutil.copytree(SITE_EXAMPLE, site)
    data = site / "group_data" / "all.py"
    data.write_text(data.read_text() + choice)
    return site / "inventory.py"


def pair(**overrides_by_host):
    """Two valid nodes; overrides_by_host={"spark-b": {"rank": 0}} changes one host's data."""
    hosts = {
        "spark-a": {**SSH, **SHARED, "ssh_hostname": "10.0.0.11", "rank": 0, "fabric_address": "10.77.77.1/30",
                    "fabric_twin_address": "10.77.78.1/30"},
        "spark-b": {**SSH, **SHARED, "ssh_hostname": "10.0.0.12", "rank": 1, "fabric_address": "10.77.77.2/30",
                    "fabric_twin_address": "10.77.78.2/30"},
    }
    hosts = copy.deepcopy(hosts)
    for name, changes in overrides_by_host.items():
        hosts.setdefault(name, {})
        for key, value in changes.items():
            if value is DELETE:
                hosts[name].pop(key, None)
            else:
                hosts[name][key] = value
    return list(hosts.items())


DELETE = object()
# A port of one half (no twin): what a node without enP2p1s0f0np0 is given.
ONE_HALF = {"fabric_twin_netdev": None, "fabric_twin_address": None, "rdma_twin_hca": None}

GROUP_NODES = ("spark-a", "spark-b", "spark-c", "spark-d")


def group(count=4, **overrides_by_host):
    """`count` valid nodes of one serving group, as pair() builds two: spark-a (rank 0), spark-b, ...,
    their fabric addresses in one /29 on a switch (a back-to-back cable joins two); overrides_by_host
    as pair()'s."""
    hosts = {
        name: {**SSH, **SHARED, "ssh_hostname": f"10.0.0.{11 + i}", "rank": i, "fabric_address": f"10.77.77.{1 + i}/29",
               "fabric_twin_address": f"10.77.78.{1 + i}/29",
               **({"fabric_topology": "switch"} if count > 2 else {})}
        for i, name in enumerate(GROUP_NODES[:count])
    }
    return pair(**{name: {**data, **overrides_by_host.get(name, {})} for name, data in hosts.items()})


def run_pyinfra(inventory, *args, operations=("deploy.py",), env=None, prefix=()):
    """`pyinfra -y INVENTORY OPERATIONS ARGS` from the repository (its config.py and group_data/all.py
    apply, as for a user's deploy); stdout and stderr in one string, as an operator sees them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    command = [*prefix] if prefix else [str(Path(sys.executable).with_name("pyinfra"))]
    result = subprocess.run(
        [*command, "-y", str(inventory), *operations, *args], cwd=repo, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=120, env={**os.environ, **(env or {})},
    )
    return result.returncode, result.stdout


def fanout_rsyncd(tmp_path, weights=None, kernel_cache=None):
    """A context manager starting roles/fanout's rsync daemon as rendered for spark-a, moved to
    loopback (address, a free port, hosts allow, pid and log files under tmp_path, the modules' paths
    given); every other line as on a node. Yields the rsync:// URL of the daemon. Needs root (chroot)."""
    import contextlib
    import re
    import socket
    import subprocess
    import time

    from sparkfleet.config import build_cluster
    from sparkfleet.render import render

    node = build_cluster(pair()).node("spark-a")
    text = render("fanout", "/etc/sparkfleet/rsyncd.conf", node=node, fabric_network=node.fabric_address.network)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = re.sub(r"(?m)^address = .*$", "address = 127.0.0.1", text)
    text = re.sub(r"(?m)^port = .*$", f"port = {port}", text)
    text = re.sub(r"(?m)^hosts allow = .*$", "hosts allow = 127.0.0.1", text)
    for path, ours in ((node.weights_dir, weights), (node.kernel_cache_dir, kernel_cache)):
        text = text.replace(f"path = {path}\n", f"path = {ours or tmp_path / 'unused'}\n")
    text = text.replace("log file = /dev/null", f"log file = {tmp_path / 'rsyncd.log'}\npid file = {tmp_path / 'rsyncd.pid'}")
    conf = tmp_path / "rsyncd.conf"
    conf.write_text(text)

    @contextlib.contextmanager
    def running():
        daemon = subprocess.Popen(["rsync", "--daemon", "--no-detach", f"--config={conf}"])
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline and daemon.poll() is None, "the rsync daemon did not start"
                    time.sleep(0.05)
            yield f"rsync://127.0.0.1:{port}", text
        finally:
            daemon.terminate()
            daemon.wait(timeout=10)

    return running()


CAPTURES = Path(__file__).with_name("fixtures") / "captures"


def capture(name: str) -> str:
    """A real machine's output, verbatim (tests/unit/fixtures/captures/README.md names each source)."""
    return (CAPTURES / name).read_text()
