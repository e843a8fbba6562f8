"""Render role templates. A template's path mirrors its target: roles/<role>/templates/<target>.j2.

Rendering happens locally into a string, so a deploy puts exactly what the tests render, and a
file on a node changes only when its rendered text does.
"""
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

ROOT = Path(__file__).resolve().parent.parent

_env = Environment(
    # roles/ for role templates, templates/ for the partials every role shares.
    loader=FileSystemLoader([str(ROOT / "roles"), str(ROOT / "templates")]),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,
)


def render(role: str, target: str, **context) -> str:
    """The text of `target` (an absolute path on the node) as rendered by `role`."""
    assert target.startswith("/"), target
    return _env.get_template(f"{role}/templates{target}.j2").render(role=role, target=target, **context)


def sha1_text(text: str) -> str:
    """sha1 of a rendered file, as pyinfra's Sha1File fact reports the file on a node."""
    from hashlib import sha1

    return sha1(text.encode()).hexdigest()
