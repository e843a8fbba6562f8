"""What roles/kernel_cache must do, decided once at prepare time, and the step that does it.

One cache generation per engine in the image and compile key on every node
(<kernel_cache_dir>/e-<12 hex of the engine's identity>-<8 hex of the compile settings>/, or
<12 hex of the image ID>-<8 hex> where the engine cannot be read from the image's layers, with
'current' linking to the served one and <generation>.manifest beside it): the engine's identity is
what it folds into its compile-cache keys from the image (roles/kernel_cache/engine_key.py), so a
recipe bump that changes nothing compiled reuses the generation; the compile settings are the
rendered flags and variables the engine folds into its own compile-cache key
(sparkfleet/model/compile_key.py), so a changed pin the engine hashes is a generation never warmed,
and one it does not hash is not.
The head's manifest is the reference. A generation the head has no manifest for is warmed: the
pair runs once, with production's command line and environment (plus only PREWARM_ENV_ADDITIONS,
which enter no cache key), and the fixed warm-up set until no rank's cache grows. Then every rank gets
the union (the head pulls what it lacks from each worker, each worker pulls the head's), and
each rank writes its own manifest, which must equal the head's before production starts.
"""
import dataclasses
import json
import shlex
import time
from typing import Callable

from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError

from roles.fanout.commands import rsync_pull_command
from roles.fanout.sfl_files import absent, parse_manifest
from roles.kernel_cache.engine_key import (
    EngineIdentity, engine_identity, identity_changes, layers_command, parse_layers, recorded,
)
from roles.kernel_cache.facts import ENGINE_GENERATION, IMAGE_GENERATION, CacheState, GenerationState, is_generation
from roles.kernel_cache.warmup import warmup_requests
from roles.serving.api_key import curl_config, key_file
from roles.serving.ready import POLL_S, wait_for_health
from roles.serving.facts import health_command
from roles.serving.history import history_file, record_command
from sparkfleet.chat_request import request_command
from sparkfleet.image_pin import repin_command
from sparkfleet.inventory import cluster_from_state
from sparkfleet.model.compile_key import compile_settings, settings_changes, settings_key
from sparkfleet.model.engine import IMAGE_WORD, docker_args, engine_args, image_pin_path, rank_env, unit_name
from sparkfleet.model.fanout import SFL_FILES
from sparkfleet.model.kernel_cache import COMPILE_LOG_LINES, cache_vars, prewarm_env
from sparkfleet.model.serving import node_profile
from sparkfleet.model.tls import api_base, curl_tls
from sparkfleet.once import active_hosts, per_host
from sparkfleet.progress import phase_text, watched
from sparkfleet.render import render
from sparkfleet.run_failure import RunFailed, RunFailure, on_node
from sparkfleet.watchdog_handover import resume_watchdogs
from sparkfleet.decided import record_after_build
from sparkfleet.verdicts import CachePlan  # noqa: F401 (this role's verdict, on the ground floor)


PREWARM_CONTAINER = "sparkfleet-prewarm"


def generation(image_id: str | None, compile_key: dict[str, str] | str | None = None) -> str | None:
    """The generation directory name of an image and compile key: the first 12 hex digits of its ID,
    as docker prints, then '-' and the key (settings_key of the compile settings, given as the
    settings or as the key). Without a key, the name an older sparkfleet gave (the image alone)."""
    if not image_id:
        return None
    base = image_id.removeprefix("sha256:")[:12]
    if compile_key is None:
        return base
    return f"{base}-{compile_key if isinstance(compile_key, str) else settings_key(compile_key)}"


def engine_generation(identity: EngineIdentity | None, settings: dict[str, str]) -> str | None:
    """The generation keyed by the engine in the image (roles/kernel_cache/engine_key.py) and the compile
    settings: 'e-<12 hex of the identity>-<8 hex of the settings>'; None when the identity was not read."""
    if identity is None or identity.key is None:
        return None
    return f"e-{identity.key}-{settings_key(settings)}"


def generation_of(identity: EngineIdentity | None, image_id: str | None, settings: dict[str, str]) -> str | None:
    """The head's generation for this run: keyed by the engine when its identity was read, else by the
    image ID (generation), as before issue 44: when in doubt, a new image is a new generation."""
    return engine_generation(identity, settings) or generation(image_id, settings)


def generation_base(name: str) -> str:
    """A generation's name without its compile key: 'e-<12 hex>' (the engine) or 12 hex (the image)."""
    return name.rsplit("-", 1)[0] if ENGINE_GENERATION.fullmatch(name) or IMAGE_GENERATION.fullmatch(name) else name


def compile_version(profile) -> str | None:
    """The engine release the compile settings are read for: the profile's engine_version (issue 40:
    the release its recipe's image ships), None where the profile has none (every release the table
    covers is then taken together: sparkfleet/model/compile_key.py classify)."""
    return profile.engine_version


# rank_env needs a RoCE GID index where a node has one HCA, and only NCCL_IB_GID_INDEX carries it:
# no engine's compile key reads an NCCL_* variable (sparkfleet/model/compile_key.py), so the key is
# rendered without reading the GID fact (tests/unit/test_compile_key.py: the key does not move with it).
GID_NOT_KEYED = 0


def rank_compile_settings(profile, cluster, node) -> dict[str, str]:
    """One rank's compile settings, from its rendered command line and environment (engine_args,
    rank_env: what roles/serving writes into its unit and env file)."""
    return compile_settings(profile.engine, compile_version(profile), engine_args(profile, cluster, node),
                            rank_env(profile, cluster, node, GID_NOT_KEYED))


