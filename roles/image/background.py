"""The head's build and a worker's pull of the head's image run in the background (issue 44 items 1, 2).

The build (deploy.py step 2d) starts as a transient unit (BUILD_UNIT) once Docker is configured and the
recipe checked out, before the fabric: the fabric's netplan, the firewall, the fabric's proofs, the
file path and the registry (about 20 s on a first bring-up) need no image and run while it builds;
step 5 waits for it (with its progress, docker's filesystem growing) before anything runs the image.
The build's command is the foreground one (roles/image/commands.py build_command: bounded by
image_build_timeout_s, its log on the head), so a failure prints the same lines, now at the wait.

The pull over the fabric takes minutes (a 20 GB image at docker's gunzip pace), and nothing between
the push and the prewarm needs it except the collective proof: the head's wait for its fetch and the
weights' fan-out, the engine proof on the head, the key, TLS and the API proxy. So once the head has
pushed, each worker starts its pull as a transient unit (PULL_UNIT, sparkfleet/background.py): the
same bounded `docker pull` by the digest the push printed, the tag, the pin its unit runs; and step
7d waits for it (with its progress, docker's filesystem growing), then every node's image ID is
checked, then the collective runs in the image.

A failed pull fails step 7d as the foreground pull failed (its output, the pull's RunFailure). A run
that stops between the start and the wait leaves the pull running, bounded (image_pull_timeout_s),
and its pin is written only once the image is there; the next run finds the same pull running and
waits for it, or the image there and nothing to pull.
"""
from __future__ import annotations

import shlex

from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError

from roles.image.checks import RunFailed, digest_ref, pull_failure, pushed_digests
from roles.image.commands import pull_command
from sparkfleet import background
from sparkfleet.image_pin import repin_command
from sparkfleet.inventory import cluster_from_state
from sparkfleet.model.serving import node_profile
from sparkfleet.progress import docker_used_probe

PULL_UNIT = "sparkfleet-image-pull.service"
JOB = "pull"  # the unit's one job
BUILD_UNIT = "sparkfleet-image-build.service"
BUILD_JOB = "build"  # the build unit's one job


START_PREFIX = "Start pulling "  # every start_step begins so: what tests and the plan's check match
BUILD_START_PREFIX = "Start building "  # so does every build_start_step


def build_start_step(profile) -> str:
    return f"{BUILD_START_PREFIX}{profile.image_ref} on the head, in the background"


def build_dir(node) -> str:
    """Where the background build keeps its script and status files (root-only)."""
    return f"{node.preflight_data_dir}/image-build"


def _build_lost(node, ref: str) -> str:
    return (f"sparkfleet: {node.name}: the background build of {ref} ({BUILD_UNIT}) ended without finishing it; "
            f"its journal: journalctl -u {BUILD_UNIT}; a re-run builds again from docker's layer cache")


def _start(*, unit: str, base: str, job: str, command: str, what: str, description: str, already: str,
           ref: str, verb: str) -> None:
    """Start `unit` running `command` as its one job (sparkfleet/background.py), or find it running
    that very script already; `what` names the job in its script's header."""
    script = background.job_script(f"managed by sparkfleet (roles/image/background.py): {what}, run by {unit}",
                                   [(job, command)], base)
    ok, out = host.run_shell_command(StringCommand(background.start_command(
        unit, base, script, description=description, already=already)))
    if not ok:
        raise DeployError(f"{host.name}: starting the {verb} of {ref} failed:\n{out.stderr or out.stdout}")
    logger.info(f"    [{host.name}] {verb}ing {ref} in the background ({unit})")


def start_build(*, ref: str, build: str) -> None:
    """Operation body (the head, step 2d): start `build` (roles/image/commands.py build_command, bounded)
    as BUILD_UNIT; an earlier run's build of the same script still running is waited for instead."""
    node = cluster_from_state(state).node(host.name)
    _start(unit=BUILD_UNIT, base=build_dir(node), job=BUILD_JOB, command=build, what="the head's image build",
           description="sparkfleet: the head's image build",
           already="already building (started by an earlier run): waited for at step 5", ref=ref, verb="build")


def await_build(*, ref: str, step: str) -> None:
    """Operation body (the head, step 5): wait for the background build, with its progress; record its
    own start and end under `step` (what bench/bringup.py reads); fail with what the build printed
    (bounded's lines: the limit, the log on the head, the data key, the next step)."""
    node = cluster_from_state(state).node(host.name)
    ok, out = background.await_job(host, unit=BUILD_UNIT, base=build_dir(node), name=BUILD_JOB,
                                   lost=_build_lost(node, ref), step=step, interval=node.progress_interval_s,
                                   probe=docker_used_probe())
    if not ok:
        raise DeployError(f"{host.name}: \"{step}\" failed; what it printed:\n{out.stderr[-6000:]}")


def start_step(profile) -> str:
    return f"{START_PREFIX}{profile.image_ref} from the head, in the background"


def pull_dir(node) -> str:
    """Where the background pull keeps its script and status files (root-only)."""
    return f"{node.preflight_data_dir}/image-pull"


def pull_job(node, ref: str, local: str) -> str:
    """The pull by digest `ref` (bounded: image_pull_timeout_s), its tag `local`, and the pin its unit
    runs, written last: a pin names only an image the node holds."""
    q = shlex.quote
    where = q(node.serving_dir)  # roles/serving's directory (0700), made here on a first deploy
    return (f"{pull_command(node, node_profile(node), ref)} && docker tag {q(ref)} {q(local)} && "
            f"{{ [ -d {where} ] || mkdir -p -m 0700 {where}; }} && {repin_command(node, ref)}")


def _lost(node, ref: str) -> str:
    return (f"sparkfleet: {node.name}: the background pull of {ref} ({PULL_UNIT}) ended without finishing it; "
            f"its journal: journalctl -u {PULL_UNIT}; a re-run pulls again (only the layers this node lacks)")


def _pulled_ref(remote: str) -> tuple[object, object, str]:
    cluster = cluster_from_state(state)
    node = cluster.node(host.name)
    digest = pushed_digests(state).get(remote)
    if digest is None:
        raise DeployError(f"{host.name}: the head pushed no digest for {remote} in this run; nothing to pull by")
    return cluster, node, digest_ref(cluster, node_profile(node), digest)


def start_pull(remote: str, local: str) -> None:
    """Operation body (a worker, after the head's push_image): start pulling the manifest the head
    pushed, by its digest (<registry>/<repo>@digest; Docker checks the content against it)."""
    _, node, ref = _pulled_ref(remote)
    _start(unit=PULL_UNIT, base=pull_dir(node), job=JOB, command=pull_job(node, ref, local),
           what="the worker's image pull", description="sparkfleet: the worker image pull",
           already="already pulling (started by an earlier run): waited for at step 7d", ref=ref, verb="pull")


def await_pull(remote: str, pin: str, *, step: str) -> None:
    """Operation body (a worker, step 7d): wait for its background pull, with its progress; record the
    pull's own start and end under `step`; fail as the pull failed."""
    cluster, node, ref = _pulled_ref(remote)
    ok, out = background.await_job(host, unit=PULL_UNIT, base=pull_dir(node), name=JOB, lost=_lost(node, ref),
                                   step=step, interval=node.progress_interval_s, probe=docker_used_probe())
    if not ok:
        raise RunFailed(pull_failure(cluster, node, ref), out.stderr or out.stdout)
    logger.info(f"    [{host.name}] pulled {ref}; its unit runs that digest ({pin})")
