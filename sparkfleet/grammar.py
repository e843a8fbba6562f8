"""Every name from data or a profile held to the grammar of what it names, before any connection.

A hub repository id becomes a directory (`<weights_dir>/<model id>`, `/models/<model id>` in the
container) and a shell word; a revision a manifest line and a hub argument; an image name a unit's
word and a registry path; a URL a line of prometheus.yml or alertmanager.yml. Quoting keeps a value
one shell word, but `..` in a path stays `..`: so each value is held to what it names, not only to
what survives quoting. Each `*_problem` function returns why a value is refused, with the grammar
allowed, or None; `node_grammar_problems` applies them to one node's data keys (sparkfleet/config.py),
the profile's fields apply them as validators (sparkfleet/model/serving.py).
"""
from __future__ import annotations

import re
from urllib.parse import urlsplit

from sparkfleet.refusal import Problem
from sparkfleet.values import path_problem

# A hub repository id, as huggingface_hub validates one (huggingface_hub/utils/_validators.py,
# validate_repo_id and REPO_ID_REGEX, 2.4.0): each part 1-96 of letters, digits, `_`, `.` and `-`, starting
# and ending with a letter, digit or `_` (its `\b`), no `--` or `..`, not ending in `.git`. sparkfleet asks
# for the namespace too (owner/name): the model's directory is `<weights_dir>/<owner>/<name>`.
_HUB_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
HUB_REPO_ID = re.compile(rf"^{_HUB_PART}/{_HUB_PART}$")
HUB_REPO_ID_FORM = ("a hub repository id `owner/name`, each part 1-96 of letters, digits, _ . - starting and ending "
                    "with a letter, digit or _, no `--` or `..`, not ending in .git (huggingface_hub's validate_repo_id)")

# A revision: a commit (40 hex) or a branch or tag name, held to a strict part of `git check-ref-format`
# (git's Documentation/git-check-ref-format.txt): components of letters, digits, _ . - joined by single
# `/`, none starting with `.` or `-` nor ending in `.lock`, no `..`, not ending in `/` or `.`; the rules'
# other characters (space, ~ ^ : ? * [ \ @{) are outside the set. The hub's `refs/pr/<n>` passes.
_REF_COMPONENT = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
GIT_REF = re.compile(rf"^{_REF_COMPONENT}(?:/{_REF_COMPONENT})*$")
REVISION_FORM = ("a commit (40 hex) or a branch or tag name: components of letters, digits, _ . - joined by `/`, "
                 "none starting with . or - nor ending in .lock, no `..`, not ending in . (git check-ref-format)")

# Every pattern here is matched whole (re.fullmatch): `$` alone also matches before a trailing newline.

# A plain token: a word on the engine's command line, a key of JSON and YAML, a path component.
TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
TOKEN_FORM = "a plain token: a letter or digit, then letters, digits, _ . -"
# The name the API serves the model under (vLLM and SGLang --served-model-name): what clients send as
# `model`, the router's and the watchdog's configs, the receipt. A plain token, `:` allowed (`qwen3:30b`);
# no `/`: a name with one is the hub id itself, served when served_model_name is left out.
SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
SERVED_NAME_FORM = "a plain token: a letter or digit, then letters, digits, _ . : - (no /: leave it out to serve the hub id)"

# An SPDX license id (SPDX specification, license expression syntax: idstring = 1*(ALPHA / DIGIT / "-" / "."),
# a trailing `+` for "or later").
SPDX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*\+?$")
SPDX_FORM = "an SPDX license id: letters, digits, . - (CC-BY-NC-ND-4.0)"

# A Docker image name and reference (distribution/reference, reference.go's grammar and regexp.go):
# path components of lower-case letters and digits joined by `.`, `_`, `__` or dashes; an optional domain
# (DNS labels, an optional :port) before the first `/`; a tag [\w][\w.-]{0,127}; a digest sha256:<64 hex>;
# at most 255 characters of name (RepositoryNameTotalLengthMax).
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?"
IMAGE_PATH = re.compile(rf"^{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*$")
IMAGE_REFERENCE = re.compile(
    rf"^(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}))?(?:@(?P<digest>sha256:[a-f0-9]{{64}}))?$")
IMAGE_NAME_MAX = 255
IMAGE_PATH_FORM = ("a Docker image name: path components of lower-case letters and digits joined by . _ __ or -, "
                   "separated by / (distribution/reference)")
IMAGE_REFERENCE_FORM = ("a Docker image reference `[registry[:port]/]name[:tag][@sha256:<64 hex>]`: name components of "
                        "lower-case letters and digits joined by . _ __ or -, a tag of [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}, "
                        "a digest of sha256: and 64 lower-case hex digits (distribution/reference)")

