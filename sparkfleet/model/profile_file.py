"""Reading a profile file so that every problem names the file, the line and the value found.

A YAML syntax error, a file that is not a mapping, and every field the Profile model refuses
become one ValueError whose text reads `<file> line <n>: <field> = <value found>: <what is allowed>`.
"""
import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


def read(path: Path) -> tuple[Any, yaml.Node | None]:
    """The file's data and its YAML node tree (for line numbers); a syntax error names file, line, column.

    The file is read every time, its YAML parsed once per distinct text (_parsed), and each caller
    gets a copy of the data of its own (load_profile changes it). Why: a deploy asks for a node's
    profile some 25 times per host at prepare (node_profile, in every role), and the two YAML passes
    of the shipped profile (7.6 ms) were a quarter of the deploy's own CPU on the controller, four
    hosts' worth in the fleet (bench/noop.py --fleet; docs/performance.md)."""
    text = path.read_text()
    try:
        data, node = _parsed(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{path} line {mark.line + 1} column {mark.column + 1}" if mark else str(path)
        what = " ".join(str(p) for p in (getattr(err, "context", None), getattr(err, "problem", None)) if p) or str(err)
        raise ValueError(f"{where}: not valid YAML ({what}); fix the syntax there") from None
    return copy.deepcopy(data), node


@lru_cache(maxsize=32)
def _parsed(text: str) -> tuple[Any, yaml.Node | None]:
    """A profile's text parsed: its data and its node tree (read only: line_of walks it). A text that
    is not valid YAML raises, and is not kept."""
    return yaml.safe_load(text), yaml.compose(text, Loader=yaml.SafeLoader)


def line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """1-based line of the deepest key of `loc` the file has (the key's own line)."""
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def describe(err: ValidationError, node: yaml.Node | None) -> str:
    """Every refused field: `line <n>: <field> = <value found>: <message>` ('; ' between them)."""
    parts = []
    for e in err.errors():
        loc = tuple(e["loc"])
        line = line_of(node, loc) or (line_of(node, loc[:1]) if loc else None)
        at = f"line {line}: " if line else ""
        field = ".".join(map(str, loc))
        if e["type"] == "missing":
            parts.append(f"{field} is required (not in the file)")
        elif not loc:
            parts.append(f"{at}{e['msg']}")
        else:
            parts.append(f"{at}{field} = {e['input']!r}: {e['msg']}")
    return "; ".join(parts)
