"""The `sparkfleet` command line (sparkfleet/__main__.py, sparkfleet/deploy_command.py): every subcommand's
exit status by sparkfleet/exit_codes.py, the front door's decisions (validate, plan, confirm once, deploy
with pyinfra's -y), `--version`, and the make targets that act on machines refusing to run without an
inventory. No lab and no SSH: pyinfra is replaced where a command would start it."""
import io
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version as package_version
from pathlib import Path

import pytest

from sparkfleet import capture, deploy_command, plan_command
from sparkfleet.__main__ import main
from sparkfleet.exit_codes import CHANGES, FAILED, OK, normalised
from tests.unit.test_inventory_refusal import write_inventory

REPO = Path(__file__).resolve().parents[2]
SPARKFLEET = Path(sys.executable).with_name("sparkfleet")  # pyproject.toml's console script


class Runs:
    """What would have started pyinfra: the plan (answering as given) and the deploy's subprocess."""

    def __init__(self, monkeypatch, plan_code=CHANGES, deploy_status=0):
        self.plans, self.deploys = [], []

        def plan(inventory, extra):
            self.plans.append((inventory, list(extra)))
            return plan_code, (["spark-a", "spark-b"] if plan_code in (OK, CHANGES) else [])

        def run(command, cwd=None, **kwargs):
            self.deploys.append((command, cwd))
            return subprocess.CompletedProcess(command, deploy_status)

        monkeypatch.setattr(plan_command, "run", plan)
        monkeypatch.setattr(deploy_command.subprocess, "run", run)


class Terminal(io.StringIO):
    """stdin as a terminal whose user types `answer`."""

    def isatty(self):
        return True


def on_terminal(monkeypatch, answer: str):
    monkeypatch.setattr(sys, "stdin", Terminal(answer))


def inventory(tmp_path, a="") -> str:
    """A pair's inventory in a directory of its own (pyinfra keeps a file's code by its path)."""
    directory = tmp_path / f"inventory-{len(list(tmp_path.glob('inventory-*')))}"
    directory.mkdir()
    return str(write_inventory(directory, [22, 23], a=a))


# ------------------------------------------------------------------------------------------ --version

@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_is_the_installed_packages_with_the_checkouts_commit(flag):
    result = subprocess.run([str(SPARKFLEET), flag], capture_output=True, text=True, cwd="/")
    commit = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.strip()
    assert result.returncode == OK, result.stderr
    assert result.stdout == f"sparkfleet {package_version('sparkfleet')} (commit {commit})\n"
    assert re.fullmatch(r"sparkfleet \d+\.\d+\.\d+ \(commit [0-9a-f]{12}(-dirty)?\)\n", result.stdout)


# ------------------------------------------------------------------------------- usage and the inventory

@pytest.mark.parametrize("argv", [[], ["deploy"], ["plan"], ["nosuch", "inventory.py"], ["config"],
                                  ["config", "inventory.py", "--hots", "spark-a"]])
def test_a_usage_error_exits_1_never_2_which_is_a_plans_changes(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == FAILED
    assert "usage: sparkfleet" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["deploy", "plan", "config", "capture"])
def test_a_missing_inventory_file_exits_1_before_pyinfra_starts(command, monkeypatch, tmp_path, capsys):
    runs = Runs(monkeypatch)
    monkeypatch.setattr(capture, "main", lambda *a: pytest.fail("capture ran"))
    monkeypatch.setattr(plan_command, "main", lambda *a: pytest.fail("plan ran"))
    assert main([command, str(tmp_path / "inventroy.py")]) == FAILED
    err = capsys.readouterr().err
    # pyinfra itself would take the name for a host to connect to
    assert f"no inventory file '{tmp_path / 'inventroy.py'}'" in err and "the lab's is lab/inventory.py" in err
    assert runs.plans == [] and runs.deploys == []


def test_config_exits_0_with_the_merged_data_and_1_on_a_refusal_or_an_unknown_host(tmp_path, capsys):
    assert main(["config", inventory(tmp_path), "--host", "spark-b"]) == OK
    assert capsys.readouterr().out.startswith("spark-b:\n  name: spark-b\n  rank: 1\n")
    assert main(["config", inventory(tmp_path), "--host", "spark-c"]) == FAILED
    assert "no host 'spark-c'" in capsys.readouterr().err
    assert main(["config", inventory(tmp_path, a=', "netplan_renderer": "wicked"')]) == FAILED
    assert "spark-a: key 'netplan_renderer' = 'wicked'" in capsys.readouterr().err


