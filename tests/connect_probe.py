"""Try TCP connections at once and say what each got, as the user running it: the firewall's output
chain judges a connection by its socket's user, so the unit tier runs this as root and as other users
in a network namespace of its own (tests/unit/netns_firewall.py), the lab on a node as a user it
created and in a container on the host's network (tests/e2e/local_users.py).

Python 3's standard library only, no import from this repository: it is sent as `python3 -c` source
to wherever it runs. Arguments: the timeout in seconds, a JSON list of [host, port], and optionally a
firewall mark every socket carries (SO_MARK, root only: tests/state/test_firewall.py routes by it).
Prints a JSON list of results in the same order, each one of:
  answered  connected, and the server sent something first (a banner, rsyncd's greeting)
  open      connected, nothing sent within READ_WAIT_S (an HTTP server waits for the request)
  refused   ECONNREFUSED: nothing listens, or the firewall's reject (a TCP reset, at once)
  timeout   no answer at all (a drop on the way)
  <errno>   anything else, by its errno name (EPERM: a drop in this node's output chain)
"""
import errno
import json
import socket
import sys
import threading


# How long a connected socket waits for the server to speak first. Either way the port was reached;
# a greeting server (rsyncd) speaks at once, and an HTTP server never will, so waiting out the whole
# connect timeout there only cost each probe of an open port its seconds.
READ_WAIT_S = 1.0


def probe(host, port, timeout, mark=None):
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.settimeout(timeout)
    if mark is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
    try:
        sock.connect(address)
    except socket.timeout:
        sock.close()
        return "timeout"
    except OSError as err:
        sock.close()
        return "refused" if err.errno == errno.ECONNREFUSED else errno.errorcode.get(err.errno, str(err))
    try:
        sock.settimeout(min(timeout, READ_WAIT_S))
        return "answered" if sock.recv(1) else "open"
    except socket.timeout:
        return "open"
    except OSError:
        return "open"
    finally:
        sock.close()


def main(argv):
    timeout, targets = float(argv[1]), json.loads(argv[2])
    mark = int(argv[3]) if len(argv) > 3 else None
    results = [""] * len(targets)

    def run(i, host, port):
        results[i] = probe(host, int(port), timeout, mark)

    threads = [threading.Thread(target=run, args=(i, h, p)) for i, (h, p) in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv)
