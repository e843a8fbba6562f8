"""The README and docs/: the data-key reference is the config model's (written from it, never stale),
every link between the documents reaches a file and a heading that exist, and the README stays a
ten-minute read."""
import re
from pathlib import Path

import pytest

from sparkfleet import datadoc
from sparkfleet.config import DATA_FIELDS
from tests.unit.helpers import LICENSE_ACKNOWLEDGED, SITE_EXAMPLE, write_site_data

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)  # no headings in code blocks
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_the_data_key_reference_is_written_from_the_model_and_not_stale():
    assert datadoc.DATA_KEYS_DOC.read_text() == datadoc.data_keys_markdown(), (
        "docs/data-keys.md differs from the config model: run `make docs` and commit it")


def test_every_model_key_has_a_description_and_a_row_with_its_default():
    rows = {m[1]: (m[2], m[3]) for m in re.finditer(r"^\| `([a-z_]+)` \| ([^|]+) \| ([^|]+) \|",
                                                      datadoc.data_keys_markdown(), re.M)}
    assert sorted(rows) == sorted(DATA_FIELDS)
    for key, field in DATA_FIELDS.items():
        assert field.description and len(field.description) > 20, key
        where, default = (cell.strip() for cell in rows[key])
        if field.is_required():
            assert default == "required" and where == "inventory, per node", key
        elif field.get_default(call_default_factory=True) is None:
            assert default.startswith("none"), key