def test_an_inventory_in_the_checkout_is_named_as_the_runs_started_there_find_it(monkeypatch, capsys):
    runs = Runs(monkeypatch, plan_code=OK)
    monkeypatch.chdir(REPO / "lab")  # pyinfra runs in the checkout: ./inventory.py is lab/inventory.py there
    assert main(["deploy", "inventory.py"]) == OK
    assert runs.plans == [("lab/inventory.py", [])]


# ------------------------------------------------------------------------------------- plan, capture

@pytest.mark.parametrize("pyinfra_exit", [0, 1, 2])
def test_plan_exits_1_when_no_plan_is_made(pyinfra_exit, monkeypatch, tmp_path):
    """0 and 2 come from the plan read (tests/unit/test_plan_command.py); a run that wrote no plan, a
    prepare that failed, or pyinfra's own usage error (click exits 2) is 1, never "changes"."""
    program = tmp_path / "fake.py"
    program.write_text(f"import sys; sys.exit({pyinfra_exit})")
    monkeypatch.setattr(plan_command, "pyinfra_command", lambda inv, extra: [sys.executable, str(program)])
    assert main(["plan", inventory(tmp_path), "--limit", "spark-a"]) == FAILED


def fake_capture(monkeypatch, tmp_path, hosts):
    """The capture's two runs replaced by one program writing a fact record for each of `hosts`."""
    program = tmp_path / "fake.py"
    program.write_text(
        "import json, os, sys\n"
        f"with open(os.path.join(os.environ[{capture.CAPTURE_VAR!r}], 'facts-1.jsonl'), 'a') as f:\n"
        f"    for host in {hosts!r}:\n"
        "        f.write(json.dumps({'host': host, 'fact': 'm.F', 'kwargs': {}, 'command': 'true', 'status': True, "
        "'stdout': ['x']}) + '\\n')\n")
    monkeypatch.setattr(capture, "runs", lambda inv, plan_dir: [("plan", [sys.executable, str(program)], {}),
                                                                ("doctor", [sys.executable, "-c", "pass"], {})])


@pytest.mark.parametrize("hosts, code", [(["spark-a", "spark-b"], OK), (["spark-a"], FAILED), ([], FAILED)])
def test_capture_exits_0_only_when_every_host_was_read(hosts, code, monkeypatch, tmp_path):
    fake_capture(monkeypatch, tmp_path, hosts)
    out = tmp_path / "bundle.json"
    assert main(["capture", inventory(tmp_path), "--out", str(out)]) == code
    assert {h for h, records in json.loads(out.read_text())["nodes"].items() if records} == set(hosts)


# ---------------------------------------------------------------------------------------------- deploy

def test_deploy_refuses_a_bad_inventory_before_the_plan(monkeypatch, tmp_path, capsys):
    runs = Runs(monkeypatch)
    assert main(["deploy", inventory(tmp_path, a=', "netplan_renderer": "wicked"'), "--yes"]) == FAILED
    assert "spark-a: key 'netplan_renderer' = 'wicked'" in capsys.readouterr().err
    assert runs.plans == [] and runs.deploys == []


def test_deploy_validates_with_the_runs_data(monkeypatch, tmp_path, capsys):
    """--data as pyinfra parses it: a value the inventory gets wrong and --data corrects is no refusal,
    and a wrong --data value is refused though the inventory is right."""
    runs = Runs(monkeypatch, plan_code=OK)
    bad = inventory(tmp_path, a=', "netplan_renderer": "wicked"')
    assert main(["deploy", bad, "--data", "netplan_renderer=networkd"]) == OK
    assert runs.plans == [(bad, ["--data", "netplan_renderer=networkd"])]
    assert main(["deploy", inventory(tmp_path), "--data=fabric_mtu=99999"]) == FAILED
    assert "fabric_mtu" in capsys.readouterr().err and len(runs.plans) == 1


def test_deploy_with_nothing_to_change_exits_0_without_deploying(monkeypatch, tmp_path, capsys):
    runs = Runs(monkeypatch, plan_code=OK)
    assert main(["deploy", inventory(tmp_path), "--yes"]) == OK
    assert runs.deploys == []
    assert "nothing to change: no deploy run" in capsys.readouterr().out


