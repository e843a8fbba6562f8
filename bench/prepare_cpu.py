"""Benchmark, offline: the controller's own CPU for a deploy and for its facts-only floor, with every node
answered from a `sparkfleet capture` bundle instead of SSH (issue 44 item 4).

    python bench/prepare_cpu.py [BUNDLE] [--rounds N]      (default: tests/unit/fixtures/capture-lab.json)

bench/noop.py measures the no-op against its floor on the lab, where the controller's CPU and the
nodes' round trips overlap and both share the machine's cores. This takes the round trips away: each
run is `pyinfra -y <the bundle's inventory> deploy.py` (then bench/facts_only.py) in a fresh
interpreter, every host served by pyinfra 3.10's own @fake connector (pyinfra/connectors/fake.py: no
delay here) answering each command with the output the bundle recorded for it on that node, so what
is left is sparkfleet's and pyinfra's work on the controller, per host. A bundle captured after a
deploy and an unchanged re-run (as tests/unit/fixtures/capture-lab.json was) replays as a no-op: the
run says "0 with changes" and changes nothing, which is checked. The deploy lock's take and release
are no facts, so the bundle does not hold them: they are answered as a free lock would answer.

Printed: the median user + system CPU seconds of each, over the rounds, their difference, and the
commands no recorded answer matched (answered with nothing, as @fake does). Not yet for a fleet with a
router: its deploy reads the fleet's key over SSH (roles/router/fleet_key.py), which a capture never
holds (it holds no secret), so its replay plans the key's writes and is refused as no no-op.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BUNDLE = REPO / "tests" / "unit" / "fixtures" / "capture-lab.json"
# Answers the bundle cannot hold (roles/lock/node_lock.py's JSON line): the lock is free, then given back.
LOCK_ANSWERS = ((re.compile(r"' take /run/sparkfleet/deploy\.lock"), '{"holder": null, "result": "took"}'),
                (re.compile(r"' release /run/sparkfleet/deploy\.lock"), '{"holder": null, "result": "released"}'))
UNANSWERED = "prepare_cpu: unanswered: "


def answers(bundle: dict) -> dict[str, list[tuple[str, bool, list[str]]]]:
    """node -> (command, status, stdout lines) of every fact the bundle recorded, longest command first
    (a command is matched as a substring of what pyinfra runs, which wraps it)."""
    return {node: sorted(((r["command"], bool(r.get("status", True)), r.get("stdout") or []) for r in records
                          if "command" in r), key=lambda a: -len(a[0]))
            for node, records in bundle["nodes"].items()}


def child(bundle_path: str, argv: list[str]) -> None:
    """In a fresh interpreter: pyinfra's CLI with its ssh connector replaced by @fake, answered from the bundle."""
    import pyinfra.api.inventory as inventory
    from pyinfra.connectors.fake import FakeConnector
    from pyinfra.connectors.util import CommandOutput, OutputLine

    table = answers(json.loads(Path(bundle_path).read_text()))

    class Replayed(FakeConnector):
        def _sleep(self) -> None:  # no round trip: the controller's work alone
            pass

        def _lookup_response(self, command: str):
            for pattern, line in LOCK_ANSWERS:
                if pattern.search(command):
                    return True, CommandOutput([OutputLine("stdout", line)])
            for recorded, status, stdout in table.get(self.host.name, ()):
                if recorded in command:
                    return status, CommandOutput([OutputLine("stdout", line) for line in stdout])
            print(f"{UNANSWERED}{self.host.name}: {command[:160]}", file=sys.stderr)
            return True, CommandOutput([])

    connectors = inventory.get_execution_connectors
    inventory.get_execution_connectors = lambda: {**connectors(), "ssh": Replayed}
    import pyinfra_cli.__init__  # noqa: F401  (gevent's patching, as the pyinfra script has it)
    from pyinfra_cli.main import main as cli

    sys.argv = ["pyinfra", *argv]
    cli()


def cpu_of(bundle: str, inventory: str, deploy_file: str) -> tuple[float, str]:
    """(user + system CPU seconds of one run in a fresh interpreter, its output)."""
    before = os.times()
    run = subprocess.run([sys.executable, __file__, "--child", bundle, "-y", inventory, deploy_file], cwd=REPO,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "SFL_LAB_STATE": os.environ.get("SFL_PREPARE_CPU_STATE", "/nonexistent")})
    after = os.times()
    out = run.stdout + run.stderr
    if run.returncode != 0:
        sys.exit(f"{deploy_file} failed under the bundle's answers:\n{out[-6000:]}")
    return (after.children_user - before.children_user) + (after.children_system - before.children_system), out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2:])
        return 0
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 5
    paths = [a for i, a in enumerate(argv) if not a.startswith("--") and (i == 0 or argv[i - 1] != "--rounds")]
    bundle = str(Path(paths[0]).resolve()) if paths else str(DEFAULT_BUNDLE)
    inventory = json.loads(Path(bundle).read_text())["inventory"]
    figures: dict[str, list[float]] = {"deploy.py": [], "bench/facts_only.py": []}
    unanswered: set[str] = set()
    for _ in range(rounds):
        for deploy_file, cpu in figures.items():
            seconds, out = cpu_of(bundle, inventory, deploy_file)
            cpu.append(seconds)
            unanswered |= {line[len(UNANSWERED):] for line in out.splitlines() if line.startswith(UNANSWERED)}
            if deploy_file == "deploy.py" and (" 0 with changes" not in out or re.search(r"\] Success$", out, re.M)):
                sys.exit(f"the bundle did not replay as a no-op (a stale capture?):\n{out[-6000:]}")
    deploy, floor = (statistics.median(v) for v in figures.values())
    print(f"{bundle} ({inventory}), {rounds} rounds, no round trips: the controller's CPU (user + system), medians")
    print(f"  no-op re-deploy (deploy.py)      {deploy:6.2f} s   (runs: {', '.join(f'{t:.2f}' for t in figures['deploy.py'])})")
    print(f"  facts-only (bench/facts_only.py) {floor:6.2f} s")
    print(f"  the deploy's own, on top         {deploy - floor:6.2f} s")
    for line in sorted(unanswered):
        print(f"  answered with nothing (not in the bundle): {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
