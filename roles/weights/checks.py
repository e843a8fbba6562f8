"""What roles/weights must do, decided once at prepare time for the whole cluster.

The head holds the reference copy: it is in place when its manifest names the configured source
and revision and every file it lists is on disk with its size. A worker's copy is in place when
its manifest is byte-identical to the head's and its files match too. Anything else is fetched
(head) or pulled over the fabric (workers); nothing else moves.
"""
import shlex
import urllib.parse
from dataclasses import dataclass

from pyinfra.api.exceptions import DeployError
from pyinfra.facts.files import File

from sparkfleet.model.fanout import SFL_FILES
from roles.fanout.sfl_files import absent, parse_manifest
from sparkfleet.model.serving import node_profile, profile_models  # noqa: F401 (profile_models: this role's API)
from sparkfleet.model.weights import model_dir
from roles.weights.facts import ModelCopy
from sparkfleet.bounded import bounded
from sparkfleet.run_failure import Advice, on_node
from sparkfleet.inventory import cluster_from_state
from sparkfleet.once import active_hosts, per_host
from sparkfleet.verdicts import WeightsPlan  # noqa: F401 (this role's verdict, on the ground floor)

HUB_TOKEN_IN_CONTAINER = "/run/secrets/hf-token"
# The hub fetch's container, named so that a fetch stopped at its limit can remove it (a killed
# docker client leaves its container running).
HUB_FETCH_CONTAINER = "sparkfleet-weights-fetch"


def manifest_path(node, model: str) -> str:
    return f"{node.weights_dir}/{model}.manifest"


def landed_path(node, model: str) -> str:
    """The head's list of the files its running fetch has landed (sfl_files.py land), beside the
    manifest; what a worker's following pull reads (issue 44 item 2)."""
    return f"{node.weights_dir}/{model}.landed"


# Why a worker pulls a model the head fetches in this run: whatever it holds, it follows the fetch
# (roles/weights/background.py), file by file as each lands on the head.
FOLLOWS_FETCH = "the head fetches it: pulled as each file lands there"


def manifest_header(model: str, revision: str, source: str) -> list[str]:
    return ["sparkfleet weights manifest v1", f"model: {model}", f"revision: {revision}", f"source: {source}"]


def copy_problem(copy: dict, header: list[str] | None = None, reference: str | None = None) -> str | None:
    """Why a node's copy is not in place, or None. `header`: what the head's manifest must say;
    `reference`: the head's manifest text a worker's must equal."""
    text = copy["manifest"]
    if text is None:
        return "no manifest"
    if reference is not None and text != reference:
        return "manifest differs from the head's"
    if header is not None:
        want = dict(line.split(": ", 1) for line in header[1:])
        have, _ = parse_manifest(text)
        diff = [f"{k} {have.get(k)!r} -> {v!r}" for k, v in want.items() if have.get(k) != v]
        if diff:
            return ", ".join(diff)
    _, entries = parse_manifest(text)
    if not entries:
        return "empty manifest"
    bad = absent(entries, copy["files"])
    if bad:
        return f"{len(bad)} file(s) missing or resized ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})"
    return None


@dataclass(frozen=True)
class WeightsFacts:
    """What the verdict reads, at prepare: each node's copy of each model the profile loads
    (ModelCopy: node -> model -> {"manifest", "files"}; a node not in the run is absent), and the
    head's hub token file (File: None when absent, or when the source is not the hub)."""
    copies: dict[str, dict[str, dict]]
    token_file: dict | None = None


def token_file_problem(name: str, path: str, info: dict | None) -> str | None:
    """The hub token file must be root's and unreadable to anyone else (absent is fine: anonymous)."""
    if info is None:
        return None
    mode = int(str(info["mode"]), 8)
    if info["user"] != "root" or mode & 0o077:
        return (
            f"{name}: weights_hf_token_file {path} is owned by {info['user']} with mode {mode:04o}; it must be "
            f"root-only (chown root {path} && chmod 0600 {path}). Nothing was fetched."
        )
    return None


