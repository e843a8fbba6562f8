"""The README lists every data key of the config model with its default, and no key the model lacks."""
import re
from pathlib import Path

from sparkfleet.config import DATA_FIELDS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
TABLE = README.split("## Data keys", 1)[1].split("\n## ", 1)[0]
ROWS = {m[1]: m[2] for m in re.finditer(r"^\| `([a-z_]+)` \| [^|]+ \| ([^|]+) \|", TABLE, re.M)}


def test_every_model_key_is_in_the_readme():
    assert sorted(ROWS) == sorted(DATA_FIELDS)


def test_readme_defaults_match_the_model():
    for key, field in DATA_FIELDS.items():
        shown = ROWS[key].strip()
        if field.is_required():
            assert shown == "required", key
        elif field.get_default(call_default_factory=True) is None:
            assert shown.startswith("none"), key
        else:
            default = field.get_default(call_default_factory=True)
            text = str(default).lower() if isinstance(default, bool) else str(default).replace("'", '"')
            assert shown.startswith(f"`{text}`"), f"{key}: README says {shown}, model says {default!r}"
