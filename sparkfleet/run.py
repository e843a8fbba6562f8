"""What sparkfleet adds to a pyinfra run of its own deploy files (deploy.py, doctor.py, rollback.py).

pyinfra's CLI runs config.py, then builds the inventory (the inventory file, every group data
file, --group-data directories, --data), then initialises its state, then connects. `install()`
(called by config.py, and by sparks() in an inventory) wraps that initialisation, so:

1. Before any connection, the data pyinfra merged for every host (host.data, exactly what the
   deploy reads) is validated once, whatever its source and whether or not the inventory calls
   sparks(): the config model, every invariant across nodes, every guard that needs no facts. A
   refusal prints one block naming host, key, value found, where it came from (file and line,
   or --data) and what to do, and exits 2. An inventory with no hosts is refused the same way.
2. During the run, an expected refusal (sparkfleet.refusal.Refusal, or pyinfra's DeployError
   that the roles raise) is printed as one block, at prepare or inside an operation, never with
   a traceback; any other exception keeps pyinfra's traceback.
3. When a host cannot be reached or fails, the run ends with one block naming the host, the
   address tried and the reason, and what happened on the others, instead of pyinfra's bare
   "Over 0% of hosts failed"; when the run had paused watchdogs it did not start again, that block
   ends saying where they stay paused until the next successful deploy, and how to check.

Runs whose operations are not sparkfleet's own files (`pyinfra inventory.py exec -- uptime`,
`fact`, `debug-inventory`) are left alone: they read no sparkfleet data, and they must work on an
inventory that is still being fixed.
"""
from __future__ import annotations

import ast
import logging
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from pyinfra import logger
from pyinfra.api.exceptions import DeployError, PyinfraError
from pyinfra.api.state import BaseStateCallback, StateStage
from pyinfra.context import ctx_host, ctx_state

from sparkfleet.model.serving import SECRET_BEARING_KEYS, withhold_secrets
from sparkfleet.config import ConfigError, build_cluster
from sparkfleet.refusal import Problem, Refusal, as_problem, block, is_expected, merge_hosts, refusal_block
from sparkfleet.watchdog_handover import PAUSE_STEPS, START_STEPS, paused_note, resumed_on

REPO = Path(__file__).resolve().parent.parent
NOTHING_CHANGED = "Nothing was changed: no host was contacted."


# --- where a host's value came from ----------------------------------------------------------------

def _display(path: str | os.PathLike, cwd: str | None) -> str:
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path(cwd or os.getcwd()).resolve()))
    except ValueError:
        return str(p)


class _Lines:
    """Line numbers of data in Python files: module-level `key = ...`, and `"key": ...` in dicts."""

    def __init__(self):
        self._trees: dict[str, ast.Module | None] = {}

    def _tree(self, path: str) -> ast.Module | None:
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse(Path(path).read_text(), filename=path)
            except (OSError, SyntaxError, ValueError):
                self._trees[path] = None
        return self._trees[path]

    def assignment(self, path: str, key: str) -> int | None:
        tree, line = self._tree(path), None
        for node in tree.body if tree else ():
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == key for t in targets):
                line = node.lineno
        return line

    def dict_key(self, path: str, key: str, host: str | None = None) -> int | None:
        """The line of `"key":` in the host's own (name, {...}) tuple, else in any dict of the file."""
        tree = self._tree(path)
        if tree is None:
            return None
        anywhere = None
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple) and len(node.elts) == 2 and host is not None:
                name, data = node.elts
                if isinstance(name, ast.Constant) and name.value == host and isinstance(data, ast.Dict):
                    for k in data.keys:
                        if isinstance(k, ast.Constant) and k.value == key:
                            return k.lineno
            if isinstance(node, ast.Dict) and anywhere is None:
                for k in node.keys:
                    if isinstance(k, ast.Constant) and k.value == key:
                        anywhere = k.lineno
                        break
        return anywhere