def weights_facts(state) -> WeightsFacts:
    """Every fact decide() reads, every node at once (the head's whether or not it is active)."""
    cluster = cluster_from_state(state)
    head = cluster.head
    models = [model for model, _ in profile_models(node_profile(head))]
    head_host = state.inventory.get_host(head.name)
    hosts = [head_host] + [h for h in active_hosts(state) if h.name != head.name]

    def read(node_host):
        node = cluster.node(node_host.name)
        copies = {m: node_host.get_fact(ModelCopy, root=node.weights_dir, model=m) for m in models}
        hub_token = node.is_head and node.weights_source == "hub"
        return copies, node_host.get_fact(File, path=node.weights_hf_token_file) if hub_token else None

    read_by_node = per_host(state, read, hosts)
    return WeightsFacts(copies={name: copies for name, (copies, _) in read_by_node.items()},
                        token_file=read_by_node[head.name][1])


def decide(facts: WeightsFacts, cluster) -> WeightsPlan:
    """What moves, a pure function of the facts: the head fetches a model whose copy does not match
    the configured source and revision; a worker is sent one whose copy is not the head's. A hub
    token file anyone but root can read refuses the run."""
    head = cluster.head
    if head.weights_source == "hub":
        problem = token_file_problem(head.name, head.weights_hf_token_file, facts.token_file)
        if problem:
            raise DeployError(problem)
    fetch, pull = {}, {}
    for model, revision in profile_models(node_profile(head)):
        head_copy = facts.copies[head.name][model]
        why = copy_problem(head_copy, header=manifest_header(model, revision, head.weights_source))
        if why:
            fetch[model] = why
        for node in cluster.workers:
            if node.name not in facts.copies:  # not in this run
                continue
            problem = FOLLOWS_FETCH if why else copy_problem(facts.copies[node.name][model],
                                                                     reference=head_copy["manifest"])
            if problem:
                pull[(model, node.name)] = problem
    return WeightsPlan(fetch=fetch, pull=pull)


def summary(plan: WeightsPlan) -> str:
    """The verdict in one line, as the deploy prints it."""
    lines = [f"{m}: head fetches ({why})" for m, why in plan.fetch.items()]
    lines += [f"{m} -> {n}: sent over the fabric ({why})" for (m, n), why in plan.pull.items()]
    return "; ".join(lines) if lines else "every node's copy matches the head's manifest"


def fetch_step(node, model: str, revision: str) -> str:
    """The name of the head's fetch operation (and of the step a timeout names)."""
    return f"Fetch {model} at {revision} on the head ({node.weights_source})"


def pull_step(model: str) -> str:
    return f"Send {model} to the workers over the fabric"


def fetch_command(node, profile, model: str, revision: str) -> str:
    """The head's fetch of one model from the configured source, ending with its manifest; bounded
    by weights_fetch_timeout_s (sparkfleet/bounded.py). Every form resumes on a re-run: HTTP with
    ranges from the partial file, a directory with rsync's partial dir, the hub client from its
    incomplete files; the manifest is written (atomically) only once every file is in place."""
    log = weights_log(node, "fetch", model)
    source = node.weights_source
    reach = ("the Hugging Face hub, with a token that may read the model when it is gated (weights_hf_token_file "
             f"{node.weights_hf_token_file})" if source == "hub" else source)
    # Under `land`: while the fetch runs, the files it has landed are listed (landed_path) for the
    # workers' following pulls; its status passes through, and a TERM at the limit reaches the fetch.
    q = shlex.quote
    landing = (f"python3 {SFL_FILES} land {q(model_dir(node, model))} --landed {q(landed_path(node, model))} -- "
               f"sh -c {q(_fetch(node, profile, model, revision))}")
    return bounded(
        landing, step=fetch_step(node, model, revision), host=node.name,
        limit_s=node.weights_fetch_timeout_s, key="weights_fetch_timeout_s",
        cleanup=f"docker rm -f {HUB_FETCH_CONTAINER} >/dev/null 2>&1" if source == "hub" else None,
        log_file=log,
        advice=Advice(
            log=on_node(node.management_address, f"tail -n 200 {log}"), key="weights_source",
            next_step=f"check that {node.name} reaches {reach} and holds {model} at {revision}, and the free space "
                      f"the log names (weights_free_margin_gib); a re-run resumes from what arrived"),
    )


def weights_log(node, what: str, model: str) -> str:
    """The node's log of its last fetch or pull of `model` (root-only, overwritten by the next):
    <preflight_data_dir>/logs/weights-<what>-<model, / as -->.log."""
    return f"{node.preflight_data_dir}/logs/weights-{what}-{model.replace('/', '--')}.log"


