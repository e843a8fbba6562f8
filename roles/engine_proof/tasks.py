"""Step 7a, on each group's head, once it holds the group's image and weights, before anything stops the pair
(the prewarm, step 8, and the restart, step 9): the image's own engine judges every distinct rank
command line and environment (checks.py). A refusal stops the deploy here, quoting the engine, with
the pair as it was: still serving if it served. Runs only when this run moves the pair; the verdict's
line names the engine version the image ships, and the proven one is recorded on the head
(engine_proof_path) for the receipt and `make status`.

The engine's report is kept on the head under REPORTS, named by what decides it: the image's ID (its
content), the request's digest, the model's pinned revisions (the engine reads the mounted config.json)
and the shipped checkers' digest. A run that asks the same image the same
question again (a re-run after a later step failed, a way back to a command line proven before) judges
that report again instead of a second `docker run`, which costs the engine's whole import (15-30 s on
the lab's two cores)."""
import hashlib
import json
import shlex
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import files, python

from roles.engine_proof.checks import (
    CONTAINER, CONTAINER_DIR, FILES, PROOF_DIR, SHIPPED, judge, proof_request, request_digest,
)
from sparkfleet.decided import decisions
from sparkfleet.inventory import cluster_from_state
from sparkfleet.model.engine import CONTAINER_WEIGHTS_ROOT
from sparkfleet.model.engine_proof import engine_proof_path, record_text
from sparkfleet.model.serving import node_profile

cluster = cluster_from_state(state)
node = cluster.node(host.name)
profile = node_profile(node)
planned = decisions(state)
moves = planned.serving.restart or planned.caches.prewarm

REQUEST = f"{PROOF_DIR}/request.json"
REPORTS = f"{PROOF_DIR}/reports"
REPORTS_KEPT = 8  # the newest reports kept; older ones are removed as each new one is written
CHECKERS_DIGEST = hashlib.sha256(b"".join((FILES / name).read_bytes() for name in SHIPPED)).hexdigest()[:16]


