"""A worker's pull of the head's image runs in the background (issue 44 item 2).

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


START_PREFIX = "Start pulling "  # every start_step begins so: what tests and the plan's check match


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
    script = background.job_script(
        f"managed by sparkfleet (roles/image/background.py): the worker's image pull, run by {PULL_UNIT}",
        [(JOB, pull_job(node, ref, local))], pull_dir(node))
    ok, out = host.run_shell_command(StringCommand(background.start_command(
        PULL_UNIT, pull_dir(node), script, description="sparkfleet: the worker image pull",
        already="already pulling (started by an earlier run): waited for at step 7d")))
    if not ok:
        raise DeployError(f"{host.name}: starting the pull of {ref} failed:\n{out.stderr or out.stdout}")
    logger.info(f"    [{host.name}] pulling {ref} in the background ({PULL_UNIT})")


def await_pull(remote: str, pin: str, *, step: str) -> None:
    """Operation body (a worker, step 7d): wait for its background pull, with its progress; record the
    pull's own start and end under `step`; fail as the pull failed."""
    cluster, node, ref = _pulled_ref(remote)
    ok, out = background.await_job(host, unit=PULL_UNIT, base=pull_dir(node), name=JOB, lost=_lost(node, ref),
                                   step=step, interval=node.progress_interval_s, probe=docker_used_probe())
    if not ok:
        raise RunFailed(pull_failure(cluster, node, ref), out.stderr or out.stdout)
    logger.info(f"    [{host.name}] pulled {ref}; its unit runs that digest ({pin})")
