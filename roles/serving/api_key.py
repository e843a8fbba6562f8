"""The head's API key: one root-only file, and the root-only files derived from it on the head.

The key never passes through pyinfra (no fact returns it, no command carries it): the head reads
the key file and writes, in serving_dir, each mode 0600 root (the one reader on the controller is the
benchmark receipt, roles/receipt/receipt.py, over SFTP into memory, then its load generator's stdin):
  api-key.curl  header = "Authorization: Bearer <key>"   curl -K for every probe that asks the API
  api-key.haproxy  Bearer <key>               the API proxy's pattern file (roles/api_proxy: HAProxy's
                                              master reads it as root at start and reload)
The engine gets no key: the API proxy checks it in front of the engine (sparkfleet/model/engine.py
ENGINE_HTTP_HOST). RETIRED_FILES, the engine's key files an earlier sparkfleet wrote, are removed.
With no serving_api_key_file in data, the key file is <serving_dir>/api-key, generated on the first
deploy from 32 bytes of /dev/urandom (64 hex digits).
"""
import shlex

from pyinfra.api import FactBase
from pyinfra.api.exceptions import DeployError

from sparkfleet.model.engine import KEY_CURL_FILE, KEY_PROXY_FILE
from sparkfleet.model.api_key import KEY_PATTERN, KEY_TEXT, generated, key_file  # noqa: F401 (this role's API)
from sparkfleet.keyfiles import generate_command
from sparkfleet.keyfiles import problem as key_file_problem
from sparkfleet.keyfiles import state_command as key_file_state


# The engine's own key files, which sparkfleet wrote in serving_dir until the engine stopped getting
# the key: vLLM's second --env-file (VLLM_API_KEY=<key>) and SGLang's --config (api-key: "<key>").
# Nothing reads them now; a copy of the key left there is one reader too many, so the deploy removes
# them (their presence makes the key's state stale).
RETIRED_FILES = ("api-key.env", "api-key.yaml")


def curl_config(node) -> str:
    return f"{node.serving_dir}/{KEY_CURL_FILE}"


def _derived(node) -> list[tuple[str, str]]:
    d = node.serving_dir
    return [
        (f"{d}/{KEY_CURL_FILE}", 'header = \\"Authorization: Bearer %s\\"\\n'),
        (f"{d}/{KEY_PROXY_FILE}", "Bearer %s\\n"),
    ]


def retired(node) -> list[str]:
    """The retired files' paths on `node`; never the key file itself, wherever data puts it."""
    return [path for path in (f"{node.serving_dir}/{name}" for name in RETIRED_FILES) if path != key_file(node)]


def state_command(node) -> str:
    """One line: missing | unreadable <why> | owner <user> <mode> | format | stale | ok. Never the key.
    Only a path with nothing at it is missing (sparkfleet/keyfiles.py): a key file that cannot be read
    is refused, never replaced by a new key. A retired file still there is stale (write_command removes it)."""
    stale = " || ".join(
        [f'! printf "{fmt}" "$v" | cmp -s - {shlex.quote(path)}' for path, fmt in _derived(node)]
        + [f"[ -e {shlex.quote(path)} ] || [ -L {shlex.quote(path)} ]" for path in retired(node)]
    )
    modes = " || ".join(
        f'[ "$(stat -c %U:%a {shlex.quote(path)} 2>/dev/null)" != root:600 ]' for path, _ in _derived(node)
    )
    return (key_file_state(key_file(node), KEY_PATTERN)
            + f"elif {stale} || {modes}; then echo stale; else echo ok; fi; fi")


class ApiKeyState(FactBase):
    """The head's key file and its derived files: missing, owner <user> <mode>, format, stale or ok."""

    def command(self, command: str) -> str:
        return command

    def process(self, output):
        return " ".join(output).strip()


def problem(node, found: str) -> str | None:
    """A refusal for a key file the deploy must not use (None when it can go on)."""
    path = key_file(node)
    if found == "missing" and not generated(node):
        # install -D: the file's directory may not exist yet (a fresh node has no /etc/sparkfleet); -D
        # makes only the missing ones and changes no existing directory's mode, and the file is 0600
        # from its creation (the deploy makes serving_dir 0700 itself).
        return (f"{node.name}: serving_api_key_file {path} does not exist; create it root-only "
                f"(install -D -m 0600 /dev/stdin {path} < key.txt) or remove serving_api_key_file from data to "
                f"have sparkfleet generate {node.serving_dir}/api-key. Nothing was changed.")
    return key_file_problem(node.name, "serving_api_key_file", path, found, KEY_TEXT)


def write_command(node) -> str:
    """On the head: generate the key when sparkfleet owns it and it is absent, then (re)write the
    derived files, all 0600 root. The key is only ever in the shell's variable."""
    k = shlex.quote(key_file(node))
    lines = ["set -e", "umask 077", f"mkdir -p {shlex.quote(node.serving_dir)}"]
    if generated(node):
        lines.append(generate_command(key_file(node)))
    lines.append(f"v=$(cat {k})")
    if retired(node):
        lines.append(f"rm -f {' '.join(shlex.quote(path) for path in retired(node))}")
    for path, fmt in _derived(node):
        q = shlex.quote(path)
        lines.append(f'rm -f {q}.new && printf "{fmt}" "$v" > {q}.new && chown root:root {q}.new && '
                     f'chmod 0600 {q}.new && mv {q}.new {q}')
    return "; ".join(lines)


def authed_curl(node, extra: str = "") -> str:
    """curl with the key's header from its root-only config (never on curl's command line)."""
    return f"curl -K {shlex.quote(curl_config(node))}{' ' + extra if extra else ''}"


def head_key_found(state, head) -> str:
    """The head's key state as its node reads it at prepare (ApiKeyState: "ok", "missing", ...)."""
    return state.inventory.get_host(head.name).get_fact(ApiKeyState, command=state_command(head))


def decide_key(head, found: str, replaced: bool) -> str:
    """The head's key verdict, a pure function of what its node holds and whether the fleet's one key
    replaces it in this run (roles/router fleet_key.decide, in the plan: behind a router, the head's
    derived files are rewritten and its API proxy reloads). A key file the deploy must not use stops
    the deploy there (DeployError: a refusal block, nothing changed)."""
    found = "stale" if replaced else found
    why = problem(head, found)
    if why:
        raise DeployError(why)
    return found
