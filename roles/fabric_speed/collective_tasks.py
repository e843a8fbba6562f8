"""Step 7e, once every rank holds the serving image (step 7d waited for the pulls): the collective the
engine runs, across the group, inside that image (files/sfl_gather.py: all_gather, NCCL on GPU nodes, gloo without), held
to the bar for the size it gathers (fabric_speed_busbw_bars_gbytes); then, the whole proof passed,
each node's record.

Its buffer comes from the memory guard's budget at prepare (checks.buffer_mib): the largest size
with a bar that fits, at most fabric_speed_max_buffer_mib. Workers' ranks start first, detached; the
head's runs in the foreground and prints the figure; every rank's container is removed whatever
happened."""
import shlex
import time
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import files, python

from roles.fabric_speed.checks import (
    SPEED_TEXTFILE, speed_metrics_text,
    RUNNER_IN_CONTAINER, RUNNER_PATH, RUNNER_SOURCE, SPEED_CONTAINER, env_path, gather_args, gather_docker_args, gather_failures,
    gather_figure, keep_figures, kept_figures, record_path, record_text,
)
from sparkfleet.decided import decisions
from sparkfleet.model.engine import IMAGE_VAR, image_pin_path, rank_env
from sparkfleet.model.serving import node_profile
from sparkfleet.inventory import cluster_from_state
from sparkfleet.roce_gid import resolve_gid_index
from sparkfleet.root_paths import textfile_write_command

cluster = cluster_from_state(state)
node = cluster.node(host.name)
profile = node_profile(node)
plan = decisions(state).speed  # the run's plan (tools/plan.py)
group = node.serving_group


def rank_command(rank_node, mib: int) -> str:
    """One rank's `docker run` of the runner: the head's image by tag, a worker's by the digest its
    pin file holds (roles/image), as its unit runs it."""
    words = gather_docker_args(profile, rank_node, env_path(rank_node))
    args = [RUNNER_IN_CONTAINER] + gather_args(cluster, rank_node, mib)
    if rank_node.is_head:
        return shlex.join(words + [profile.image_ref] + args)
    detached = [words[0], words[1], "--detach"] + words[2:]
    return f". {shlex.quote(image_pin_path(rank_node))} && {shlex.join(detached)} \"${IMAGE_VAR}\" {shlex.join(args)}"


def run_collective(mib: int) -> None:
    """Operation body on the head."""
    hosts = {n.name: state.inventory.get_host(n.name) for n in cluster.nodes}
    workers = [n for n in cluster.nodes if not n.is_head]

    def sh(name, command):
        return hosts[name].run_shell_command(StringCommand(command))

    for n in cluster.nodes:
        sh(n.name, f"docker rm -f {SPEED_CONTAINER} >/dev/null 2>&1 || true")
    try:
        for w in workers:
            ok, out = sh(w.name, rank_command(w, mib))
            if not ok:
                raise DeployError(f"fabric speed: {w.name}: the collective's rank did not start:\n{out.stderr}")
        ok, out = sh(cluster.head.name, rank_command(cluster.head, mib))
        logs = {}
        for w in workers:
            _, wout = sh(w.name, f"docker wait {SPEED_CONTAINER}; docker logs --tail 20 {SPEED_CONTAINER} 2>&1")
            logs[w.name] = wout.stdout
        try:
            figure = gather_figure(out.stdout)
        except ValueError as err:
            tails = "\n".join(f"--- {name}:\n{text[-1500:]}" for name, text in logs.items())
            raise DeployError(f"fabric speed: {cluster.head.name}: {err}\n{out.stderr[-1500:]}\n{tails}") from err
    finally:
        for n in cluster.nodes:
            sh(n.name, f"docker rm -f {SPEED_CONTAINER} >/dev/null 2>&1 || true")
    logger.info(f"    fabric speed: all_gather ({figure['backend']}, {mib} MiB, {len(cluster.nodes)} ranks): busbw "
                f"{figure['busbw_gbytes']:.3f} GB/s (out-of-place {figure['busbw_out_of_place_gbytes']:.3f}, in-place "
                f"{figure['busbw_in_place_gbytes']:.3f}), the bar for {mib} MiB "
                f"{cluster.head.fabric_speed_busbw_bars_gbytes.get(mib)}")
    failures = gather_failures(cluster, figure)
    if failures:
        raise DeployError("\n".join(failures))
    keep_figures(state, group, [{"test": "all_gather", **figure}])


def write_record(path: str, key: str) -> None:
    """Operation body on each node: the passed proof's record, with every figure of this run; on the
    head, with monitoring on, the figures as metrics too (SPEED_TEXTFILE)."""
    figures = kept_figures(state, group)
    command = (f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && printf '%s' {shlex.quote(record_text(key, figures))} > "
               f"{shlex.quote(path)}.tmp && mv {shlex.quote(path)}.tmp {shlex.quote(path)}")
    if node.is_head and node.monitoring_enabled:
        # The textfile directory: every directory of it root's alone, the file written through mktemp
        # (sparkfleet/root_paths.py); a planted symlink fails the step, naming it.
        command += " && " + textfile_write_command(SPEED_TEXTFILE, speed_metrics_text(figures, time.time()))
    ok, out = host.run_shell_command(StringCommand(command))
    if not ok:
        raise DeployError(f"fabric speed: {node.name}: writing {path} failed: {out.stderr}")


if plan.why and node.fabric_speed_collective:
    files.put(
        name="Install the collective's runner (sfl_gather.py)",
        src=RUNNER_SOURCE,
        dest=RUNNER_PATH,
        mode="0644",
        create_remote_dir=True,
    )
    files.put(
        name="Write the collective's environment (the rank's own, root-only)",
        src=StringIO("".join(f"{k}={v}\n" for k, v in sorted(
            rank_env(profile, cluster, node, resolve_gid_index(host, node)).items()))),
        dest=env_path(node),
        user="root",
        group="root",
        mode="0600",
    )
    if node.is_head:
        python.call(
            name="Prove the fabric's speed: all_gather across the group in the serving image",
            function=run_collective,
            mib=plan.buffer_mib,
        )

if plan.why:
    python.call(
        name="Record the passed fabric speed proof",
        function=write_record,
        path=record_path(node),
        key=plan.key,
    )
