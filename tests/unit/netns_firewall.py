"""A node's rendered firewall, loaded for real in a network namespace of its own, and connections tried
through it as root and as other users (tests/unit/test_firewall_local_users.py).

Run as root by the test inside `unshare -n -m` (a network and a mount namespace, both gone when this
ends: the machine's ruleset, links and /etc are never touched); reads its spec as JSON on stdin and
prints the probes' results as JSON. It builds the node as the deploy leaves it, as far as a namespace
can:
  - /etc under an overlay whose changes die with the namespace, and in it the users the rules name,
    made as the deploy makes them: `prometheus` by the command roles/monitoring's user step runs
    (the packages' own postinst line), a package's user (haproxy) when this machine lacks it;
  - loopback up; each half of the fabric port a veth named as the node's netdev, with the node's
    fabric address, its other end in a second namespace (the peer) with the peer's; the management
    address on a link of its own;
  - the rules loaded with `nft -c -f`, then `nft -f`, as roles/firewall applies them;
  - listeners as root (each sends a line on accept), one as another user (a daemon that runs as its
    own user: the registry), one in the peer;
  - tests/connect_probe.py run as each user asked, with setpriv (uid, gid, no supplementary groups),
    on the node or in the peer.
"""
import json
import os
import pwd
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

PROBE = (Path(__file__).resolve().parents[1] / "connect_probe.py").read_text()
# A listener for another user or namespace: sends a line on every connection (the probe's `answered`).
LISTENER = """
import socket, sys
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(family, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"sparkfleet\\n")
    c.close()
"""


def sh(*argv: str) -> None:
    run = subprocess.run(argv, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {run.returncode}: {run.stderr.strip()}")


def listen(host: str, port: int) -> None:
    """A root listener on (host, port), in this process: answers every connection with a line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # torch's store: every address, both families
    s.bind((host, port))
    s.listen(16)

    def serve():
        while True:
            c, _ = s.accept()
            c.sendall(b"sparkfleet\n")
            c.close()

    threading.Thread(target=serve, daemon=True).start()


def as_user(user: str, python: str) -> list[str]:
    """The command prefix that runs `python` as `user` (root: as is)."""
    if user == "root":
        return [python]
    entry = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", python]


def started(argv: list[str]) -> subprocess.Popen:
    """A listener process, once it listens."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        raise SystemExit(f"{' '.join(argv[:6])}: did not listen: {line}{proc.stderr.read()}")
    return proc


def main() -> None:
    spec = json.load(sys.stdin)
    python = spec["python"]
    # /etc as the node's: an overlay, its changes gone with this mount namespace.
    upper = spec["workdir"]  # the test's temporary directory
    os.makedirs(f"{upper}/u")
    os.makedirs(f"{upper}/w")
    sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir=/etc,upperdir={upper}/u,workdir={upper}/w", "/etc")
    sh("sh", "-c", spec["adduser"])
    for user in spec["package_users"]:
        sh("sh", "-c", f"getent passwd {user} >/dev/null || adduser --quiet --system --group --no-create-home {user}")

    sh("ip", "link", "set", "lo", "up")
    peer = subprocess.Popen(["unshare", "-n", "sleep", "600"])
    try:
        time.sleep(0.2)
        pid = str(peer.pid)
        sh("nsenter", "-t", pid, "-n", "ip", "link", "set", "lo", "up")
        for i, link in enumerate(spec["links"]):
            sh("ip", "link", "add", link["name"], "type", "veth", "peer", "name", f"peer{i}", "netns", pid)
            sh("ip", "addr", "add", link["address"], "dev", link["name"])
            sh("ip", "link", "set", link["name"], "up")
            sh("nsenter", "-t", pid, "-n", "ip", "addr", "add", link["peer_address"], "dev", f"peer{i}")
            sh("nsenter", "-t", pid, "-n", "ip", "link", "set", f"peer{i}", "up")
        sh("ip", "link", "add", "mgmt0", "type", "veth", "peer", "name", "mgmt1")
        sh("ip", "addr", "add", spec["management"], "dev", "mgmt0")
        sh("ip", "link", "set", "mgmt0", "up")
        sh("ip", "link", "set", "mgmt1", "up")

        rules = Path(upper, "firewall.nft")
        rules.write_text(spec["rules"])
        sh("nft", "-c", "-f", str(rules))
        sh("nft", "-f", str(rules))

        for host, port in spec["listen"]:
            listen(host, port)
        others = [started(as_user(user, python) + ["-c", LISTENER, host, str(port)])
                  for user, host, port in spec["listen_as"]]
        others += [started(["nsenter", "-t", pid, "-n", python, "-c", LISTENER, host, str(port)])
                   for host, port in spec["peer_listen"]]
        time.sleep(0.5)  # the peer's addresses past duplicate address detection, every listener up

        results = []
        for p in spec["probes"]:
            where = ["nsenter", "-t", pid, "-n"] if p.get("in_peer") else []
            run = subprocess.run(where + as_user(p["user"], python) + ["-c", PROBE, "2", json.dumps(p["targets"])],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                raise SystemExit(f"probe as {p['user']}: {run.stderr}")
            results.append(json.loads(run.stdout))
        for proc in others:
            proc.kill()
        print(json.dumps({"probes": results, "table": subprocess.run(
            ["nft", "list", "chain", "inet", "sparkfleet", "output"], capture_output=True, text=True).stdout}))
    finally:
        peer.kill()


if __name__ == "__main__":
    main()
