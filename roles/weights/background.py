"""The head's fetch runs in the background while the image is built and shipped (issue 44 item 2).

A fetch from the hub takes tens of minutes on an office uplink, and so do the image's build and its
ship over the fabric; nothing in one needs the other, except that the hub's client runs inside the
serving image. So the deploy starts the fetch as a transient systemd unit on the head
(FETCH_UNIT, `systemd-run`) as early as it can: at step 4b, while the image builds (the build runs
in the background from step 2d), when the source is a URL or a directory, or when the head already
holds the image; right after the build when the hub's client needs the image being built. Step 7's fetch operation then waits for it (with its progress, as
before), prints what it printed and fails the run as the fetch did.

The unit (sparkfleet/background.py: its script, status files, start and wait) fetches each model
of the plan in turn, each exactly as the foreground fetch did (roles/weights/checks.py fetch_command:
bounded by weights_fetch_timeout_s, its log, free disk first, the manifest last), stopping at the
first that fails; a model's output is, on a failure, its log's tail and the failure line. The wait
records the fetch's own start and end (sparkfleet/progress.py SPANS: what bench/bringup.py reads as
the fetch phase).

A run that stops after the start (a failed build, a Ctrl-C) leaves the fetch running, bounded as
ever, and the next run waits for it (or stops it, for another revision, source or model). A re-run
resumes a fetch that failed, as the foreground fetch did.

The workers do not wait for the whole model either. Each fetch runs under `sfl_files.py land`, which
lists the files landed so far beside the manifest (<model>.landed), and in the operation after the
start each worker lacking a model the head fetches starts its pull as a transient unit of its own
(PULL_UNIT): `sfl_files.py pull --follow` takes each listed file as it lands, verified against the
list, and finishes against the manifest the fetch writes last. Step 7's pull operation on that worker
waits for it, as the head's waits for the fetch.
"""
from __future__ import annotations

import shlex

from pyinfra import host, state
from pyinfra.api.exceptions import DeployError

from roles.weights.checks import HUB_FETCH_CONTAINER, fetch_command, fetch_step, landed_path, pull_command, pull_step
from sparkfleet import background
from sparkfleet.background import job_span as fetch_span, slug  # noqa: F401 (this role's names for them)
from sparkfleet.progress import dir_bytes_probe
from sparkfleet.model.weights import model_dir

FETCH_UNIT = "sparkfleet-weights-fetch.service"
START_STEP = "Start the head's weights fetch in the background"
# Each worker's pull of what the head fetches in this run, following the fetch file by file.
PULL_UNIT = "sparkfleet-weights-pull.service"
FOLLOW_STEP = "Start the workers' pulls of the weights the head fetches, in the background"


def fetch_dir(node) -> str:
    """Where the background fetch keeps its script and each model's status files (root-only)."""
    return f"{node.preflight_data_dir}/weights-fetch"


def starts_before_build(source: str, image_on_head: bool) -> bool:
    """Whether the fetch can start before the image step: it needs no image (a URL or a directory,
    fetched by sfl_files.py), or the head holds the image already. Otherwise (the hub's client runs
    in the serving image) it starts right after the build."""
    return source != "hub" or image_on_head


def fetch_script(node, profile, models: list[tuple[str, str]]) -> str:
    """The unit's script: each model's fetch in turn (a job named by the model), stopping at the first
    that fails."""
    return background.job_script(
        f"managed by sparkfleet (roles/weights/background.py): the head's weights fetch, run by {FETCH_UNIT}",
        [(model, fetch_command(node, profile, model, revision)) for model, revision in models], fetch_dir(node))


def start_command(node, script: str, models: list[str] = ()) -> str:
    """Start FETCH_UNIT running `script`, unless it runs that very script already (an earlier run's
    fetch: waited for, not started again). A unit running another script is stopped first, with the
    hub client's container a stopped docker client leaves. Before it starts, each model's landing list
    goes: a worker that follows the fetch (next operation) must not take an earlier fetch's list (its
    `done` or `failed`) for this one's. The manifest stays until the fetch writes its own: a fetch
    that fails leaves the head's copy as it was, and a following pull reads no manifest before the
    list says `done`."""
    stale = " ".join(shlex.quote(landed_path(node, m)) for m in models)
    return background.start_command(
        FETCH_UNIT, fetch_dir(node), script, description="sparkfleet: the head weights fetch",
        already="already fetching (started by an earlier run): waited for at step 7",
        stop_also=f"command -v docker >/dev/null && docker rm -f {HUB_FETCH_CONTAINER} >/dev/null 2>&1",
        before_start=f"rm -f {stale}" if stale else "")


def pull_dir(node) -> str:
    """Where a worker's background pull keeps its script and each model's status files (root-only)."""
    return f"{node.preflight_data_dir}/weights-pull"


