"""Drive the lab from tests and benchmarks: deploy, state checks, commands on a lab host."""
import os
import re
import runpy
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.e2e import plan_conformance

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LAB_STATE = Path(os.environ.get("SFL_LAB_STATE", "/var/lib/sparkfleet-lab"))
SSH_CONFIG = LAB_STATE / "ssh_config"
INVENTORY = "lab/inventory.py"
# The pair this process drives (lab/pair.py: SFL_LAB_PAIR, spark-a and spark-b unless it names
# spark-c,spark-d), head first, and where lab.sh puts each host on the management bridge. tests/e2e and
# tests/state stay on spark-a and spark-b (make test runs them there); tests/real and what they share
# with it here follow the variable (make test runs tests/real on spark-c and spark-d at the same time).
_PAIR = runpy.run_path(str(REPO / "lab" / "pair.py"))
HOSTS = _PAIR["lab_pair"]()
HEAD, WORKER = HOSTS
MANAGEMENT = _PAIR["MANAGEMENT"]


def host_renderer(host: str) -> str:
    """The netplan renderer lab.sh brought `host` up with (per host: use_renderer switches one pair)."""
    return _PAIR["renderer"](host, LAB_STATE)
# The four-host lab on a switched fabric (SFL_LAB_HOSTS=4 lab/lab.sh up): two groups of two, or one of four.
FLEET_HOSTS = ("spark-a", "spark-b", "spark-c", "spark-d")
FLEET_INVENTORY = "lab/inventory_fleet.py"
FLEET_ONE_INVENTORY = "lab/inventory_fleet_one.py"

_OP = re.compile(r"^--> Starting operation: (?:\S+ \| )*(?P<name>.*?)\s*$")  # every include prefix off
_RESULT = re.compile(r"^\s*\[(?P<host>[^\]]+)\] (?P<result>Success|No changes|Error.*)\s*$")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A run-time failure as the deploy prints it (sparkfleet/run_failure.py), in either of its two forms:
# a shell step's one line (failure_line; pyinfra puts "[host] " before it, a block's log tail "| "), or
# an operation body's block (RunFailure.block: a title, then four labelled lines).
_FAILURE_LINE = re.compile(r'sparkfleet: (?P<host>[^:\s]+): (?P<waited>"[^"]*"|.+?): (?P<what>.+?); '
                           r"log: (?P<log>ssh root@\S+ .+?); key: (?P<key>[a-z0-9_]+); next: (?P<next>.+)$")
_BLOCK_TITLE = re.compile(r"sparkfleet: (?P<host>[^:\s]+): (?P<what>.+)$")
_BLOCK_LABELS = (("waited for", "waited_for"), ("log", "log"), ("key", "key"), ("next", "next_step"))


@dataclass(frozen=True)
class Failure:
    """One run-time failure's five parts as the run printed them: where, what was waited for (and what
    happened instead), the log command, the data key, the next step; `form`: "line" or "block"."""
    host: str
    waited_for: str
    what: str
    log: str
    key: str
    next_step: str
    form: str


@dataclass
class Run:
    returncode: int
    output: str

    def failures(self) -> list[Failure]:
        """Every run-time failure printed, in order (a block's log tail may repeat a shell step's line)."""
        lines = [_ANSI.sub("", line) for line in self.output.splitlines()]
        found = []
        for i, line in enumerate(lines):
            if m := _FAILURE_LINE.search(line):
                found.append(Failure(m["host"], m["waited"], m["what"], m["log"], m["key"], m["next"], "line"))
            elif (m := _BLOCK_TITLE.search(line)) and lines[i + 1:i + 2] and lines[i + 1].startswith("  waited for:"):
                labelled = lines[i + 1:i + 1 + len(_BLOCK_LABELS)]
                fields = {}
                for (label, name), text in zip(_BLOCK_LABELS, labelled):
                    assert text.startswith(f"  {label}:"), f"a failure block's line is not its {label!r}: {text!r}"
                    fields[name] = text.split(":", 1)[1].strip()
                assert len(fields) == len(_BLOCK_LABELS), "a failure block cut short:\n" + "\n".join(labelled)
                found.append(Failure(m["host"], what=m["what"], form="block", **fields))
        return found

    def failure(self, host: str, key: str, form: str | None = None) -> Failure:
        """The first failure printed for `host` naming data key `key` (of that form); the output when none."""
        found = [f for f in self.failures() if f.host == host and f.key == key and form in (None, f.form)]
        assert found, (f"no failure of {host} naming key {key}{f' as a {form}' if form else ''}; printed: "
                       f"{self.failures()}\n{self.output[-8000:]}")
        return found[0]

    def results(self) -> list[tuple[str, str, str]]:
        """(operation, host, 'Success' | 'No changes' | 'Error...') for every operation result printed."""
        out, op = [], None
        for line in self.output.splitlines():
            if m := _OP.match(line):
                op = m["name"]
            elif (m := _RESULT.match(line)) and op:
                out.append((op, m["host"], m["result"]))
        return out

    def changed(self) -> list[tuple[str, str]]:
        """(operation, host) of every operation that changed something ('Success' in pyinfra's words)."""
        return [(op, host) for op, host, result in self.results() if result == "Success"]


