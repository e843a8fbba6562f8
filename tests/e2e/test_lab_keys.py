"""Key files on the lab pair (issue 23): a key file that exists but cannot be read stops the deploy
naming the host, the path and the error, and is never replaced by a new key; with the router on
spark-b, `pyinfra --diff` of the deploy that writes the fleet's key there shows no key, the router's
control-plane key is root-only on spark-b alone, the API key every client has is refused on smg's
control plane while it serves completions, and an unchanged re-deploy changes nothing; the router
removed again takes its control-plane key and the router hop's certificate with it; and, as a
non-root ssh_user would read it over the deploy's connection, a key file is read through the host's
sudo, and without sudo it is refused as unreadable, never taken for missing.

Begins with its own deploy (no router) and ends with one.
"""
import json

import pytest

from tests.e2e.lab import BIN, api_curl, deploy, on, router_api, run

pytestmark = pytest.mark.lab

KEY_FILE = "/etc/sparkfleet/api-key"
CONTROL_KEY_FILE = "/etc/sparkfleet/router-control-key"
ROUTER = "https://198.18.0.12:8100"  # router_node spark-b, router_port 8100 (the default): its gate, over TLS
WITH_ROUTER = ("--data", "router_node=spark-b")


@pytest.fixture(scope="module", autouse=True)
def serving_pair():
    run = deploy()
    assert run.returncode == 0, run.output
    yield
    on("spark-a", f"[ -d {KEY_FILE} ] && rmdir {KEY_FILE} && mv {KEY_FILE}.saved {KEY_FILE} || true")
    assert deploy().returncode == 0


def code(command: str) -> str:
    return on("spark-a", f"{command} -sS -m 10 -o /dev/null -w '%{{http_code}}'")


def test_a_key_file_that_exists_but_cannot_be_read_stops_the_deploy_and_is_kept():
    key = on("spark-a", f"cat {KEY_FILE}").strip()
    # A directory at the key file's path: "not a regular file" (as an NFS share that squashes root or
    # an I/O error would be unreadable too). Before, `[ ! -f ]` took it for a missing key.
    on("spark-a", f"mv {KEY_FILE} {KEY_FILE}.saved && mkdir -m 0700 {KEY_FILE}")
    refused = deploy()  # should it raise, the module's teardown puts the key file back
    on("spark-a", f"rmdir {KEY_FILE} && mv {KEY_FILE}.saved {KEY_FILE}")
    assert refused.returncode != 0
    assert (f"spark-a: serving_api_key_file {KEY_FILE} exists but cannot be read: it is a directory, not a regular "
            f"file. A key is generated only when the file does not exist") in refused.output, refused.output[-3000:]
    assert "Traceback" not in refused.output and refused.changed() == []
    assert on("spark-a", f"cat {KEY_FILE}").strip() == key
    again = deploy()
    assert again.returncode == 0 and again.changed() == [], again.output[-3000:]


