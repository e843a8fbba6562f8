"""Inventory helpers: validate the cluster when the inventory is loaded, before pyinfra connects.

pyinfra executes the inventory file, then connects to every host, and only then runs deploy.py.
Validation in deploy.py would come after the first SSH connection, so ``sparks()`` validates
the merged data (group_data < host data, merged the way pyinfra merges it) from inside the
inventory file and stops the run there with every problem listed.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Mapping

import runpy
import types

from sparkfleet.config import ClusterConfig, ConfigError, build_cluster

HostEntry = tuple[str, Mapping[str, Any]]


def _data_file(path: Path) -> dict[str, Any]:
    """A group_data file's values, as pyinfra reads them: no dunders, no imported modules or classes."""
    attrs = runpy.run_path(str(path))
    return {
        k: v
        for k, v in attrs.items()
        if not k.startswith("__") and not isinstance(v, (types.ModuleType, type, types.FunctionType))
    }

# Inside pyinfra a bad inventory ends the run (exit 2, message on stderr); when sparkfleet
# itself loads an inventory (tests, the config printer) the ConfigError is raised instead.
_raise_config_errors = False


def group_data_for(inventory_file: str | os.PathLike, cwd: str | None = None) -> dict[str, Any]:
    """group_data/all.py then group_data/<inventory stem>.py, from the cwd then the inventory's folder.

    The same folders, in the same order, that pyinfra's CLI reads.
    """
    inventory_path = Path(inventory_file).resolve()
    folders = [Path(cwd or os.getcwd()) / "group_data"]
    if inventory_path.parent != folders[0].parent:
        folders.append(inventory_path.parent / "group_data")
    out: dict[str, Any] = {}
    for group in ("all", inventory_path.stem):
        for folder in folders:
            if (folder / f"{group}.py").is_file():
                out.update(_data_file(folder / f"{group}.py"))
    return out


def merge_hosts(inventory_file: str | os.PathLike, hosts: tuple[HostEntry, ...], cwd: str | None = None):
    shared = group_data_for(inventory_file, cwd)
    return [(name, {**shared, **dict(data)}) for name, data in hosts]


def sparks(inventory_file: str, *hosts: HostEntry) -> list[HostEntry]:
    """Declare the nodes of a cluster in an inventory file; refuse bad data before any connection."""
    try:
        build_cluster(merge_hosts(inventory_file, hosts))
    except ConfigError as err:
        if _raise_config_errors:
            raise
        print(f"sparkfleet: {inventory_file}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    return [(name, dict(data)) for name, data in hosts]


def load_cluster(
    inventory_file: str | os.PathLike, cwd: str | None = None, overrides: Mapping[str, Any] | None = None
) -> ClusterConfig:
    """The validated cluster of an inventory file, outside pyinfra (tests, the config printer).

    overrides apply to every host, last, as pyinfra's `--data KEY=VALUE` does.
    """
    global _raise_config_errors
    _raise_config_errors = True
    try:
        attrs = runpy.run_path(str(inventory_file))
    finally:
        _raise_config_errors = False
    hosts: list[HostEntry] = []
    for value in attrs.values():
        if isinstance(value, list) and value and all(isinstance(h, tuple) and len(h) == 2 for h in value):
            hosts.extend(value)
    merged = merge_hosts(inventory_file, tuple(hosts), cwd)
    return build_cluster([(name, {**data, **dict(overrides or {})}) for name, data in merged])


def cluster_from_state(state) -> ClusterConfig:
    """The validated cluster as pyinfra merged it (inside a deploy). Cached on the state."""
    cached = getattr(state, "_sparkfleet_cluster", None)
    if cached is None:
        cached = build_cluster((h.name, h.data.dict()) for h in state.inventory)
        state._sparkfleet_cluster = cached
    return cached
