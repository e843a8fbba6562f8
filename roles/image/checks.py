"""Where the recipe lives on the head, which image a profile builds, and whether every node has it."""
import json
import re
import shlex
import time
from dataclasses import dataclass
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError

from roles.guards.drift import drift_report, launch_defaults
from roles.guards.exact_drift import (
    env_file_values,
    exact_report,
    launcher_argv,
    rank_findings,
    recorder_files,
    recorder_run,
    stop_message,
)
from roles.image.commands import registry_of
from roles.image.facts import (  # noqa: F401 (pin_of: callers of this module read the pin with it)
    DockerImageId,
    ImagePin,
    RepoDigests,
    pin_of,
)
from sparkfleet.bounded import bounded
from sparkfleet.decided import decisions
from sparkfleet.inventory import cluster_from_state
from sparkfleet.model.docker import registry_address
from sparkfleet.model.engine import engine_args, env_file_path, image_pin_path
from sparkfleet.model.image import REGISTRY_ROOT
from sparkfleet.model.serving import FULL_SHA, load_profile, node_profile, profile_names, profile_path
from sparkfleet.once import active_hosts, per_host
from sparkfleet.progress import docker_used_probe, fs_used_probe, run_with_progress
from sparkfleet.refusal import Problem, Refusal
from sparkfleet.run_failure import Advice, RunFailed, RunFailure, journal, on_node
from sparkfleet.verdicts import ImagePlan  # noqa: F401 (this role's verdict, on the ground floor)


def recipe_dir(node, profile) -> str:
    return f"{node.preflight_data_dir}/recipes/{profile.name}"


def commit_problem(node, profile, resolved: str | None) -> Problem | None:
    """Why the recipe commit cannot be built, or None: it must be a full 40-hex SHA (an abbreviation
    can become ambiguous as the repository grows, and names no object by itself), and not the
    all-zero placeholder of an unpinned profile. `resolved`: the full SHA the head found for an
    abbreviated commit (roles/image/facts.ResolvedCommit), or None."""
    commit = profile.recipe.commit
    if node.serving_recipe_commit:
        key, where = "serving_recipe_commit", "data"
    else:
        key, where = "recipe.commit", str(profile_path(profile.name, node.serving_site))
    if set(commit) == {"0"}:
        return Problem(
            f"key '{key}' = {commit!r} is a placeholder: profile {profile.name} ships no recipe commit",
            [node.name], key=key, sources=[where],
            fix="pin the full commit SHA of the recipe you validated (serving_recipe_commit in data, or the profile)",
        )
    if FULL_SHA.match(commit):
        return None
    if resolved:
        fix = f"use the full SHA: serving_recipe_commit = \"{resolved}\" (resolved on {node.name})"
    else:
        fix = (f"give the full 40-hex SHA ({node.name} cannot resolve {commit} yet: run `git rev-parse {commit}` "
               f"in a clone of {profile.recipe.repository})")
    return Problem(
        f"key '{key}' = {commit!r} is an abbreviated commit; recipe commits are full 40-hex SHAs",
        [node.name], key=key, sources=[where], fix=fix,
    )


def recipe_bumped(served: list[str], commit: str) -> bool:
    """A recipe bump (or a rollback): the head's served-commit history ends with another commit. The
    launch-default drift check (step 2d) and the exact drift check (step 5) both run only then."""
    return bool(served) and not served[-1].startswith(commit)


def refuse_loose_commit(node, profile, resolved: str | None) -> None:
    """Prepare time, on the head: stop the run before any change when the commit is not a full SHA."""
    problem = commit_problem(node, profile, resolved)
    if problem:
        raise Refusal("the recipe commit is not pinned by a full SHA; nothing was changed", [problem])