# The site fronts loaded in this process (sparkfleet.inventory.site_front): the front inventory file
# (resolved) -> the site's pyinfra Inventory and inventory file, so a key the front hands over as host
# data is traced to where the site sets it (its inventory or its group_data), not to the front.
SITE_FRONTS: dict[str, tuple[Any, str]] = {}


@dataclass
class DataSources:
    """Which layer of pyinfra's merged host data a value came from, as pyinfra merges them:
    --data (override) > the host's data in the inventory > its groups' data (group data files or
    the inventory's groups; the last group wins) > the all group (group_data/all.py)."""

    inventory: Any
    inventory_file: str | None = None
    cwd: str | None = None
    data_args: tuple[str, ...] = ()
    group_data_dirs: tuple[str, ...] = ()
    lines: _Lines = field(default_factory=_Lines)

    def folders(self) -> list[str]:
        folders = []
        if self.cwd:
            folders.append(str(Path(self.cwd) / "group_data"))
        if self.inventory_file:
            inventory_dir = str(Path(self.inventory_file).parent.resolve())
            if inventory_dir != self.cwd:
                folders.append(str(Path(inventory_dir) / "group_data"))
        return folders + list(self.group_data_dirs)

    def _inventory_source(self, key: str, host: str | None) -> str:
        if not self.inventory_file:
            return "the inventory"
        line = self.lines.dict_key(self.inventory_file, key, host)
        return _display(self.inventory_file, self.cwd) + (f" line {line}" if line else "")

    def _group_source(self, group: str, key: str) -> str:
        found = None
        for folder in self.folders():
            path = Path(folder)
            candidate = path if path.is_file() and path.stem == group else path / f"{group}.py"
            if candidate.is_file() and candidate.suffix == ".py":
                line = self.lines.assignment(str(candidate), key)
                if line is not None:
                    found = f"{_display(candidate, self.cwd)} line {line}"
        return found or self._inventory_source(key, None)

    def of(self, host_name: str, key: str) -> str | None:
        """Where `key` of `host_name` came from; None when it is not set (the model's default)."""
        inv = self.inventory
        if key in inv.get_override_data():
            raw = [a for a in self.data_args if a.split("=", 1)[0] == key]
            if raw and key in SECRET_BEARING_KEYS:
                shown = withhold_secrets(inv.get_override_data()[key])
                return f"--data {key}={shown!r}" if shown != inv.get_override_data()[key] else f"--data {raw[-1]}"
            return f"--data {raw[-1]}" if raw else "the command line"
        if key in inv.get_host_data(host_name):
            site = SITE_FRONTS.get(str(Path(self.inventory_file).resolve())) if self.inventory_file else None
            if site is not None:  # the root inventory.py: the host's data is the site's, merged
                return DataSources(site[0], site[1], self.cwd).of(host_name, key)
            return self._inventory_source(key, host_name)
        host = inv.get_host(host_name, None)
        for group in reversed(list(getattr(host, "groups", []) or [])):
            if key in inv.get_group_data(group):
                return self._group_source(group, key)
        if key in inv.get_data():
            return self._group_source("all", key)
        return None

    def attribute(self, problem: Problem, all_hosts: list[str]) -> Problem:
        if problem.sources or not problem.key:
            return problem
        per_host = {h: self.of(h, problem.key) for h in (problem.hosts or all_hosts) if h in all_hosts}
        distinct = list(dict.fromkeys(per_host.values()))
        if distinct == [None]:
            sources = [f"not set: {problem.key!r} has its default"]
        elif len(distinct) == 1:
            sources = [distinct[0]]
        else:
            sources = [f"{src or 'its default'} ({h})" for h, src in per_host.items()]
        where = next((s for s in distinct if s), None)
        fix = problem.fix
        if where:
            fix = fix or "change it where it is set (from: above)"
        elif problem.key:
            fix = fix or (f"set {problem.key} in your site's group_data/all.py (every node) or in its inventory "
                             f"(one node)")
        if "roles/serving/profiles/" in problem.detail or ".yaml" in problem.detail:
            fix = "correct the profile file named above, or choose another serving_profile"
        return problem.replace(sources=tuple(sources), fix=fix)


