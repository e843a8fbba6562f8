"""bench/facts_only.py is the floor bench/noop.py measures the no-op re-deploy against; it is honest
only while it gathers every fact the deploy's own code reads. These tests read the code (no lab):
every `get_fact(SomeFact, ...)` call in a module the deploy can run (deploy.py, the files it
includes, and every repository module they import) must have a call in the baseline with the same
fact class, the same argument names and the same literal values; and every file read over the
deploy's connection without a fact (REMOTE_READS: the fleet key's source) a call of the same shape. A
role that starts reading a fact the baseline does not gather fails here, naming the file and line.

What the scan cannot see: a fact read with the same argument names but another non-literal value
(one more Sha1File(path=...)). Left out on purpose: the facts pyinfra's operations read for
themselves (bench/facts_only.py's docstring says why), and sparkfleet/unchanged.py's one fact that
stands in for them (OPERATION_FACTS).
"""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("roles", "sparkfleet")
ENTRY = REPO / "deploy.py"
BASELINE = REPO / "bench" / "facts_only.py"
GET_FACT = ("get_fact", "get_facts")
# Reads of a node that are not pyinfra facts, counted as facts: a file read over the deploy's own
# connection (the fleet key's source, roles/router/fleet_key.py), matched by its number of arguments.
REMOTE_READS = {"sparkfleet.keyfiles.read"}
# Read while operations run, in place of the facts pyinfra's operations read for themselves (one
# round trip per host instead of two or three per operation): their cost, not the floor's.
OPERATION_FACTS = {"sparkfleet.unchanged.ManagedTargets"}


def module_file(dotted: str) -> Path | None:
    """The repository file of a dotted module name, or None (pyinfra, the standard library, ...)."""
    if dotted.split(".")[0] not in PACKAGES:
        return None
    base = REPO.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_names(tree: ast.AST) -> dict[str, str]:
    """local name -> dotted name, for every `from a.b import c [as d]` anywhere in the module."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


def dependencies(path: Path, tree: ast.AST) -> set[Path]:
    """Repository modules `path` imports, and the files it runs with local.include("...")."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(module_file(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(module_file(node.module))
            out.update(module_file(f"{node.module}.{alias.name}") for alias in node.names)  # a submodule
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "include"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.add(REPO / node.args[0].value)
    return {p for p in out if p is not None and p.is_file()}


def reachable(entry: Path) -> set[Path]:
    seen, todo = set(), [entry]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(dependencies(path, ast.parse(path.read_text(), filename=str(path))) - seen)
    return seen


