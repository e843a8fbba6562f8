"""The README and docs/: the data-key reference is the config model's (written from it, never stale),
every link between the documents reaches a file and a heading that exist, and the README stays a
ten-minute read."""
import re
from pathlib import Path

import pytest

from sparkfleet import datadoc
from sparkfleet.config import DATA_FIELDS

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