def group_compile_settings(cluster) -> dict[str, str]:
    """The group's compile settings: each one every rank renders alike under its own name, one that
    differs between ranks (a node's own serving_env_pins) as '<name>@<node>' for each rank having it."""
    profile = node_profile(cluster.head)
    ranks = {node.name: rank_compile_settings(profile, cluster, node) for node in cluster.nodes}
    out = {}
    for name in sorted(set().union(*ranks.values())):
        values = {rank: settings.get(name) for rank, settings in ranks.items()}
        if len(set(values.values())) == 1:
            out[name] = values[cluster.head.name]
        else:
            out.update({f"{name}@{rank}": value for rank, value in values.items() if value is not None})
    return out


def engine_header(identity: EngineIdentity) -> str:
    """The manifest header line's value that records the engine's identity a generation was warmed for."""
    return json.dumps(identity.record(), sort_keys=True, separators=(",", ":"))


def compile_header(settings: dict[str, str]) -> str:
    """The manifest header line's value that records the compile settings a generation was warmed with."""
    return json.dumps(settings, sort_keys=True, separators=(",", ":"))


def prewarm_env_path(node) -> str:
    return f"{node.serving_dir}/{unit_name(node)}.prewarm.env"


def prewarm_env_file(profile, cluster, node, gid_index: int | None) -> str:
    """The prewarm environment file of one rank: the production one (rank_env, rendered with the
    same template as roles/serving's), plus only PREWARM_ENV_ADDITIONS of the profile's engine."""
    env = prewarm_env(profile.engine, rank_env(profile, cluster, node, gid_index))
    return render("serving", "/etc/sparkfleet/rank.env", node=node, profile=profile, env=env)


def missing_entries(manifest_text: str | None, files: dict[str, int]) -> list[str]:
    """Files a manifest lists that are absent or resized on disk."""
    if not manifest_text:
        return []
    return absent(parse_manifest(manifest_text)[1], files)


def manifest_differences(reference: str, other: str) -> tuple[list[str], list[str]]:
    """(paths the reference has that `other` lacks or has different, paths only `other` has)."""
    _, ref = parse_manifest(reference)
    _, oth = parse_manifest(other)
    return sorted(p for p in ref if oth.get(p) != ref[p]), sorted(p for p in oth if p not in ref)


def expired(generations: dict[str, float], keep: int, current: str | None) -> list[str]:
    """Generations past the retention count, oldest first out; the current one always stays, and a
    name that is not a generation sparkfleet made (12 hex digits) is never a candidate."""
    generations = {g: t for g, t in generations.items() if is_generation(g)}
    others = sorted((g for g in generations if g != current), key=lambda g: generations[g], reverse=True)
    room = keep - (1 if current in generations else 0)
    return sorted(others[max(room, 0):])


def warmed_caches(engine: str) -> str:
    """The value of a generation manifest's 'caches' header: the cache variables it was warmed for."""
    return ",".join(sorted(cache_vars(engine)))


def compile_changes(gen: str, settings: dict[str, str] | None, current: str | None,
                    current_header: dict[str, str] | None) -> list[str]:
    """'NAME OLD -> NEW' per compile setting that differs from those the served generation of the
    same image (or engine) was warmed with (its manifest's 'compile' header); [] where that cannot be
    told (another image, no such header: an older sparkfleet's generation)."""
    if settings is None or not current or current == gen or generation_base(current) != generation_base(gen):
        return []
    try:
        old = json.loads((current_header or {}).get("compile", ""))
    except ValueError:
        return []
    return settings_changes(old, settings) if isinstance(old, dict) else []


def engine_changes(gen: str, settings: dict[str, str] | None, current: str | None,
                   current_header: dict[str, str] | None, identity: EngineIdentity | None) -> list[str]:
    """Between two engine-keyed generations, what moved the name: each input of the engine's identity
    that differs from the one the served generation `current` was warmed with (its manifest's
    'engine' record), and the compile settings (its 'compile' record). [] where that cannot be told
    (the served one keyed by its image, or an older header)."""
    if (identity is None or identity.key is None or not current or current == gen or not ENGINE_GENERATION.fullmatch(gen)
            or not ENGINE_GENERATION.fullmatch(current) or generation_base(current) == generation_base(gen)):
        return []
    old = recorded((current_header or {}).get("engine"))
    if old is None:
        return []
    changed = identity_changes(old, identity)
    try:
        old_settings = json.loads((current_header or {}).get("compile", ""))
    except ValueError:
        old_settings = None
    moved = settings_changes(old_settings, settings) if isinstance(old_settings, dict) and settings is not None else []
    return changed + ([f"a compile-relevant setting changed: {'; '.join(moved)}"] if moved else [])


def prewarm_reason(gen: str | None, reference: str | None, engine: str, settings: dict[str, str] | None = None,
                   current: str | None = None, current_header: dict[str, str] | None = None,
                   identity: EngineIdentity | None = None) -> str | None:
    """Why the head's generation must be warmed before production, or None: the image is new (built in
    this run), the engine in it or a compile setting changed (from what `current`, the served
    generation, was warmed with: engine_changes, compile_changes), the generation was never warmed
    (saying why when the engine could not be read and the image keys it), it was warmed for another
    set of cache variables (an older sparkfleet's, or another engine's), so caches production now
    writes were never warmed, or its manifest records another engine than its name says."""
    if gen is None:
        return "the image is built in this run"
    if not reference or not parse_manifest(reference)[1]:
        moved = engine_changes(gen, settings, current, current_header, identity)
        if moved:
            return "; ".join(moved)
        changed = compile_changes(gen, settings, current, current_header)
        if changed:
            return f"a compile-relevant setting changed: {'; '.join(changed)}"
        why = f"generation {gen} was never warmed"
        if identity is not None and identity.key is None and identity.image_id:
            why += f" (keyed by the image ID: the engine in it could not be read: {identity.problem})"
        elif identity is not None and identity.key and current and IMAGE_GENERATION.fullmatch(current):
            why += f" (the served {current} is keyed by its image, not by the engine in it)"
        return why
    header = parse_manifest(reference)[0]
    if header.get("caches") != warmed_caches(engine):
        return f"generation {gen} was warmed for another set of cache variables"
    if ENGINE_GENERATION.fullmatch(gen) and identity is not None and recorded(header.get("engine")) != identity.record():
        return f"generation {gen}'s manifest records another engine than the image's ({identity.engine}): warmed again"
    return None