def check_recipe_drift(src: str, old: str, new: str, launch_files, pinned: dict, acknowledged) -> None:
    """Operation body (head, after the checkout fetched `new`): report every launch default that
    changed between the served commit and the new one; stop on one sparkfleet does not pin."""


    def defaults(commit):
        out = {}
        for name in launch_files:
            ok, text = host.run_shell_command(StringCommand(f"git -C {src} show {commit}:{name} 2>/dev/null || true"))
            out.update(launch_defaults(text.stdout if ok else ""))
        return out

    lines, stops = drift_report(defaults(old), defaults(new), pinned, set(acknowledged))
    header = f"recipe {old[:12]} -> {new[:12]}, launch defaults ({', '.join(launch_files)}):"
    logger.info(f"    [{host.name}] {header} " + ("; ".join(lines) if lines else "unchanged"))
    if stops:
        raise DeployError(
            f"{header} {', '.join(stops)} changed upstream and sparkfleet does not pin "
            f"{'it' if len(stops) == 1 else 'them'}: pin in data (serving_env_pins: {{{stops[0]}: ...}}) or "
            f"acknowledge (recipe_drift_acknowledged: [{', '.join(stops)}]). Nothing was built or restarted.\n  "
            + "\n  ".join(lines)
        )


def exact_drift_ranks(state, cluster) -> list[tuple[str, list[str], str]]:
    """Prepare time, per rank of this run: (node name, the engine argv sparkfleet renders for it,
    its environment file as roles/serving will write it)."""

    pair = decisions(state).serving  # the ranks' files as roles/serving writes them (the run's plan)
    return [
        (node.name, engine_args(node_profile(node), cluster, node),
         pair.files[node.name][env_file_path(node, node.serving_dir)][0])
        for node in cluster.nodes
        if node.name in pair.files
    ]


def check_exact_drift(src: str, new: str, image: str, launcher: str, launcher_args: str, engine: str, ranks,
                      weights_dir: str, acknowledged) -> None:
    """Operation body (head, after the new image is built, before it is pushed): run the recipe's
    launcher at `new` inside the new image once per rank, with the engine replaced by a recorder
    (roles/guards/exact_drift.py), and compare what it would start with what sparkfleet renders.
    `ranks`: [(label, rendered engine argv, rendered environment file text)] from prepare time.
    An unexplained difference stops the deploy before anything leaves the head."""



    def sh(command: str):
        ok, out = host.run_shell_command(StringCommand(command))
        if not ok:
            raise DeployError(f"{host.name}: exact recipe drift: `{command}` failed: {out.stderr or out.stdout}")
        return out.stdout

    tmp = sh("mktemp -d /tmp/sfl-exact-drift.XXXXXX").strip()
    mnt = f"{tmp}/mnt"
    findings = {}
    try:
        # The rank environment files stay in the root-only directory; the container sees mnt/ only.
        sh(f"chmod 0700 {tmp} && mkdir -p {mnt}/bin {mnt}/py/sglang {mnt}/out && chmod 0755 {mnt} {mnt}/bin {mnt}/py "
           f"{mnt}/py/sglang")
        for rel, (text, mode) in recorder_files().items():
            host.put_file(StringIO(text), f"{mnt}/{rel}")
            sh(f"chmod {mode} {mnt}/{rel}")
        for i, (label, argv, env_text) in enumerate(ranks):
            name = f"sfl-exact-drift-{i}"
            host.put_file(StringIO(env_text), f"{tmp}/rank{i}.env")
            sh(f"docker rm -f {name} >/dev/null 2>&1; rm -f {mnt}/out/*; chmod 1777 {mnt}/out")
            run = recorder_run(image, f"{tmp}/rank{i}.env", mnt, src, weights_dir,
                               launcher_argv(launcher, launcher_args, engine, argv), name)
            status = sh(f"{run} >{tmp}/rank{i}.log 2>&1; echo $?").strip()
            baseline = sh(f"cat {mnt}/out/baseline.json 2>/dev/null || true").strip()
            records = [json.loads(line) for line in sh(f"cat {mnt}/out/records.jsonl 2>/dev/null || true").splitlines()
                       if line.strip()]
            findings[label] = rank_findings(
                engine, argv, env_file_values(env_text), json.loads(baseline) if baseline else None, records,
                int(status) if status.isdigit() else None, "" if records else sh(f"tail -n 15 {tmp}/rank{i}.log"),
            )
    finally:
        host.run_shell_command(StringCommand(
            f"for c in $(seq 0 {len(ranks)}); do docker rm -f sfl-exact-drift-$c >/dev/null 2>&1; done; rm -rf {tmp}"))

    lines, stops = exact_report(findings, acknowledged)
    header = f"recipe {new[:12]}, exact drift ({launcher} in {image}, the engine recorded per rank):"
    logger.info(f"    [{host.name}] {header} " + ("; ".join(lines) if lines else "no difference"))
    if stops:
        raise DeployError(stop_message(new, launcher, image, lines, stops))