# A URL's characters: RFC 3986's unreserved and reserved ones and `%`, less ' $ ( ) * ! (a shell's or
# a template's quotes and substitutions): percent-encode those. No space, quote, backquote or newline.
_URL_CHARS = re.compile(r"^[A-Za-z0-9._~:/?#\[\]@&+,;=%-]+$")
URL_FORM = ("a URL {schemes}://host[:port]/path of RFC 3986's characters less ' $ ( ) * ! (percent-encode them), "
            "no user or password in it, no `..` segment")
HTTP = ("http", "https")
GIT = ("https", "http", "git", "ssh")  # git clone's URL forms with a scheme (git's urls.txt)

# A path inside the recipe's repository (its Dockerfile, build context, launch files).
RELATIVE_PATH = re.compile(r"^[A-Za-z0-9_.+-]+(?:/[A-Za-z0-9_.+-]+)*$")
RELATIVE_PATH_FORM = "a path inside the repository: letters, digits, _ . + - joined by /, no `..`, not absolute"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _matched(pattern: re.Pattern, form: str, value) -> str | None:
    if isinstance(value, str) and pattern.fullmatch(value):
        return None
    return f"not {form}"


def hub_repo_id_problem(value) -> str | None:
    if isinstance(value, str) and HUB_REPO_ID.fullmatch(value) and "--" not in value and ".." not in value \
            and not value.endswith(".git"):
        return None
    return f"not {HUB_REPO_ID_FORM}"


def revision_problem(value) -> str | None:
    if isinstance(value, str) and GIT_REF.fullmatch(value) and ".." not in value \
            and not any(c.endswith((".lock", ".")) for c in value.split("/")):
        return None
    return f"not {REVISION_FORM}"


def token_problem(value) -> str | None:
    return _matched(TOKEN, TOKEN_FORM, value)


def served_name_problem(value) -> str | None:
    return _matched(SERVED_NAME, SERVED_NAME_FORM, value)


def spdx_problem(value) -> str | None:
    return _matched(SPDX_ID, SPDX_FORM, value)


def image_path_problem(value) -> str | None:
    if isinstance(value, str) and IMAGE_PATH.fullmatch(value) and len(value) <= IMAGE_NAME_MAX:
        return None
    return f"not {IMAGE_PATH_FORM}"


def image_reference_problem(value, tag_required: bool = True) -> str | None:
    m = IMAGE_REFERENCE.fullmatch(value) if isinstance(value, str) else None
    if m and len(m["name"]) <= IMAGE_NAME_MAX and (m["tag"] or m["digest"] or not tag_required):
        return None
    return f"not {IMAGE_REFERENCE_FORM}" + (" (a tag or digest is required)" if tag_required else "")


def relative_path_problem(value) -> str | None:
    if isinstance(value, str) and RELATIVE_PATH.fullmatch(value) and ".." not in value.split("/"):
        return None
    return f"not {RELATIVE_PATH_FORM}"


def url_problem(value, schemes=HTTP, user_allowed: bool = False, query_allowed: bool = True) -> str | None:
    """Why `value` is not a URL of `schemes` (None: it is); a user (ssh://git@host) only where allowed, a
    password never; a query only where allowed (a webhook's token rides in it)."""
    form = URL_FORM.format(schemes="|".join(schemes))
    if not isinstance(value, str) or not _URL_CHARS.fullmatch(value):
        return f"not {form}"
    parts = urlsplit(value)
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number in range)
    except ValueError:
        return f"not {form} (its port is not a number of 0-65535)"
    if parts.scheme not in schemes or not parts.hostname or not value.startswith(f"{parts.scheme}://"):
        return f"not {form}"
    if parts.password is not None or (parts.username is not None and not user_allowed):
        return (f"not {form}: it carries credentials (`user:password@`), which data must not hold (the inventory, "
                f"its repository, `make config`)")
    if ".." in parts.path.split("/"):
        return f"not {form}"
    if parts.query and not query_allowed:
        return (f"not {form}: it carries a query (`?...`), where a webhook's or a remote write's token rides, which "
                f"data must not hold")
    return None


def secret_url_problem(value, schemes=HTTP) -> str | None:
    """A URL monitoring sends alerts or samples to: no credentials and no query (`url_problem`)."""
    return url_problem(value, schemes, query_allowed=False)


_USERINFO = re.compile(r"(?<=://)[^/?#@]*@")
_QUERY = re.compile(r"\?[^#]*")


def redacted(value):
    """`value` as a refusal may show it: a URL's user, password and query replaced by `***` (each may be a
    secret: `https://ghp_...@github.com`, `?token=...`); anything else as it is."""
    if not isinstance(value, str) or "://" not in value:
        return value
    return _QUERY.sub("?***", _USERINFO.sub("***@", value, count=1), count=1)