def prove(request: dict) -> None:
    """Operation body on the head: the short `docker run` of the group's image, then the verdict."""
    image = profile.image_ref
    words = ["timeout", str(node.engine_proof_timeout_s), "docker", "run", "--rm", "-i", "--name", CONTAINER,
             "--network=none", "--entrypoint", "python3", f"--volume={PROOF_DIR}:{CONTAINER_DIR}:ro",
             # the weights as the units mount them: vLLM reads the model's config.json from the path in argv
             # (a path it cannot find it takes for a hub repository id, and refuses)
             f"--volume={node.weights_dir}:{CONTAINER_WEIGHTS_ROOT}:ro"]
    if node.gpu_expected:  # the engine detects its platform as it would serving (NVML); no GPU work is done
        words.append("--gpus=all")
    words += [image, f"{CONTAINER_DIR}/sfl_engine_proof.py"]
    # The first line names the report's file for this image (by ID), request and checkers; a kept
    # report is printed in place of a run.
    draft = profile.speculative and f"{profile.speculative.draft_model}@{profile.speculative.draft_model_revision}"
    weights = hashlib.sha256(f"{profile.model}@{profile.model_revision} {draft}".encode())
    name = f"{request_digest(request)}-{CHECKERS_DIGEST}-{weights.hexdigest()[:16]}"
    command = (f"id=$(docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)} 2>/dev/null); "
               f"kept={shlex.quote(REPORTS)}/{name}-${{id#sha256:}}.json; echo \"$kept\"; "
               f"if [ -n \"$id\" ] && [ -s \"$kept\" ]; then echo kept; cat \"$kept\"; echo; exit 0; fi; "
               f"docker rm -f {CONTAINER} >/dev/null 2>&1; {shlex.join(words)} < {shlex.quote(REQUEST)}; "
               f"rc=$?; docker rm -f {CONTAINER} >/dev/null 2>&1; exit $rc")
    ok, out = host.run_shell_command(StringCommand(command))
    lines = out.stdout.strip().splitlines()
    kept_path, kept = (lines[0], len(lines) > 1 and lines[1] == "kept") if lines else ("", False)
    try:
        report = json.loads(lines[-1])
    except (ValueError, IndexError):
        if kept:  # written whole then renamed, so this is not expected: removed, the next run asks the engine
            host.run_shell_command(StringCommand(f"rm -f {shlex.quote(kept_path)}"))
            raise DeployError(f"engine proof: {node.name}: the kept report {kept_path} did not parse; removed, "
                              f"a re-run asks the engine in {image} again")
        raise DeployError(
            f"engine proof: {node.name} (group {node.serving_group}): the image's engine could not judge the "
            f"command lines (docker run of {image} exited {'0' if ok else 'non-zero'}, within "
            f"engine_proof_timeout_s={node.engine_proof_timeout_s}); its last output:\n{out.stderr[-3000:]}\n"
            f"Read it again with: sudo docker run --rm -i --network=none --entrypoint python3 "
            f"-v {PROOF_DIR}:{CONTAINER_DIR}:ro -v {node.weights_dir}:{CONTAINER_WEIGHTS_ROOT}:ro {image} {CONTAINER_DIR}/sfl_engine_proof.py < {REQUEST}")
    verdict = judge(report, request, node.serving_group, profile, node.monitoring_enabled, image,
                    node.serving_engine_advisories_acknowledged)
    logger.info(f"    engine proof: {verdict.line}"
                + (" (this image's report for this request, kept from an earlier run: no docker run)" if kept else ""))
    if verdict.refusals:
        raise DeployError(
            f"engine proof: refused before the pair is stopped (it keeps serving as it was):\n  "
            + "\n  ".join(verdict.refusals))
    record = record_text(image, verdict.engine, verdict.version, request_digest(request), verdict.proven)
    keep = ""
    if not kept and kept_path.startswith(f"{REPORTS}/") and not kept_path.endswith("-.json"):
        # The engine's report of an accepted request (a refused one stops the run above; the data changes
        # before the next), written whole then renamed; the oldest beyond REPORTS_KEPT removed.
        keep = (f" && mkdir -p -m 0700 {shlex.quote(REPORTS)} && (umask 077; printf '%s' "
                f"{shlex.quote(json.dumps(report))} > {shlex.quote(kept_path)}.tmp) && mv {shlex.quote(kept_path)}.tmp "
                f"{shlex.quote(kept_path)} && (ls -1t {shlex.quote(REPORTS)}/*.json | tail -n +{REPORTS_KEPT + 1} | "
                f"xargs -r rm -f)")
    ok, out = host.run_shell_command(StringCommand(
        f"mkdir -p {shlex.quote(node.preflight_data_dir)} && printf '%s' {shlex.quote(record)} > "
        f"{shlex.quote(engine_proof_path(node))}.tmp && mv {shlex.quote(engine_proof_path(node))}.tmp "
        f"{shlex.quote(engine_proof_path(node))}{keep}"))
    if not ok:
        raise DeployError(f"engine proof: {node.name}: writing {engine_proof_path(node)} failed: {out.stderr}")


if node.is_head and moves:
    request = proof_request(profile, cluster, planned.serving.files)
    for name in SHIPPED:
        files.put(name=f"Install the engine proof's {name}", src=str(FILES / name), dest=f"{PROOF_DIR}/{name}",
                  mode="0644", create_remote_dir=True)
    files.put(
        name="Write the engine proof's request (each rank's command line and environment; root-only)",
        src=StringIO(json.dumps(request)),
        dest=REQUEST,
        user="root",
        group="root",
        mode="0600",
    )
    python.call(
        name=f"Prove the command lines with the engine in {profile.image_ref} (before the pair is stopped)",
        function=prove,
        request=request,
    )
