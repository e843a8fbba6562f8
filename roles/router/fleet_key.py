"""One API key for the fleet behind the router.

smg takes one key (`api_key`) that clients must present and that it sends to every backend, so every
routed group's head must require that same key. Today each head has its own key file
(roles/serving/api_key.py: `serving_api_key_file`, else `<serving_dir>/api-key` generated on the first
deploy). With a router, the key of the router group's head is the fleet's: this module reads it once
per run, at prepare, over the deploy's SSH connection into the controller's memory
(sparkfleet/keyfiles.py, as the benchmark receipt reads it; it is in no fact, command line or log),
and the deploy writes it, root-only from the first byte, through a shell's stdin (no files.put:
`--diff` would print it), into the key file of every other routed head and of the router node
wherever theirs differs (roles/router/key_tasks.py, before roles/serving/api_key_tasks.py). A head
whose key file is replaced counts as a changed key
(roles/serving/api_key.py decide_key, given `replaced_on` by tools/plan.py): its derived files are rewritten and its group
restarts once. On the first deploy (no key anywhere) the controller generates it (32 random bytes,
hex, as the head would) and writes it to the router group's head too. Only a key file with nothing at
its path counts as absent: one that exists but cannot be read stops the deploy at prepare naming the
host, the path and the error (a new key would restart every group and lock every client out).

What is compared is the sha1 of each key file (pyinfra's Sha1File fact), never the key.
"""
from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, field

from pyinfra.api.exceptions import DeployError
from pyinfra.facts.files import Sha1File

from roles.router.node_config import key_holders
from sparkfleet.model.api_key import KEY_PATTERN, generated, key_file
from sparkfleet.inventory import fleet_from_state
from sparkfleet.keyfiles import KeyFileError, read, write
from sparkfleet.once import once_per_fleet


@dataclass
class KeyPlan:
    source: str  # the node whose key file is the fleet's (the router group's head)
    key: bytes = field(repr=False)  # the key file's content, as read (or generated)
    writes: dict = field(default_factory=dict)  # node name -> key file path to (re)write with `key`


def plan(state) -> KeyPlan | None:
    """Once per run, at prepare: the fleet's key and where it must be written (None: no router, or a
    source key file roles/serving refuses anyway: absent though named in data, or not one valid line)."""
    def compute():
        holders = key_holders(fleet_from_state(state))
        if holders is None:
            return None
        source, targets = holders
        try:
            raw = read(state.inventory.get_host(source.name), key_file(source))
        except KeyFileError as e:
            raise DeployError(f"{e}; it is the fleet's API key (the router group's head's): a new one is generated "
                              f"only when the file does not exist. Nothing was changed.") from None
        writes = {}
        if raw is None:
            if not generated(source):
                return None  # named in data and absent: roles/serving stops the deploy at prepare
            raw = secrets.token_hex(32).encode()
            writes[source.name] = key_file(source)
        if not re.fullmatch(KEY_PATTERN, raw.decode(errors="replace").strip()) or raw.strip().count(b"\n"):
            return None  # roles/serving refuses the source key's format at prepare
        digest = hashlib.sha1(raw).hexdigest()
        for node in targets:
            path = key_file(node)
            found = state.inventory.get_host(node.name).get_fact(Sha1File, path=path)
            if found != digest:
                writes[node.name] = path
        return KeyPlan(source=source.name, key=raw, writes=writes)

    return once_per_fleet(state, "router-fleet-key", compute)


def replaced_on(state, name: str) -> bool:
    """True when this run writes the fleet's key into `name`'s key file (a changed key there)."""
    found = plan(state)
    return found is not None and name in found.writes


def write_fleet_key(path: str) -> None:
    """Operation body (a node of KeyPlan.writes): the fleet's key into `path`, root-only from its first
    byte, over the shell's stdin; the key is taken from the plan here, so it is in no operation's
    arguments either."""
    from pyinfra import host, state  # the operation's own host and state, at execution

    write(host, path, plan(state).key)
