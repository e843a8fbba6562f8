"""The head's fetch runs in the background while the image is built and shipped (issue 44 item 2).

A fetch from the hub takes tens of minutes on an office uplink, and so do the image's build and its
ship over the fabric; nothing in one needs the other, except that the hub's client runs inside the
serving image. So the deploy starts the fetch as a transient systemd unit on the head
(FETCH_UNIT, `systemd-run`) as early as it can: before the build when the source is a URL or a
directory, or when the head already holds the image; right after the build when the hub's client
needs the image being built. Step 7's fetch operation then waits for it (with its progress, as
before), prints what it printed and fails the run as the fetch did.

The unit runs one script (`<preflight_data_dir>/weights-fetch/fetch.sh`, root-only), which fetches
each model of the plan in turn, each exactly as the foreground fetch did (roles/weights/checks.py
fetch_command: bounded by weights_fetch_timeout_s, its log, free disk first, the manifest last),
stopping at the first that fails. Per model it leaves `<slug>.start` (the node's clock when the
fetch began), `<slug>.out` (what it printed: on a failure, its log's tail and the failure line) and
`<slug>.end` (when it ended, and its exit status). The wait reads them back and records the fetch's
own start and end (sparkfleet/progress.py SPANS: what bench/bringup.py reads as the fetch phase).

A run that stops after the start (a failed build, a Ctrl-C) leaves the fetch running, bounded as
ever: the next run finds the unit active with the same script and waits for it instead of starting
again; a script that differs (another revision, source or model) stops it first. A re-run resumes a
fetch that failed, as the foreground fetch did.
"""
from __future__ import annotations

import re
import shlex
import time

from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError

from roles.weights.checks import HUB_FETCH_CONTAINER, fetch_command, fetch_step
from sparkfleet.progress import background_done_line, dir_bytes_probe, record_span, run_with_progress
from sparkfleet.model.weights import model_dir

FETCH_UNIT = "sparkfleet-weights-fetch.service"
START_STEP = "Start the head's weights fetch in the background"
_SPAN = re.compile(r"^sparkfleet-fetch-span (?P<start>[\d.]+) (?P<end>[\d.]+) (?P<rc>\d+)$", re.M)


def fetch_dir(node) -> str:
    """Where the background fetch keeps its script and each model's status files (root-only)."""
    return f"{node.preflight_data_dir}/weights-fetch"


def slug(model: str) -> str:
    """A model id as a file name: '/' as '--', anything else outside [A-Za-z0-9._-] as '-'."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", model.replace("/", "--"))


def starts_before_build(source: str, image_on_head: bool) -> bool:
    """Whether the fetch can start before the image step: it needs no image (a URL or a directory,
    fetched by sfl_files.py), or the head holds the image already. Otherwise (the hub's client runs
    in the serving image) it starts right after the build."""
    return source != "hub" or image_on_head


def fetch_script(node, profile, models: list[tuple[str, str]]) -> str:
    """The unit's script: each model's fetch in turn, its status files around it; the first failure
    ends the script with its exit status."""
    base = fetch_dir(node)
    lines = ["#!/bin/sh",
             "# managed by sparkfleet (roles/weights/background.py): the head's weights fetch, run by "
             f"{FETCH_UNIT}"]
    for model, revision in models:
        b = shlex.quote(f"{base}/{slug(model)}")
        lines += [
            f"date +%s.%N > {b}.start",
            f"( {fetch_command(node, profile, model, revision)} ) > {b}.out 2>&1",
            "rc=$?",
            f'echo "$(date +%s.%N) $rc" > {b}.end.tmp && mv {b}.end.tmp {b}.end',
            '[ "$rc" -eq 0 ] || exit "$rc"',
        ]
    return "\n".join(lines) + "\n"


def start_command(node, script: str) -> str:
    """Start FETCH_UNIT running `script`, unless it runs that very script already (an earlier run's
    fetch: waited for, not started again). A unit running another script is stopped first, with the
    hub client's container a stopped docker client leaves."""
    base = shlex.quote(fetch_dir(node))
    path = f"{base}/fetch.sh"
    return "\n".join([
        f"umask 077 && mkdir -p {base} && chmod 0700 {base}",
        f"printf '%s' {shlex.quote(script)} > {path}.new",
        f"if systemctl is-active --quiet {FETCH_UNIT}; then",
        f"  if cmp -s {path}.new {path}; then",
        f"    rm -f {path}.new; echo 'already fetching (started by an earlier run): waited for at step 7'; exit 0",
        "  fi",
        f"  systemctl stop {FETCH_UNIT}; command -v docker >/dev/null && docker rm -f {HUB_FETCH_CONTAINER} >/dev/null 2>&1",
        "fi",
        f"systemctl reset-failed {FETCH_UNIT} 2>/dev/null",
        f"rm -f {base}/*.start {base}/*.out {base}/*.end {base}/*.end.tmp",
        f"mv {path}.new {path} && chmod 0700 {path}",
        f"systemd-run --quiet --collect --unit={FETCH_UNIT} --description='sparkfleet: the head weights fetch' "
        f"/bin/sh {path}",
    ])


def wait_command(node, model: str) -> str:
    """Wait for the background fetch of `model` to end; print what it printed (to stderr), then its
    span on stdout, and exit with its status. A unit that ended without ending this model's fetch
    (stopped, killed, or an earlier model failed) fails naming the unit and its journal."""
    b = shlex.quote(f"{fetch_dir(node)}/{slug(model)}")
    lost = (f"sparkfleet: {node.name}: the background fetch of {model} ({FETCH_UNIT}) ended without finishing it; "
            f"its journal: journalctl -u {FETCH_UNIT}; a re-run starts it again")
    return "\n".join([
        f"while [ ! -f {b}.end ]; do",
        f"  if ! systemctl is-active --quiet {FETCH_UNIT}; then",
        f"    [ -f {b}.end ] && break",
        f"    echo {shlex.quote(lost)} >&2; journalctl -u {FETCH_UNIT} -n 20 --no-pager >&2; exit 1",
        "  fi",
        "  sleep 1",
        "done",
        f"cat {b}.out >&2",
        f"read started < {b}.start; read ended rc < {b}.end",
        'echo "sparkfleet-fetch-span $started $ended $rc"',
        'exit "$rc"',
    ])


def fetch_span(stdout: str) -> tuple[float, float, int] | None:
    """(start, end, exit status) of the fetch, as wait_command printed them; None when it printed none."""
    m = _SPAN.search(stdout)
    return (float(m["start"]), float(m["end"]), int(m["rc"])) if m else None


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
    began = time.monotonic()
    ok, out = run_with_progress(host, StringCommand(wait_command(node, model)), step=step,
                                interval=node.progress_interval_s, probe=dir_bytes_probe(model_dir(node, model)))
    waited = time.monotonic() - began
    span = fetch_span(out.stdout)
    if span is not None:
        start, end, status = span
        record_span(host.name, step, start, end, status == 0)
        # Waited for less than an interval: the fetch ran (mostly) before this step, unwatched; its own
        # duration is its done line. Otherwise the wait's progress and done lines were printed already.
        line = background_done_line(host.name, step, end - start, status == 0, node.progress_interval_s) \
            if waited < node.progress_interval_s else None
        if line:
            logger.info(line)
    if not ok:
        raise DeployError(f"{host.name}: \"{step}\" failed; what it printed:\n{out.stderr[-6000:]}")