def test_the_reference_shows_what_the_shipped_group_data_sets_beside_the_models_default():
    text = datadoc.data_keys_markdown()
    row = {m[1]: m[0] for m in re.finditer(r"^\| `([a-z_]+)` \|.*$", text, re.M)}
    assert "| none (`rocep1s0f0` in group_data/all.py) |" in row["rdma_hca"]
    assert "| `production` (`research` in group_data/all.py) |" in row["deployment_purpose"]
    assert "| group_data | `9000` |" in row["fabric_mtu"]  # the same in both: shown once
    assert "| group_data or inventory, per group |" in row["serving_tensor_parallel_size"]
    # A reference to another document becomes a link that the link test below checks.
    assert "[fleet.md#router](fleet.md#router)" in row["router_node"]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_between_the_documents_reaches_a_file_and_a_heading(document):
    broken = []
    for target in LINK.findall(re.sub(r"^```.*?^```", "", document.read_text(), flags=re.M | re.S)):
        if re.match(r"^[a-z]+://|^mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, broken


def test_every_document_is_reachable_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    for doc in DOCUMENTS[1:]:
        assert f"(docs/{doc.name}" in readme, f"the README does not link {doc.name}"


def test_the_readme_is_a_ten_minute_read():
    """About 200 words a minute for technical prose: the reference lives in docs/."""
    words = len((ROOT / "README.md").read_text().split())
    assert words <= 2000, f"README.md has {words} words; move reference material into docs/"


# --- The docs that describe the code hold what the code has (issue 45 item 6) --------------------

DEPLOY_DOC = ROOT / "docs" / "deploy.md"
MONITORING_DOC = ROOT / "docs" / "monitoring.md"
RULES = ROOT / "roles" / "monitoring" / "templates" / "etc" / "prometheus" / "sparkfleet.rules.yml.j2"
# deploy.py numbers its steps in comments: `# 3c. The ...`, `# 7c-11, one serving group ...`.
STEP_LABEL = re.compile(r"^\s*# (\d+[a-z]?\d*(?:-\d+)?)[.,] ", re.M)
ALERT_NAME = re.compile(r"^\s*- alert: (\w+)\s*$", re.M)


def table_under(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table after `heading`: its rows up to the first line that is not one
    (a blank line ends a Markdown table, so a row after it is no row of the table)."""
    rest = text[text.index(heading):].splitlines()[1:]
    start = next(i for i, line in enumerate(rest) if line.startswith("|"))
    rows = []
    for line in rest[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows[2:]  # after the header and its rule


def step_labels(deploy_text: str) -> list[str]:
    return STEP_LABEL.findall(deploy_text)


def test_step_labels_are_read_from_deploy_py():
    labels = step_labels((ROOT / "deploy.py").read_text())
    # the rule reads every form deploy.py writes: a number, a letter, a second number, a range
    assert {"0", "1b", "3c", "3d", "7e", "7b2", "7c-11", "12b", "13"} <= set(labels), labels
    assert len(labels) == len(set(labels)), f"a step label twice in deploy.py: {labels}"


def test_every_step_of_deploy_py_has_a_row_in_the_full_table():
    documented = {row[0] for row in table_under(DEPLOY_DOC.read_text(), "## What a deploy does")}
    missing = [label for label in step_labels((ROOT / "deploy.py").read_text()) if label not in documented]
    assert not missing, f"docs/deploy.md's table 'What a deploy does' has no row for deploy.py's step(s) {missing}"
    stale = documented - set(step_labels((ROOT / "deploy.py").read_text()))
    assert not stale, f"docs/deploy.md's table has rows for steps deploy.py does not have: {sorted(stale)}"


def test_every_alert_of_the_rules_has_a_row_in_the_monitoring_doc():
    alerts = ALERT_NAME.findall(RULES.read_text())
    assert len(alerts) >= 15, alerts  # the rule reads the template's alerts
    rows = table_under(MONITORING_DOC.read_text(), "## Alerts, each the failure it catches")
    documented = [row[0].strip("`") for row in rows]
    assert sorted(documented) == sorted(alerts), (
        f"docs/monitoring.md's alert table: missing {sorted(set(alerts) - set(documented))}, "
        f"not in the rules {sorted(set(documented) - set(alerts))}")


COUNT_WORDS = {w: n for n, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                           "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())}


def test_every_count_of_alerts_in_the_docs_is_the_rules():
    alerts = len(ALERT_NAME.findall(RULES.read_text()))
    counts = [(doc.name, m[1]) for doc in DOCUMENTS
              for m in re.finditer(r"\b([a-z]+|\d+) alerts\b", doc.read_text(), re.I)
              if m[1].lower() in COUNT_WORDS or m[1].isdigit()]
    assert counts, "the README's count of alerts was not found"
    wrong = [(name, said) for name, said in counts if COUNT_WORDS.get(said.lower(), None if not said.isdigit()
                                                                       else int(said)) != alerts]
    assert not wrong, f"the rules have {alerts} alerts; the docs say {wrong}"


# A doc quotes a key's value in one of two forms, and the value must be the key's default (the model's,
# or the one group_data/all.py ships, as docs/data-keys.md shows both):
#   - the key in backticks, then a parenthesis that opens with a number: "`serving_health_timeout_s`
#     (1200 s)", "`fanout_streams` (4)", "`key` (default 30)"; a unit after the number is converted to the
#     key's own (a key ending in _s counts seconds: "(20 min by default)" is 1200; _mib/_gib count MiB/GiB);
#   - the key and its value together in backticks, as data writes them: "`key = 30`", "`key: 30`",
#     "`--data key=30`".
# Not a default, so not checked: a key without a numeric default (required, none, text, a boolean:
# "`rank` (0 is the head)", "`router_node` (32 bytes of ...)"), and a sentence that says the value is
# another than the default: an example ("e.g.", "for example"), an override ("--data", "instead of"), the
# lab's own data ("the lab", "lab/"), a setting tried ("tried"); in any case.
OTHER_THAN_DEFAULT = ("e.g.", "for example", "--data", "instead of", "the lab", "lab/", "tried")
NUMBER = r"(-?\d+(?:\.\d+)?)"
QUOTED_IN_PARENS = re.compile(r"`([a-z][a-z0-9_]*)`\s*\((?:default\s+)?" + NUMBER + r"(?:\s*([A-Za-z%]+))?")
QUOTED_AS_DATA = re.compile(r"`(?:--data\s+)?([a-z][a-z0-9_]*)\s*(?:=|:)\s*" + NUMBER + r"`")
UNITS = {
    "_s": {None: 1, "s": 1, "sec": 1, "second": 1, "seconds": 1, "min": 60, "minute": 60, "minutes": 60,
           "h": 3600, "hour": 3600, "hours": 3600},
    "_mib": {None: 1, "MiB": 1, "GiB": 1024},
    "_gib": {None: 1, "GiB": 1, "MiB": 1 / 1024},
}
# Where a sentence ends: its stop, a paragraph, a list item, a table cell (each cell says its own thing).
SENTENCE_END = re.compile(r"(?<=[.!?:])\s+(?=[A-Z`*(])|\n\s*\n|\n\s*[-|] | \| ")


def numeric_defaults() -> dict[str, set[float]]:
    """key -> the defaults a doc may quote: the model's, and group_data/all.py's where it ships another."""
    shipped = datadoc.shipped_defaults()
    values = {}
    for key, field in DATA_FIELDS.items():
        candidates = [] if field.is_required() else [field.get_default(call_default_factory=True)]
        candidates += [shipped[key]] if key in shipped else []
        numbers = {float(v) for v in candidates if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if numbers:
            values[key] = numbers
    return values


def quoted_default_drift(text: str, defaults: dict[str, set[float]]) -> list[str]:
    """Every quoted value of a key with a numeric default that is not that default (the rule above)."""
    drift = []
    for sentence in SENTENCE_END.split(text):
        if any(marker in sentence.lower() for marker in OTHER_THAN_DEFAULT):
            continue
        quotes = [(m[1], m[2], m[3]) for m in QUOTED_IN_PARENS.finditer(sentence)]
        quotes += [(m[1], m[2], None) for m in QUOTED_AS_DATA.finditer(sentence)]
        for key, number, unit in quotes:
            if key not in defaults:
                continue
            scale = next((units for suffix, units in UNITS.items() if key.endswith(suffix)), {None: 1})
            value = float(number) * scale.get(unit, 1)  # a word after the number that is no unit: as written
            if not any(abs(value - d) <= 1e-9 * max(1.0, abs(d)) for d in defaults[key]):
                found = f"{number} {unit}" if unit in scale and unit else number
                want = " or ".join(f"{d:g}" for d in sorted(defaults[key]))
                drift.append(f"`{key}` quoted as {found}, its default is {want}: {' '.join(sentence.split())[:160]}")
    return drift


def test_the_default_rule_catches_a_wrong_quote_and_passes_the_right_one_and_examples():
    defaults = {"serving_health_timeout_s": {1200.0}, "fanout_streams": {4.0}, "fabric_speed_max_buffer_mib": {2048.0}}
    assert quoted_default_drift("waits `serving_health_timeout_s`\n(1800 s) = 33 min at most.", defaults)
    assert quoted_default_drift("The pull runs `fanout_streams` (8) streams.", defaults)
    assert quoted_default_drift("Set `fanout_streams = 8` here.", defaults)
    assert not quoted_default_drift("waits `serving_health_timeout_s` (20 min by default) on a head.", defaults)
    assert not quoted_default_drift("at most `fabric_speed_max_buffer_mib` (2 GiB), and", defaults)
    assert not quoted_default_drift("a slower link needs more (`--data serving_health_timeout_s=3600`).", defaults)
    assert not quoted_default_drift("In the lab, `serving_health_timeout_s` (60 s) suffices.", defaults)
    assert not quoted_default_drift("`rank` (0 is the head)", defaults)


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if d != datadoc.DATA_KEYS_DOC],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_default_a_document_quotes_is_the_models(document):
    text = re.sub(r"^```.*?^```", "", document.read_text(), flags=re.M | re.S)  # code blocks are examples
    drift = quoted_default_drift(text, numeric_defaults())
    assert not drift, "\n".join(drift)


def rendered_alerts(**data) -> dict[str, dict]:
    """The alert rules as roles/monitoring renders them for the example site's inventory (its licence
    choice made in the test's data) with `data` on top."""
    import yaml

    from roles.monitoring.checks import rules_text
    from sparkfleet.inventory import load_cluster

    fleet = load_cluster(SITE_EXAMPLE / "inventory.py", cwd=str(ROOT),
                         overrides={"monitoring_enabled": True, **LICENSE_ACKNOWLEDGED, **data})
    return {rule["alert"]: rule for group in yaml.safe_load(rules_text(fleet))["groups"] for rule in group["rules"]}


def moved(value):
    """Another valid value near a default: ints one more, fractions of 1 halved, other floats x 1.5."""
    if isinstance(value, int):
        return value + 1
    return value / 2 if value <= 1 else value * 1.5


def test_every_alert_a_data_keys_description_names_is_one_that_key_moves():
    """A key's description names the alerts it sets, as docs/data-keys.md shows it: each named alert is
    in the rules, and every alert whose rule the key changes (rendered with the key moved) is named.
    A key may name more (monitoring_alert_fabric_link_mbits moves SparkfleetFabricSlow through each
    node's textfile, not the rule)."""
    shipped = rendered_alerts()
    wrong = []
    checked = 0
    for key, field in DATA_FIELDS.items():
        named = set(re.findall(r"`(Sparkfleet\w+)`", field.description or ""))
        if not named:
            continue
        checked += 1
        changed = {name for name, rule in rendered_alerts(**{key: moved(field.get_default())}).items()
                   if rule != shipped[name]}
        if named - set(shipped) or changed - named:
            wrong.append(f"{key}: names {sorted(named)}; the rules have none of {sorted(named - set(shipped))}, "
                         f"and the key also moves {sorted(changed - named)}")
    assert checked >= 8, checked  # the monitoring_alert_* keys that name their alerts
    assert not wrong, "\n".join(wrong)


INVENTORY_EXAMPLE = re.compile(r"^```python\n(.*?sparks\(.*?)^```", re.M | re.S)


def test_the_inventory_examples_are_valid_against_the_shipped_defaults(tmp_path):
    """Each inventory a document shows (a python block calling sparks()), written as the file it shows
    in a site whose group_data makes the licence choice alone (the shipped defaults make none), passes
    the checks a deploy runs before any connection with the checkout's group_data/all.py under it."""
    from sparkfleet.inventory import load_cluster

    examples = [(doc, m[1]) for doc in DOCUMENTS for m in INVENTORY_EXAMPLE.finditer(doc.read_text())]
    assert any(doc.name == "fleet.md" for doc, _ in examples), "docs/fleet.md's example inventory was not found"
    write_site_data(tmp_path)
    for i, (doc, code) in enumerate(examples):
        inventory = tmp_path / f"inventory_{i}.py"
        inventory.write_text(code)
        cluster = load_cluster(inventory, cwd=str(ROOT))  # a Refusal names every problem of the example
        assert len(cluster.nodes) == code.count('"rank":'), doc.name