def reuse_note(gen: str | None, reference: str | None, identity: EngineIdentity | None,
               image_id: str | None) -> str | None:
    """Why a warmed engine-keyed generation serves an image it was not warmed under (a recipe bump that
    changed nothing the engine compiles: its manifest names another image), or None."""
    if gen is None or not reference or identity is None or identity.key is None or not ENGINE_GENERATION.fullmatch(gen):
        return None
    warmed_under = parse_manifest(reference)[0].get("image")
    if not warmed_under or not image_id or warmed_under == image_id:
        return None
    return (f"generation {gen} reused for image {image_id.removeprefix('sha256:')[:12]} (sealed under "
            f"{warmed_under.removeprefix('sha256:')[:12]}): the engine ({identity.described()}), the image's "
            f"environment and entrypoint, and the compile settings are the ones it was warmed with")


def foreign_summary(entries: list[tuple[str, str]]) -> str:
    """'<n> entr(y|ies) not regular files: <path> (<kind>), ...' of what sfl_files.py scrub found."""
    shown = ", ".join(f"{rel} ({kind})" for kind, rel in entries[:3]) + (", ..." if len(entries) > 3 else "")
    return f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} not regular files: {shown}"


def scrub_command(root: str, gen: str) -> str:
    """Drop (and print, `kind<TAB>path` a line) what in generation `gen` is not a regular file or a
    directory, or is setuid/setgid (sfl_files.py scrub)."""
    return f"python3 {SFL_FILES} scrub {shlex.quote(f'{root}/{gen}')}"


def dropped_lines(node_name: str, gen: str, output: str) -> list[str]:
    """One line per entry a rank's scrub dropped, naming the rank, the path and what it was."""
    lines = []
    for line in output.splitlines():
        kind, sep, rel = line.partition("\t")
        if sep:
            lines.append(f"{node_name}: dropped {gen}/{rel} ({kind}): refused, never merged")
    return lines


def cache_facts(state, image_layers: Callable[[], dict | None] = lambda: None) -> dict[str, dict]:
    """node name -> its CacheState for the profile's image (every node of the run at once), of the
    generation keyed by the engine in the head's image when `image_layers()` (the head's image's layers,
    roles/kernel_cache/engine_key.py parse_layers: the facts pass reads them with the head's
    EngineVersions, tools/plan.py) tells its identity, else of the one keyed by the image ID. The
    head's entry carries that identity ("engine")."""
    cluster = cluster_from_state(state)
    profile = node_profile(cluster.head)
    settings = group_compile_settings(cluster)
    identity = engine_identity(image_layers(), profile.engine)
    gen = engine_generation(identity, settings)
    if gen is not None:
        facts = per_host(state, lambda h: h.get_fact(GenerationState, root=cluster.node(h.name).kernel_cache_dir,
                                                     ref=profile.image_ref, gen=gen))
    else:
        key = settings_key(settings)
        facts = per_host(state, lambda h: h.get_fact(CacheState, root=cluster.node(h.name).kernel_cache_dir,
                                                     ref=profile.image_ref, key=key))
    if cluster.head.name in facts:
        facts[cluster.head.name] = {**facts[cluster.head.name], "engine": identity}
    return facts


def warmed_engine_generations(head_facts: dict, settings: dict[str, str]) -> list[str]:
    """The head's sealed engine-keyed generations for these compile settings: those a new image's
    engine may turn out to be warmed in already (its generation's name is one of them)."""
    suffix = f"-{settings_key(settings)}"
    return sorted(g for g in head_facts["generations"] if ENGINE_GENERATION.fullmatch(g) and g.endswith(suffix))


def decide(facts: dict[str, dict], cluster) -> CachePlan:
    """Prewarm, repair or nothing, a pure function of every rank's CacheState: the head's generation
    is the one of the engine in its image and the compile settings (the image's, where the engine could
    not be read); its manifest is the reference; a generation it never warmed is warmed (and then
    every rank merged), saying which input moved; a warmed one serving a new image is reused, saying
    why; else each rank whose files or manifest differ is synced, each whose 'current' links elsewhere
    is linked, and generations past kernel_cache_keep_generations are expired. An image built in
    this run has no identity yet: when the head holds a generation warmed for these settings by an
    engine, which one (if any) the new image's engine is warmed in is decided after the build, by this
    same function on the facts read then (converge_caches); else it is warmed."""
    head = cluster.head
    head_facts = facts[head.name]
    settings = group_compile_settings(cluster)
    identity = head_facts.get("engine")
    gen = generation_of(identity, head_facts["image"], settings)
    reference = head_facts["manifest"]
    if gen is None and (warmed := warmed_engine_generations(head_facts, settings)):
        return CachePlan(generation=None, after_build=True,
                         why_after_build=(f"the image is built in this run; the head holds {', '.join(warmed)}, warmed "
                                          f"for these compile settings: the new image's engine, read from its "
                                          f"layers after the build, reuses its generation if it is one of them "
                                          f"(no prewarm: the pair restarts once, warm), else it is warmed first"))
    why_prewarm = prewarm_reason(gen, reference, node_profile(head).engine, settings, head_facts["current"],
                                 head_facts.get("current_header"), identity)
    reused = None if why_prewarm is not None else reuse_note(gen, reference, identity, head_facts["image"])
    sync, link, expire = {}, [], {}
    for name, f in facts.items():
        node = cluster.node(name)
        if gen is not None and f["current"] != gen:
            link.append(name)
        if why_prewarm is not None:
            continue
        missing = missing_entries(reference, f["files"])
        if f["foreign"]:  # dropped and named by the merge's scrub before anything crosses
            sync[name] = f"{foreign_summary(f['foreign'])}, never merged"
        elif missing:
            sync[name] = f"{len(missing)} file(s) missing or resized: {', '.join(missing[:3])}"
        elif f["manifest"] != reference:
            sync[name] = "its manifest differs from the head's"
        old = expired(f["generations"], node.kernel_cache_keep_generations, gen)
        if old:
            expire[name] = old
    return CachePlan(generation=gen, prewarm=why_prewarm is not None, sync=sync, link=link,
                     expire=expire, why_prewarm=why_prewarm, reused=reused)