def test_deploy_without_a_plan_exits_1_without_deploying(monkeypatch, tmp_path, capsys):
    runs = Runs(monkeypatch, plan_code=FAILED)
    assert main(["deploy", inventory(tmp_path), "--yes"]) == FAILED
    assert runs.deploys == [] and "no plan, so no deploy: nothing was changed" in capsys.readouterr().err


def test_deploy_without_a_terminal_or_yes_refuses_and_changes_nothing(monkeypatch, tmp_path, capsys):
    runs = Runs(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # piped: no one reads a question
    assert main(["deploy", inventory(tmp_path)]) == FAILED
    assert runs.deploys == []
    assert "no terminal to ask on and no --yes: nothing was changed" in capsys.readouterr().err


@pytest.mark.parametrize("answer, deployed", [("y\n", True), ("yes\n", True), ("\n", False), ("n\n", False),
                                              ("", False)])
def test_deploy_on_a_terminal_asks_once(answer, deployed, monkeypatch, tmp_path, capsys):
    runs = Runs(monkeypatch)
    on_terminal(monkeypatch, answer)
    assert main(["deploy", inventory(tmp_path)]) == (OK if deployed else FAILED)
    assert "deploy these changes to 2 host(s) (spark-a, spark-b)? [y/N]" in capsys.readouterr().out
    assert len(runs.deploys) == deployed


@pytest.mark.parametrize("argv", [["--yes", "{inv}", "--limit", "spark-a"], ["{inv}", "--yes", "--limit", "spark-a"],
                                  ["{inv}", "--limit", "spark-a", "-y"]])
def test_deploy_with_yes_runs_pyinfra_with_y_and_the_args_given(argv, monkeypatch, tmp_path):
    runs = Runs(monkeypatch)
    inv = inventory(tmp_path)
    assert main(["deploy", *[a.format(inv=inv) for a in argv]]) == OK
    assert runs.plans == [(inv, ["--limit", "spark-a"])]
    [(command, cwd)] = runs.deploys
    assert Path(command[0]).name == "pyinfra" and cwd == REPO
    assert command[1:] == ["-y", inv, "deploy.py", "--limit", "spark-a"]


@pytest.mark.parametrize("pyinfra_exit", [1, 2])
def test_a_failed_deploy_exits_1(pyinfra_exit, monkeypatch, tmp_path, capsys):
    Runs(monkeypatch, deploy_status=pyinfra_exit)
    assert main(["deploy", inventory(tmp_path), "--yes"]) == FAILED
    assert f"the deploy failed (pyinfra exit {pyinfra_exit})" in capsys.readouterr().err


def test_pyinfras_statuses_normalised():
    assert [normalised(s) for s in (0, 1, 2, -15)] == [OK, FAILED, FAILED, FAILED]


# ----------------------------------------------------------------------------------------- make targets

def make(*args: str) -> subprocess.CompletedProcess:
    """make in the checkout, as a user runs it (no INVENTORY in the environment, not inside make test's
    own make); the virtualenv taken as installed."""
    env = {k: v for k, v in os.environ.items() if k not in ("INVENTORY", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "-o", ".venv/.installed", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("target", ["deploy", "plan", "config", "doctor", "status", "rollback", "capture"])
def test_a_make_target_acting_on_machines_needs_an_inventory(target):
    result = make("-s", target)
    assert result.returncode != 0
    assert f"make {target} needs INVENTORY=<your inventory>" in result.stderr
    assert "INVENTORY=lab/inventory.py" in result.stderr  # the example: the lab only when named


@pytest.mark.parametrize("target, command", [
    ("plan-lab", ".venv/bin/sparkfleet plan lab/inventory.py"),
    ("doctor-lab", ".venv/bin/pyinfra -y lab/inventory.py doctor.py"),
    ("status-lab", ".venv/bin/pyinfra -y lab/inventory.py status.py"),
    ("deploy INVENTORY=inventory.py YES=1", ".venv/bin/sparkfleet deploy inventory.py --yes"),
])
def test_the_labs_targets_name_the_lab_and_deploy_is_the_front_door(target, command):
    result = make("-n", *target.split())
    assert command in result.stdout.splitlines(), result.stdout + result.stderr
