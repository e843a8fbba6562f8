"""Published security advisories of the serving engines, in one table, judged against sparkfleet's
exposure. An engine release an advisory affects is refused before any change, naming the advisory,
its first fixed release and its record, unless data acknowledges it with a reason
(`serving_engine_advisories_acknowledged`, validated against ADVISORY_IDS before any connection).

The exposure each entry is judged against (docs/security.md):
- the engine's HTTP server listens on loopback only, behind HAProxy (roles/api_proxy), which demands
  the API key on every route but `GET`/`HEAD /health`; a client holding the key reaches every route the
  engine registers, and sends any request content (prompt, chat template, multimodal payload);
- the model's files come from the hub at a pinned revision the user chose (a model's own code runs
  only with `trust_remote_code`, pinned in the profile);
- the ranks talk over the fabric (torch rendezvous, NCCL, the engines' ZMQ sockets), which roles/firewall
  opens to the other nodes' fabric addresses alone: whoever reaches those sockets already runs a rank.
So an advisory is refused when a key-holding client can use it (run code, crash or stall the engine,
read another user's data, pass the engine's own key check) or a model's files can; one reachable from the
fabric alone, or only through a runtime or flag sparkfleet never renders, is listed but not refused
(`refused=False`: its `why` says why), and printed as a warning when the release is affected.

Ranges are as the records state them, in OSV's terms: affected from `introduced` ("0": every earlier
release) up to but not including `fixed`; where a record names no fixed release, up to and including
`last_affected`, or with neither, every later release. Versions compare by their PEP 440 release
(`release_key`): a local part such as the lab's "+cpu" is the same release; a pre-release sorts before
its release, so "0.32.0rc1" is affected by an advisory fixed in 0.32.0.

An entry is added only from a record someone can read (`read`: where the range and the fix were read;
`source`: the advisory itself). Read and not added: CVE-2026-5760 (SGLang /v1/rerank renders a model's
chat template unsandboxed: its CVE record names one commit, 8f3097e, and a fix PR, sgl-project/sglang
#23660, but no release range); vLLM's 0.31.0 batch (GHSA-h3rc-6mm3-gc2m, GHSA-gx7p-2j49-hfq4,
GHSA-rhcx-5729-88vg, GHSA-w9r6-29q4-pvpr, GHSA-p6g9-7v3x-m8mv) and GHSA-5r3c-5x4v-8gjh ("fixed in
0.33.0"), named only in third-party release notes (munimtechnologies/local-ai-checkup v0.4.1,
ai-stack-advisories v1.2.6), whose records were not found; PYSEC-2026-4325 and PYSEC-2026-4353 (vLLM,
fixed in 0.30.0), whose records name no GHSA or CVE.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from sparkfleet.refusal import Problem

ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class Advisory:
    id: str  # the GHSA id; the CVE id where no GHSA was published
    cve: str | None
    engine: str  # vllm | sglang
    introduced: str  # first affected release; "0": every release before the fix
    fixed: str | None  # first fixed release; None: the record names none
    last_affected: str | None  # with no fixed release: the last the record calls affected
    title: str
    refused: bool
    why: str  # why sparkfleet's exposure makes it reachable, or why it is listed and not refused
    source: str  # the advisory
    read: tuple[str, ...]  # the records its range and fix were read from


# Why a key-holding client reaches a route: every route the engine registers is behind the proxy's
# key check, and nothing narrower (docs/security.md, "Every route behind the key").
_CLIENT = "any client holding the API key reaches it through the proxy"
_FABRIC = ("reachable from the fabric alone, which roles/firewall opens to the other nodes' fabric addresses: "
           "whoever can send there already runs a rank of the pair")

ADVISORIES: tuple[Advisory, ...] = (
    Advisory(
        id="GHSA-542m-9234-8gvf", cve="CVE-2026-115911", engine="vllm", introduced="0.19.0", fixed="0.32.0",
        last_affected=None,
        title="chat templates (a request's, or the model repository's) rendered with no time, output-size or "
              "iteration bound: one request stalls /v1/responses and every chat-template user, or exhausts memory",
        refused=True,
        why=f"a request's chat template is request content: {_CLIENT}; the model's own template comes with its files",
        source="https://github.com/vllm-project/vllm/security/advisories/GHSA-542m-9234-8gvf",
        read=("https://www.tenable.com/cve/CVE-2026-115911",
              "https://osv.dev/vulnerability/PYSEC-2026-4344 (pypa/advisory-database vulns/vllm/PYSEC-2026-4344.yaml: "
              "introduced 0.19.0, fixed 0.32.0)"),
    ),
    Advisory(
        id="GHSA-x567-49g5-p4cf", cve="CVE-2026-115918", engine="vllm", introduced="0.16.0", fixed="0.32.0",
        last_affected=None,
        title="/v1/responses takes a caller's template in chat_template_kwargs past trust_request_chat_template "
              "(CPU or memory exhaustion through Jinja rendering)",
        refused=True,
        why=f"/v1/responses is a route of the engine: {_CLIENT}",
        source="https://github.com/vllm-project/vllm/security/advisories/GHSA-x567-49g5-p4cf",
        read=("https://www.tenable.com/cve/CVE-2026-115918", "https://osv.dev/vulnerability/CVE-2026-115918",
              "https://osv.dev/vulnerability/PYSEC-2026-4349 (introduced 0.16.0, fixed 0.32.0)"),
    ),
    Advisory(
        id="GHSA-85xf-c7hm-whqw", cve="CVE-2026-105757", engine="vllm", introduced="0", fixed="0.30.0",
        last_affected=None,
        title="structured-output request errors escape the request and terminate the shared EngineCore",
        refused=True,
        why=f"an ordinary constrained-generation request ends the engine: {_CLIENT}",
        source="https://github.com/vllm-project/vllm/security/advisories/GHSA-85xf-c7hm-whqw",
        read=("https://www.tenable.com/cve/CVE-2026-105757",
              "https://osv.dev/vulnerability/PYSEC-2026-4199 (introduced 0, fixed 0.30.0)"),
    ),
    Advisory(
        id="GHSA-58v5-2m8f-94pr", cve="CVE-2026-105760", engine="vllm", introduced="0", fixed="0.30.0",
        last_affected=None,
        title="a request's media_io_kwargs select the GLMGA video backend with unbounded fps and max_frames: a tiny "
              "video consumes the shared media-loading executor's CPU and memory",
        refused=True,
        why=f"a multimodal payload is request content (an inline data: URL needs no allowed media domain): {_CLIENT}",
        source="https://github.com/vllm-project/vllm/security/advisories/GHSA-58v5-2m8f-94pr",
        read=("https://www.tenable.com/plugins/container-security/472970 (prior to 0.30.0, fixed in 0.30.0)",),
    ),
    Advisory(
        id="GHSA-94f4-hr76-p5j6", cve="CVE-2026-48746", engine="vllm", introduced="0.3.0", fixed="0.22.0",
        last_affected=None,
        title="the OpenAI API's AuthenticationMiddleware bypassed (ASGI servers' and starlette's handling of a "
              "smuggled request): the API without the key",
        refused=True,
        why="the engine's own key check is the second of two behind the proxy (docs/security.md); request smuggling "
            "is what a front proxy and the engine reading one request differently allows",
        source="https://github.com/vllm-project/vllm/security/advisories/GHSA-94f4-hr76-p5j6",
        read=("CVEProject/cvelistV5 cves/2026/48xxx/CVE-2026-48746.json (from 0.3.0 until 0.22.0)",),
    ),
    Advisory(
        id="GHSA-3ww4-5jv9-j5gm", cve="CVE-2026-47155", engine="vllm", introduced="0", fixed="0.22.0",
        last_affected=None,
        title="--revision and --code-revision not applied to every artifact: dynamic code, GGUF files, image "
              "processors and subfolder weights load from the unpinned default revision",
        refused=True,
        why="sparkfleet pins every model revision (model_revision, a full commit with trust_remote_code); this "
            "loads the model repository's unreviewed files anyway",
        source="https://github.com/vllm-project/vllm/security/advisories/GHSA-3ww4-5jv9-j5gm",
        read=("https://raw.githubusercontent.com/pypa/advisory-database/main/vulns/vllm/PYSEC-2026-2301.yaml "
              "(introduced 0, fixed 0.22.0)",),
    ),
    Advisory(
        id="GHSA-3mwp-wvh9-7528", cve="CVE-2026-34756", engine="vllm", introduced="0.1.0", fixed="0.19.0",
        last_affected=None,
        title="no upper bound on a request's n: one request blocks the event loop and runs the server out of memory",
        refused=True,
        why=f"n is a field of /v1/completions and /v1/chat/completions: {_CLIENT}",
        source="https://github.com/vllm-project/vllm/security/advisories/GHSA-3mwp-wvh9-7528",
        read=("https://raw.githubusercontent.com/pypa/advisory-database/main/vulns/vllm/PYSEC-2026-2298.yaml "
              "(introduced 0.1.0, fixed 0.19.0)",),
    ),
    Advisory(
        id="GHSA-7972-pg2x-xr59", cve="CVE-2026-27893", engine="vllm", introduced="0.10.1", fixed="0.18.0",
        last_affected=None,
        title="NemotronVL and KimiK25 hardcode trust_remote_code=True for sub-components: a model repository's "
              "code runs with --trust-remote-code off",
        refused=True,
        why="a model's files the user loads run as code although the profile pins trust_remote_code off",
        source="https://github.com/vllm-project/vllm/security/advisories/GHSA-7972-pg2x-xr59",
        read=("CVEProject/cvelistV5 cves/2026/27xxx/CVE-2026-27893.json",
              "https://raw.githubusercontent.com/pypa/advisory-database/main/vulns/vllm/PYSEC-2026-2297.yaml "
              "(introduced 0.10.1, fixed 0.18.0)"),
    ),
    Advisory(
        id="GHSA-wf98-gv64-5wrf", cve="CVE-2026-15976", engine="sglang", introduced="0", fixed=None,
        last_affected="0.5.15",
        title="/update_weights_from_disk falls back to torch.load(weights_only=False): a hub repository's .bin "
              "file runs code (pickle)",
        refused=True,
        why=f"/update_weights_from_disk is a route of the engine: {_CLIENT}",
        source="https://github.com/sgl-project/sglang/security/advisories/GHSA-wf98-gv64-5wrf",
        read=("CVEProject/cvelistV5 cves/2026/15xxx/CVE-2026-15976.json (affected 0 through v0.5.15; no fixed "
              "release named)",),
    ),
    Advisory(
        id="CVE-2026-86793", cve="CVE-2026-86793", engine="sglang", introduced="0", fixed=None,
        last_affected="0.5.18",
        title="/update_weights_from_tensor unpickles the request; its SafeUnpickler resolves builtins.__import__ "
              "and getattr: code execution",
        refused=True,
        why=f"/update_weights_from_tensor is a route of the engine: {_CLIENT} (the record's 'no auth keys' case is "
            f"the engine's own check; the key's holders pass both)",
        source="https://vicone.com/blog/cve-2026-86793-sglang-bypass-could-let-attackers-run-code-on-ai-servers/",
        read=("CVEProject/cvelistV5 cves/2026/86xxx/CVE-2026-86793.json (affected 0 through 0.5.18; no GHSA and no "
              "fixed release named)",),
    ),
    Advisory(
        id="CVE-2026-111391", cve="CVE-2026-111391", engine="sglang", introduced="0.5.10", fixed=None,
        last_affected="0.5.22",
        title="the debug dumper's filter is eval()ed with an escapable sandbox: a filter sent to the unauthenticated "
              "/dumper/configure runs code in the scheduler",
        refused=True,
        why="needs DUMPER_SERVER_PORT in the engine's environment (a variable SGLang 0.5.23 reads: "
            "roles/serving/known_env/sglang-0.5.23.txt), which a profile's env or serving_env_pins can set and a "
            "version alone cannot rule out; its port is not behind the proxy",
        source="https://www.cve.org/CVERecord?id=CVE-2026-111391",
        read=("CVEProject/cvelistV5 cves/2026/111xxx/CVE-2026-111391.json (0.5.10 through 0.5.22; no GHSA and no "
              "fixed release named)",),
    ),
    Advisory(
        id="CVE-2026-112266", cve="CVE-2026-112266", engine="sglang", introduced="0", fixed=None,
        last_affected="0.5.22",
        title="a client-chosen short rid aborts every other client's in-flight generation (prefix-matching abort)",
        refused=True,
        why=f"/generate takes the rid from the request: {_CLIENT}",
        source="https://github.com/sgl-project/sglang/issues/45002",
        read=("https://www.tenable.com/cve/CVE-2026-112266 (through 0.5.22; no GHSA and no fixed release named)",),
    ),
    Advisory(
        id="CVE-2026-93034", cve="CVE-2026-93034", engine="sglang", introduced="0", fixed=None,
        last_affected="0.5.20",
        title="the ZMQ message decoder unpickles PickleWrapper payloads even with SGLANG_USE_PICKLE_IPC off: remote "
              "code execution with data-parallel attention and a non-loopback --dist-init-addr",
        refused=False,
        why=f"{_FABRIC}; and sparkfleet renders no data-parallel attention",
        source="https://m00dy.sh/notes/disabling-pickle-did-not-remove-pickle",
        read=("CVEProject/cvelistV5 cves/2026/93xxx/CVE-2026-93034.json (affected 0 through v0.5.20; no GHSA and no "
              "fixed release named)",),
    ),
    Advisory(
        id="GHSA-rgq9-fqf5-fv58", cve="CVE-2026-3059", engine="sglang", introduced="0", fixed="0.5.10",
        last_affected=None,
        title="the multimodal generation module's ZMQ broker unpickles unauthenticated messages",
        refused=False,
        why=f"the multimodal generation runtime is not what sparkfleet starts (python3 -m sglang.launch_server); "
            f"its broker would be {_FABRIC}",
        source="https://github.com/advisories/GHSA-rgq9-fqf5-fv58",
        read=("https://raw.githubusercontent.com/pypa/advisory-database/main/vulns/sglang/PYSEC-2026-539.yaml "
              "(introduced 0, fixed 0.5.10)",),
    ),
    Advisory(
        id="GHSA-jx93-g359-86wm", cve="CVE-2026-3060", engine="sglang", introduced="0", fixed="0.5.10",
        last_affected=None,
        title="the encoder parallel disaggregation module unpickles unauthenticated data",
        refused=False,
        why=f"sparkfleet renders no encoder disaggregation; its sockets would be {_FABRIC}",
        source="https://github.com/advisories/GHSA-jx93-g359-86wm",
        read=("https://raw.githubusercontent.com/pypa/advisory-database/main/vulns/sglang/PYSEC-2026-537.yaml "
              "(introduced 0, fixed 0.5.10)",),
    ),
    Advisory(
        id="CVE-2026-7304", cve="CVE-2026-7304", engine="sglang", introduced="0.4.1.post7", fixed=None,
        last_affected=None,
        title="with --enable-custom-logit-processor a request's logit processor is dill.loads()ed: code execution",
        refused=False,
        why="only with --enable-custom-logit-processor, which sparkfleet does not render and no shipped profile "
            "passes; a profile's extra_args or serving_extra_args that adds it makes this reachable by any client "
            "holding the key",
        source="https://antiproof.pages.dev/blog/three-rces-in-sglang/",
        read=("CVEProject/cvelistV5 cves/2026/7xxx/CVE-2026-7304.json (CERT/CC VU#777338: no patch)",
              "https://antiproof.pages.dev/blog/three-rces-in-sglang/ (v0.4.1.post7 and later, no patch)"),
    ),
    Advisory(
        id="CVE-2026-7301", cve="CVE-2026-7301", engine="sglang", introduced="0.5.5", fixed=None,
        last_affected=None,
        title="the multimodal generation runtime's scheduler ROUTER socket unpickles unauthenticated messages",
        refused=False,
        why=f"the multimodal generation runtime is not what sparkfleet starts; its socket would be {_FABRIC}",
        source="https://antiproof.pages.dev/blog/three-rces-in-sglang/",
        read=("https://antiproof.pages.dev/blog/three-rces-in-sglang/ (v0.5.5 and later, no patch; CERT/CC "
              "VU#777338)",),
    ),
    Advisory(
        id="CVE-2026-7302", cve="CVE-2026-7302", engine="sglang", introduced="0.5.5", fixed=None,
        last_affected=None,
        title="the multimodal generation runtime writes an uploaded file where its name points (path traversal)",
        refused=False,
        why="the multimodal generation runtime, whose HTTP API takes the upload, is not what sparkfleet starts",
        source="https://antiproof.pages.dev/blog/three-rces-in-sglang/",
        read=("https://antiproof.pages.dev/blog/three-rces-in-sglang/ (v0.5.5 and later, no patch; CERT/CC "
              "VU#777338)",),
    ),
)
ADVISORY_IDS: tuple[str, ...] = tuple(a.id for a in ADVISORIES)

# PEP 440 (packaging.version's grammar, without epochs): release, pre-release, post-release, dev
# release and a local part. packaging is not one of sparkfleet's own dependencies (pyproject.toml), so
# the few lines it takes to order engine releases are here; tests/unit/test_engine_advisories.py holds
# them to packaging.version on every version of the table and the lab's.
_VERSION = re.compile(
    r"v?(?P<release>[0-9]+(?:\.[0-9]+)*)"
    r"(?:[-_.]?(?P<pre_l>alpha|beta|preview|pre|rc|a|b|c)[-_.]?(?P<pre_n>[0-9]*))?"
    r"(?P<post>-(?P<post_n1>[0-9]+)|[-_.]?(?:post|rev|r)[-_.]?(?P<post_n2>[0-9]*))?"
    r"(?P<dev>[-_.]?dev[-_.]?(?P<dev_n>[0-9]*))?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?",
    re.IGNORECASE,
)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_INF = float("inf")


def release_key(version: str) -> tuple:
    """A key that orders PEP 440 versions as packaging.version does, less the local part ("0.32.0+cpu"
    is release 0.32.0): release (trailing zeros dropped), then dev < pre < final < post. ValueError
    names a version that is not PEP 440."""
    m = _VERSION.fullmatch(version.strip())
    if not m:
        raise ValueError(f"engine version {version!r} is not a PEP 440 version (e.g. 0.32.0, 0.5.10.post1, "
                         f"0.32.0+cpu)")
    release = tuple(int(p) for p in m["release"].split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    pre = (_PRE[m["pre_l"].lower()], int(m["pre_n"] or 0)) if m["pre_l"] else None
    post = int(m["post_n1"] or m["post_n2"] or 0) if m["post"] else None
    dev = int(m["dev_n"] or 0) if m["dev"] else None
    if pre is None and post is None and dev is not None:
        pre_key = (-_INF, 0)  # a dev release of a final sorts before its pre-releases
    elif pre is None:
        pre_key = (_INF, 0)
    else:
        pre_key = pre
    return release, pre_key, -_INF if post is None else post, _INF if dev is None else dev


def affects(advisory: Advisory, version: str) -> bool:
    """Whether `version` is in the advisory's affected range, as its record states it."""
    v = release_key(version)
    if advisory.introduced != "0" and v < release_key(advisory.introduced):
        return False
    if advisory.fixed is not None:
        return v < release_key(advisory.fixed)
    if advisory.last_affected is not None:
        return v <= release_key(advisory.last_affected)
    return True