def summary(plan: CachePlan, facts: dict[str, dict], head_name: str) -> str:
    """The verdict in one line, as the deploy prints it."""
    gen = plan.generation
    if plan.after_build:
        return f"decided after the build: {plan.why_after_build}"
    if plan.prewarm:
        return f"prewarm ({plan.why_prewarm}), then merge on every rank"
    reused = f"; {plan.reused}" if plan.reused else ""
    if plan.converge:
        parts = [f"{n}: {why}" for n, why in plan.sync.items()] + [f"{n}: link to {gen}" for n in plan.link]
        parts += [f"{n}: remove {', '.join(g)}" for n, g in plan.expire.items()]
        return "repair without prewarm: " + "; ".join(parts) + reused
    return (f"generation {gen} identical on every rank ({len(parse_manifest(facts[head_name]['manifest'])[1])} files)"
            + reused)


def prewarm_command(profile, cluster, node) -> str:
    """The prewarm container of one rank: the production command line (docker_args and
    engine_args, as in the unit's ExecStart), detached, with its own name and the prewarm
    environment file; nothing else differs. Not --rm: an engine that dies while the pair comes up
    leaves its container, so the deploy can print its log (the prewarm removes its containers)."""
    words = docker_args(profile, node, prewarm_env_path(node), name=PREWARM_CONTAINER, detach=True, remove=False)
    command = shlex.join(words + engine_args(profile, cluster, node))
    if node.is_head:
        return command
    # A worker's image word is its pinned digest, from the file its unit reads (sparkfleet/model/engine.py).
    return pinned_image_source(node) + command.replace(shlex.quote(IMAGE_WORD), f'"{IMAGE_WORD}"', 1)


def pinned_image_source(node) -> str:
    """The shell prefix that sets a worker's IMAGE_VAR from its pin file, as systemd does for its unit."""
    return f". {shlex.quote(image_pin_path(node))} && "


def cache_count_command(root: str) -> str:
    """`<files> <bytes>` of the served generation. -H: `current` is followed, no link inside it (the
    prewarm counts before the merge scrubs: a planted symlink to / would walk the whole disk)."""
    return f"find -H {shlex.quote(root)}/current -type f -printf '%s\\n' 2>/dev/null | awk '{{n++; b+=$1}} END {{print n+0, b+0}}'"


class _Nodes:
    """Shell on any node of the cluster from the head's operation, failing with the node's name."""

    def __init__(self, state):
        self.cluster = cluster_from_state(state)
        self.hosts = {h.name: h for h in active_hosts(state)}

    def run(self, name: str, command: str, what: str, check: bool = True) -> str:
        ok, out = self.hosts[name].run_shell_command(StringCommand(command))
        if check and not ok:
            raise DeployError(f"{name}: {what} failed:\n{out.stderr or out.stdout}")
        return out.stdout

    def cache_state(self, node, ref: str, key: str = "", gen: str | None = None) -> dict:
        """The node's CacheState read afresh (the prepare-time fact is stale once the step runs): of
        the engine-keyed generation `gen` when given, else of the image's and `key`'s."""
        fact, kwargs = ((GenerationState(), {"gen": gen}) if gen and ENGINE_GENERATION.fullmatch(gen)
                        else (CacheState(), {"key": key}))
        command = fact.command(root=node.kernel_cache_dir, ref=ref, **kwargs)
        return fact.process(self.run(node.name, command, "reading the cache").splitlines())

    def identity(self, profile) -> EngineIdentity:
        """The engine's identity in the head's image, read afresh from its layers (the image may have
        been built in this run)."""
        out = self.run(self.cluster.head.name, layers_command(profile.image_ref, profile.engine),
                       "reading the image's layers", check=False)
        return engine_identity(parse_layers(out.splitlines()), profile.engine)

    def cache_facts(self, profile, settings: dict[str, str], identity: EngineIdentity) -> dict[str, dict]:
        """cache_facts() read afresh through this step's connections: every rank's CacheState of the
        generation of the head's image as it is now (`identity`: its engine's), the head's carrying it."""
        gen = engine_generation(identity, settings)
        facts = {n.name: self.cache_state(n, profile.image_ref, settings_key(settings), gen) for n in self.cluster.nodes}
        facts[self.cluster.head.name] = {**facts[self.cluster.head.name], "engine": identity}
        return facts

    def counts(self) -> dict[str, tuple[int, int]]:
        out = {}
        for node in self.cluster.nodes:
            n, b = self.run(node.name, cache_count_command(node.kernel_cache_dir), "counting the cache").split()
            out[node.name] = (int(n), int(b))
        return out


def prewarm_log(node) -> str:
    """Where a rank keeps its last prewarm engine's log (root-only): the container is removed after the
    prewarm, however it ends, so its log is copied here first (save_prewarm_log_command)."""
    return f"{node.preflight_data_dir}/logs/prewarm.log"