def git_repository_problem(value) -> str | None:
    """A recipe repository: a git URL (https, http, git; ssh with a user, never a password: an https user is a
    token) or an absolute path."""
    if isinstance(value, str) and value.startswith("/"):
        why = path_problem(value)
        return f"not an absolute path of the head: {why}" if why else None
    return url_problem(value, GIT, user_allowed=isinstance(value, str) and value.startswith("ssh://"))


def absolute_path_problem(value) -> str | None:
    why = path_problem(value) if isinstance(value, str) else "must be a path"
    return f"not an absolute path: {why}" if why else None


def field_check(problem):
    """A pydantic validator (classmethod body) refusing a value `problem` finds fault with; None passes."""
    def check(cls, value):
        if value is None:
            return value
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            why = problem(v)
            if why:
                raise ValueError(f"{v!r}: {why}")
        return value
    return classmethod(check)


def _receiver_problems(receivers) -> list[tuple[str, object, str]]:
    """(where, value, why) of every receiver's name that is no plain token and every URL setting (`url`,
    `*_url`) that is no http(s) URL without credentials."""
    found = []

    def urls(tree, where):
        if isinstance(tree, dict):
            for k, v in tree.items():
                here = f"{where}.{k}"
                if isinstance(k, str) and (k == "url" or k.endswith("_url")):
                    why = secret_url_problem(v)
                    if why:
                        found.append((here, v, why))
                else:
                    urls(v, here)
        elif isinstance(tree, list):
            for i, v in enumerate(tree):
                urls(v, f"{where}[{i}]")

    for i, r in enumerate(receivers):
        if not isinstance(r, dict):
            continue
        if "name" in r:
            why = token_problem(r["name"])
            if why:
                found.append((f"[{i}].name", r["name"], why))
        urls({k: v for k, v in r.items() if k != "name"}, f"[{i}]")
    return found


# Each node key held to a grammar here: key -> (problem function, what to do). The directories and key
# files are sparkfleet/values.py's (absolute, normalised, confined); the profile's fields are the
# Profile model's (sparkfleet/model/serving.py).
NODE_GRAMMARS = {
    "serving_profile": (token_problem, "name a file of roles/serving/profiles/ or the site's profiles/, without .yaml"),
    "serving_recipe_repository": (git_repository_problem, "write the clone URL (https://host/owner/repo.git) or an "
                                  "absolute path; a private repository's credentials go in the head's git config"),
    "weights_source": (lambda v: None if v == "hub" else (absolute_path_problem(v) if v.startswith("/")
                                                          else url_problem(v)),
                       "write 'hub', an absolute directory of the head, or an http(s) URL without credentials"),
    "monitoring_remote_write_url": (lambda v: secret_url_problem(v, ("https",)),
                                    "write the receiver's https URL (samples and credentials over TLS only); its "
                                    "credentials go in monitoring_remote_write_password_file or "
                                    "monitoring_remote_write_credentials_file, never in the URL"),
    "monitoring_gpu_exporter_image": (image_reference_problem, "write the image as `docker pull` takes it, pinned by "
                                      "its digest (nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.1-ubuntu22.04@sha256:"
                                      "<64 hex>), or with its tag"),
    "drafter_license_acknowledged": (spdx_problem, "spell the license id as the profile's draft_license has it"),
    "router_node": (token_problem, "name a node of the inventory"),
    "monitoring_node": (token_problem, "name a node of the inventory"),
    "preflight_allowed_archs": (token_problem, "list `uname -m` values (aarch64, x86_64)"),
}


def node_grammar_problems(node) -> list[Problem]:
    """Every data key of `node` whose value is not of the grammar of what it names (NODE_GRAMMARS, the
    Alertmanager receivers' names and URLs), each naming the host, the key, the value and the grammar."""
    problems: list[Problem] = []
    for key, (problem, fix) in NODE_GRAMMARS.items():
        value = getattr(node, key)
        for v in (value if isinstance(value, list) else [value]):
            why = v is not None and problem(v)
            if why:
                problems.append(Problem(f"key '{key}' = {redacted(v)!r}: {why}", [node.name], key=key, fix=fix))
    key = "monitoring_alertmanager_receivers"
    for where, value, why in _receiver_problems(node.monitoring_alertmanager_receivers):
        problems.append(Problem(f"key '{key}'{where} = {redacted(value)!r}: {why}", [node.name], key=key,
                                fix="a receiver's name is a plain token; a URL is http(s) with no user, password or "
                                    "query: a URL that carries a secret goes in a root-only file on the controller, "
                                    "named by the setting's *_file form (url_file from Alertmanager 0.26.0, "
                                    "api_url_file)"))
    return problems
