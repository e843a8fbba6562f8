"""`sparkfleet capture INVENTORY` (`make capture INVENTORY=...`): a user's machines become fixtures.

Read-only. It runs what a deploy reads before it changes anything (the deploy's prepare under
`--dry`, as `sparkfleet plan` does: the lock only read, never taken) and then the doctor, with a
recorder on pyinfra's fact layer: every fact command either reads on every node is kept with its raw
output, per node, in one bundle (JSON), with sparkfleet's version and commit. The bundle is what a
parser needs to be tested on a real machine: the command as sparkfleet ran it, the lines the node
printed, and the fact's own arguments.

No secret is in it: sparkfleet never reads a key or token file's content into a fact
(sparkfleet/keyfiles.py: its readings print a state, never the key), the commands are pyinfra's
masked values, and the recorder keeps stdout only (never stderr, never an operation's output). The
lab's end-to-end tier proves it: the bundle of a deployed lab pair holds none of the nodes'
root-only files' contents (tests/e2e/test_lab_capture.py).

The recorder is installed by config.py only when CAPTURE_VAR names a directory (this command sets
it for the runs it starts); a deploy never records. `replay_facts()` answers pyinfra's fact layer
from a bundle instead of the nodes, so the unit tier takes the plan of a captured pair with the
deploy's own readers and verdicts (tools/replay.py; tests/unit/test_capture.py replays the lab's own
bundle).
"""
from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
CAPTURE_VAR = "SPARKFLEET_CAPTURE_DIR"  # set by this command only: the run records its facts there
FORMAT = 1


def fact_path(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def kwargs_key(kwargs: dict) -> str:
    """A fact's arguments as one comparable text (the same call in capture and in replay)."""
    return json.dumps({k: v for k, v in kwargs.items() if k != "self"}, sort_keys=True, default=str)


def _fact_call(state, host, cls, args, kwargs) -> tuple[str, dict]:
    """(fact path, the fact's own arguments) as pyinfra computes them for its command."""
    from pyinfra.api.facts import _handle_fact_kwargs

    fact_kwargs, _ = _handle_fact_kwargs(state, host, cls, args, kwargs)
    return fact_path(cls), {k: v for k, v in fact_kwargs.items() if k != "self"}


# ---------------------------------------------------------------------------------------- recording

def install_recorder() -> bool:
    """In a run started by `sparkfleet capture` (CAPTURE_VAR set): keep every fact's command and raw
    stdout, per host, as JSON lines in that directory. False (and nothing installed) otherwise."""
    directory = os.environ.get(CAPTURE_VAR)
    if not directory:
        return False
    import gevent
    from pyinfra.api import facts as pyinfra_facts
    from pyinfra.api.host import Host

    out = Path(directory) / f"facts-{os.getpid()}.jsonl"
    pending: dict = {}  # greenlet -> the record its fact is filling (a fact runs one command)
    original_get_fact, original_run = pyinfra_facts._get_fact, Host.run_shell_command

    def run_shell_command(self, command, *args, **kwargs):
        status, output = original_run(self, command, *args, **kwargs)
        record = pending.get(gevent.getcurrent())
        if record is not None and record["host"] == self.name and "command" not in record:
            masked = command.get_masked_value() if hasattr(command, "get_masked_value") else str(command)
            record.update(command=masked, status=bool(status), stdout=list(output.stdout_lines))
        return status, output

    def get_fact(state, host, cls, args=None, kwargs=None, *rest, **kw):
        path, fact_kwargs = _fact_call(state, host, cls, args, kwargs)
        me = gevent.getcurrent()
        record = pending[me] = {"host": host.name, "fact": path, "kwargs": fact_kwargs}
        try:
            return original_get_fact(state, host, cls, args, kwargs, *rest, **kw)
        finally:
            pending.pop(me, None)
            if "command" in record:
                with out.open("a") as f:  # one write per record; greenlets do not interleave it
                    f.write(json.dumps(record, default=str) + "\n")

    pyinfra_facts._get_fact = get_fact
    Host.run_shell_command = run_shell_command
    return True


def version() -> dict:
    """sparkfleet's package version and the checkout's commit (with -dirty when it has changes)."""
    from importlib.metadata import PackageNotFoundError, version as package_version

    try:
        number = package_version("sparkfleet")
    except PackageNotFoundError:
        number = "unknown"
    commit = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=REPO,
                            capture_output=True, text=True)
    return {"version": number, "commit": commit.stdout.strip() if commit.returncode == 0 else "unknown"}


def merge_records(lines: list[dict]) -> dict[str, list[dict]]:
    """host -> its records in the order first read; a fact read again with the same arguments (by the
    doctor after the plan, or twice in one run) is kept once, as first read."""
    nodes: dict[str, list[dict]] = {}
    seen = set()
    for record in lines:
        key = (record["host"], record["fact"], kwargs_key(record["kwargs"]))
        if key in seen:
            continue
        seen.add(key)
        nodes.setdefault(record["host"], []).append({k: v for k, v in record.items() if k != "host"})
    return nodes