PREWARM_LOG_LINES = 5000  # the engine's start-up and the warm-up; the end, where an error is, kept


def save_prewarm_log_command(node) -> str:
    """Copy the prewarm container's log to prewarm_log(node), root-only (an engine may log its
    arguments); nothing when there is no container."""
    log = shlex.quote(prewarm_log(node))
    return (f"mkdir -p -m 0700 $(dirname {log}) && : > {log} && chmod 0600 {log} && "
            f"docker logs --tail {PREWARM_LOG_LINES} {PREWARM_CONTAINER} > {log} 2>&1 || true")


def _read_prewarm_log(node) -> str:
    return on_node(node.management_address, f"tail -n 200 {prewarm_log(node)}")


def prewarm_stopped_failure(node, status: str, timeout: int) -> RunFailure:
    return RunFailure(
        host=node.name, waited_for=f"the prewarm pair's /health to answer 200 (up to {timeout} s)",
        what=f"the prewarm engine stopped ({status}) before the pair was up", log=_read_prewarm_log(node),
        key="serving_profile",
        next_step=("read the rank's prewarm log for why its engine exited (out of memory, NCCL, a model that does "
                   "not load); it runs production's command line, so fix it in the profile (serving_profile) or "
                   "the node, then re-deploy"))


def prewarm_health_failure(head, timeout: int, code: str) -> RunFailure:
    return RunFailure(
        host=head.name, waited_for=f"the prewarm pair's /health to answer 200 (up to {timeout} s)",
        what=f"prewarm pair not healthy after {timeout} s (last /health: {code or 'no answer'})",
        log=_read_prewarm_log(head), key="kernel_cache_prewarm_timeout_s",
        next_step=(f"read the head's prewarm log: if the engine was still loading or compiling, raise "
                   f"kernel_cache_prewarm_timeout_s (now {timeout}); an engine error is fixed in the profile or "
                   f"the node; then re-deploy (the prewarm starts again)"))


def warmup_failure(head, label: str, answer: str) -> RunFailure:
    key = "kernel_cache_prewarm_long_prompt_words" if label.startswith("long prefill") else "serving_profile"
    return RunFailure(
        host=head.name, waited_for=f"warm-up request '{label}' to answer 200",
        what=f"warm-up request '{label}' answered {answer or 'nothing'}", log=_read_prewarm_log(head), key=key,
        next_step=(f"read the head's prewarm log for the engine's answer; "
                   + ("lower kernel_cache_prewarm_long_prompt_words if the prompt exceeds max_model_len, "
                      if key != "serving_profile" else
                      "the request follows the profile (tool_call_parser, vision): correct serving_profile's file, ")
                   + "then re-deploy"))


def _prewarm(nodes: _Nodes, profile) -> None:

    cluster = nodes.cluster
    head, workers = cluster.head, cluster.workers
    # The production pair stops first (head first); prewarm ranks start workers first, like production.
    for node in (head, *workers):
        nodes.run(node.name, f"systemctl stop {unit_name(node)}.service 2>/dev/null; docker rm -f {PREWARM_CONTAINER} >/dev/null 2>&1; true", "stopping serving")

    def warm() -> None:
        for node in (*workers, head):
            nodes.run(node.name, prewarm_command(profile, cluster, node), "starting the prewarm container")
        timeout = head.kernel_cache_prewarm_timeout_s
        start = time.monotonic()
        while True:
            elapsed = time.monotonic() - start
            code = nodes.run(head.name, health_command(api_base(head, profile.port), curl_tls(head)), "health", check=False).strip()
            if code == "200":
                logger.info(f"    [{head.name}] prewarm pair up after {elapsed:.0f} s")
                break
            for node in cluster.nodes:
                status = nodes.run(node.name, f"docker inspect --format '{{{{.State.Status}}}}' {PREWARM_CONTAINER} 2>/dev/null || echo gone", "inspect", check=False).strip()
                if status != "running":
                    logs = nodes.run(node.name, f"docker logs --tail 30 {PREWARM_CONTAINER} 2>&1 || true", "logs", check=False)
                    raise RunFailed(prewarm_stopped_failure(node, status, timeout), logs)
            if elapsed > timeout:
                logs = nodes.run(head.name, f"docker logs --tail 30 {PREWARM_CONTAINER} 2>&1 || true", "logs", check=False)
                raise RunFailed(prewarm_health_failure(head, timeout, code), logs)
            time.sleep(POLL_S)  # its progress: phase() every progress_interval_s, below
        requests = warmup_requests(profile, head.kernel_cache_prewarm_long_prompt_words)
        before = nodes.counts()
        for round_no in range(1, head.kernel_cache_prewarm_max_rounds + 1):
            for label, body in requests:
                ok, out = nodes.hosts[head.name].run_shell_command(StringCommand(request_command(api_base(head, profile.port), curl_tls(head), body, curl_config(head))))
                if not ok or out.stdout.strip() != "200":
                    raise RunFailed(warmup_failure(head, label, out.stdout.strip()), out.stderr[-500:])
            after = nodes.counts()
            grown = {n: (after[n][0] - before[n][0], after[n][1] - before[n][1]) for n in after}
            logger.info(
                f"    [{head.name}] warm-up round {round_no}: "
                + ", ".join(f"{n} {after[n][0]} files (+{grown[n][0]})" for n in sorted(after))
            )
            if round_no > 1 and not any(files or size for files, size in grown.values()):
                break
            before = after
        else:
            logger.warning(f"    [{head.name}] caches still grew after {head.kernel_cache_prewarm_max_rounds} rounds; merging what there is")

    def phase() -> str:
        """The prewarm engine's phase, its log's last line, and the head's /health (sparkfleet/progress.py)."""
        log = nodes.run(head.name, f"docker logs --tail 40 {PREWARM_CONTAINER} 2>&1", "logs", check=False)
        code = nodes.run(head.name, health_command(api_base(head, profile.port), curl_tls(head)), "health", check=False).strip()
        return f"{phase_text(log) or 'no log line yet'} (/health: {code or 'no answer'})"

    try:
        # Every progress_interval_s while the pair starts and warms, the phase; `done in` at the end.
        watched(warm, phase, label=f"{head.name}: prewarm", interval=head.progress_interval_s, emit=logger.info)
    finally:
        report_compile_log(nodes, profile)
        # Each rank's log kept (prewarm_log) before its container goes. The grace before SIGKILL is the
        # profile's stop_timeout_s, as for production's units (and the container's own --stop-timeout),
        # not a longer one of its own: the warm-up is over (its rounds end once no rank's cache grew), and
        # the merge checks what each rank holds after the stop. vLLM 0.32's headless worker, its head gone,
        # waits VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS, SIGTERMs its worker process and waits 4 s more
        # (vllm/v1/executor/multiproc_executor.py): 11 s in the lab, where the grace is 5 s.
        for node in (head, *workers):
            nodes.run(node.name, f"docker stop --time={profile.container.stop_timeout_s} {PREWARM_CONTAINER} >/dev/null 2>&1; "
                                 f"{save_prewarm_log_command(node)}; "
                                 f"docker rm -f {PREWARM_CONTAINER} >/dev/null 2>&1; true", "stopping the prewarm container", check=False)


