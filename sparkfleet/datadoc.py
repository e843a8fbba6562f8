"""docs/data-keys.md, written from the config model: every data key, where it is set, its default
(and the value group_data/all.py ships, when that differs) and its meaning, the field's own
description. One source: the text a refusal quotes is the text the reference shows.
`python -m sparkfleet docs` (make docs) writes it; tests/unit/test_docs.py fails when it is stale."""
import json
import re
import runpy
from pathlib import Path

from sparkfleet.config import DATA_FIELDS, NodeConfig

ROOT = Path(__file__).resolve().parents[1]
DATA_KEYS_DOC = ROOT / "docs" / "data-keys.md"
SHIPPED_DEFAULTS = ROOT / "group_data" / "all.py"

HEADER = """\
<!-- Written by `python -m sparkfleet docs` (make docs) from the config model's field descriptions
     (sparkfleet/config.py and sparkfleet/model/); edit those, not this file. -->
# Data keys

Every key is validated by the config model (`sparkfleet/config.py`, composed of each role's
schema in `sparkfleet/model/<role>.py`); an unknown key is refused, naming the closest known one. pyinfra's own keys (`ssh_*`,
`_sudo`, ...) pass through. The default is the model's; where `group_data/all.py` (the defaults
shipped for DGX Sparks) sets another value, it is shown beside it, and `lab/group_data/all.py`
overrides some for the lab. `python -m sparkfleet config inventory.py` prints what each node ends
up with. The keys are grouped by the role whose schema declares them.
"""

FOOTER = """
Derived, not settable: `name` (the inventory name), `management_given` (`ssh_hostname`, else the
name) and `management_address` (an IP address: `management_given` when it is one, else the one IPv4
address it resolved to on the controller; see [Addresses, not names](security.md#addresses-not-names)).
"""


def shown(value) -> str:
    """A value as data writes it: true/false, numbers, text, JSON lists and mappings."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (list, tuple, dict)):
        return f"`{json.dumps(list(value) if isinstance(value, tuple) else value)}`"
    return f"`{value}`"


def default_cell(key: str, shipped: dict) -> str:
    field = DATA_FIELDS[key]
    if field.is_required():
        return "required"
    default = field.get_default(call_default_factory=True)
    cell = shown(default)
    if key in shipped and shipped[key] != default:
        cell += f" ({shown(shipped[key])} in group_data/all.py)"
    return cell


def set_in(key: str) -> str:
    field = DATA_FIELDS[key]
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return extra.get("set_in") or ("inventory, per node" if field.is_required() else "group_data")


def meaning(key: str) -> str:
    """The field's description, its references to other documents made links (from docs/)."""
    text = DATA_FIELDS[key].description or ""
    text = re.sub(r"\bdocs/([a-z-]+\.md(?:#[a-z0-9-]+)?)", r"[\1](\1)", text)
    text = re.sub(r"\bREADME\.md(#[a-z0-9-]+)?", lambda m: f"[README{m[1] or ''}](../README.md{m[1] or ''})", text)
    return text.replace("|", "\\|")


def owner(key: str) -> str:
    """The module that declares the key: sparkfleet/model/<role>.py, or sparkfleet/config.py."""
    for cls in NodeConfig.__mro__:
        if key in cls.__dict__.get("__annotations__", {}):
            return cls.__module__.replace(".", "/") + ".py"
    return "sparkfleet/config.py"


def shipped_defaults() -> dict:
    values = runpy.run_path(str(SHIPPED_DEFAULTS))
    return {k: v for k, v in values.items() if k in DATA_FIELDS}


def data_keys_markdown() -> str:
    shipped = shipped_defaults()
    groups: dict[str, list[str]] = {}
    for key in DATA_FIELDS:
        groups.setdefault(owner(key), []).append(key)
    out = [HEADER]
    for module in sorted(groups, key=lambda m: (not m.startswith("sparkfleet/"), m)):
        out.append(f"\n## {module}\n\n| key | set in | default | meaning |\n| --- | --- | --- | --- |\n")
        for key in groups[module]:
            out.append(f"| `{key}` | {set_in(key)} | {default_cell(key, shipped)} | {meaning(key)} |\n")
    out.append(FOOTER)
    return "".join(out)


def write() -> Path:
    DATA_KEYS_DOC.parent.mkdir(exist_ok=True)
    DATA_KEYS_DOC.write_text(data_keys_markdown())
    return DATA_KEYS_DOC
