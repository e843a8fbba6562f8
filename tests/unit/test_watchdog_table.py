"""docs/watchdog.md's table of the real drills is one run's record (tools/watchdog_table.py), and its
rows are the drills tests/real runs: a drill added to the tier without a row, or a row for a drill the
tier no longer runs, fails here."""
import ast
import json
import re
from pathlib import Path

from tests.e2e.drills import DRILLS as LAB_DRILLS
from tools import watchdog_table

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "tests" / "real" / "test_real_watchdog.py"


def recorded_names() -> set[str]:
    """The names test_real_watchdog.py records under: FAULTS' keys, the reboot's and power cut's
    Drill.what, and every literal drill name passed to report()."""
    tree = ast.parse(MODULE.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FAULTS" for t in node.targets):
            names |= {k.value for k in node.value.keys}
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "report" and len(node.args) >= 3:
            if isinstance(node.args[2], ast.Constant):
                names.add(node.args[2].value)
    params = re.search(r'parametrize\("key", (\[[^\]]*\])\)\ndef test_after_a_reboot', MODULE.read_text())
    assert params, "the reboot/power-cut drills' keys"
    names |= {LAB_DRILLS[k].what for k in ast.literal_eval(params.group(1))}
    return names


def test_the_table_has_a_row_for_each_drill_the_real_tier_records_and_no_other():
    assert {name for name, _, _ in watchdog_table.DRILLS} == recorded_names()


def record(*names, seconds=12.3):
    return {"commit": "0123456789ab", "date": "2026-12-05 14:00 UTC", "machine": "2 x cpu",
            "drills": [{"drill": n, "seconds": seconds, "result": "", "saw": "probe failed | 2/2"} for n in names]}


def test_a_record_renders_one_row_per_drill_naming_the_run_and_a_missing_drill_says_so():
    block = watchdog_table.render(record("worker SIGKILL", "head SIGSTOP"))
    assert "commit `0123456789ab`, 2026-12-05 14:00 UTC, 2 x cpu" in block
    assert "| SIGKILL the worker's engine | serving again after 12.3 s | `probe failed \\| 2/2` |" in block
    assert "| SIGSTOP every process of the worker's engine | not run in this record | |" in block
    rows = [ln for ln in block.splitlines() if ln.startswith("| ") and not ln.startswith("| drill") and "---" not in ln]
    assert len(rows) == len(watchdog_table.DRILLS)
    assert watchdog_table.missing(record("worker SIGKILL")) == [n for n, _, _ in watchdog_table.DRILLS[1:]]


def test_the_doc_carries_one_runs_figures_for_every_drill(tmp_path):
    doc = (REPO / "docs" / "watchdog.md").read_text()
    block = doc.split(watchdog_table.BEGIN, 1)[1].split(watchdog_table.END, 1)[0]
    assert re.search(r"One run of `tests/real` \(commit `[0-9a-f]{12}`, \d{4}-\d\d-\d\d \d\d:\d\d UTC, ", block), block
    for _, what, _ in watchdog_table.DRILLS:
        row = next((ln for ln in block.splitlines() if ln.startswith(f"| {what} |")), None)
        assert row is not None and "not run in this record" not in row, (what, block)


def test_make_watchdog_table_rewrites_only_the_block(tmp_path, monkeypatch):
    doc = tmp_path / "watchdog.md"
    doc.write_text(f"before\n{watchdog_table.BEGIN}\nold rows\n{watchdog_table.END}\nafter\n")
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record(*[n for n, _, _ in watchdog_table.DRILLS])))
    monkeypatch.setattr(watchdog_table, "DOC", doc)
    monkeypatch.setattr(watchdog_table, "REPO", tmp_path)
    assert watchdog_table.main([str(path)]) == 0
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("\nafter\n") and "old rows" not in text
    assert watchdog_table.main([str(tmp_path / "absent.json")]) == 1
