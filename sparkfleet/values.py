"""Values from data that reach a file or a shell on the nodes, checked before any connection.

Every string of a node's data (and every string inside its lists and mappings) may hold no
control character: a newline in an env value, a path or a name would start a new line in an env
file, a unit, a daemon config or a shell command. Names and paths are held to the characters that
need no quoting anywhere they are written. Every directory key (every `*_dir` of the node's data)
is held to one rule: absolute, normalised, never a system directory and never inside a tree that
belongs to the system or to a user (FORBIDDEN_TREES; sparkfleet's own /etc/sparkfleet excepted), and
never inside another directory key (the data dir may hold the weights and cache dirs: it is where
their free space is measured). Root writes into these directories, removes from them, and the rsync
daemon (as root, uid = root) serves three of them to every peer: /root/.ssh there hands out root's keys.
"""
from __future__ import annotations

import posixpath
import re
from typing import Any, Iterable

from sparkfleet.refusal import Problem

# Paths: absolute, normalised, letters, digits and . _ + - / only (no space, quote, $, ;, newline).
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._+/-]*$")
# Netdev and RDMA device names (IFNAMSIZ: at most 15 characters; never `.` or `..`, which the kernel refuses
# too, linux net/core/dev.c dev_valid_name: the name is a directory of /sys/class/net). Not starting with
# `-` or `.`: a word of `ip` and `ethtool` commands.
SAFE_IFNAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A package name as apt takes it.
SAFE_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]*$")

# The directory keys: every key of a node's data whose name ends in _dir is one of these (the unit
# test_every_directory_key_is_confined fails on a new one not listed here), each held to dir_problem.
# Key: what sparkfleet does there.
OWNED_DIRS = {
    "weights_dir": "weights (served to the peers by the rsync daemon)",
    "kernel_cache_dir": "kernel caches (served to the peers by the rsync daemon)",
    "serving_dir": "the ranks' root-only env files and the API key",
    "watchdog_state_dir": "watchdog's state (served to the peers by the rsync daemon)",
    "receipt_dir": "receipts (the oldest *.json of each profile's directory removed)",
}
# Where images, weights and caches live (its free space is checked); may hold the owned dirs.
DATA_DIR = "preflight_data_dir"
DIRECTORY_KEYS = (*OWNED_DIRS, DATA_DIR)
# Files, not directories: a key file is read where the operator keeps it (a hub token in /root is
# common); held to path_problem only, and to the key's own content checks where it is read.
OTHER_PATHS = ("weights_hf_token_file", "serving_api_key_file", "tls_cert_file", "tls_key_file", "tls_cert_ca_file")

# Never one of these exactly (the trees below aside): the roots of other software's data.
SYSTEM_DIRS = frozenset({
    "/", "/media", "/mnt", "/opt", "/srv", "/var", "/var/lib", "/var/cache", "/var/log", "/var/spool",
    "/var/mail", "/var/local", "/var/opt", "/var/backups",
})
# Never inside one of these trees (nor one of them): the system's configuration and programs, root's
# and the users' homes, kernel and device trees, runtime and temporary trees, and other daemons' data.
# Root follows a symlink a user planted in /home or /tmp; a daemon's tree is not sparkfleet's to prune.
FORBIDDEN_TREES = (
    "/etc", "/root", "/home", "/boot", "/usr", "/proc", "/sys", "/dev", "/run", "/bin", "/sbin", "/lib",
    "/lib32", "/lib64", "/libx32", "/snap", "/tmp", "/var/tmp", "/var/run", "/var/lock", "/var/lib/docker",
    "/var/lib/containerd", "/var/lib/apt", "/var/lib/dpkg", "/var/lib/systemd",
)
# sparkfleet's own configuration tree: the one place inside FORBIDDEN_TREES a directory key may be
# (serving_dir's default). It holds fixed files too (rsyncd.conf, watchdog.json, router.json), so a
# directory key other than serving_dir is never the tree itself (the served modules would expose them).
SPARKFLEET_ETC = "/etc/sparkfleet"
ALLOWED_FORM = ("an absolute directory of sparkfleet's own, outside " + ", ".join(FORBIDDEN_TREES[:10])
                + ", ... (such as under /var/lib/sparkfleet or a data disk's /srv/sparkfleet)")


