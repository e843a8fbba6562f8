"""Inventory helpers: the cluster of an inventory, validated once from the data pyinfra merges.

In a pyinfra run of sparkfleet's deploy files, the data of every host is validated after pyinfra
has merged it (inventory, every group data file, --group-data, --data) and before it connects
(sparkfleet.run, installed by config.py; sparks() installs it too). Outside pyinfra (tests, the
config printer) `load_cluster` builds the inventory with pyinfra's own loader and runs the same
validation, so both see exactly the same data.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from sparkfleet.config import ClusterConfig, ConfigError, build_cluster
from sparkfleet.run import DataSources, hosts_problems, install, validate_inventory


HostEntry = tuple[str, Mapping[str, Any]]


def sparks(inventory_file: str, *hosts: HostEntry) -> list[HostEntry]:
    """Declare the nodes of a cluster in an inventory file.

    Inside a pyinfra run the merged data is validated before any connection (sparkfleet.run); a
    name declared twice, which pyinfra would silently merge into one host, is refused there too.
    The inventory file's directory is the site (the user's data: inventory, group_data/, profiles/):
    each node's serving_site names it, unless the node's own data does, so the site's
    profiles/NAME.yaml is found wherever the site is and whichever command reads it.
    """

    problems = hosts_problems(hosts, inventory_file)
    run = install()
    if problems:
        if run is None:
            raise ConfigError(problems, title=f"{inventory_file}: invalid inventory")
        run.inventory_problems.extend(problems)
    site = str(Path(inventory_file).resolve().parent)
    return [(name, {"serving_site": site, **data}) for name, data in hosts]


# The site directory (docs/configuration.md): the user's inventory, group_data/ and profiles/, outside the
# checkout's tracked files. The root inventory.py is its front: $SPARKFLEET_SITE, else <checkout>/site.
SITE_VARIABLE = "SPARKFLEET_SITE"


def site_directory(checkout: str | os.PathLike) -> Path:
    """The site the checkout's inventory.py fronts: $SPARKFLEET_SITE (relative to the cwd), else <checkout>/site."""
    given = os.environ.get(SITE_VARIABLE)
    return (Path(given).expanduser() if given else Path(checkout) / "site").resolve()


def site_front(front_file: str) -> dict[str, list[HostEntry]]:
    """The groups of the site's inventory, each host carrying the data `pyinfra SITE/inventory.py` gives it,
    for the checkout's inventory.py to declare as its own.

    Why: `pyinfra inventory.py deploy.py` from the checkout reads group_data only from the cwd and beside
    the inventory file given (pyinfra_cli/inventory.py, make_inventory_from_files: lines 366-371), both the
    checkout's group_data/, so the site's group_data/ would be missed. Here pyinfra's own loader builds the
    site's inventory with its group_data (cwd = the site: read once), and each host's data is merged as
    pyinfra's Host merges it (pyinfra/api/host.py HostData: host > its groups, in order > all; Inventory
    get_host_data / get_groups_data / get_data). Handed over as host data, it lies above the checkout's
    group_data/all.py, as the site's group_data does in `pyinfra SITE/inventory.py`: both forms give every
    host the same data. serving_site is the site (sparks() is called by the site's inventory).
    """
    from pyinfra_cli.inventory import make_inventory_from_files

    from sparkfleet.refusal import Problem
    from sparkfleet.run import SITE_FRONTS

    front = Path(front_file).resolve()
    site = site_directory(front.parent)
    site_inventory = site / "inventory.py"
    if not site_inventory.is_file() or site_inventory.resolve() == front:
        given = os.environ.get(SITE_VARIABLE)
        looked = (f"{SITE_VARIABLE}={given} ({site_inventory})" if given
                  else f"{SITE_VARIABLE} (not set), then {site_inventory}")
        problem = Problem(
            f"no site inventory: looked at {looked}" + (" (the checkout itself)" if site_inventory.is_file() else ""),
            fix=f"make your site in the checkout ({front.parent}): cp -r site.example site (or elsewhere, with "
                f"{SITE_VARIABLE}=DIR), then edit its inventory.py and group_data/all.py (docs/configuration.md)")
        run = install()  # as sparks() refuses: inside a pyinfra run, in its one block before any connection
        if run is None:
            raise ConfigError([problem], title=f"{front_file}: no site directory")
        run.inventory_problems.append(problem)
        return {}
    inventory = make_inventory_from_files(str(site_inventory), cwd=str(site))
    SITE_FRONTS[str(front)] = (inventory, str(site_inventory))
    groups: dict[str, list[HostEntry]] = {}
    for group, hosts in inventory.groups.items():
        if group == "all" or not hosts:  # all: rebuilt by pyinfra from these groups; empty: data-only groups
            continue
        groups[group] = [(host.name, {**inventory.get_data(), **inventory.get_groups_data(host.groups),
                                      **inventory.get_host_data(host.name)}) for host in hosts]
    return groups