def other_profile_images(local: list[str], profile, registry: str, site_dir: str | None = None) -> list[str]:
    """Local images (plain and registry-tagged) of every profile (shipped, and the site's) but the served one."""

    repos = {load_profile(n, site_dir=site_dir).image for n in profile_names(site_dir)} - {profile.image}
    repos |= {f"{registry}/{r}" for r in repos}
    return [ref for ref in local if ref.rsplit(":", 1)[0] in repos]


def registry_ref(cluster, profile) -> str:
    return f"{registry_address(cluster)}/{profile.image_ref}"


_PUSHED = re.compile(r"digest: (sha256:[0-9a-f]{64})")


def digest_ref(cluster, profile, digest: str) -> str:
    """`<registry>/<repo>@sha256:...`: the manifest a worker pulls and runs, whatever the tag names."""
    return f"{registry_address(cluster)}/{profile.image}@{digest}"


def pushed_digest(output: str) -> str | None:
    """The manifest digest `docker push` printed (`<tag>: digest: sha256:<64 hex> size: <n>`), or None."""
    found = _PUSHED.findall(output)
    return found[-1] if found else None


def image_facts(state, profile) -> "ImageFacts":
    """At prepare time, every node at once: the image's ID on each (DockerImageId), the head's registry
    digests of it (RepoDigests, a list), each worker's (pinned reference: its pin file or None, its
    local copy's registry digests)."""
    cluster = cluster_from_state(state)

    def read(h):
        node = cluster.node(h.name)
        image_id = h.get_fact(DockerImageId, ref=profile.image_ref)
        if node.is_head:
            return image_id, h.get_fact(RepoDigests, ref=profile.image_ref)
        # A worker's own registry digests of its local copy too: an image it pulled by digest before
        # (a rollback to a commit every node kept) needs its pin written again, not a pull.
        return image_id, (h.get_fact(ImagePin, path=image_pin_path(node)), h.get_fact(RepoDigests, ref=profile.image_ref))

    read_by_node = per_host(state, read)
    return ImageFacts(ids={n: i for n, (i, _) in read_by_node.items()},
                      pins={n: p for n, (_, p) in read_by_node.items()})


def pushed_digests(state) -> dict[str, str]:
    """registry ref -> the digest the head's push printed in this run (push_image), for the workers' pulls."""
    return state.__dict__.setdefault("_sparkfleet_pushed", {})


def push_image(local: str, remote: str, push: str, *, step: str, interval: int) -> None:
    """Operation body (head): tag the local build `local` as `remote` in the fabric registry, push it
    (`push`, bounded), and keep the manifest digest the push printed: what every worker pulls and runs
    (roles/image/background.py), so a push under the same tag after this one changes nothing a worker gets. While
    it runs, `step`'s progress every `interval` s (sparkfleet/progress.py)."""

    ok, out = run_with_progress(  # progress: the registry's filesystem growing (sparkfleet/progress.py)
        host, StringCommand(f"docker tag {shlex.quote(local)} {shlex.quote(remote)} && {push}"), step=step,
        interval=interval, probe=fs_used_probe(REGISTRY_ROOT))
    text = f"{out.stdout}\n{out.stderr}"
    if not ok:
        raise RunFailed(push_failure(cluster_from_state(state).node(host.name), remote), text)
    digest = pushed_digest(text)
    if digest is None:
        raise DeployError(f"{host.name}: `docker push {remote}` printed no manifest digest:\n{text[-2000:]}")
    pushed_digests(state)[remote] = digest
    logger.info(f"    [{host.name}] pushed {remote} as {digest}")