def run(cmd: list[str], timeout=900, **kw) -> Run:
    result = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, **kw)
    return Run(result.returncode, result.stdout)


@dataclass
class DeployTime:
    """One lab deploy's wall time, and each step's: from its "Starting operation" line to the next
    (pyinfra runs an operation on every host before it starts the next), "prepare" up to the first."""
    test: str
    inventory: str
    seconds: float
    steps: dict[str, float]


# Every lab deploy of this session, in order: tests/conftest.py prints where the tiers' time goes
# (per deploy, per step summed over deploys) after the time per module.
DEPLOY_TIMES: list[DeployTime] = []


def _timed(cmd: list[str], timeout=900, env: dict | None = None) -> tuple[Run, dict[str, float], float]:
    """run(), with the time at which each step of pyinfra's output began."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    killed = threading.Event()
    timer = threading.Timer(timeout, lambda: (killed.set(), proc.kill()))  # subprocess.run(timeout=)'s bound
    timer.start()
    lines, steps, step, began = [], {}, "prepare", start
    try:
        for line in proc.stdout:
            lines.append(line)
            if m := _OP.match(line.rstrip("\n")):
                now = time.monotonic()
                steps[step] = steps.get(step, 0.0) + now - began
                step, began = m["name"], now
        proc.wait()
    finally:
        timer.cancel()
    end = time.monotonic()
    steps[step] = steps.get(step, 0.0) + end - began
    if killed.is_set():
        raise subprocess.TimeoutExpired(cmd, timeout, output="".join(lines))
    return Run(proc.returncode, "".join(lines)), steps, end - start


# The benchmark receipt (roles/receipt) is a fixed load through the API after every deploy that restarts
# the pair: about 1.3 s each on the stand-in, taken by 95 of tests/e2e's 119 deploys (make test of
# adce184: 124 s of the tier). The deploys of lab/inventory.py take none unless the test asks
# (receipt=True: tests/e2e/test_lab_serving.py, whose tests are about receipts); the README's path
# (tests/e2e/test_lab_first_pair.py, through inventory.py) and tests/fleet take theirs; tests/real's first
# deploy takes one, its others none (tests/real/conftest.py).
NO_RECEIPT = ("--data", "receipt_enabled=false")


def deploy(*extra: str, inventory: str = INVENTORY, front_door: bool = False, env: dict | None = None,
           timeout: float = 900, receipt: bool = False) -> Run:
    """A lab deploy; one that succeeded must have done exactly what its printed plan said
    (tests/e2e/plan_conformance.py): every end-to-end test that deploys checks that too. Its time and
    each step's are kept in DEPLOY_TIMES. front_door: through `sparkfleet deploy INVENTORY --yes` (the
    README's way: validate, plan, then pyinfra -y), not pyinfra itself; env: the run's environment;
    timeout: seconds before the run is killed; receipt: whether a deploy of lab/inventory.py takes the
    benchmark receipt when it restarts the pair (NO_RECEIPT otherwise; other inventories as they say)."""
    if inventory == INVENTORY and not receipt:
        extra = (*extra, *NO_RECEIPT)
    cmd = ([str(BIN / "sparkfleet"), "deploy", inventory, "--yes", *extra] if front_door
           else [str(BIN / "pyinfra"), "-y", inventory, "deploy.py", *extra])
    result, steps, seconds = _timed(cmd, timeout=timeout, env=env)
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    DEPLOY_TIMES.append(DeployTime(test, inventory, seconds, steps))
    if result.returncode == 0:
        problems = plan_conformance.mismatches(result.output, result.changed())
        assert not problems, ("the deploy did not do what its plan printed:\n  " + "\n  ".join(problems)
                              + f"\n{result.output}")
    return result


def reset_lab(size: int = 2) -> None:
    """Fresh lab hosts (lab/lab.sh reset, as make test's lab tiers start from): the pair, or with
    size 4 the fleet's four on a switch. A reset that fails ends the caller (a benchmark) with its output."""
    r = subprocess.run(["bash", "lab/lab.sh", "reset"], cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "SFL_LAB_HOSTS": str(size)})
    if r.returncode != 0:
        sys.exit(f"lab.sh reset ({size} hosts) failed:\n{r.stdout}{r.stderr}")