def fact_reads(path: Path, source: str | None = None) -> dict[tuple, list[str]]:
    """(fact class, argument shape) -> ["file:line", ...] of every get_fact/get_facts call in a module.

    The shape: each keyword's name, with its value when it is a literal (Which(command="git") is
    not Which(command="nft")), and the number of further positional arguments."""
    source = path.read_text() if source is None else source
    tree = ast.parse(source, filename=str(path))
    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
    names = imported_names(tree)
    names.update({n.name: f"{module}.{n.name}" for n in ast.walk(tree) if isinstance(n, ast.ClassDef)})
    out: dict[tuple, list[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if isinstance(node.func, ast.Name) and names.get(func) in REMOTE_READS:
            key = (names[func], (("positional", str(len(node.args))),))
            out.setdefault(key, []).append(f"{path.relative_to(REPO)}:{node.lineno}")
            continue
        if func not in GET_FACT:
            continue
        # host.get_fact(Fact, ...) or pyinfra's get_fact(state, host, Fact, ...): the fact is the first
        # argument that names a class (imported or defined here), not a variable.
        positions = [i for i, a in enumerate(node.args) if isinstance(a, ast.Name) and a.id in names]
        if not positions:
            raise AssertionError(f"{path.relative_to(REPO)}:{node.lineno}: {func}() with a fact this scan cannot name")
        first = positions[0]
        shape = tuple(sorted(
            (kw.arg, repr(kw.value.value) if isinstance(kw.value, ast.Constant) else "...")
            for kw in node.keywords if kw.arg
        )) + ((("positional", str(len(node.args) - first - 1)),) if len(node.args) > first + 1 else ())
        key = (names[node.args[first].id], shape)
        out.setdefault(key, []).append(f"{path.relative_to(REPO)}:{node.lineno}")
    return out


def reads_of(paths) -> dict[tuple, list[str]]:
    out: dict[tuple, list[str]] = {}
    for path in sorted(paths):
        for key, where in fact_reads(path).items():
            out.setdefault(key, []).extend(where)
    return out


def describe(key: tuple) -> str:
    cls, shape = key
    return f"{cls.rsplit('.', 1)[1]}({', '.join(f'{k}={v}' for k, v in shape)})"


def missing_from_baseline(deploy_reads: dict, baseline_reads: dict) -> list[str]:
    return [f"{describe(key)} read at {', '.join(where)}" for key, where in sorted(deploy_reads.items())
            if key not in baseline_reads and key[0] not in OPERATION_FACTS]


def test_the_deploy_reaches_every_role_and_reads_facts():
    modules = {str(p.relative_to(REPO)) for p in reachable(ENTRY)}
    tasks = {line.split('"')[1] for line in ENTRY.read_text().splitlines() if "local.include(" in line}
    assert tasks and tasks <= modules
    assert {"roles/guards/run.py", "roles/preflight/checks.py", "roles/fabric/checks.py"} <= modules
    assert "bench/facts_only.py" not in modules
    names = {describe(key) for key in reads_of(reachable(ENTRY))}
    assert "NodeFacts(data_dir=..., hcas=..., netdev=..., twin=...)" in names
    assert "Which(command='git')" in names
    assert "read(positional=2)" in names  # the fleet key's source file, over SSH (sparkfleet.keyfiles.read)


def test_the_facts_only_baseline_gathers_every_fact_the_deploy_reads():
    missing = missing_from_baseline(reads_of(reachable(ENTRY)), reads_of([BASELINE]))
    assert not missing, (
        "bench/facts_only.py does not gather facts the deploy reads (add them there, under the same "
        "condition the role reads them, or bench/noop.py's floor is too low):\n  " + "\n  ".join(missing)
    )


@pytest.mark.parametrize("call, flagged", [
    ("host.get_fact(Which, command='nft')", False),
    ("host.get_fact(Which, command='curl')", True),  # a literal the baseline does not use
    ("host.get_fact(NodeFacts, data_dir=d, netdev=n, twin=t, hcas=h)", False),
    ("host.get_fact(NodeFacts, data_dir=d, netdev=n, extra=1)", True),  # another argument shape
    ("get_fact(state, host, LiveMarker)", False),  # pyinfra's own function, the fact third
    ("host.get_fact(Sneaky)", True),  # a fact class defined in the role itself
    ("read(host, '/etc/sparkfleet/api-key')", False),  # a file read over SSH, as the baseline reads the fleet key
    ("read(host, path, 'more')", True),  # another shape of it
])
def test_a_fact_read_the_baseline_lacks_is_named(call, flagged):
    role = REPO / "roles" / "example" / "tasks.py"  # never written: the source is given
    source = (
        "from pyinfra.facts.server import Which\n"
        "from roles.preflight.facts import NodeFacts\n"
        "from sparkfleet.firewall_facts import LiveMarker\n"
        "from sparkfleet.keyfiles import read\n"
        "from pyinfra.api import FactBase\n"
        "class Sneaky(FactBase):\n    command = 'true'\n"
        f"{call}\n"
    )
    missing = missing_from_baseline(fact_reads(role, source), reads_of([BASELINE]))
    assert bool(missing) == flagged, missing
    if flagged:
        assert "roles/example/tasks.py:8" in missing[0]