def validate_inventory(inventory, sources: DataSources, extra_problems: Iterable[Problem] = ()):
    """The cluster of an inventory as pyinfra merged it; every problem raises one Refusal with the
    source of each value. Used before connecting (the CLI) and by load_cluster (tests, config printer)."""
    names = [h.name for h in inventory]
    where = _display(sources.inventory_file, sources.cwd) if sources.inventory_file else "the inventory"
    problems = list(extra_problems)
    if not names and not problems:  # (with problems: the inventory said why it has none, e.g. no site)
        raise Refusal(
            f"{where}: the inventory has no hosts; a sparkfleet inventory declares every node, e.g. "
            f"spark_hosts = sparks(__file__, (\"spark-a\", {{\"ssh_hostname\": ..., \"rank\": 0, "
            f"\"fabric_address\": ...}}), ...)", footer=NOTHING_CHANGED,
        )
    cluster = None
    try:
        cluster = build_cluster([(h.name, h.data.dict()) for h in inventory]) if names else None
    except ConfigError as err:
        problems += [as_problem(p, names) for p in err.problems]
    if problems:
        problems = merge_hosts(sources.attribute(p, names) for p in problems)
        raise Refusal(
            f"{where}: refused before connecting to any host ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''} in the data)", problems, footer=NOTHING_CHANGED,
        )
    return cluster


# --- the hook into pyinfra's CLI ------------------------------------------------------------------

@dataclass
class RunContext:
    inventory_arg: str
    cwd: str
    data_args: tuple[str, ...]
    group_data_dirs: tuple[str, ...]
    inventory_problems: list[Problem] = field(default_factory=list)
    connect_errors: dict[str, str] = field(default_factory=dict)
    failed_ops: dict[str, list[str]] = field(default_factory=dict)
    printed: set[str] = field(default_factory=set)
    # (host, op hash, "pause" or "start") of each watchdog pause and start that ended well, and the
    # nodes whose watchdogs a failed prewarm started again itself (sparkfleet/watchdog_handover.py).
    watchdog_ops: list[tuple[Any, str, str]] = field(default_factory=list)
    watchdogs_resumed: set[str] = field(default_factory=set)

    @property
    def inventory_file(self) -> str | None:
        path = Path(self.cwd) / self.inventory_arg
        return str(path) if path.is_file() else None


def _cli_params() -> dict | None:
    try:
        import click
    except ImportError:  # pragma: no cover
        return None
    ctx = click.get_current_context(silent=True)
    return ctx.params if ctx is not None and "operations" in ctx.params else None


def is_sparkfleet_run(operations: Iterable[str], cwd: str) -> bool:
    """Every operation is a Python file of this repository (deploy.py, doctor.py, rollback.py, bench/...)."""
    operations = list(operations)
    if not operations:
        return False
    for op in operations:
        path = (Path(cwd) / op).resolve()
        if path.suffix != ".py" or not path.is_file() or REPO not in path.parents:
            return False
    return True


def current_run() -> RunContext | None:
    """The sparkfleet context of this pyinfra CLI run, when install() took it over."""
    if not ctx_state.isset():
        return None
    run = getattr(ctx_state.get(), "_sparkfleet_run", None)
    return run or None