# What the command runs, each read-only: the deploy's prepare as a plan (the lock only read), then
# the doctor, which reads the plan's facts and its own.
def runs(inventory: str, plan_dir: str) -> list[tuple[str, list[str], dict]]:
    from sparkfleet.plan_command import PLAN_DIR_VAR, pyinfra_command

    pyinfra = str(Path(sys.executable).parent / "pyinfra")
    return [("plan", pyinfra_command(inventory, []), {PLAN_DIR_VAR: plan_dir}),
            ("doctor", [pyinfra, "-y", inventory, "doctor.py"], {})]


def main(inventory: str, out: str | None) -> int:
    """Exit 0: the bundle is written and every host of the inventory is in it; 1: it is not (the
    runs' own output says why). What the plan or the doctor judged is not this command's verdict."""
    from sparkfleet.inventory import load_inventory

    hosts = [h.name for h in load_inventory(REPO / inventory, cwd=str(REPO))]  # as the runs (cwd REPO) read it
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = Path(out or f"sparkfleet-capture-{stamp}.json")
    with tempfile.TemporaryDirectory(prefix="sparkfleet-capture.") as tmp:
        done = []
        for what, command, env in runs(inventory, tmp):
            print(f"--> sparkfleet capture: the {what}'s reads ({' '.join(command[1:])})", flush=True)
            proc = subprocess.run(command, cwd=REPO, env={**os.environ, **env, CAPTURE_VAR: tmp},
                                  stdout=subprocess.DEVNULL if what == "plan" else None)
            done.append({"what": what, "exit": proc.returncode})
        lines = [json.loads(line) for path in sorted(Path(tmp).glob("facts-*.jsonl"))
                 for line in path.read_text().splitlines()]
    nodes = merge_records(lines)
    bundle = {"format": FORMAT, "sparkfleet": version(), "captured_at": stamp, "inventory": inventory,
              "runs": done, "nodes": {h: nodes.get(h, []) for h in hosts}}
    # The user's machines in detail (addresses, versions, paths): root's or the user's own, 0600.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(bundle, f, indent=1, sort_keys=False)
        f.write("\n")
    counts = ", ".join(f"{h} {len(bundle['nodes'][h])} facts" for h in hosts)
    print(f"--> sparkfleet capture: wrote {target} ({counts}; plan exit {done[0]['exit']}, doctor exit "
          f"{done[1]['exit']}: read-only, nothing was changed)")
    missing = [h for h in hosts if not bundle["nodes"][h]]
    if missing:
        print(f"sparkfleet capture: nothing was read on {', '.join(missing)} (unreachable, or refused before any "
              f"read: the output above says which)", file=sys.stderr)
        return 1
    return 0


# ------------------------------------------------------------------------------------------- replay

def load(path: str | os.PathLike) -> dict:
    bundle = json.loads(Path(path).read_text())
    if bundle.get("format") != FORMAT:
        raise ValueError(f"{path}: bundle format {bundle.get('format')!r}, this sparkfleet reads {FORMAT}")
    return bundle


def fact_class(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def processed(cls, record: dict):
    """What the fact gives the deploy for this record: its own parser on the lines, as pyinfra
    calls it (a failed command or no output at all: the fact's default). The command is built first,
    as pyinfra builds it: some facts keep their arguments there for the parser (pyinfra's Sha1File)."""
    fact = cls()
    if callable(fact.command):
        fact.command(**record["kwargs"])
    return fact.process(record["stdout"]) if record["status"] and record["stdout"] else fact.default()


@contextlib.contextmanager
def replay_facts(bundle: dict) -> Iterator[list[str]]:
    """pyinfra's fact layer answered from the bundle, not the nodes: every fact a reader asks of a
    host is its recorded output through the fact's own parser. Yields the list of facts asked for
    that the bundle does not hold (each also raises LookupError where it was asked)."""
    from pyinfra.api import facts as pyinfra_facts

    table = {(host, r["fact"], kwargs_key(r["kwargs"])): r for host, records in bundle["nodes"].items()
             for r in records}
    missing: list[str] = []
    original = pyinfra_facts._get_fact

    def get_fact(state, host, cls, args=None, kwargs=None, *rest, **kw):
        path, fact_kwargs = _fact_call(state, host, cls, args, kwargs)
        record = table.get((host.name, path, kwargs_key(fact_kwargs)))
        if record is None:
            missing.append(f"{host.name}: {path}({kwargs_key(fact_kwargs)})")
            raise LookupError(f"the bundle holds no {path} of {host.name} with {kwargs_key(fact_kwargs)}")
        return processed(cls, record)

    pyinfra_facts._get_fact = get_fact
    try:
        yield missing
    finally:
        pyinfra_facts._get_fact = original


def replay_state(bundle: dict, inventory: str | None = None):
    """A pyinfra State of the bundle's inventory (or `inventory`), every host active, connected to
    nothing: with replay_facts, the deploy's readers run on the captured answers."""
    from pyinfra.api import Config, State

    from sparkfleet.inventory import load_inventory

    state = State(load_inventory(inventory or bundle["inventory"], cwd=str(REPO)), Config())
    for host in state.inventory:
        state.activate_host(host)
    return state
