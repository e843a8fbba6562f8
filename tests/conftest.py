"""Test options shared by every suite.

- tests/unit: no machine needed.
- tests/state: testinfra checks of real machines (or the lab); need --hosts, and --inventory for
  the expected values (the same inventory the deploy used).
- tests/e2e: the lab end to end (boots nothing itself; `make test` brings the lab up); need --lab.
- tests/real: a pair of lab hosts serving the real vLLM (its CPU build, lab/inventory_vllm_cpu.py): one
  deploy, then the state checks, the keys, the prewarm's compile cache and the watchdog's drills
  against it; need --lab (and `make lab-wheels`; `make test` runs it on the second pair of a four-host
  lab, SFL_LAB_PAIR=spark-c,spark-d, while tests/e2e and tests/state run on the first).
- tests/fleet: the four-host lab end to end (serving groups, the router, rolling upgrades; `make test`
  brings the four-host lab up after the two-host tiers); need --lab.
- tests/parity: the rendered command lines and environments against the real vLLM and SGLang, each
  in its own cached virtualenv (tests/parity/venv.sh builds them); need --parity.
"""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser):
    parser.addoption(
        "--inventory",
        default=os.environ.get("SPARKFLEET_INVENTORY", str(REPO / "inventory.py")),
        help="sparkfleet inventory the state checks take their expected values from",
    )
    parser.addoption(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a data key on every host, as pyinfra's --data does for the deploy",
    )
    parser.addoption("--lab", action="store_true", help="run the lab end-to-end tests (make lab-up first)")
    parser.addoption("--parity", action="store_true",
                     help="run the engine-parity tier against the real engines (builds their virtualenvs once)")


# Runs first in a session (the README's path brings the fresh lab's pair up: tests/e2e/test_lab_first_pair.py).
FIRST = ("tests", "e2e", "test_lab_first_pair.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: Path(str(item.fspath)).relative_to(REPO).parts != FIRST)  # stable: the rest keep their order
    for item in items:
        parts = Path(str(item.fspath)).relative_to(REPO).parts
        if parts[:2] == ("tests", "state") and not config.getoption("hosts"):
            item.add_marker(pytest.mark.skip(reason="state checks need --hosts=ssh://... (real Sparks or the lab)"))
        if parts[:2] == ("tests", "parity") and not config.getoption("parity"):
            item.add_marker(pytest.mark.skip(reason="engine parity needs --parity (make test runs it)"))
        if parts[:2] == ("tests", "e2e") and not config.getoption("lab"):
            item.add_marker(pytest.mark.skip(reason="lab end-to-end needs --lab (make test runs it)"))
        if parts[:2] == ("tests", "real") and not config.getoption("lab"):
            item.add_marker(pytest.mark.skip(reason="the real engine in the lab needs --lab (make test runs it)"))
        if parts[:2] == ("tests", "fleet") and not config.getoption("lab"):
            item.add_marker(pytest.mark.skip(reason="the four-host lab end-to-end needs --lab (make test runs it)"))


# Where a lab tier's time goes, per module (setup, call and teardown summed; a module fixture's
# deploy counts where it ran): CI's hour is spent by modules, and --durations shows only tests.
_MODULE_SECONDS: dict[str, float] = {}
# Which tests failed, and in which phase: a CI log shows only its tail (the unit tier's), so a lab
# tier's failures must be findable in its record too (stop 50's CI: "lab tiers exit 1", nothing else).
_FAILED: list[str] = []


def pytest_runtest_logreport(report):
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration
    if report.failed:
        _FAILED.append(f"{report.nodeid} ({report.when})")


def pytest_terminal_summary(terminalreporter, config):
    if not config.getoption("lab") or not _MODULE_SECONDS:
        return
    ranked = sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])
    terminalreporter.write_sep("=", f"time per module ({sum(_MODULE_SECONDS.values()):.0f} s in all)")
    for module, seconds in ranked:
        if seconds >= 1:
            terminalreporter.write_line(f"{seconds:8.1f} s  {module}")
    _deploy_summary(terminalreporter)


def _deploy_summary(terminalreporter) -> None:
    """Where the lab tiers' deploys spend their time: the slowest deploys (which test ran them), and each
    step's time summed over every deploy of the session (tests/e2e/lab.py DEPLOY_TIMES)."""
    import sys
    lab = sys.modules.get("tests.e2e.lab")
    times = getattr(lab, "DEPLOY_TIMES", None)
    if not times:
        return
    _write_times(times)
    total = sum(d.seconds for d in times)
    terminalreporter.write_sep("=", f"time per deploy ({len(times)} deploys, {total:.0f} s in all; the 15 slowest)")
    for d in sorted(times, key=lambda d: -d.seconds)[:15]:
        terminalreporter.write_line(f"{d.seconds:8.1f} s  {d.test}  ({d.inventory})")
    steps: dict[str, list[float]] = {}
    for d in times:
        for step, seconds in d.steps.items():
            steps.setdefault(step, []).append(seconds)
    terminalreporter.write_sep("=", "time per deploy step, summed over every deploy (the 20 largest)")
    for step, spent in sorted(steps.items(), key=lambda kv: -sum(kv[1]))[:20]:
        terminalreporter.write_line(f"{sum(spent):8.1f} s  {step}  ({len(spent)} runs, the longest {max(spent):.1f} s)")


def _write_times(times) -> None:
    """Every deploy and module time of the session, for working out where CI's hour goes (the summary
    prints only the largest): SFL_TIMES_RECORD, else the lab's records directory, one file per tier
    (kept by `lab.sh reset`, which make test's four-host tier runs after the others)."""
    import dataclasses
    import json
    state = Path(os.environ.get("SFL_LAB_STATE", "/var/lib/sparkfleet-lab"))
    tiers = "-".join(sorted({m.split("/")[1] for m in _MODULE_SECONDS if m.count("/") >= 2}))  # e2e-real-state, fleet
    path = Path(os.environ.get("SFL_TIMES_RECORD") or state / "records" / f"test-times-{tiers}.json")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"modules": _MODULE_SECONDS, "failed": _FAILED, "deploys": [dataclasses.asdict(d) for d in times]},
                                   indent=1) + "\n")
    except OSError as err:  # a record, never a reason to fail the tier
        print(f"test times not written to {path}: {err}")