def test_with_the_router_no_key_is_in_the_diff_and_the_api_key_opens_no_control_plane():
    fleet_key = on("spark-a", f"cat {KEY_FILE}").strip()
    # Another key in spark-b's key file (left by an earlier router there, or none at all): the fleet's
    # is written over it, the write this test watches with --diff on.
    on("spark-b", f"(umask 077; printf '%s\\n' other-key-0123456789abcdef > {KEY_FILE})")
    run = deploy("--diff", *WITH_ROUTER)
    assert run.returncode == 0, run.output[-4000:]
    # The fleet's key was written into spark-b's key file (the router node's), with --diff on.
    assert ("Write the fleet's API key into /etc/sparkfleet/api-key (the router presents one key to every group)",
            "spark-b") in run.changed(), run.changed()
    assert on("spark-b", f"cat {KEY_FILE}").strip() == fleet_key
    assert on("spark-b", f"stat -c '%U %a' {KEY_FILE} {CONTROL_KEY_FILE}").split() == ["root", "600", "root", "600"]
    control_key = on("spark-b", f"cat {CONTROL_KEY_FILE}").strip()
    assert len(control_key) == 64 and control_key != fleet_key
    assert on("spark-a", f"ls {CONTROL_KEY_FILE} 2>/dev/null || echo none").strip() == "none"
    for secret in (fleet_key, control_key):
        assert secret not in run.output
    # The router serves with the API key and refuses it on its control plane.
    assert router_api("spark-b") == ROUTER
    chat = (f"{api_curl()} -H 'Content-Type: application/json' -d "
            "'{\"model\": \"glm-5.3-flash\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 4}' "
            f"{ROUTER}/v1/chat/completions")
    assert code(chat) == "200"
    add = (f"{api_curl()} -H 'Content-Type: application/json' -d "
           f"'{{\"url\": \"http://198.18.0.11:9\"}}' {ROUTER}/workers")
    assert code(add) == "401"
    assert code(f"{api_curl()} {ROUTER}/workers") == "401"
    assert code(f"{api_curl()} -X DELETE {ROUTER}/workers/any") == "401"
    # spark-b is a worker: the router's gate there checks the fleet's key with the pattern file derived from
    # it (root-only), as a head's API proxy does; its certificate is spark-b's, from the fleet CA
    assert on("spark-b", "stat -c '%U %a' /etc/sparkfleet/api-key.haproxy /etc/sparkfleet/api-key.curl").split() == [
        "root", "600", "root", "600"]
    assert code(f"curl --cacert /etc/sparkfleet/tls/ca.crt {ROUTER}/loads") == "401"
    routing = on("spark-b", "python3 /usr/local/libexec/sparkfleet/sfl_router.py routing /etc/sparkfleet/router.json")
    table = {b["url"]: b["state"] for b in json.loads(routing.strip().splitlines()[-1])}
    assert table == {"https://198.18.0.11:8000": "routed"}, table  # nothing added with the API key
    # Unchanged: nothing changes (the key compared by sha1, the control key left as it is).
    again = deploy(*WITH_ROUTER)
    assert again.returncode == 0 and again.changed() == [], again.changed()
    assert on("spark-b", f"cat {CONTROL_KEY_FILE}").strip() == control_key
    # No router again: its unit, config, control-plane key and the router hop's certificate and key leave spark-b.
    gone = deploy()
    assert gone.returncode == 0, gone.output[-3000:]
    assert on("spark-b", f"ls {CONTROL_KEY_FILE} /etc/sparkfleet/router.json /etc/sparkfleet/router-proxy.cfg "
                         "/etc/sparkfleet/tls/router-hop.pem 2>/dev/null || echo none").strip() == "none"
    assert on("spark-b", "systemctl is-active sparkfleet-router-proxy", check=False).strip() != "active"


READ_AS = """
import sys
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from sparkfleet import keyfiles

user, sudo, path = sys.argv[1], sys.argv[2] == "sudo", sys.argv[3]
data = {"ssh_user": user, "ssh_key": "/var/lib/sparkfleet-lab/id_ed25519", "ssh_strict_host_key_checking": "yes",
        "ssh_known_hosts_file": "/var/lib/sparkfleet-lab/known_hosts", **({"_sudo": True} if sudo else {})}
inventory = Inventory((["198.18.0.11"], data))
state = State(inventory, Config())
connect_all(state)
try:
    found = keyfiles.read(inventory.get_host("198.18.0.11"), path)
    print("missing" if found is None else f"read {len(found)} bytes")
except keyfiles.KeyFileError as e:
    print(f"refused: {e}")
"""


def read_as(user: str, sudo: bool, path: str = KEY_FILE) -> str:
    done = run([str(BIN / "python"), "-c", READ_AS, user, "sudo" if sudo else "plain", path])
    assert done.returncode == 0, done.output
    return done.output.strip().splitlines()[-1]


def test_a_key_file_is_read_through_the_hosts_sudo_and_without_sudo_it_is_refused_not_missing():
    """What keyfiles.read does over the deploy's connection for a non-root ssh_user: with _sudo (host
    data) it reads as root; without, the file is unreadable (Permission denied), never absent."""
    on("spark-a", "id sfl >/dev/null 2>&1 || useradd -m -s /bin/sh sfl; install -d -m 0700 -o sfl -g sfl ~sfl/.ssh; "
                  "install -m 0600 -o sfl -g sfl /root/.ssh/authorized_keys ~sfl/.ssh/authorized_keys; "
                  "echo 'sfl ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/sfl; chmod 0440 /etc/sudoers.d/sfl")
    try:
        size = len(on("spark-a", f"cat {KEY_FILE}"))
        assert read_as("sfl", sudo=True) == f"read {size} bytes"
        assert read_as("sfl", sudo=True, path="/etc/sparkfleet/no-such-key") == "missing"
        refused = read_as("sfl", sudo=False)
        assert refused.startswith(f"refused: 198.18.0.11: {KEY_FILE} exists but cannot be read: ")
        assert refused.endswith("Permission denied"), refused
    finally:
        on("spark-a", "rm -f /etc/sudoers.d/sfl; userdel -r sfl 2>/dev/null; true")