def push_failure(head, remote: str) -> RunFailure:
    """The head's push to the fabric registry failed (not at its limit: bounded() says that one)."""
    return RunFailure(
        host=head.name, waited_for=f"docker push of {remote} to the head's registry", what=f"pushing {remote} failed",
        log=journal(head.management_address, "docker-registry"), key="docker_registry_port",
        next_step=(f"read the docker output below and the registry's log; check that the registry runs and "
                   f"listens on {registry_of(remote)} ({on_node(head.management_address, 'systemctl status docker-registry')}); "
                   f"then re-deploy (a re-run pushes only the layers the registry lacks)"))


def pull_failure(cluster, node, ref: str) -> RunFailure:
    """A worker's pull from the head's registry (or its tag and pin after it) failed."""
    return RunFailure(
        host=node.name, waited_for=f"docker pull of {ref} from the head's registry over the fabric",
        what=f"pulling {ref} failed", log=journal(node.management_address, "docker"), key="docker_registry_port",
        next_step=(f"check that {node.name} reaches the registry on {cluster.head.name}'s fabric address "
                   f"({on_node(node.management_address, f'curl -sS http://{registry_of(ref)}/v2/')} answers {{}}) "
                   f"and that it runs there ({on_node(cluster.head.management_address, 'systemctl status docker-registry')}); "
                   f"then re-deploy (a re-run pulls only the layers this node lacks)"))


@dataclass(frozen=True)
class ImageFacts:
    ids: dict[str, str | None]  # node -> the image's ID there before the run (None: not there)
    pins: dict[str, object]  # head -> its RepoDigests; worker -> (its pin or None, its RepoDigests)


def decide(facts: ImageFacts, cluster, profile) -> ImagePlan:
    """Whether the head builds the profile's image and which workers pull it: a pure function of the
    image IDs and pins every node of the group had at prepare time."""
    ids, pins = facts.ids, facts.pins
    head_id = ids.get(cluster.head.name)
    repo = f"{registry_address(cluster)}/{profile.image}@"
    pushed = [d for d in pins.get(cluster.head.name) or [] if d.startswith(repo)]
    ship, repin, worker_pins = [], {}, {}
    for n in cluster.workers:
        if n.name not in ids:
            continue
        pin, held = pins.get(n.name) or (None, [])
        worker_pins[n.name] = pin
        if head_id is None or ids[n.name] != head_id:
            ship.append(n.name)
        elif pin not in pushed:
            common = sorted(set(held or []) & set(pushed))
            if common:
                repin[n.name] = common[0]
            else:
                ship.append(n.name)
    return ImagePlan(head_id=head_id, ship=ship, repin=repin, ids=dict(ids), worker_pins=worker_pins)


def ids_differ_message(ids: dict[str, str | None], ref: str) -> str:
    rows = ", ".join(f"{name}={(image_id or 'missing')[:19]}" for name, image_id in sorted(ids.items()))
    return f"image {ref} differs between nodes: {rows}; every rank must run the same image"


def verify_same_image(ref: str) -> None:
    """Operation body (runs on the head after the pulls): the same image ID on every node, read afresh."""

    ids = {}
    for node_host in active_hosts(state):
        ok, out = node_host.run_shell_command(StringCommand(DockerImageId().command(ref)))
        ids[node_host.name] = DockerImageId().process(out.stdout_lines) if ok else None
    if len(set(ids.values())) != 1 or None in ids.values():
        raise DeployError(ids_differ_message(ids, ref))


_ARG_REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def base_images(dockerfile: str, build_args: dict[str, str]) -> list[str]:
    """The images a Dockerfile builds FROM, in order: global ARG defaults and the build args
    substituted, `scratch` and references to earlier stages left out."""
    text = re.sub(r"\\\n", " ", dockerfile)
    args: dict[str, str] = {}
    stages: set[str] = set()
    bases: list[str] = []
    seen_from = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "ARG" and not seen_from:
            name, eq, default = rest.strip().partition("=")
            args[name.strip()] = build_args.get(name.strip(), default.strip().strip('"\'') if eq else "")
        elif word == "FROM":
            seen_from = True
            parts = [p for p in rest.split() if not p.startswith("--")]
            if not parts:
                continue
            ref = _ARG_REF.sub(lambda m: args.get(m[1] or m[3]) or (m[2] or ""), parts[0])
            if len(parts) >= 3 and parts[1].lower() == "as":
                stages.add(parts[2].lower())
            if ref.lower() != "scratch" and ref.lower() not in stages and ref not in bases:
                bases.append(ref)
    return bases