def _fetch(node, profile, model: str, revision: str) -> str:
    dest, out, source = model_dir(node, model), manifest_path(node, model), node.weights_source
    headers = " ".join(f"--header {shlex.quote(h)}" for h in manifest_header(model, revision, source))
    margin = f"--margin-gib {node.weights_free_margin_gib:g}"
    q = shlex.quote
    if source.startswith(("http://", "https://")):
        return f"python3 {SFL_FILES} fetch-http {q(f'{source}/{model}')} {q(dest)} --manifest {q(out)} {headers} {margin}"
    if source.startswith("/"):
        return (
            f"python3 {SFL_FILES} fetch-dir {q(f'{source}/{model}')} {q(dest)} --manifest {q(out)} {headers} {margin}"
            f" --io-timeout {node.fanout_rsync_io_timeout_s}"
        )
    # The hub: its client runs inside the serving image (the recipe's own huggingface_hub). The
    # token file is mounted read-only and named by HF_TOKEN_PATH: never an argument, never logged.
    # The container is named (a leftover of a killed client is removed first) and runs under
    # --init, so the TERM of a timeout reaches the client instead of a PID 1 that ignores it.
    token = node.weights_hf_token_file
    mount_token = (
        f"$( [ -f {q(token)} ] && echo -v {q(token)}:{HUB_TOKEN_IN_CONTAINER}:ro -e HF_TOKEN_PATH={HUB_TOKEN_IN_CONTAINER} )"
    )
    return (
        f"{{ docker rm -f {HUB_FETCH_CONTAINER} >/dev/null 2>&1 || true; }} && "
        f"mkdir -p {q(dest)} && docker run --rm --init --name {HUB_FETCH_CONTAINER} --network=host -v {q(dest)}:/weights "
        f"-v {SFL_FILES}:/sfl_files.py:ro {mount_token} --entrypoint python3 {q(profile.image_ref)} "
        f"/sfl_files.py fetch-hub {q(model)} {q(revision)} /weights {margin} "
        f"&& python3 {SFL_FILES} seal {q(dest)} --manifest {q(out)} {headers}"
    )


def pull_command(cluster, node, model: str, follow: bool = False) -> str:
    """A worker's pull of one model from the head's HTTP server of its weights (sfl_files.py serve) over
    the fabric in fanout_streams streams, each byte hashed as it arrives; a read that waits longer than
    fanout_rsync_io_timeout_s gives up, the whole pull bounded by fanout_rsync_timeout_s. `follow`: the
    head fetches it in this run, and the pull takes each file as it lands there (sfl_files.py pull
    --follow), so its bound is the fetch's and the pull's together."""
    head = cluster.head
    url = f"http://{head.fabric_ip}:{head.fanout_http_port}/{urllib.parse.quote(model)}"
    q = shlex.quote
    command = (
        f"python3 {SFL_FILES} pull {q(url)} {q(model_dir(node, model))} --manifest {q(manifest_path(node, model))} "
        f"--streams {node.fanout_streams} --bwlimit {node.fanout_bwlimit_kib} "
        f"--margin-gib {node.weights_free_margin_gib:g} --io-timeout {node.fanout_rsync_io_timeout_s}"
        + (" --follow" if follow else "")
    )
    log = weights_log(node, "pull", model)
    limit, key = ((node.fanout_rsync_timeout_s + head.weights_fetch_timeout_s,
                   "fanout_rsync_timeout_s + the head's weights_fetch_timeout_s")
                  if follow else (node.fanout_rsync_timeout_s, "fanout_rsync_timeout_s"))
    return bounded(command, step=pull_step(model), host=node.name, limit_s=limit,
                   key=key, log_file=log,
                   advice=Advice(
                       log=on_node(node.management_address, f"tail -n 200 {log}"), key="fanout_http_port",
                       next_step=f"check that the head's HTTP server of its weights runs and answers on {head.fabric_ip}:"
                                 f"{head.fanout_http_port} ({on_node(head.management_address, 'systemctl status sparkfleet-fanout-http')}) "
                                 f"and {node.name}'s free space (the log names it); a re-run resumes from what arrived"))
