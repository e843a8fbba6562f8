"""The head's fetch runs in the background while the image is built and shipped (issue 44 item 2).

A fetch from the hub takes tens of minutes on an office uplink, and so do the image's build and its
ship over the fabric; nothing in one needs the other, except that the hub's client runs inside the
serving image. So the deploy starts the fetch as a transient systemd unit on the head
(FETCH_UNIT, `systemd-run`) as early as it can: before the build when the source is a URL or a
directory, or when the head already holds the image; right after the build when the hub's client
needs the image being built. Step 7's fetch operation then waits for it (with its progress, as
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
"""
from __future__ import annotations

from pyinfra import host, state
from pyinfra.api.exceptions import DeployError

from roles.weights.checks import HUB_FETCH_CONTAINER, fetch_command, fetch_step
from sparkfleet import background
from sparkfleet.background import job_span as fetch_span, slug  # noqa: F401 (this role's names for them)
from sparkfleet.progress import dir_bytes_probe
from sparkfleet.model.weights import model_dir

FETCH_UNIT = "sparkfleet-weights-fetch.service"
START_STEP = "Start the head's weights fetch in the background"


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


def start_command(node, script: str) -> str:
    """Start FETCH_UNIT running `script`, unless it runs that very script already (an earlier run's
    fetch: waited for, not started again). A unit running another script is stopped first, with the
    hub client's container a stopped docker client leaves."""
    return background.start_command(
        FETCH_UNIT, fetch_dir(node), script, description="sparkfleet: the head weights fetch",
        already="already fetching (started by an earlier run): waited for at step 7",
        stop_also=f"command -v docker >/dev/null && docker rm -f {HUB_FETCH_CONTAINER} >/dev/null 2>&1")


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

    node = cluster_from_state(state).node(host.name)
    profile = node_profile(node)
    plan = decisions(state)
    models = [(m, r) for m, r in profile_models(profile) if m in plan.weights.fetch] if node.is_head else []
    here = bool(models) and starts_before_build(node.weights_source, plan.image.head_id is not None) == before_build
    server.shell(
        name=START_STEP if before_build else f"{START_STEP} (the hub's client, in the image just built)",
        commands=[start_command(node, fetch_script(node, profile, models))] if here else [],
        _if=lambda: here,
    )


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