def load_inventory(inventory_file: str | os.PathLike, cwd: str | None = None,
                   overrides: Mapping[str, Any] | None = None, group_data_dirs=()):
    """The pyinfra Inventory of an inventory file, built by pyinfra's own loader (its group data
    folders, in its order), with `overrides` as `--data KEY=VALUE` would give them."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    cwd = str(cwd or os.getcwd())
    with ctx_state.use(State()):
        return make_inventory(str(inventory_file), cwd=cwd, override_data=dict(overrides or {}),
                              group_data_directories=list(group_data_dirs))


def load_cluster(
    inventory_file: str | os.PathLike, cwd: str | None = None, overrides: Mapping[str, Any] | None = None,
    group_data_dirs=(),
) -> ClusterConfig:
    """The validated cluster of an inventory file, outside pyinfra (tests, the config printer).

    overrides apply to every host, last, as pyinfra's `--data KEY=VALUE` does. Raises Refusal.
    """

    cwd = str(cwd or os.getcwd())
    inventory = load_inventory(inventory_file, cwd, overrides, group_data_dirs)
    data_args = tuple(f"{k}={v!r}" for k, v in (overrides or {}).items())
    sources = DataSources(inventory, str(Path(inventory_file).resolve()), cwd, data_args, tuple(group_data_dirs))
    return validate_inventory(inventory, sources)


def fleet_from_state(state) -> ClusterConfig:
    """The validated fleet (every serving group) as pyinfra merged it (inside a deploy). Cached on
    the state."""
    cached = getattr(state, "_sparkfleet_cluster", None)
    if cached is None:
        cached = build_cluster((h.name, h.data.dict()) for h in state.inventory)
        state._sparkfleet_cluster = cached
        state._sparkfleet_groups = None  # built on first use (cluster_from_state)
    return cached


def current_group(state) -> str | None:
    """The serving group of the host pyinfra is working on (its greenlet's host), or None outside one."""
    from pyinfra.context import ctx_host

    host = ctx_host.get()
    fleet = fleet_from_state(state)
    node = fleet.find(host.name) if host is not None else None
    return node.serving_group if node is not None else None


def cluster_from_state(state) -> ClusterConfig:
    """The serving group of the current host: what a role sees as "the cluster" (its head, its
    workers, its peers). Every prepare-time decision is taken per group, so groups are independent;
    with one group (today's pair) it is the whole inventory. Outside a host's context: the fleet."""
    fleet = fleet_from_state(state)
    group = current_group(state)
    if group is None:
        return fleet
    groups = getattr(state, "_sparkfleet_groups", None)
    if groups is None:
        groups = state._sparkfleet_groups = fleet.groups
    return groups[group]


def group_hosts(state, hosts) -> list:
    """The hosts among `hosts` that are in the current host's serving group (all of them outside a host)."""
    fleet = fleet_from_state(state)
    group = current_group(state)
    if group is None:
        return list(hosts)
    return [h for h in hosts if (n := fleet.find(h.name)) is not None and n.serving_group == group]
