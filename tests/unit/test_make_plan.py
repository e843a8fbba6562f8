"""`make plan` exits as `sparkfleet plan` does (0 nothing, 2 changes, 1 error: Terraform's
`plan -detailed-exitcode`), through GNU make, which folds any failed recipe into its own 2 unless the
Makefile says otherwise (its comment above `plan`). The real Makefile runs, with BIN pointing at a
`sparkfleet` that prints its arguments and exits with the code asked of it."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def make(tmp_path, *args, rc=0):
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "sparkfleet").write_text('#!/bin/sh\necho "sparkfleet $*"\nexit "$FAKE_RC"\n')
    (fake / "sparkfleet").chmod(0o755)
    return subprocess.run(["make", "--no-print-directory", *args, f"BIN={fake}"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "FAKE_RC": str(rc)})


@pytest.mark.parametrize("code", [0, 1, 2])
def test_make_plan_exits_with_the_plans_own_code(tmp_path, code):
    run = make(tmp_path, "plan", "INVENTORY=site/inventory.py", rc=code)
    assert run.returncode == code, run.stdout + run.stderr
    assert "sparkfleet plan site/inventory.py" in run.stdout  # the plan ran, its output shown


def test_make_plan_lab_exits_with_the_plans_own_code_too(tmp_path):
    run = make(tmp_path, "plan-lab", rc=1)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "sparkfleet plan lab/inventory.py" in run.stdout


def test_make_plan_without_an_inventory_is_an_error_not_changes(tmp_path):
    run = make(tmp_path, "plan", rc=0)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "make plan needs INVENTORY=" in run.stderr and "sparkfleet plan" not in run.stdout


def test_other_targets_keep_makes_own_codes(tmp_path):
    """Question mode is for `plan` alone: another target's failure is make's 2 and its recipes run."""
    run = make(tmp_path, "config", "INVENTORY=site/inventory.py", rc=1)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "sparkfleet config" in run.stdout


def test_make_n_plan_prints_the_plan_command_and_runs_nothing(tmp_path):
    """A `+` line runs even under -n: the Makefile keeps question mode and `+` off then."""
    run = make(tmp_path, "-n", "plan", "INVENTORY=site/inventory.py", rc=1)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{tmp_path}/bin/sparkfleet plan site/inventory.py" in run.stdout.splitlines(), run.stdout
    assert "sparkfleet plan site/inventory.py" not in run.stdout.replace(f"{tmp_path}/bin/sparkfleet", ""), run.stdout