def compile_log_command(engine: str) -> str | None:
    """The prewarm container's log lines about its compile cache (COMPILE_LOG_LINES), or None for an
    engine that logs none."""
    pattern = COMPILE_LOG_LINES[engine]
    if pattern is None:
        return None
    return f"docker logs {PREWARM_CONTAINER} 2>&1 | grep -E {shlex.quote(pattern)} | tail -n 20 || true"


def report_compile_log(nodes: "_Nodes", profile) -> None:
    """Print each prewarm rank's compile-cache lines, prefixed with the rank's node."""
    command = compile_log_command(profile.engine)
    if command is None:
        return
    for node in nodes.cluster.nodes:
        for line in nodes.run(node.name, command, "reading the prewarm's log", check=False).splitlines():
            logger.info(f"    [{node.name}] prewarm engine: {line.strip()[:400]}")


def unit_state_command(unit: str) -> str:
    """`<is-active> <is-enabled>` of a production unit (`inactive` alone when it does not exist)."""
    u = shlex.quote(f"{unit}.service")
    return f"echo $(systemctl is-active {u} 2>/dev/null) $(systemctl is-enabled {u} 2>/dev/null)"


def units_to_restore(states: dict[str, str]) -> set[str]:
    """Nodes whose production unit comes back after a failed prewarm: those active (or starting)
    before the prewarm stopped them, and the enabled ones. `states`: node -> unit_state_command."""
    out = set()
    for name, line in states.items():
        words = line.split() + ["", ""]
        if words[0] in ("active", "activating", "reloading") or words[1] == "enabled":
            out.add(name)
    return out


def commit_of(image: str) -> str | None:
    """The recipe commit an image reference is tagged with (<image>:<commit>), or None."""
    tag = image.rpartition(":")[2]
    return tag if len(tag) >= 7 and all(c in "0123456789abcdef" for c in tag) else None


def prewarm_failure_message(failure: str, restored: str | None, problem: str | None) -> str:
    """What a failed prewarm leaves: the failure, then whether the previous production serves again."""
    return f"{failure}\n{prewarm_outcome(restored, problem)}"


def prewarm_outcome(restored: str | None, problem: str | None) -> str:
    """Whether the previous production serves again after a failed prewarm, and what to do."""
    if restored:
        return (
            f"The previous production is serving again: {restored}. Nothing was lost: "
            f"fix the cause and re-deploy (the new generation is warmed from the start), or `make rollback` "
            f"to stay on the commit that served last."
        )
    return (
        f"Restarting the previous production failed too: {problem}\nThe pair is NOT serving. "
        f"Re-deploy (or `make rollback`) to bring it back."
    )


def _restore_production(nodes: _Nodes, profile, gen: str, previous: dict[str, str | None],
                        restore: set[str], history: str,
                        previous_pins: dict[str, str | None] | None = None) -> tuple[str | None, str | None]:
    """After a failed prewarm (its containers stopped): every node's 'current' linked back to the
    generation production used, the production units that were active or are enabled restarted
    workers first (each container running), then the head, and /health awaited. Returns (what serves
    again, None) or (None, what failed)."""

    cluster = nodes.cluster
    head = cluster.head
    try:
        for node in cluster.nodes:
            old = previous.get(node.name)
            if old and old != gen:
                nodes.run(node.name, f"cd {shlex.quote(node.kernel_cache_dir)} && ln -sfn {shlex.quote(old)} current",
                          f"linking the kernel cache back to generation {old}")
        if head.name not in restore:
            return None, (f"no production unit was active or enabled on {head.name} before the prewarm "
                          f"(a first deploy?): nothing to restart")
        for node in cluster.workers:  # workers first, each one's container running
            if node.name not in restore:
                continue
            pin = (previous_pins or {}).get(node.name)
            if pin:  # the image production ran: its unit runs the pin, which this run's pull moved on

                nodes.run(node.name, repin_command(node, pin), f"pinning the worker back to {pin}")
            unit = unit_name(node)
            nodes.run(node.name, f"systemctl restart {unit}.service", f"restarting {unit}")
            deadline = time.monotonic() + 120
            while nodes.run(node.name, f"docker inspect --format '{{{{.State.Status}}}}' {unit} 2>/dev/null || true",
                            "inspect", check=False).strip() != "running":
                if time.monotonic() > deadline:
                    raise DeployError(f"{node.name}: {unit} container not running 120 s after its restart")
                time.sleep(POLL_S)
        nodes.run(head.name, f"systemctl restart {unit_name(head)}.service", f"restarting {unit_name(head)}")
        wait_for_health(
            unit=unit_name(head), api=api_base(head, profile.port), tls=curl_tls(head),
            timeout_s=head.serving_health_timeout_s, endpoint=f"{api_base(head, profile.port)}/v1",
            max_model_len=profile.max_model_len, curl_config=curl_config(head), key_file=key_file(head),
        )
    except DeployError as exc:
        return None, str(exc)
    image = nodes.run(head.name, f"docker inspect --format '{{{{.Config.Image}}}}' {unit_name(head)}", "inspect",
                      check=False).strip()
    commit = commit_of(image)
    if commit:
        nodes.run(head.name, record_command(history, "served", commit), "recording the served commit", check=False)
    links = sorted({previous.get(n.name) or "none" for n in cluster.nodes})
    restarted = " then ".join(n.name for n in (*cluster.workers, head) if n.name in restore)
    return (f"{image or 'its image'}" + (f" (recipe {commit})" if commit else "")
            + f" on kernel-cache generation {', '.join(links)}; restarted {restarted}; /health 200"), None