def plan(*extra: str, inventory: str = INVENTORY, receipt: bool = False) -> Run:
    """`python -m sparkfleet plan` on the lab: what a deploy would do, changing nothing (exit 0
    nothing, 2 changes, 1 error); its output after the deploy's own prepare output. receipt: as
    deploy()'s, so that a plan and the deploy it predicts are of the same data."""
    if inventory == INVENTORY and not receipt:
        extra = (*extra, *NO_RECEIPT)
    return run([str(BIN / "python"), "-m", "sparkfleet", "plan", inventory, *extra])


def state_checks(*extra: str, path: str = "tests/state", hosts=HOSTS, inventory: str = INVENTORY) -> Run:
    targets = ",".join(f"ssh://{h}" for h in hosts)
    return run([
        str(BIN / "pytest"), path, "-q", "-p", "no:cacheprovider", f"--hosts={targets}",
        f"--ssh-config={SSH_CONFIG}", f"--inventory={inventory}", *extra,
    ])


def on(host: str, command: str, check=True, timeout: float = 120) -> str:
    result = subprocess.run(["ssh", "-F", str(SSH_CONFIG), host, command], capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{host}: `{command}` failed ({result.returncode}): {result.stdout}{result.stderr}")
    return result.stdout


# The lab's API as a client reaches it (roles/tls): TLS on the head's management address, its certificate
# verified with the fleet's trust bundle. On a head (or the router node) the bundle is on the node; anywhere
# else it is fetched from the head first (ca_file, ca_on), as docs/first-pair.md tells a client to.
CA_BUNDLE = "/etc/sparkfleet/tls/ca.crt"
API_PORT = 8000  # the lab profile's port
ROUTER_PORT = 8100  # router_port's default: the router's gate (roles/router/gate.py), over TLS too
NODE_PEM = "/etc/sparkfleet/tls/api.pem"  # a node's server certificate, then its key (roles/tls)
HOP_PEM = "/etc/sparkfleet/tls/router-hop.pem"  # the router hop's client certificate and key, on the router node


def head_api(host: str = HEAD, port: int = API_PORT) -> str:
    """https://<the head's management address>:<port>: what its certificate names."""
    return f"https://{management_address(host)}:{port}"


def router_api(host: str) -> str:
    """https://<the router node's management address>:<router_port>: the fleet's endpoint, its gate's
    certificate from the fleet CA for that address."""
    return head_api(host, ROUTER_PORT)


def api_curl(extra: str = "") -> str:
    """curl on a head as every sparkfleet probe runs it there: the key from its root-only config, the
    certificate verified with the node's bundle (never -k)."""
    return f"curl -K /etc/sparkfleet/api-key.curl --cacert {CA_BUNDLE}{' ' + extra if extra else ''}"


def models_command(host: str = HEAD) -> str:
    """GET /v1/models through the head's proxy, run on the head: the lab tests' 'it serves' probe."""
    return f"{api_curl('-fsS -m 10')} {head_api(host)}/v1/models"


def ca_file(head: str = HEAD) -> Path:
    """The fleet's trust bundle as a client gets it: from the head over SSH, into a file on the controller
    (one per head, fetched again each call: a test may have made a new CA)."""
    path = LAB_STATE / f"ca-{head}.crt"
    path.write_text(on(head, f"cat {CA_BUNDLE}"))
    return path


def ca_on(host: str, head: str = HEAD) -> str:
    """The head's bundle copied to `host` (a worker has none), at a path curl there can name."""
    text = on(head, f"cat {CA_BUNDLE}")
    subprocess.run(["ssh", "-F", str(SSH_CONFIG), host, "cat > /tmp/sparkfleet-ca.crt"], input=text, text=True,
                   check=True, timeout=60)
    return "/tmp/sparkfleet-ca.crt"


def tls_context(head: str = HEAD):
    """Python's ssl context that trusts the fleet's CA alone (for urllib from the controller)."""
    import ssl

    return ssl.create_default_context(cafile=str(ca_file(head)))


def management_address(host: str) -> str:
    """Where the lab's ssh reaches `host` (lab.sh writes SSH_CONFIG): its management address."""
    name = None
    for line in SSH_CONFIG.read_text().splitlines():
        words = line.split()
        if words[:1] == ["Host"]:
            name = words[1]
        elif words[:1] == ["HostName"] and name == host:
            return words[1]
    raise AssertionError(f"{host} is not in {SSH_CONFIG}")


_LOG_FILE = re.compile(r"^(?:cat|tail -n \d+) (?P<path>/\S+)$")


def read_failure_log(failure: Failure, host: str | None = None) -> str:
    """Run the log command a failure printed, exactly as printed (`ssh root@<address> '<command>'`, the
    operator's ssh given the lab's key and known hosts), and return what it shows. It must reach
    `host` (the failing node unless said), show something, and a log file it names must be
    root-only (0600) there."""
    host = host or failure.host
    result = run_printed(failure.log, host)
    assert result.returncode == 0, f"{failure.log} failed ({result.returncode}): {result.stdout}{result.stderr}"
    shown = result.stdout.strip()
    assert shown and not shown.startswith("-- No entries --"), f"{failure.log} shows nothing"
    if m := _LOG_FILE.match(shlex.split(failure.log)[2]):
        assert on(host, f"test -s {m['path']} && stat -c %a {m['path']}").strip() == "600", m["path"]
    return result.stdout


def run_printed(command: str, host: str) -> subprocess.CompletedProcess:
    """A command sparkfleet printed for the operator (`ssh root@<address> '<command>'`), run as printed
    (the operator's ssh given the lab's key and known hosts); it must be the one that reaches `host`."""
    argv = shlex.split(command)
    assert len(argv) == 3 and argv[0] == "ssh", f"not one ssh command: {command}"
    assert argv[1] == f"root@{management_address(host)}", f"{command} does not reach {host}"
    return subprocess.run(
        ["ssh", "-i", str(LAB_STATE / "id_ed25519"), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", f"UserKnownHostsFile={LAB_STATE / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes", *argv[1:]],
        capture_output=True, text=True, timeout=120)


def fabric_rx_bytes(host: str) -> int:
    """Bytes the host has received on its fabric netdev (what crossed the CX7 link to it)."""
    return int(on(host, "cat /sys/class/net/enp1s0f0np0/statistics/rx_bytes"))


def pause_watchdogs(hosts=HOSTS) -> None:
    """Stop sparkfleet-watchdog on every node, the head's first, before a test breaks the pair on
    purpose: the watchdog would repair it under the test. The next deploy hands the pair back to the
    watchdogs and starts them (roles/watchdog, step 10)."""
    for host in hosts:
        on(host, "systemctl stop sparkfleet-watchdog 2>/dev/null || true")


# lab.sh waits (SFL_LAB_LOCK_WAIT, 900 s) while another lab.sh holds the lab's lock (make test's other
# pair rebooting its hosts), then does its own work (a power cut's boot: up to a few minutes).
LAB_SH_TIMEOUT = 900 + 300
_WAITED = re.compile(r"^lab: waited ([0-9.]+) s for another lab\.sh$", re.M)


def reboot(*hosts: str, power_cut=False) -> float:
    """The lab's reboot (systemd's own) or power cut of `hosts`, then the hosts booted again; the seconds
    it waited for another lab.sh before the fault (the other pair's reboot holding the lab's lock)."""
    cmd = ["bash", "lab/lab.sh", "reboot", *(["--power-cut"] if power_cut else []), *hosts]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=LAB_SH_TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    return sum(float(m) for m in _WAITED.findall(r.stdout))


def use_renderer(renderer: str, hosts=HOSTS) -> None:
    """Make this process's pair of hosts run `renderer` (NetworkManager or networkd) as netplan's (a host
    is rebooted when it changes; the lab's other hosts are left as they are: SFL_LAB_RENDERER_HOSTS); the
    lab remembers it per host, and lab/inventory.py gives it to the deploy and the state checks."""
    r = subprocess.run(["bash", "lab/lab.sh", "up"], cwd=REPO, capture_output=True, text=True, timeout=LAB_SH_TIMEOUT,
                       env={**os.environ, "SFL_LAB_RENDERER": renderer, "SFL_LAB_RENDERER_HOSTS": " ".join(hosts)})
    assert r.returncode == 0, r.stdout + r.stderr


def running_tag(host: str, container: str) -> str:
    """The sparkfleet/<profile>:<commit> tag of the image a rank's container runs. The head runs its
    build by that tag; a worker runs the head's registry digest (roles/image) and tags the same image
    ID with the plain name, so the tag says which commit either runs."""
    image_id = on(host, f"docker inspect --format '{{{{.Image}}}}' {container}").strip()
    tags = on(host, f"docker image inspect --format '{{{{join .RepoTags \" \"}}}}' {image_id}").split()
    local = [t for t in tags if t.startswith("sparkfleet/")]
    return local[0] if len(local) == 1 else f"{image_id} tagged {' '.join(sorted(tags)) or 'nothing'}"