def install() -> RunContext | None:
    """Take over a pyinfra CLI run of sparkfleet's deploy files (idempotent; no-op outside the CLI)."""
    params = _cli_params()
    if params is None or not ctx_state.isset():
        return None
    st = ctx_state.get()
    if hasattr(st, "_sparkfleet_run"):
        return st._sparkfleet_run or None
    cwd = st.cwd or os.getcwd()
    if not is_sparkfleet_run(params.get("operations") or (), cwd):
        st._sparkfleet_run = False
        return None
    run = RunContext(
        inventory_arg=params.get("inventory") or "", cwd=cwd, data_args=tuple(params.get("data") or ()),
        group_data_dirs=tuple(params.get("group_data") or ()),
    )
    st._sparkfleet_run = run
    # pyinfra's CLI calls state.init(inventory, ...) once the inventory is merged and right before
    # connect_all: the one point that sees all the data and comes before any socket. Validating
    # here (not in a host_before_connect callback) also keeps the refusal in the main greenlet, and
    # init resets the callback handlers, so ours is added after it.
    original_init = st.init

    def init(inventory, config, initial_limit=None):
        _refuse_before_connecting(run, inventory)
        original_init(inventory, config, initial_limit=initial_limit)
        st.add_callback_handler(_Recorder(run))  # state.init resets the handlers: added after it
        _wrap_fail_hosts(st, run)

    st.init = init
    _install_log_filter()
    return run


def _refuse_before_connecting(run: RunContext, inventory) -> None:
    sources = DataSources(inventory, run.inventory_file, run.cwd, run.data_args, run.group_data_dirs)
    try:
        validate_inventory(inventory, sources, run.inventory_problems)
    except Refusal as err:
        _stop(run, "--> " + err.block(), code=2)


# --- during the run: record failures, print refusals as blocks --------------------------------------

def step_name(op_name: str) -> str:
    """An operation's own name: pyinfra names an operation of an included file "<file> | <name>" (the
    lab's run printed "roles/watchdog/pause_tasks.py | Pause the head's sparkfleet-watchdog ..."), so
    the name a role gave it is what follows the last " | "."""
    return op_name.rsplit(" | ", 1)[-1]


class _Recorder(BaseStateCallback):
    def __init__(self, run: RunContext):
        self.run = run

    def host_connect_error(self, state, host, error):
        reason = error.args[0] if getattr(error, "args", None) else str(error)
        self.run.connect_errors[host.name] = str(reason)

    def operation_host_success(self, state, host, op_hash, retry_count=0):
        # Called for an operation whose _if was false too (no command ran): watchdogs_left_paused
        # reads whether it changed anything once the run ends.
        names = {step_name(n) for n in state.get_op_meta(op_hash).names}
        for kind, steps in (("pause", PAUSE_STEPS), ("start", START_STEPS)):
            if names & set(steps):
                self.run.watchdog_ops.append((host, op_hash, kind))

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):
        names = ", ".join(sorted(state.get_op_meta(op_hash).names)) or op_hash
        self.run.failed_ops.setdefault(host.name, []).append(names)


def _address(host) -> str:
    data = host.data
    user = data.get("ssh_user")
    port = data.get("ssh_port") or 22
    return f"ssh {user + '@' if user else ''}{data.get('ssh_hostname') or host.name} port {port}"


def watchdogs_left_paused(state, run: RunContext) -> list[str]:
    """Nodes whose watchdog this run paused (a pause that ran a command: pyinfra's OperationMeta
    did_change, pyinfra/api/operation.py) and neither started again nor saw a failed prewarm start."""
    ran: dict[str, list[str]] = {"pause": [], "start": []}
    for host, op_hash, kind in run.watchdog_ops:
        meta = state.get_op_data_for_host(host, op_hash).operation_meta
        if meta.is_complete() and meta.did_change():
            ran[kind].append(host.name)
    resumed = run.watchdogs_resumed | resumed_on(state)
    return [n for n in ran["pause"] if n not in ran["start"] and n not in resumed]