RECORD_BASE_STEP = "Record the recipe's base images by digest"


def base_record_path(node, profile) -> str:
    """Where the head records the base images the profile's image was built from (by digest)."""
    return f"{node.preflight_data_dir}/recipes/{profile.name}.{profile.recipe.commit}.base"


def base_record_line(ref: str, repo_digests: list[str], image_id: str) -> str:
    """`<ref>\\t<registry digest, or - for an image no registry gave>\\t<local image ID>`."""
    name = ref.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    name = f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]  # the tag off, a registry port kept
    digest = next((d for d in repo_digests if d.split("@", 1)[0] == name), repo_digests[0] if repo_digests else "-")
    return f"{ref}\t{digest}\t{image_id}"


def record_base_images(src: str, commit: str, dockerfile: str, build_args: dict, record: str, pull_limit_s: int) -> None:
    """Operation body (head, after the checkout, before the build): every base image of the
    Dockerfile at `commit` is made local (pulled when absent, so the build uses exactly the image
    recorded: docker build takes a local FROM image unless --pull) and written to `record` with its
    registry digest and image ID."""


    interval = cluster_from_state(state).node(host.name).progress_interval_s

    def sh(command: str, what: str, progress: str | None = None) -> str:
        """`command` on the head; with `progress`, that step's progress while it runs (a base image's
        pull can be tens of GiB: docker's filesystem growing, sparkfleet/progress.py)."""
        ok, out = (run_with_progress(host, StringCommand(command), step=progress, interval=interval,
                                     probe=docker_used_probe()) if progress else host.run_shell_command(StringCommand(command)))
        if not ok:
            raise DeployError(f"{host.name}: {what} failed:\n{out.stderr or out.stdout}")
        return out.stdout

    text = sh(f"git -C {shlex.quote(src)} show {shlex.quote(f'{commit}:{dockerfile}')}", f"reading {dockerfile} at {commit[:12]}")
    lines = [f"# sparkfleet: base images of recipe {commit} ({dockerfile}), recorded {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"]
    for ref in base_images(text, build_args):
        q = shlex.quote(ref)
        fmt = shlex.quote("{{json .RepoDigests}}\t{{.Id}}")
        address = cluster_from_state(state).node(host.name).management_address
        pull = bounded(f"docker pull --quiet {q} >&2", step=RECORD_BASE_STEP, host=host.name, limit_s=pull_limit_s,
                       key="image_pull_timeout_s", resume="a re-run pulls only the layers the head lacks",
                       advice=Advice(
                           log=journal(address, "docker"), key="serving_recipe_commit",
                           next_step=f"check that {host.name} reaches the registry of {ref} (the recipe's FROM at "
                                     f"serving_recipe_commit {commit[:12]}): {on_node(address, f'docker pull {q}')}; "
                                     f"a re-run pulls only the layers the head lacks"))
        out = sh(f"docker image inspect --format {fmt} {q} 2>/dev/null || {{ {pull} && "
                 f"docker image inspect --format {fmt} {q}; }}", f"resolving base image {ref}", f"Pull base image {ref}")
        digests_json, _, image_id = out.strip().partition("\t")
        line = base_record_line(ref, json.loads(digests_json or "[]") or [], image_id.strip())
        lines.append(line)
        digest = line.split("\t")[1]
        logger.info(f"    [{host.name}] base image {ref}: " + (
            digest if digest != "-" else f"no registry digest (a local image), ID {image_id.strip()}"))
    body = "\n".join(lines) + "\n"
    sh(f"mkdir -p $(dirname {shlex.quote(record)}) && printf '%s' {shlex.quote(body)} > {shlex.quote(record)}.tmp "
       f"&& mv {shlex.quote(record)}.tmp {shlex.quote(record)}", "writing the base image record")