def follow_script(cluster, node, models: list[str]) -> str:
    """A worker's unit script: each model's pull following the head's fetch, in turn."""
    return background.job_script(
        f"managed by sparkfleet (roles/weights/background.py): the worker's weights pull, run by {PULL_UNIT}",
        [(model, pull_command(cluster, node, model, follow=True)) for model in models], pull_dir(node))


def follow_start_command(node, script: str) -> str:
    return background.start_command(
        PULL_UNIT, pull_dir(node), script, description="sparkfleet: the worker weights pull",
        already="already pulling (started by an earlier run): waited for at step 7")


def followed(plan, cluster, node, models: list[str]) -> list[str]:
    """The models `node` (a worker) pulls while the head fetches them: those the head fetches in this
    run and this worker lacks (the plan's fetch and pull)."""
    if node.is_head:
        return []
    return [m for m in models if m in plan.weights.fetch and (m, node.name) in plan.weights.pull]


def wait_command(node, model: str) -> str:
    """Wait for the background fetch of `model` to end (sparkfleet/background.py wait_command)."""
    return background.wait_command(FETCH_UNIT, fetch_dir(node), model, _lost(node, model))


def _lost(node, model: str) -> str:
    return (f"sparkfleet: {node.name}: the background fetch of {model} ({FETCH_UNIT}) ended without finishing it; "
            f"its journal: journalctl -u {FETCH_UNIT}; a re-run starts it again")


def define_start(*, before_build: bool) -> None:
    """The start operation at one of its two places (deploy.py steps 4b and 5), on the head when the
    plan fetches a model and this is the place its source allows (starts_before_build)."""
    from pyinfra.operations import server

    from sparkfleet.decided import decisions
    from sparkfleet.inventory import cluster_from_state
    from sparkfleet.model.serving import node_profile, profile_models

    cluster = cluster_from_state(state)
    node = cluster.node(host.name)
    profile = node_profile(node)
    plan = decisions(state)
    models = [(m, r) for m, r in profile_models(profile) if m in plan.weights.fetch] if node.is_head else []
    # The head's source decides the place, for its workers too.
    place = starts_before_build(cluster.head.weights_source, plan.image.head_id is not None) == before_build
    here = bool(models) and place
    server.shell(
        name=START_STEP if before_build else f"{START_STEP} (the hub's client, in the image just built)",
        commands=[start_command(node, fetch_script(node, profile, models), [m for m, _ in models])] if here else [],
        _if=lambda: here,
    )
    # Then each worker's pull, following the fetch: after the start above on every host (pyinfra runs
    # one operation on every host before the next), so the last fetch's list is gone by then.
    follows = followed(plan, cluster, node, [m for m, _ in profile_models(profile)]) if place else []
    server.shell(
        name=FOLLOW_STEP if before_build else f"{FOLLOW_STEP} (after the build)",
        commands=[follow_start_command(node, follow_script(cluster, node, follows))] if follows else [],
        _if=lambda: bool(follows),
    )


def await_pull(*, model: str) -> None:
    """Operation body (a worker, step 7): wait for its background pull of `model`, which followed the
    head's fetch, with its progress (the model's directory growing); record the pull's own start and
    end; fail as it failed (its log's tail and its line, as the foreground pull's)."""
    from sparkfleet.inventory import cluster_from_state

    node = cluster_from_state(state).node(host.name)
    lost = (f"sparkfleet: {node.name}: the background pull of {model} ({PULL_UNIT}) ended without finishing it; "
            f"its journal: journalctl -u {PULL_UNIT}; a re-run resumes from what arrived")
    ok, out = background.await_job(host, unit=PULL_UNIT, base=pull_dir(node), name=model, lost=lost,
                                   step=pull_step(model), interval=node.progress_interval_s,
                                   probe=dir_bytes_probe(model_dir(node, model)))
    if not ok:
        raise DeployError(f"{host.name}: \"{pull_step(model)}\" failed; what it printed:\n{out.stderr[-6000:]}")


def await_fetch(*, model: str, revision: str) -> None:
    """Operation body (head, step 7): wait for the background fetch of `model`, with its progress (the
    model's directory growing); record its own start and end; fail as it failed."""
    from sparkfleet.inventory import cluster_from_state

    node = cluster_from_state(state).node(host.name)
    step = fetch_step(node, model, revision)
    ok, out = background.await_job(host, unit=FETCH_UNIT, base=fetch_dir(node), name=model, lost=_lost(node, model),
                                   step=step, interval=node.progress_interval_s,
                                   probe=dir_bytes_probe(model_dir(node, model)))
    if not ok:
        raise DeployError(f"{host.name}: \"{step}\" failed; what it printed:\n{out.stderr[-6000:]}")
