"""Step 7a, on each group's head, once it holds the group's image and weights, before anything stops the pair
(the prewarm, step 8, and the restart, step 9): the image's own engine judges every distinct rank
command line and environment (checks.py). A refusal stops the deploy here, quoting the engine, with
the pair as it was: still serving if it served. Runs only when this run moves the pair; the verdict's
line names the engine version the image ships, and the proven one is recorded on the head
(engine_proof_path) for the receipt and `make status`."""
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
    command = (f"docker rm -f {CONTAINER} >/dev/null 2>&1; {shlex.join(words)} < {shlex.quote(REQUEST)}; "
               f"rc=$?; docker rm -f {CONTAINER} >/dev/null 2>&1; exit $rc")
    ok, out = host.run_shell_command(StringCommand(command))
    try:
        report = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DeployError(
            f"engine proof: {node.name} (group {node.serving_group}): the image's engine could not judge the "
            f"command lines (docker run of {image} exited {'0' if ok else 'non-zero'}, within "
            f"engine_proof_timeout_s={node.engine_proof_timeout_s}); its last output:\n{out.stderr[-3000:]}\n"
            f"Read it again with: sudo docker run --rm -i --network=none --entrypoint python3 "
            f"-v {PROOF_DIR}:{CONTAINER_DIR}:ro -v {node.weights_dir}:{CONTAINER_WEIGHTS_ROOT}:ro {image} {CONTAINER_DIR}/sfl_engine_proof.py < {REQUEST}")
    verdict = judge(report, request, node.serving_group, profile, node.monitoring_enabled, image,
                    node.serving_engine_advisories_acknowledged)
    logger.info(f"    engine proof: {verdict.line}")
    if verdict.refusals:
        raise DeployError(
            f"engine proof: refused before the pair is stopped (it keeps serving as it was):\n  "
            + "\n  ".join(verdict.refusals))
    record = record_text(image, verdict.engine, verdict.version, request_digest(request), verdict.proven)
    ok, out = host.run_shell_command(StringCommand(
        f"mkdir -p {shlex.quote(node.preflight_data_dir)} && printf '%s' {shlex.quote(record)} > "
        f"{shlex.quote(engine_proof_path(node))}.tmp && mv {shlex.quote(engine_proof_path(node))}.tmp "
        f"{shlex.quote(engine_proof_path(node))}"))
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