def _strings(value: Any, where: str) -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k, f"{where} (a name)")
            yield from _strings(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")


def control_problem(text: str) -> str | None:
    bad = sorted({c for c in text if ord(c) < 32 or ord(c) == 127})
    if bad:
        names = ", ".join({"\n": "newline", "\r": "carriage return", "\t": "tab", "\0": "NUL"}.get(c, f"0x{ord(c):02x}")
                          for c in bad)
        return f"holds {names}: a value is one line in the env file, unit or command it reaches"
    return None


def under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def path_problem(path: str) -> str | None:
    if not SAFE_PATH.match(path):
        return ("must be an absolute path of letters, digits and . _ + - / only (no space, quote, $, ; or "
                "newline: it is written into units and shell commands)")
    if posixpath.normpath(path) != path:
        return f"must be normalised (no '..', '.', '//' or trailing '/'): {posixpath.normpath(path)}"
    return None


def dir_problem(path: str, key: str = "") -> str | None:
    """Why `path` cannot be a directory key's value (`key`: only serving_dir may be /etc/sparkfleet)."""
    problem = path_problem(path)
    if problem:
        return problem
    if path in SYSTEM_DIRS:
        return f"{path} is a system directory; sparkfleet writes into and removes from it"
    if path == SPARKFLEET_ETC and key != "serving_dir":
        return (f"{path} is sparkfleet's configuration directory (rsyncd.conf, watchdog.json, router.json); only "
                f"serving_dir may be it")
    if under(path, SPARKFLEET_ETC):
        return None
    for base in FORBIDDEN_TREES:
        if under(path, base):
            return f"{path} is a system directory" if path == base else f"is under {base}, a system tree"
    return None


def node_value_problems(node) -> list[Problem]:
    """Every value of one node's data that would break a file or a shell, and every directory
    setting that is a system directory or holds another's."""
    problems: list[Problem] = []
    name = node.name

    def refuse(key: str, detail: str, fix: str | None = None):
        problems.append(Problem(detail, [name], key=key, fix=fix))

    data = node.model_dump()
    for key, value in data.items():
        for where, text in _strings(value, key):
            why = control_problem(text)
            if why:
                refuse(key, f"key {where} = {text!r}: {why}", "write it on one line, without control characters")
    if problems:
        return problems

    for key in ("serving_env_pins",):
        bad = sorted(k for k in getattr(node, key) if not ENV_NAME.match(k))
        if bad:
            refuse(key, f"key '{key}': {bad} not variable names (letters, digits, _; not starting with a digit)")
    for key in ("fabric_netdev", "fabric_twin_netdev"):
        value = getattr(node, key)
        if value is not None and not SAFE_IFNAME.match(value):
            refuse(key, f"key '{key}' = {value!r}: not a netdev name (at most 15 of letters, digits, _ . -)")
    for key in ("rdma_hca", "rdma_twin_hca"):
        value = getattr(node, key)
        if value is not None and not SAFE_IFNAME.match(value):
            refuse(key, f"key '{key}' = {value!r}: not an RDMA device name (at most 15 of letters, digits, _ . -)")
    if not SAFE_PACKAGE.match(node.docker_package):
        refuse("docker_package", f"key 'docker_package' = {node.docker_package!r}: not a package name")
    for i, word in enumerate(node.serving_extra_args):
        if word.startswith("-") and not word.startswith("--"):
            refuse("serving_extra_args", f"key serving_extra_args[{i}] = {word!r}: short options are not rendered")

    dirs = {key: getattr(node, key) for key in DIRECTORY_KEYS}
    for key, path in dirs.items():
        why = dir_problem(path, key)
        if why:
            default = type(node).model_fields[key].default
            refuse(key, f"key '{key}' = {path!r}: {why}; allowed: {ALLOWED_FORM}",
                   f"use a directory of its own, such as the default {default}")
    for key in OTHER_PATHS:
        path = getattr(node, key)
        why = path and path_problem(path)
        if why:
            refuse(key, f"key '{key}' = {path!r}: {why}")
    if problems:
        return problems
    owned = list(OWNED_DIRS)
    for i, a in enumerate(owned):
        for b in owned[i + 1:]:
            pa, pb = dirs[a], dirs[b]
            if under(pa, pb) or under(pb, pa):
                outer, inner = (a, b) if under(pb, pa) else (b, a)
                refuse(outer, f"key '{outer}' = {dirs[outer]!r} holds key '{inner}' = {dirs[inner]!r}: the "
                       f"{OWNED_DIRS[outer]} and the {OWNED_DIRS[inner]} each need a directory of their own",
                       "give each its own directory (the defaults: " + ", ".join(
                           f"{k} {type(node).model_fields[k].default}" for k in owned) + ")")
    for key in owned:
        if under(dirs[DATA_DIR], dirs[key]):
            refuse(DATA_DIR, f"key '{DATA_DIR}' = {dirs[DATA_DIR]!r} is inside key '{key}' = {dirs[key]!r}; the "
                   f"data dir may hold the weights and cache dirs, never sit inside one")
    return problems