def _merge(nodes: _Nodes, profile, gen: str, image_id: str, settings: dict[str, str],
           identity: EngineIdentity | None = None) -> int:
    """Every rank gets the union of the generation's files; each writes its manifest, which must
    equal the head's (with what the generation was warmed for: the image, the cache variables, the
    compile settings and, for an engine-keyed generation, the engine's identity). Returns the number
    of files."""

    cluster = nodes.cluster
    head = cluster.head

    def url(node):
        return f"rsync://{node.fabric_ip}:{node.fanout_rsync_port}/kernel-cache/{gen}/"

    # First, on every rank: what is not a regular file or a directory (a device node, a fifo, a
    # symlink out of the generation) or is setuid/setgid is removed and named; never merged. The
    # transfers below carry regular files only besides (SAFE_RSYNC, both ends): an entry planted
    # after the scrub, while an engine still runs, does not cross either.
    dropped = []
    for node in (head, *cluster.workers):
        dropped += dropped_lines(node.name, gen, nodes.run(node.name, scrub_command(node.kernel_cache_dir, gen),
                                                           "scrubbing the cache generation"))
    for line in dropped:
        logger.warning(f"    [{host.name}] kernel cache: {line}")
    # Union: the head takes what only a worker compiled, then every worker takes the head's whole set.
    for worker in cluster.workers:
        step = f"Pull {worker.name}'s kernel cache {gen} onto {head.name}"  # bounded: fanout_rsync_timeout_s
        nodes.run(head.name, rsync_pull_command(head, url(worker), f"{head.kernel_cache_dir}/{gen}/", step, "--ignore-existing",
                                                source=worker),
                  f"pulling {worker.name}'s cache")
    for worker in cluster.workers:
        step = f"Pull {head.name}'s kernel cache {gen} onto {worker.name}"
        nodes.run(worker.name, rsync_pull_command(worker, url(head), f"{worker.kernel_cache_dir}/{gen}/", step, source=head),
                  "pulling the head's cache")
    manifests = {}
    for node in (head, *cluster.workers):
        root = node.kernel_cache_dir
        nodes.run(
            node.name,
            f"python3 {SFL_FILES} seal {root}/{gen} --manifest {root}/{gen}.manifest "
            f"--header 'sparkfleet kernel cache manifest v1' --header 'image: {image_id}' "
            f"--header {shlex.quote('caches: ' + warmed_caches(profile.engine))} "
            f"--header {shlex.quote('compile: ' + compile_header(settings))}"
            + (f" --header {shlex.quote('engine: ' + engine_header(identity))}"
               if identity is not None and identity.key and ENGINE_GENERATION.fullmatch(gen) else ""),
            "writing the cache manifest",
        )
        manifests[node.name] = nodes.run(node.name, f"cat {root}/{gen}.manifest", "reading the cache manifest")
    problems = []
    for worker in cluster.workers:
        lacking, extra = manifest_differences(manifests[head.name], manifests[worker.name])
        if lacking or extra:
            problems.append(
                f"{worker.name}: " + "; ".join(
                    part for part in (
                        f"missing or different: {', '.join(lacking[:10])}" if lacking else "",
                        f"only here: {', '.join(extra[:10])}" if extra else "",
                    ) if part
                )
            )
    if problems:
        raise DeployError(
            f"kernel caches of {gen} differ from the head's; production serving is not started:\n  " + "\n  ".join(problems)
        )
    files = len(parse_manifest(manifests[head.name])[1])
    logger.info(f"    [{host.name}] kernel caches of {gen}: {files} files, identical on {len(manifests)} ranks"
                + (f"; {len(dropped)} entr{'y' if len(dropped) == 1 else 'ies'} not regular files dropped" if dropped else ""))
    return files