def stop_summary(state, run: RunContext, error: BaseException) -> str:
    """The end of a run stopped by failed hosts: who failed, why, and what happened on the others."""
    failed = [h for h in state.inventory if h in state.failed_hosts]
    others = [h.name for h in state.inventory if h in state.activated_hosts and h not in state.failed_hosts]
    if state.current_stage <= StateStage.Connect:
        problems = [
            Problem(f"{_address(h)}: {run.connect_errors.get(h.name, 'could not connect')}", [h.name],
                    fix="check that the host is up and reachable at this address (ssh_hostname, ssh_port, "
                        "ssh_user in the inventory)")
            for h in failed
        ]
        return block(
            f"{len(failed)} of {len(state.inventory)} hosts could not be reached; the run stopped before preparing "
            f"any operation", problems,
            f"Nothing was changed on {', '.join(others)} (reached) or any other host." if others
            else "Nothing was changed on any host.",
        )
    ops = list(dict.fromkeys(op for h in failed for op in run.failed_ops.get(h.name, [])))
    at = ", ".join(repr(o) for o in ops) or "an operation"
    addresses = {h.name: h.data.get("ssh_hostname") or h.name for h in state.inventory}
    note = paused_note(watchdogs_left_paused(state, run), addresses)
    return block(
        f"the run stopped at {at}: {', '.join(h.name for h in failed)} failed (the error is above)", (),
        "Operations before it were applied; nothing after it ran on any host"
        + (f" ({', '.join(others)} did not fail)." if others else ".") + (f"\n{note}" if note else ""),
    )


class _OperationRefusalLog(logging.Filter):
    """pyinfra prints an exception raised inside an operation body (python.call) as a traceback
    and "Unexpected error in Python callback", while handling it. For an expected refusal, print
    its block instead (once per run, whichever host raised it); the operation still fails."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = sys.exc_info()[1]
        run = current_run()
        if run is None or not is_expected(exc):
            return True
        message = record.getMessage()
        if message.startswith("Traceback (most recent call last)"):
            host = ctx_host.get().name if ctx_host.isset() else None
            text = "--> " + refusal_block(exc, host)
            if text in run.printed:
                return False
            run.printed.add(text)
            record.msg, record.args = text, ()
            record.levelno, record.levelname = logging.ERROR, "ERROR"
            return True
        return "Unexpected error in Python callback" not in message


def _install_log_filter() -> None:
    if not any(isinstance(f, _OperationRefusalLog) for f in logger.filters):
        logger.addFilter(_OperationRefusalLog())
    # paramiko logs a failed handshake with a traceback of its own; pyinfra already names the
    # host and the reason (host_connect_error, the stop summary).
    logging.getLogger("paramiko").addHandler(logging.NullHandler())


def _stop(run: RunContext, text: str, code: int = 1):
    if text not in run.printed:
        run.printed.add(text)
        logger.error(text)
    raise SystemExit(code)


def _wrap_fail_hosts(st, run: RunContext) -> None:
    """pyinfra stops a run with "Over 0% of hosts failed (50%)" or "No hosts remaining!": say who
    failed, the address and the reason, and what happened on the others, then exit 1."""
    original = st.fail_hosts

    def fail_hosts(hosts_to_fail, activated_count=None):
        try:
            return original(hosts_to_fail, activated_count=activated_count)
        except PyinfraError as err:
            _stop(run, "--> " + stop_summary(st, run, err))

    st.fail_hosts = fail_hosts


@contextmanager
def refusals_stop_the_run():
    """Around a sparkfleet deploy file's body: an expected refusal at prepare (a guard, the
    preflight, the doctor's verdict, bad data) is printed as one block and the run exits 1, instead
    of pyinfra's "pyinfra error in <file> line <n>". Outside a sparkfleet CLI run it propagates."""
    try:
        yield
    except DeployError as err:
        run = current_run()
        if run is None:
            raise
        _stop(run, "--> " + refusal_block(err))


def hosts_problems(hosts: Iterable[tuple[str, Mapping[str, Any]]], inventory_file: str | None) -> list[Problem]:
    """Problems of a sparks() host list that pyinfra would hide by merging: a name declared twice."""
    seen: dict[str, int] = {}
    for name, _ in hosts:
        seen[name] = seen.get(name, 0) + 1
    where = f" in {inventory_file}" if inventory_file else ""
    return [Problem(f"declared {count} times{where}; pyinfra would merge them into one host", [name],
                    fix="give every node its own inventory name") for name, count in seen.items() if count > 1]
