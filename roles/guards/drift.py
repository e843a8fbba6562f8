"""Recipe drift: the launch defaults a recipe update changes, and whether sparkfleet pins them.

The field report's recipe update made start.sh default CG_ESTIMATE=1, which would have re-enabled
the CUDA-graph KV deduction that killed a bring-up. A default that changes upstream must either be
pinned by sparkfleet (profile env or serving_env_pins) or acknowledged in data before a deploy
moves to the new commit.
"""
import re

# `: "${NAME:=VALUE}"`, `: ${NAME:=VALUE}`, `NAME=${NAME:-VALUE}`, `export NAME="${NAME:-VALUE}"`, `NAME=VALUE`
_PATTERNS = (
    re.compile(r'^\s*:\s+"?\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*):?=(?P<value>[^}]*)\}"?\s*$'),
    re.compile(r'^\s*(?:export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)="?\$\{(?P=name):?-(?P<value>[^}]*)\}"?\s*$'),
    re.compile(r'^\s*(?:export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>[^$`\s][^\s]*|"[^"$`]*"|)\s*$'),
)


def launch_defaults(text: str) -> dict[str, str]:
    """NAME -> default value, from a start script or an env file (first definition wins)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        for pattern in _PATTERNS:
            m = pattern.match(line)
            if m:
                out.setdefault(m["name"], m["value"].strip('"'))
                break
    return out


def drift_report(old: dict[str, str], new: dict[str, str], pinned: dict[str, str], acknowledged) -> tuple[list[str], list[str]]:
    """(one line per changed default, the ones that stop the deploy)."""
    lines, stops = [], []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name, "(unset)"), new.get(name, "(unset)")
        if before == after:
            continue
        if name in pinned:
            lines.append(f"{name}: {before} -> {after} (pinned by sparkfleet to {pinned[name]})")
        elif name in acknowledged:
            lines.append(f"{name}: {before} -> {after} (not pinned; acknowledged in recipe_drift_acknowledged)")
        else:
            lines.append(f"{name}: {before} -> {after} (NOT pinned)")
            stops.append(name)
    return lines, stops
