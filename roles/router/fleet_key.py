"""One API key for the fleet behind the router.

smg takes one key (`api_key`) that clients must present and that it sends to every backend, so every
routed group's head must require that same key. Today each head has its own key file
(roles/serving/api_key.py: `serving_api_key_file`, else `<serving_dir>/api-key` generated on the first
deploy). With a router, the key of the router group's head is the fleet's: key_facts reads it in the
run's facts pass (step 1, tools/plan.py fleet_facts), over the deploy's SSH connection into the
controller's memory (sparkfleet/keyfiles.py, as the benchmark receipt reads it; it is in no fact,
command line or log), with the sha1 of every other holder's key file; decide, a pure function of
those, is the key's fate in the run's plan (step 1b: sparkfleet/decided.py FleetDecision, printed
under the router's line). The deploy writes it, root-only from the first byte, through a shell's
stdin (no files.put: `--diff` would print it), into the key file of every other routed head and of
the router node wherever theirs differs (roles/router/key_tasks.py, before
roles/serving/api_key_tasks.py). A head whose key file is replaced counts as a changed key
(roles/serving/api_key.py decide_key, told so by tools/plan.py from this verdict): its derived files
are rewritten and its API proxy reloads; its group keeps serving (the engine holds no key). On the first deploy (no key anywhere) the controller
generates it (32 random bytes, hex, as the head would) and writes it to the router group's head too.
Only a key file with nothing at its path counts as absent: one that exists but cannot be read stops
the deploy at prepare naming the host, the path and the error (a new key would lock every client
out).

What is compared is the sha1 of each key file (pyinfra's Sha1File fact), never the key.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from pyinfra.api.exceptions import DeployError
from pyinfra.facts.files import Sha1File

from roles.router.node_config import key_holders
from sparkfleet.decided import fleet_decision
from sparkfleet.keyfiles import KeyFileError, read, write
from sparkfleet.model.api_key import KEY_PATTERN, generated, key_file
from sparkfleet.verdicts import FleetKey


@dataclass(frozen=True)
class KeyFacts:
    """What the facts pass read of the fleet key's holders, at prepare."""
    source: bytes | None = field(repr=False)  # the source key file's content (None: nothing at its path)
    sha1: dict[str, str | None] = field(default_factory=dict)  # every other holder -> its key file's sha1


def key_facts(state, fleet) -> KeyFacts | None:
    """The facts pass's reader (tools/plan.py fleet_facts): the source key file into the controller's
    memory and each other holder's sha1; None without a router. A source key file that exists but
    cannot be read stops the deploy (DeployError, raised by the plan at step 1b)."""
    holders = key_holders(fleet)
    if holders is None:
        return None
    source, targets = holders
    try:
        raw = read(state.inventory.get_host(source.name), key_file(source))
    except KeyFileError as e:
        raise DeployError(f"{e}; it is the fleet's API key (the router group's head's): a new one is generated "
                          f"only when the file does not exist. Nothing was changed.") from None
    return KeyFacts(source=raw, sha1={n.name: state.inventory.get_host(n.name).get_fact(Sha1File, path=key_file(n))
                                      for n in targets})


def decide(fleet, facts: KeyFacts | None, fresh: bytes) -> FleetKey | None:
    """The fleet key's fate, a pure function of the facts pass's KeyFacts: the key and where it is
    written (None: no router, or a source key file roles/serving refuses anyway: absent though named
    in data, or not one valid line). `fresh`: the key the controller generates when nothing is at the
    source's path (tools/plan.py: 32 random bytes, hex, as the head would)."""
    holders = key_holders(fleet)
    if holders is None or facts is None:
        return None
    source, targets = holders
    raw, writes = facts.source, {}
    if raw is None:
        if not generated(source):
            return None  # named in data and absent: roles/serving stops the deploy at prepare
        raw = fresh
        writes[source.name] = key_file(source)
    if not re.fullmatch(KEY_PATTERN, raw.decode(errors="replace").strip()) or raw.strip().count(b"\n"):
        return None  # roles/serving refuses the source key's format at prepare
    digest = hashlib.sha1(raw).hexdigest()
    for node in targets:
        if facts.sha1.get(node.name) != digest:
            writes[node.name] = key_file(node)
    return FleetKey(source=source.name, key=raw, writes=writes, generated=facts.source is None)


def write_fleet_key(path: str) -> None:
    """Operation body (a node of the plan's key writes): the fleet's key into `path`, root-only from
    its first byte, over the shell's stdin; the key is taken from the run's plan here, so it is in no
    operation's arguments either."""
    from pyinfra import host, state  # the operation's own host and state, at execution

    write(host, path, fleet_decision(state).key.key)