def _fix(advisory: Advisory) -> str:
    if advisory.fixed:
        return f"first fixed version {advisory.fixed}"
    if advisory.last_affected:
        return f"no fixed version named (the record's last affected: {advisory.last_affected})"
    return "no fixed version published"


def _line(engine: str, version: str, a: Advisory) -> str:
    cve = f" ({a.cve})" if a.cve and a.cve != a.id else ""
    return f"{engine} {version} is affected by {a.id}{cve}: {a.title}; {_fix(a)}; {a.source}"


def _affecting(engine: str, version: str) -> list[Advisory]:
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: not one of {', '.join(ENGINES)}")
    return [a for a in ADVISORIES if a.engine == engine and affects(a, version)]


def advisories_refused(engine: str, version: str, acknowledged: dict[str, str]) -> list[str]:
    """One sentence per advisory of the table that affects `engine` at `version`, is reachable through
    sparkfleet's exposure and is not acknowledged: its id, title, first fixed version and source."""
    return [f"{_line(engine, version, a)} (reachable: {a.why})"
            for a in _affecting(engine, version) if a.refused and a.id not in acknowledged]


def advisory_warnings(engine: str, version: str, acknowledged: dict[str, str]) -> list[str]:
    """What a run that goes on says about the advisories affecting `version`: each acknowledged one with
    its reason, and each listed but not refused with why it is not."""
    out = []
    for a in _affecting(engine, version):
        if a.refused and a.id in acknowledged:
            out.append(f"{_line(engine, version, a)}; acknowledged in serving_engine_advisories_acknowledged: "
                       f"{acknowledged[a.id]}")
        elif not a.refused:
            out.append(f"{_line(engine, version, a)}; not refused: {a.why}")
    return out


def engine_advisory_problems(group: Iterable[str], engine: str, version: str,
                             acknowledged: dict[str, str]) -> list[Problem]:
    """Prepare time, before any change: one Problem per unacknowledged reachable advisory affecting the
    group's engine release, on the group's hosts (`group`: their names). A version that is not PEP 440
    is one Problem naming it."""
    hosts = tuple(group)
    key = "serving_engine_advisories_acknowledged"
    try:
        refused = [a for a in _affecting(engine, version) if a.refused and a.id not in acknowledged]
    except ValueError as err:
        return [Problem(f"{err}; the engine release cannot be held to its advisories", hosts, key=None,
                        fix="give the engine's release as its package reports it (e.g. 0.32.0 or 0.32.0+cpu)")]
    return [Problem(
        f"{_line(engine, version, a)}. Reachable: {a.why}",
        hosts, key=key, sources=[a.source, *a.read],
        fix=(f"serve an engine release with the fix ({a.fixed} or later)" if a.fixed else
             "serve a release the record does not call affected") +
            f", or acknowledge it with your reason ({key}: {{\"{a.id}\": \"...\"}})",
    ) for a in refused]