def converge_caches(prewarm: bool, expire: dict[str, list[str]], watchdogs: tuple[str, ...] = (),
                    previous_pins: dict[str, str | None] | None = None, after_build: bool = False,
                    planned: str | None = None) -> None:
    """Operation body, on the head: link every node to the generation of the engine in the image (of
    the image, where the engine could not be read), prewarm when it was never warmed, give every rank
    the union, write and compare the manifests, drop old generations. `after_build` (the plan's: the
    image was built in this run and the head holds generations an engine warmed for these settings):
    whether to prewarm is decided here, by decide() on the facts read now, and printed with why.
    When a prewarm, or the merge after it, fails, the previous production comes back (its cache link,
    its units, /health awaited), the watchdogs this run paused (`watchdogs`, roles/watchdog) watch it
    again, and a generation directory this run created is removed. `previous_pins`: each worker's image
    pin before this run (the plan's, from prepare-time facts): production ran it. `planned`: the plan's
    generation (None when the image was built in this run): the one read now must be it."""

    nodes = _Nodes(state)
    cluster = nodes.cluster
    profile = node_profile(cluster.head)
    settings = group_compile_settings(cluster)  # as the plan's (decide), from the same data
    identity = nodes.identity(profile)
    image_id = identity.image_id or nodes.cache_state(cluster.head, profile.image_ref)["image"]
    gen = generation_of(identity, image_id, settings)
    if gen is None:
        raise DeployError(f"{cluster.head.name}: image {profile.image_ref} is missing; nothing to key the kernel cache by")
    if planned is not None and gen != planned:  # the image was not rebuilt: its engine read now is the plan's
        raise DeployError(
            f"{cluster.head.name}: the kernel-cache generation of {profile.image_ref} read now is {gen}, the plan's "
            f"was {planned} ({identity.problem or identity.engine}): nothing was linked or warmed; re-deploy "
            f"(the plan is taken again from what the image holds then)")
    if after_build:
        facts = nodes.cache_facts(profile, settings, identity)
        verdict = decide(facts, cluster)  # the plan's own rule, on the image built in this run
        record_after_build(state, cluster.head.name, verdict)
        logger.info(f"    [{host.name}] kernel caches, decided after the build ({profile.image_ref}): "
                    f"{summary(verdict, facts, cluster.head.name)}")
        prewarm, expire = verdict.prewarm, verdict.expire
    subdirs = " ".join(sorted(set(cache_vars(profile.engine).values())))  # this engine's caches only
    # What production used before, to return to when the prewarm fails: its 'current', whether the
    # new generation's directory existed (removed again if this run made it), its units.
    previous, created = {}, []
    previous_pins = {n.name: (previous_pins or {}).get(n.name) for n in cluster.workers}
    if prewarm:
        for node in cluster.nodes:
            root = shlex.quote(node.kernel_cache_dir)
            link, _, there = nodes.run(
                node.name, f"echo \"$(readlink {root}/current)|$([ -d {root}/{gen} ] && echo there)\"", "readlink",
                check=False).strip().partition("|")
            previous[node.name] = link.strip() or None
            if there.strip() != "there":
                created.append(node)
    for node in cluster.nodes:
        root = shlex.quote(node.kernel_cache_dir)
        nodes.run(
            node.name,
            f"cd {root} && for d in {subdirs}; do mkdir -p {gen}/$d; done && ln -sfn {gen} current && touch {gen}",
            f"linking the kernel cache to generation {gen}",
        )
    if not prewarm:
        _merge(nodes, profile, gen, image_id, settings, identity)
    else:

        logger.info(f"    [{host.name}] prewarm of generation {gen} ({profile.image_ref})")
        history, commit = history_file(cluster.head, profile), profile.recipe.commit
        units = {n.name: nodes.run(n.name, unit_state_command(unit_name(n)), "unit state", check=False) for n in cluster.nodes}
        nodes.run(cluster.head.name, record_command(history, "attempted", commit), "recording the attempted commit")
        try:
            _prewarm(nodes, profile)  # its containers are stopped and removed however it ends
            _merge(nodes, profile, gen, image_id, settings, identity)
        except Exception as exc:
            failure = (f"the prewarm of kernel-cache generation {gen} ({profile.image_ref}) failed: "
                       f"{exc if isinstance(exc, DeployError) else repr(exc)}")
            logger.error(f"    [{host.name}] {failure.splitlines()[0]}; restoring the previous production")
            nodes.run(cluster.head.name, record_command(history, "failed", commit), "recording the failure", check=False)
            restored, problem = _restore_production(nodes, profile, gen, previous, units_to_restore(units), history,
                                                    previous_pins)
            if restored:

                resumed = resume_watchdogs(nodes.run, cluster, watchdogs)
                restored += f"; {resumed}" if resumed else ""
            for node in created:  # never warmed, never sealed: as before the run (a re-run warms it afresh)
                root = shlex.quote(node.kernel_cache_dir)
                nodes.run(node.name, f"cd {root} && [ \"$(readlink current)\" != {gen} ] && rm -rf {gen} {gen}.manifest; true",
                          "removing the unwarmed generation", check=False)
            if isinstance(exc, RunFailed):  # the five parts kept; what the prewarm left said after them
                said = dataclasses.replace(exc.failure, what=f"the prewarm of kernel-cache generation {gen} "
                                                             f"({profile.image_ref}) failed: {exc.failure.what}")
                raise RunFailed(said, exc.output, note=prewarm_outcome(restored, problem)) from None
            raise DeployError(prewarm_failure_message(failure, restored, problem)) from None
    for node in cluster.nodes:
        old = expire.get(node.name)
        if prewarm:  # new generation: retention is decided now that it exists
            gens = nodes.cache_state(node, profile.image_ref, settings_key(settings))["generations"]
            old = expired(gens, node.kernel_cache_keep_generations, gen)
        old = [g for g in old or [] if is_generation(g)]  # never a name sparkfleet did not make
        if old:
            root = shlex.quote(node.kernel_cache_dir)
            nodes.run(node.name, "cd " + root + " && rm -rf " + " ".join(f"{g} {g}.manifest" for g in old), "removing old generations")
            logger.info(f"    [{node.name}] removed kernel cache generations {', '.join(old)} (keep {node.kernel_cache_keep_generations})")
