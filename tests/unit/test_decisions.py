"""Each role's decision is a pure function of its facts and the validated config (issue 25), and the
run's plan is composed from those decisions alone (tools/plan.py decide_group).

The facts are not written by hand: each is what the fact's own command prints (run here by sh, as
pyinfra runs it on a node) over trees made the way the deploy makes them (sfl_files.py seals the
manifests), processed by the fact's own parser. The decisions are then taken with no pyinfra state,
no host and no command: any I/O inside one would fail here.
"""
import hashlib
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from pyinfra.api.exceptions import DeployError

from roles.fabric import checks as fabric_checks
from roles.fabric.checks import FabricFacts
from roles.fabric_speed import checks as fabric_speed_checks
from roles.firewall import checks as firewall_checks
from roles.image import checks as image_checks
from roles.kernel_cache import checks as kernel_cache_checks
from roles.kernel_cache.engine_key import engine_identity, parse_layers
from roles.kernel_cache.facts import CacheState, GenerationState
from roles.serving import checks as serving_checks
from roles.serving.api_key import decide_key
from roles.weights import checks as weights_checks
from roles.weights.facts import ModelCopy
from sparkfleet.config import build_cluster
from sparkfleet.firewall_facts import ManagementSubnet
from sparkfleet.firewall_rules import wanted_marker_of
from sparkfleet.model.compile_key import settings_key
from sparkfleet.model.serving import node_profile
from sparkfleet.render import sha1_text
from tests.unit.helpers import pair
from sparkfleet.plan_types import WARM_AFTER_BUILD
from tools.plan import decide_group

SFL_FILES = Path(__file__).resolve().parents[2] / "roles" / "fanout" / "sfl_files.py"
IMAGE_ID = "sha256:" + "ab12cd34ef56" + "0" * 52
SOURCE = "http://10.0.0.1:8089"


def fact_output(fact, env=None, **kwargs):
    """The fact as pyinfra gathers it: its command run by sh, its parser on the lines (no output at
    all: the fact's default)."""
    done = subprocess.run(["sh", "-c", fact.command(**kwargs)], capture_output=True, text=True, env=env, check=True)
    lines = done.stdout.splitlines()
    return fact.process(lines) if lines else fact.default()


def seal(directory: Path, manifest: Path, *header: str) -> None:
    """A manifest as the deploy writes one (sfl_files.py seal)."""
    args = [sys.executable, str(SFL_FILES), "seal", str(directory), "--manifest", str(manifest)]
    for line in header:
        args += ["--header", line]
    subprocess.run(args, check=True, capture_output=True)


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """The shipped pair; each node's disk is a directory of its own under this test's (on())."""
    monkeypatch.setattr(sys.modules[__name__], "DISKS", tmp_path)
    return build_cluster(pair(**{n: {"weights_source": SOURCE} for n in ("spark-a", "spark-b")}))


DISKS = Path("/nonexistent")


def on(node, path: str) -> Path:
    """Where `path` of `node` is in this test: the node's own directory stands for its disk."""
    return DISKS / node.name / path.lstrip("/")


# ------------------------------------------------------------------------------------------ weights

def place_model(node, model: str, revision: str, files: dict[str, bytes]) -> None:
    root = on(node, weights_checks.model_dir(node, model))
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    seal(root, on(node, weights_checks.manifest_path(node, model)),
         *weights_checks.manifest_header(model, revision, node.weights_source))


def weights_facts(cluster) -> weights_checks.WeightsFacts:
    models = [m for m, _ in weights_checks.profile_models(node_profile(cluster.head))]
    return weights_checks.WeightsFacts(copies={
        node.name: {m: fact_output(ModelCopy(), root=str(on(node, node.weights_dir)), model=m) for m in models}
        for node in cluster.nodes})


def copy_everything(cluster, files=None):
    for model, revision in weights_checks.profile_models(node_profile(cluster.head)):
        for node in cluster.nodes:
            place_model(node, model, revision, files or {"config.json": b"{}", "model-00001.safetensors": b"w" * 4096})
    # A worker's manifest is the head's (sfl_files.py pull keeps it): byte-identical.
    for model, _ in weights_checks.profile_models(node_profile(cluster.head)):
        head = on(cluster.head, weights_checks.manifest_path(cluster.head, model)).read_text()
        on(cluster.node("spark-b"), weights_checks.manifest_path(cluster.node("spark-b"), model)).write_text(head)


def test_weights_nothing_moves_when_every_copy_is_the_heads(cluster):
    copy_everything(cluster)
    plan = weights_checks.decide(weights_facts(cluster), cluster)
    assert plan.fetch == {} and plan.pull == {}
    assert weights_checks.summary(plan) == "every node's copy matches the head's manifest"


def test_weights_a_fresh_pair_fetches_once_on_the_head_and_sends_each_model_to_the_worker(cluster):
    plan = weights_checks.decide(weights_facts(cluster), cluster)
    models = [m for m, _ in weights_checks.profile_models(node_profile(cluster.head))]
    assert plan.fetch == {m: "no manifest" for m in models}
    assert plan.pull == {(m, "spark-b"): weights_checks.FOLLOWS_FETCH for m in models}


def test_weights_a_worker_missing_a_file_is_sent_it_and_the_head_fetches_nothing(cluster):
    copy_everything(cluster)
    model, _ = weights_checks.profile_models(node_profile(cluster.head))[0]
    worker = cluster.node("spark-b")
    (on(worker, weights_checks.model_dir(worker, model)) / "model-00001.safetensors").unlink()
    plan = weights_checks.decide(weights_facts(cluster), cluster)
    assert plan.fetch == {}
    assert plan.pull == {(model, "spark-b"): "1 file(s) missing or resized (model-00001.safetensors)"}


def test_weights_a_new_revision_in_data_is_fetched_on_the_head_and_sent_on(cluster, tmp_path):
    copy_everything(cluster)
    model, revision = weights_checks.profile_models(node_profile(cluster.head))[0]
    # The copies on disk were sealed for another revision than the data now pins.
    place_model(cluster.head, model, "0" * 40, {"config.json": b"{}"})
    plan = weights_checks.decide(weights_facts(cluster), cluster)
    assert plan.fetch == {model: f"revision {'0' * 40!r} -> {revision!r}"}
    assert plan.pull[(model, "spark-b")] == weights_checks.FOLLOWS_FETCH


def test_weights_a_hub_token_file_anyone_can_read_refuses_the_run_before_anything_moves(cluster):
    hub = build_cluster(pair(**{n: {"weights_source": "hub"} for n in ("spark-a", "spark-b")}))
    facts = replace(weights_facts(cluster), token_file={"user": "root", "mode": "644"})
    with pytest.raises(DeployError, match=r"spark-a: weights_hf_token_file .* mode 0644; it must be root-only"):
        weights_checks.decide(facts, hub)
    assert weights_checks.decide(replace(facts, token_file={"user": "root", "mode": "600"}), hub).fetch


# ------------------------------------------------------------------------------------ kernel caches

@pytest.fixture
def docker_knows_the_image(tmp_path):
    """`docker image inspect` as the node's Docker answers it: the image's ID."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"#!/bin/sh\necho {IMAGE_ID}\n")
    (bin_dir / "docker").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def gen_of(cluster) -> str:
    """The generation of IMAGE_ID for this group's rendered settings (its compile key)."""
    return kernel_cache_checks.generation(IMAGE_ID, kernel_cache_checks.group_compile_settings(cluster))


def warm(node, engine: str, files: dict[str, bytes], gen: str, current: bool = True,
         settings: dict[str, str] | None = None) -> None:
    """A generation as the merge leaves it: its files, its manifest sealed with the merge's headers
    (the compile settings it was warmed with, when given: an older sparkfleet wrote none)."""
    root = on(node, node.kernel_cache_dir)
    for rel, data in files.items():
        (root / gen / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / gen / rel).write_bytes(data)
    header = ["sparkfleet kernel cache manifest v1", f"image: {IMAGE_ID}", "caches: " + kernel_cache_checks.warmed_caches(engine)]
    if settings is not None:
        header.append("compile: " + kernel_cache_checks.compile_header(settings))
    seal(root / gen, root / f"{gen}.manifest", *header)
    if current:
        link = root / "current"
        link.unlink(missing_ok=True)
        link.symlink_to(gen)


def warm_for(cluster, files=None, **kwargs) -> str:
    """Every rank warmed for this group's settings, as the merge leaves it; its generation."""
    engine, gen = node_profile(cluster.head).engine, gen_of(cluster)
    for node in cluster.nodes:
        warm(node, engine, files or KERNELS, gen, settings=kernel_cache_checks.group_compile_settings(cluster), **kwargs)
    return gen


def cache_facts(cluster, env) -> dict[str, dict]:
    ref = node_profile(cluster.head).image_ref
    key = settings_key(kernel_cache_checks.group_compile_settings(cluster))
    return {n.name: fact_output(CacheState(), env=env, root=str(on(n, n.kernel_cache_dir)), ref=ref, key=key)
            for n in cluster.nodes}


KERNELS = {"triton/a.json": b"a" * 100, "inductor/b.py": b"b" * 50}


def test_caches_a_generation_never_warmed_is_prewarmed(cluster, docker_knows_the_image):
    plan = kernel_cache_checks.decide(cache_facts(cluster, docker_knows_the_image), cluster)
    gen = gen_of(cluster)
    assert plan.prewarm and plan.generation == gen and gen.startswith(IMAGE_ID[7:19] + "-")
    assert plan.why_prewarm == f"generation {gen} was never warmed"
    assert plan.link == ["spark-a", "spark-b"]  # 'current' links nowhere yet


def test_caches_identical_on_every_rank_change_nothing(cluster, docker_knows_the_image):
    gen = warm_for(cluster)
    facts = cache_facts(cluster, docker_knows_the_image)
    plan = kernel_cache_checks.decide(facts, cluster)
    assert not plan.converge
    assert kernel_cache_checks.summary(plan, facts, "spark-a") == f"generation {gen} identical on every rank (2 files)"


def test_caches_a_rank_missing_a_kernel_is_synced_without_a_prewarm(cluster, docker_knows_the_image):
    engine, gen = node_profile(cluster.head).engine, gen_of(cluster)
    warm(cluster.head, engine, KERNELS, gen)
    warm(cluster.node("spark-b"), engine, {"triton/a.json": KERNELS["triton/a.json"]}, gen)
    plan = kernel_cache_checks.decide(cache_facts(cluster, docker_knows_the_image), cluster)
    assert not plan.prewarm
    assert plan.sync == {"spark-b": "1 file(s) missing or resized: inductor/b.py"}


def test_caches_warmed_for_another_engines_variables_are_warmed_again(cluster, docker_knows_the_image):
    for node in cluster.nodes:
        warm(node, "sglang" if node_profile(cluster.head).engine == "vllm" else "vllm", KERNELS, gen_of(cluster))
    plan = kernel_cache_checks.decide(cache_facts(cluster, docker_knows_the_image), cluster)
    assert plan.prewarm and "another set of cache variables" in plan.why_prewarm


def test_caches_old_generations_past_the_count_are_expired_and_current_relinked(cluster, docker_knows_the_image):
    """The old generations are named as an older sparkfleet named them (12 hex digits of an image ID,
    no compile key): retention still counts and removes them beside the current, keyed one."""
    engine = node_profile(cluster.head).engine
    keep = cluster.head.kernel_cache_keep_generations
    olds = [hashlib.sha256(str(i).encode()).hexdigest()[:12] for i in range(keep + 1)]
    for node in cluster.nodes:
        for i, old in enumerate(olds):
            warm(node, engine, KERNELS, old, current=False)
            os.utime(on(node, node.kernel_cache_dir) / old, (1_000_000 + i, 1_000_000 + i))
        warm(node, engine, KERNELS, gen_of(cluster), current=node.is_head)  # the worker's 'current' still names the last
    plan = kernel_cache_checks.decide(cache_facts(cluster, docker_knows_the_image), cluster)
    assert not plan.prewarm and plan.sync == {}
    assert plan.link == ["spark-b"]
    expected = sorted(olds[: len(olds) - (keep - 1)])  # the newest keep-1 beside the current one stay
    assert plan.expire == {"spark-a": expected, "spark-b": expected}


def pinned(name: str, value: str):
    """The shipped pair with `name` pinned to `value` in every node's data (serving_env_pins)."""
    return build_cluster(pair(**{n: {"weights_source": SOURCE, "serving_env_pins": {name: value}}
                                 for n in ("spark-a", "spark-b")}))


def test_caches_a_hashed_pin_changed_is_a_new_generation_warmed_first(cluster, docker_knows_the_image):
    """vLLM hashes VLLM_ENGINE_READY_TIMEOUT_S into its compile key (not in vllm/envs.py
    compile_factors' ignored_factors): the same image with it changed is a generation never warmed,
    and the plan says which setting moved, read from the served generation's manifest."""
    old_gen = warm_for(cluster)
    was = node_profile(cluster.head).env["VLLM_ENGINE_READY_TIMEOUT_S"]
    now = str(int(was) + 600)
    changed = pinned("VLLM_ENGINE_READY_TIMEOUT_S", now)
    plan = kernel_cache_checks.decide(cache_facts(changed, docker_knows_the_image), changed)
    assert plan.generation == gen_of(changed) != old_gen
    assert plan.generation.split("-")[0] == old_gen.split("-")[0]  # the same image
    assert plan.prewarm
    assert plan.why_prewarm == f"a compile-relevant setting changed: VLLM_ENGINE_READY_TIMEOUT_S {was} -> {now}"
    assert plan.link == ["spark-a", "spark-b"]


def test_caches_an_unhashed_pin_changed_keeps_the_warm_generation(cluster, docker_knows_the_image):
    """VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS is in compile_factors' ignored_factors: changing it leaves
    vLLM's compile directory, so the generation and its warm caches, as they are."""
    gen = warm_for(cluster)
    was = node_profile(cluster.head).env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"]
    changed = pinned("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(int(was) + 600))
    plan = kernel_cache_checks.decide(cache_facts(changed, docker_knows_the_image), changed)
    assert plan.generation == gen
    assert not plan.converge


def test_caches_after_an_older_sparkfleet_the_keyed_generation_is_warmed(cluster, docker_knows_the_image):
    """An older sparkfleet's generation of the same image (no compile header: what it was warmed with
    is not known) is not the keyed one: warmed first, and the old one still a generation."""
    engine = node_profile(cluster.head).engine
    for node in cluster.nodes:
        warm(node, engine, KERNELS, IMAGE_ID[7:19])
    facts = cache_facts(cluster, docker_knows_the_image)
    plan = kernel_cache_checks.decide(facts, cluster)
    assert plan.prewarm and plan.why_prewarm == f"generation {gen_of(cluster)} was never warmed"
    assert set(facts["spark-a"]["generations"]) == {IMAGE_ID[7:19]}
    assert facts["spark-a"]["current_header"]["image"] == IMAGE_ID


# ------------------------------------------------------- kernel caches keyed by the engine (issue 44)

def image_layers(image_id=IMAGE_ID, version="0.1.dev20051", shared="sha256:shared", env="1111", entrypoint="e0",
                 above=0, driver="overlay2"):
    """The head's image's layers as roles/kernel_cache/engine_key.py layers_command prints them (its
    parser on the lines): a base with the system's libraries, the stack's wheels, the engine's wheel
    and dist-info, and `above` layers over them that hold no code (a README, a launcher)."""
    diffs = ["sha256:base", shared, "sha256:lane"] + [f"sha256:above{i}" for i in range(above)]
    n = len(diffs)
    return parse_layers([f"id={image_id}", f"driver={driver}", *[f"diff={d}" for d in diffs],
                         f"entrypoint {entrypoint}", f"env PATH {env}", f"layer {n} code usr/lib",
                         f"layer {n - 1} code opt/venv/lib", f"layer {n - 2} code opt/venv/lib",
                         f"layer {n - 2} has vllm-{version}.dist-info", f"dirs={n}"])


def docker_with(tmp_path, image_id: str | None) -> dict:
    """`docker image inspect` answering `image_id` (None: the head does not have the image)."""
    bin_dir = tmp_path / f"bin-{(image_id or 'none')[7:19]}"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(f"#!/bin/sh\necho {image_id}\n" if image_id else "#!/bin/sh\nexit 1\n")
    (bin_dir / "docker").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def engine_cache_facts(cluster, env, layers) -> dict[str, dict]:
    """roles/kernel_cache/checks.py cache_facts, its two reads as the deploy makes them: the engine's
    identity from the head's image's layers, then each rank's state of the generation it names (of the
    image's, where it could not be read)."""
    profile = node_profile(cluster.head)
    settings = kernel_cache_checks.group_compile_settings(cluster)
    identity = engine_identity(layers, profile.engine)
    gen = kernel_cache_checks.engine_generation(identity, settings)
    facts = {n.name: fact_output(GenerationState(), env=env, root=str(on(n, n.kernel_cache_dir)), ref=profile.image_ref,
                                 gen=gen) if gen else
             fact_output(CacheState(), env=env, root=str(on(n, n.kernel_cache_dir)), ref=profile.image_ref,
                         key=settings_key(settings))
             for n in cluster.nodes}
    facts[cluster.head.name] = {**facts[cluster.head.name], "engine": identity}
    return facts


def warm_engine(cluster, layers, engine_record=None) -> str:
    """Every rank's generation of the engine in `layers`' image, as the merge seals it (the image, the
    cache variables, the compile settings and the engine's identity it was warmed for)."""
    profile = node_profile(cluster.head)
    settings = kernel_cache_checks.group_compile_settings(cluster)
    identity = engine_identity(layers, profile.engine)
    gen = kernel_cache_checks.engine_generation(identity, settings)
    for node in cluster.nodes:
        root = on(node, node.kernel_cache_dir)
        for rel, data in KERNELS.items():
            (root / gen / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / gen / rel).write_bytes(data)
        seal(root / gen, root / f"{gen}.manifest", "sparkfleet kernel cache manifest v1", f"image: {layers['id']}",
             "caches: " + kernel_cache_checks.warmed_caches(profile.engine),
             "compile: " + kernel_cache_checks.compile_header(settings),
             "engine: " + (engine_record or kernel_cache_checks.engine_header(identity)))
        link = root / "current"
        link.unlink(missing_ok=True)
        link.symlink_to(gen)
    return gen


NEW_IMAGE = "sha256:" + "77aa" * 16


def test_caches_a_recipe_bump_that_changes_nothing_compiled_reuses_the_warm_generation(cluster, tmp_path):
    """Another image (a recipe commit whose only change is a README copied in over the engine's layers):
    the same engine, layers up to its code, environment and compile settings, so the generation it was
    warmed in serves it, no prewarm; the plan says why."""
    gen = warm_engine(cluster, image_layers())
    facts = engine_cache_facts(cluster, docker_with(tmp_path, NEW_IMAGE), image_layers(NEW_IMAGE, above=1))
    plan = kernel_cache_checks.decide(facts, cluster)
    assert plan.generation == gen and gen.startswith("e-") and not plan.prewarm and not plan.converge
    assert plan.reused == (f"generation {gen} reused for image {NEW_IMAGE[7:19]} (sealed under {IMAGE_ID[7:19]}): the "
                           f"engine (vllm 0.1.dev20051, its 3 of 4 layers up to the last holding code), the image's "
                           f"environment and entrypoint, and the compile settings are the ones it was warmed with")
    assert kernel_cache_checks.summary(plan, facts, "spark-a") == \
        f"generation {gen} identical on every rank (2 files); {plan.reused}"


@pytest.mark.parametrize("change, why", [
    ({"version": "0.1.dev20052"}, "the engine changed: vllm 0.1.dev20051 -> vllm 0.1.dev20052"),
    ({"shared": "sha256:shared-rebuilt"},
     "the engine's files changed: the image's layers up to the last holding code (3 of 3) are not the ones it was warmed with"),
    ({"env": "2222"}, "the image's environment changed: PATH"),
    ({"entrypoint": "e1"}, "the image's entrypoint changed"),
])
def test_caches_each_input_of_the_engine_changed_alone_is_a_new_generation_warmed_first_naming_it(
        cluster, tmp_path, change, why):
    served = warm_engine(cluster, image_layers())
    facts = engine_cache_facts(cluster, docker_with(tmp_path, NEW_IMAGE), image_layers(NEW_IMAGE, **change))
    plan = kernel_cache_checks.decide(facts, cluster)
    assert plan.prewarm and plan.generation != served and plan.generation.startswith("e-")
    assert plan.why_prewarm == why and plan.reused is None
    assert plan.link == ["spark-a", "spark-b"]


def test_caches_a_compile_setting_changed_alone_on_the_same_engine_is_a_new_generation_naming_it(cluster, tmp_path):
    served = warm_engine(cluster, image_layers())
    was = node_profile(cluster.head).env["VLLM_ENGINE_READY_TIMEOUT_S"]
    changed = pinned("VLLM_ENGINE_READY_TIMEOUT_S", str(int(was) + 600))
    plan = kernel_cache_checks.decide(engine_cache_facts(changed, docker_with(tmp_path, IMAGE_ID), image_layers()),
                                      changed)
    assert plan.prewarm and plan.generation.rsplit("-", 1)[0] == served.rsplit("-", 1)[0]  # the same engine
    assert plan.why_prewarm == f"a compile-relevant setting changed: VLLM_ENGINE_READY_TIMEOUT_S {was} -> {int(was) + 600}"


def test_caches_the_engine_and_a_setting_changed_together_are_both_named(cluster, tmp_path):
    warm_engine(cluster, image_layers())
    was = node_profile(cluster.head).env["VLLM_ENGINE_READY_TIMEOUT_S"]
    changed = pinned("VLLM_ENGINE_READY_TIMEOUT_S", str(int(was) + 600))
    plan = kernel_cache_checks.decide(engine_cache_facts(changed, docker_with(tmp_path, NEW_IMAGE),
                                                         image_layers(NEW_IMAGE, version="0.1.dev20052")), changed)
    assert plan.why_prewarm == ("the engine changed: vllm 0.1.dev20051 -> vllm 0.1.dev20052; a compile-relevant "
                                f"setting changed: VLLM_ENGINE_READY_TIMEOUT_S {was} -> {int(was) + 600}")


def test_caches_an_engine_that_cannot_be_read_is_keyed_by_its_image_a_new_generation_saying_so(cluster, tmp_path):
    """When in doubt, a new generation: Docker's storage driver shows no layers, so the new image's
    generation is named by its ID, never warmed, and the plan says why; the same image again keeps it."""
    warm_engine(cluster, image_layers())
    facts = engine_cache_facts(cluster, docker_with(tmp_path, NEW_IMAGE), image_layers(NEW_IMAGE, driver="vfs"))
    plan = kernel_cache_checks.decide(facts, cluster)
    gen = kernel_cache_checks.generation(NEW_IMAGE, kernel_cache_checks.group_compile_settings(cluster))
    assert plan.prewarm and plan.generation == gen
    assert plan.why_prewarm == (f"generation {gen} was never warmed (keyed by the image ID: the engine in it could not "
                                f"be read: Docker's storage driver is vfs, not overlay2: the image's layers cannot be read)")
    for node in cluster.nodes:  # the prewarm warmed it: the next run changes nothing
        warm(node, node_profile(cluster.head).engine, KERNELS, gen,
             settings=kernel_cache_checks.group_compile_settings(cluster))
    again = kernel_cache_checks.decide(engine_cache_facts(cluster, docker_with(tmp_path, NEW_IMAGE),
                                                          image_layers(NEW_IMAGE, driver="vfs")), cluster)
    assert again.generation == gen and not again.converge and again.reused is None


def test_caches_a_manifest_that_records_another_engine_than_its_name_is_warmed_again(cluster, tmp_path):
    """Safety over the 48 bits of the name: the served generation's manifest must record this engine."""
    other = kernel_cache_checks.engine_header(engine_identity(image_layers(version="9.9.9"), "vllm"))
    gen = warm_engine(cluster, image_layers(), engine_record=other)
    plan = kernel_cache_checks.decide(engine_cache_facts(cluster, docker_with(tmp_path, IMAGE_ID), image_layers()), cluster)
    assert plan.prewarm and plan.generation == gen
    assert plan.why_prewarm == (f"generation {gen}'s manifest records another engine than the image's "
                                f"(vllm 0.1.dev20051): warmed again")


def test_caches_after_image_keyed_generations_the_engine_keyed_one_is_warmed_once_saying_why(cluster, tmp_path,
                                                                                             docker_knows_the_image):
    served = warm_for(cluster)  # keyed by the image (before issue 44, or an engine not read)
    plan = kernel_cache_checks.decide(engine_cache_facts(cluster, docker_knows_the_image, image_layers()), cluster)
    assert plan.prewarm and plan.generation.startswith("e-")
    assert plan.why_prewarm == (f"generation {plan.generation} was never warmed (the served {served} is keyed by its "
                                f"image, not by the engine in it)")


def test_caches_of_an_image_built_in_this_run_are_decided_after_the_build_when_an_engine_warmed_some(cluster, tmp_path):
    """The image is built in this run: its engine is not known at prepare. With a generation an engine
    warmed for these settings on the head, the plan leaves it to the step (the same decide() on the
    facts read after the build); with none, it is warmed, as before."""
    built_here = docker_with(tmp_path, None)
    fresh = kernel_cache_checks.decide(engine_cache_facts(cluster, built_here, None), cluster)
    assert fresh.prewarm and fresh.why_prewarm == "the image is built in this run" and not fresh.after_build
    served = warm_engine(cluster, image_layers())
    plan = kernel_cache_checks.decide(engine_cache_facts(cluster, built_here, None), cluster)
    assert plan.after_build and not plan.prewarm and plan.generation is None and plan.converge
    assert kernel_cache_checks.summary(plan, {}, "spark-a") == (
        f"decided after the build: the image is built in this run; the head holds {served}, warmed for these compile "
        f"settings: the new image's engine, read from its layers after the build, reuses its generation if it is one "
        f"of them (no prewarm: the pair restarts once, warm), else it is warmed first")
    # after the build, the step's facts: the engine unchanged is the served generation, reused
    after = kernel_cache_checks.decide(engine_cache_facts(cluster, docker_with(tmp_path, NEW_IMAGE),
                                                          image_layers(NEW_IMAGE, above=1)), cluster)
    assert after.generation == served and not after.prewarm and after.reused
    # another compile key on the head does not count: its generations are not this run's to reuse
    was = node_profile(cluster.head).env["VLLM_ENGINE_READY_TIMEOUT_S"]
    changed = pinned("VLLM_ENGINE_READY_TIMEOUT_S", str(int(was) + 600))
    other = kernel_cache_checks.decide(engine_cache_facts(changed, built_here, None), changed)
    assert other.prewarm and not other.after_build


class StepNodes:
    """roles/kernel_cache's _Nodes as the step sees them after the build: the facts it reads afresh
    (this test's, made by the facts' own commands), every command recorded and answered with nothing."""

    def __init__(self, cluster, facts):
        self.cluster, self.facts, self.commands = cluster, facts, []

    def identity(self, profile):
        return self.facts[self.cluster.head.name]["engine"]

    def cache_facts(self, profile, settings, identity):
        return self.facts

    def cache_state(self, node, ref, key="", gen=None):
        return self.facts[node.name]

    def run(self, name, command, what, check=True):
        self.commands.append((name, command))
        return ""


@pytest.mark.parametrize("engine_moved", [False, True])
def test_the_cache_step_decides_after_the_build_by_the_same_rule_prints_why_and_keeps_it(
        cluster, tmp_path, monkeypatch, caplog, engine_moved):
    """converge_caches(after_build=True) on the image built in this run: the engine unchanged, the
    served generation is merged and linked, no prewarm (nothing stops the pair); the engine moved, the
    prewarm runs. Either way the verdict and its reason are printed and kept for the serving step."""
    from sparkfleet.decided import prewarmed
    from sparkfleet.verdicts import CachePlan

    served = warm_engine(cluster, image_layers())
    layers = image_layers(NEW_IMAGE, above=1, **({"version": "0.1.dev20052"} if engine_moved else {}))
    nodes = StepNodes(cluster, engine_cache_facts(cluster, docker_with(tmp_path, NEW_IMAGE), layers))
    did = []

    class Where:
        name = "spark-a"
    state = type("State", (), {})()
    monkeypatch.setattr(kernel_cache_checks, "_Nodes", lambda _: nodes)
    monkeypatch.setattr(kernel_cache_checks, "state", state)
    monkeypatch.setattr(kernel_cache_checks, "host", Where())
    monkeypatch.setattr(kernel_cache_checks, "_prewarm", lambda *a: did.append("prewarm"))
    monkeypatch.setattr(kernel_cache_checks, "_merge", lambda n, p, gen, image_id, settings, identity: did.append(
        ("merge", gen, image_id, identity.engine)))
    caplog.set_level("INFO")
    kernel_cache_checks.converge_caches(prewarm=False, expire={}, after_build=True)
    gen = kernel_cache_checks.engine_generation(nodes.facts["spark-a"]["engine"],
                                                kernel_cache_checks.group_compile_settings(cluster))
    engine = "vllm 0.1.dev20052" if engine_moved else "vllm 0.1.dev20051"
    if engine_moved:
        assert did == ["prewarm", ("merge", gen, NEW_IMAGE, engine)] and gen != served
        assert "prewarm (the engine changed: vllm 0.1.dev20051 -> vllm 0.1.dev20052), then merge" in caplog.text
    else:
        assert did == [("merge", served, NEW_IMAGE, engine)]
        assert "decided after the build (" in caplog.text and f"generation {served} reused for image" in caplog.text
        assert not [c for _, c in nodes.commands if "systemctl stop" in c]  # the pair is not stopped here
    linked = [c for _, c in nodes.commands if "ln -sfn" in c]
    assert len(linked) == 2 and all(f"ln -sfn {gen} current" in c for c in linked)
    assert prewarmed(state, "spark-a", CachePlan(generation=None, after_build=True)) == engine_moved


def test_the_cache_step_refuses_a_generation_other_than_the_plans(cluster, tmp_path, monkeypatch):
    """The image was not rebuilt, yet its engine reads otherwise now than at prepare (a layer read that
    failed then, or now): nothing is linked or warmed on a generation the plan did not decide."""
    warm_engine(cluster, image_layers())
    nodes = StepNodes(cluster, engine_cache_facts(cluster, docker_with(tmp_path, IMAGE_ID), image_layers()))
    monkeypatch.setattr(kernel_cache_checks, "_Nodes", lambda _: nodes)
    planned = "0123456789ab-" + settings_key(kernel_cache_checks.group_compile_settings(cluster))
    with pytest.raises(DeployError, match=rf"spark-a: the kernel-cache generation of \S+ read now is e-\w+-\w+, the "
                                          rf"plan's was {planned} \(vllm 0.1.dev20051\): nothing was linked or warmed"):
        kernel_cache_checks.converge_caches(prewarm=False, expire={}, planned=planned)
    assert nodes.commands == []


def test_a_verdict_taken_after_the_build_is_what_the_later_steps_read():
    from sparkfleet.decided import prewarmed, record_after_build
    from sparkfleet.verdicts import CachePlan

    class State:
        pass
    state, planned = State(), CachePlan(generation=None, after_build=True)
    assert not prewarmed(state, "spark-a", planned)
    record_after_build(state, "spark-a", CachePlan(generation="e-" + "1" * 12 + "-" + "2" * 8, prewarm=True))
    assert prewarmed(state, "spark-a", planned) and not prewarmed(state, "spark-c", planned)
    assert prewarmed(State(), "spark-a", CachePlan(generation=None, prewarm=True))


# ------------------------------------------------------------------------------- the group's plan

def fabric_facts(cluster, mtu=None, sha1=None, others=None, pings=None):
    """roles/fabric's facts of a group: every half's live link as data says (`mtu`: node -> another
    MTU on its first half), each netplan file as rendered, every ping answered (`pings`: node ->
    {(peer, half): answered} changes some)."""
    mtu, sha1, others, pings = mtu or {}, sha1 or {}, others or {}, pings or {}
    links = {n.name: {h.netdev: {"mtu": mtu.get(n.name, n.fabric_mtu) if i == 0 else n.fabric_mtu, "up": True,
                                 "ipv4": [str(h.address)]} for i, h in enumerate(n.fabric_halves)}
             for n in cluster.nodes}
    answered = {n.name: {(p.name, i): True for p in cluster.peers(n) for i, _, _ in fabric_checks.half_pairs(n, p)}
                for n in cluster.nodes}
    for name, answers in pings.items():
        answered[name].update(answers)
    return FabricFacts(links=links,
                       netplan_sha1={n.name: sha1.get(n.name, sha1_text(fabric_checks.netplan_text(n))) for n in cluster.nodes},
                       others={n.name: others.get(n.name, []) for n in cluster.nodes}, pings=answered)


# The lab pair's management subnet as its ManagementSubnet fact read it (tests/unit/fixtures/capture-lab.json:
# spark-a's session arrived at 198.18.0.11/24), through the fact's own parser.
SUBNET = ManagementSubnet().process(["198.18.0.11/24"])


def firewall_facts(cluster, live=None, subnet=SUBNET):
    """roles/firewall's facts of a group: nft installed, the lab's subnet (`subnet`: '' unread), no
    monitoring, each node's live table the one data renders (`live`: node -> another marker, '' for no
    table)."""
    live = live or {}
    return {n.name: firewall_checks.FirewallFacts(
        live=live.get(n.name, wanted_marker_of(cluster, n, subnet, None)), subnet=subnet, monitor=None, nft=True)
        for n in cluster.nodes}


def group_facts(cluster, *, ids=None, health=True, units_active=True, key="ok", fabric=None, weights=None,
                caches=None, sums=None, proven=True, firewall=None):
    """One group's facts as tools/plan.py group_facts gathers them (each reader's result)."""
    ids = ids if ids is not None else {n.name: IMAGE_ID for n in cluster.nodes}
    profile = node_profile(cluster.head)
    pushed = image_checks.digest_ref(cluster, profile, "sha256:" + "d" * 64)
    unit = {"active": "active", "container": "running"} if units_active else {"active": "inactive", "container": None}
    rendered = {n.name: serving_checks.rendered_files(cluster, n, None) for n in cluster.nodes}
    if sums is None:
        sums = {n: {p: hashlib.sha1(text.encode()).hexdigest() for p, (text, _m) in files.items()}
                for n, files in rendered.items()}
    return {
        "fabric": fabric or fabric_facts(cluster),
        "firewall": firewall or firewall_facts(cluster),
        "key_found": key,
        "image": image_checks.ImageFacts(ids=ids, pins={"spark-a": [pushed], "spark-b": (pushed, [pushed])}),
        "weights": weights,
        "caches": caches,
        "serving": serving_checks.ServingFacts(gid_index={n.name: None for n in cluster.nodes}, sums=sums,
                                               units={n.name: unit for n in cluster.nodes}, healthy=health),
        # Each node's record of the fabric's speed proof, as the proof writes it once it passed.
        "speed_records": {n.name: fabric_speed_checks.record_text(
            fabric_speed_checks.proof_key(cluster, profile.image_ref), []) if proven else None for n in cluster.nodes},
        "watchdog_units": {n.name: {"active": "active"} for n in cluster.nodes},
        "preflight": [(n, {"mem_available_gib": 100.0}, []) for n in cluster.nodes],
        # the head's EngineVersions: the engine of the image its unit runs and of this run's image
        "engine": {"running": "vllm 0.33.0" if health else None, "image": "vllm 0.33.0" if ids.get("spark-a") else None},
    }


@pytest.fixture
def settled(cluster, docker_knows_the_image):
    """A pair that serves, its weights and caches identical on both ranks: the facts of each role."""
    copy_everything(cluster)
    warm_for(cluster)
    return dict(weights=weights_facts(cluster), caches=cache_facts(cluster, docker_knows_the_image))


def test_the_plan_of_a_settled_pair_does_nothing_and_leaves_the_watchdog_running(cluster, settled):
    d = decide_group(group_facts(cluster, **settled), cluster)
    assert not d.serving.restart and d.serving.reasons == ()
    assert not d.image.build and d.image.ship == [] and d.image.same_everywhere
    assert d.summary.actions() == [] and d.watchdog.pause == () and d.speed.why is None
    # Without a passed proof of the fabric's speed on record, that proof is what this plan does.
    d = decide_group(group_facts(cluster, **settled, proven=False), cluster)
    assert d.speed.why == "no passed proof on spark-a, spark-b" and not d.serving.restart


def test_the_plan_restarts_the_pair_for_any_roles_reason_and_pauses_the_watchdog_head_first(cluster, settled):
    facts = group_facts(cluster, **settled, ids={"spark-a": IMAGE_ID, "spark-b": "sha256:" + "9" * 64}, key="stale")
    d = decide_group(facts, cluster)
    assert d.image.ship == ["spark-b"] and not d.image.build
    assert d.serving.restart
    assert d.serving.reasons[0].startswith(f"image {node_profile(cluster.head).image_ref} is new or differs")
    assert not [r for r in d.serving.reasons if "API key" in r]  # the engine holds no key: no reason of its own
    assert d.watchdog.moves == "the pair restart" and d.watchdog.pause == ("spark-a", "spark-b")


def test_a_new_api_key_alone_leaves_the_pair_serving(cluster, settled):
    """The key's files are rewritten (the plan's key verdict) and the API proxy reloads them
    (roles/api_proxy), but the engine holds no key: a rotation, or the fleet's key written over the
    head's, restarts nothing and pauses no watchdog."""
    for found in ("stale", "missing"):
        d = decide_group(group_facts(cluster, **settled, key=found), cluster)
        assert d.key == found and not d.serving.restart and d.serving.reasons == (), d.serving
        assert d.watchdog.pause == () and d.summary.actions() == []


def test_the_plan_restarts_for_a_changed_rank_file_a_stopped_unit_and_a_reconfigured_fabric(cluster, settled):
    facts = group_facts(cluster, **settled, units_active=False, fabric=fabric_facts(cluster, mtu={"spark-a": 1500}))
    facts["serving"].sums["spark-b"] = {}  # nothing written there yet
    d = decide_group(facts, cluster)
    reasons = d.serving.reasons
    assert any(r.startswith("spark-b: /etc/sparkfleet/") and r.endswith("changed") for r in reasons)
    assert "spark-a: sparkfleet-head is inactive, container unknown" in reasons
    assert "spark-a: the fabric link is reconfigured (mtu 1500 (want 9000))" in reasons
    assert d.speed.why == "this run (re)configures the fabric"  # its speed is proven again


def test_the_plan_of_a_fresh_pair_builds_ships_fetches_prewarms_and_restarts(cluster, docker_knows_the_image):
    facts = group_facts(cluster, ids={"spark-a": None, "spark-b": None}, health=False, units_active=False,
                        weights=weights_facts(cluster), caches=cache_facts(cluster, docker_knows_the_image))
    d = decide_group(facts, cluster)
    assert d.image.build and d.image.ship == ["spark-b"]
    assert d.summary.build and d.summary.warm == "prewarm" and d.summary.restart
    assert d.summary.fetch == sorted(m for m, _ in weights_checks.profile_models(node_profile(cluster.head)))
    assert d.watchdog.moves == "the prewarm"
    assert "the kernel caches are warmed first (the prewarm stops the pair)" in d.serving.reasons


def test_the_plan_of_a_recipe_bump_on_a_pair_an_engine_warmed_leaves_the_prewarm_to_after_the_build(
        cluster, tmp_path, docker_knows_the_image):
    """The bump builds a new image: the plan restarts the pair for it, pauses the watchdogs, and its warm
    cell says the caches are reused or warmed as decided after the build (not a prewarm that would stop
    the pair whatever the new image's engine)."""
    copy_everything(cluster)
    warm_engine(cluster, image_layers())
    caches = engine_cache_facts(cluster, docker_with(tmp_path, None), None)
    d = decide_group(group_facts(cluster, ids={"spark-a": None, "spark-b": IMAGE_ID}, weights=weights_facts(cluster),
                                 caches=caches), cluster)
    assert d.image.build and d.caches.after_build and not d.caches.prewarm
    assert d.summary.warm == WARM_AFTER_BUILD and d.summary.restart
    assert "warm the kernel caches (after the build: reuse or prewarm)" in d.summary.actions()
    assert d.watchdog.moves == "the pair restart (and the prewarm before it, if the new image's engine is not warmed)"
    assert d.watchdog.pause == ("spark-a", "spark-b")
    assert "the kernel caches are warmed first (the prewarm stops the pair)" not in d.serving.reasons


def test_the_heads_key_verdict_takes_the_routers_replacement_and_refuses_a_key_file_anyone_can_read(cluster):
    head = cluster.head
    assert decide_key(head, "ok", replaced=False) == "ok"
    assert decide_key(head, "ok", replaced=True) == "stale"  # the fleet's one key is written over it
    assert decide_key(head, "missing", replaced=False) == "missing"  # sparkfleet generates it
    with pytest.raises(DeployError, match=r"spark-a: serving_api_key_file /etc/sparkfleet/api-key is "
                                          r"owned by ubuntu with mode 0644; it must be root-only"):
        decide_key(head, "owner ubuntu 0644", replaced=False)


def test_the_same_facts_give_the_same_plan(cluster, settled):
    facts = group_facts(cluster, **settled, key="stale")
    assert decide_group(facts, cluster) == decide_group(facts, cluster)


def test_the_facts_pass_holds_at_most_its_limit_of_readers_at_once_and_keeps_their_order():
    """Each reader holds an SSH channel per node; sshd refuses channels past MaxSessions (10 by
    default): the pass never runs more than FACT_READERS_AT_ONCE readers together."""
    import gevent
    from pyinfra.context import ctx_host, ctx_state

    from sparkfleet.once import at_once
    from tools.plan import FACT_READERS_AT_ONCE

    running, peak = [0], [0]

    def reader(i):
        def read():
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            gevent.sleep(0.01)
            running[0] -= 1
            return i
        return read

    with ctx_state.use(object()), ctx_host.use(None):
        assert at_once(*[reader(i) for i in range(11)], limit=FACT_READERS_AT_ONCE) == list(range(11))
    assert 1 < peak[0] <= FACT_READERS_AT_ONCE < 10


# ------------------------------------------------------------------------------- roles/fabric

def test_the_fabric_of_a_settled_pair_is_converged_when_its_read_only_pings_pass(cluster):
    v = fabric_checks.decide(fabric_facts(cluster), cluster)
    assert v.converged and v.drift == {"spark-a": [], "spark-b": []} and all(v.file_current.values())


def test_a_fabric_that_changes_is_not_converged_and_its_pings_do_not_count(cluster):
    # a link not yet as data says drops jumbo frames: the proof runs after it is applied (proof_tasks.py)
    mtu = fabric_facts(cluster, mtu={"spark-b": 1500}, pings={"spark-a": {("spark-b", 0): False}})
    v = fabric_checks.decide(mtu, cluster)
    assert not v.converged and v.drift == {"spark-a": [], "spark-b": ["mtu 1500 (want 9000)"]}
    stale = fabric_checks.decide(fabric_facts(cluster, sha1={"spark-a": "0" * 40}), cluster)
    assert not stale.converged and stale.file_current == {"spark-a": False, "spark-b": True}
    other = object()  # another configuration of a fabric netdev (sparkfleet/fabric_others.py) unsettles it too
    assert not fabric_checks.decide(fabric_facts(cluster, others={"spark-b": [other]}), cluster).converged


def test_settled_links_that_drop_jumbo_frames_stop_the_deploy_naming_both_ends_unless_the_firewall_moves(cluster, settled):
    dropped = {"spark-a": {("spark-b", 1): False}}  # the twin half, from spark-a
    still = firewall_checks.decide(firewall_facts(cluster), cluster)  # the plan's slice: no table changes
    with pytest.raises(DeployError) as err:
        fabric_checks.decide(fabric_facts(cluster, pings=dropped), cluster, still)
    assert "fabric: spark-a (enP2p1s0f0np0 mtu 9000) cannot reach spark-b" in str(err.value)
    assert "about half of what the cable carries" in str(err.value)
    # a firewall that changes in this run may be what stops them: the proof runs after it instead
    moving = firewall_checks.decide(firewall_facts(cluster, live={"spark-b": ""}), cluster)
    v = fabric_checks.decide(fabric_facts(cluster, pings=dropped), cluster, moving)
    assert not v.converged and v.drift == {"spark-a": [], "spark-b": []}
    # the composer hands the fabric the firewall's verdict of the same facts pass
    with pytest.raises(DeployError, match="cannot reach spark-b"):
        decide_group(group_facts(cluster, **settled, fabric=fabric_facts(cluster, pings=dropped)), cluster)
    d = decide_group(group_facts(cluster, **settled, fabric=fabric_facts(cluster, pings=dropped),
                                 firewall=firewall_facts(cluster, live={"spark-b": ""})), cluster)
    assert not d.fabric.converged and d.firewall["spark-b"].apply and not d.firewall["spark-a"].apply


def test_a_firewall_that_cannot_be_rendered_refuses_the_run_at_step_1b_with_its_own_message(cluster, settled):
    from roles.firewall.checks import management_problem
    from sparkfleet.verdicts import RoutingPlan
    from tools.plan import refusal

    good = decide_group(group_facts(cluster, **settled), cluster)
    assert refusal({"pair": good}, cluster, RoutingPlan()) is None
    unread = decide_group(group_facts(cluster, **settled, firewall=firewall_facts(cluster, subnet="")), cluster)
    refused = refusal({"pair": unread}, cluster, RoutingPlan())
    assert isinstance(refused, DeployError)
    assert str(refused) == "\n".join(management_problem(n, "") for n in cluster.nodes)
    assert str(refused).startswith("spark-a: the management subnet could not be read (no local address matches")


def test_a_table_removed_in_this_run_also_lets_failed_pings_wait_for_the_proof_after_it(cluster):
    """firewall_enabled false with a table still live (an earlier run's): step 3b removes it before the
    proof of step 3c, so it may be what stops the pings as much as a table applied."""
    off = build_cluster(pair(**{n: {"firewall_enabled": False} for n in ("spark-a", "spark-b")}))
    dropped = {"spark-a": {("spark-b", 0): False}}
    gone = firewall_checks.decide({"spark-a": firewall_checks.FirewallFacts(live=""),
                                   "spark-b": firewall_checks.FirewallFacts(live="")}, off)
    with pytest.raises(DeployError, match="cannot reach spark-b"):
        fabric_checks.decide(fabric_facts(off, pings=dropped), off, gone)
    left = firewall_checks.decide({"spark-a": firewall_checks.FirewallFacts(live=""),
                                   "spark-b": firewall_checks.FirewallFacts(live="sparkfleet " + "1" * 40)}, off)
    assert left["spark-b"].remove and not fabric_checks.decide(fabric_facts(off, pings=dropped), off, left).converged


def test_the_groups_plan_carries_each_nodes_firewall_and_its_line(cluster, settled):
    d = decide_group(group_facts(cluster, **settled), cluster)
    assert d.summary.firewall == "" and not any(p.changes for p in d.firewall.values())
    fresh = decide_group(group_facts(cluster, **settled, firewall=firewall_facts(
        cluster, live={"spark-a": "", "spark-b": "sparkfleet " + "2" * 40})), cluster)
    assert fresh.summary.firewall == ("applied on spark-a (no table live); applied on spark-b (the live table is "
                                      "not the rendered one)")
    assert fresh.summary.actions() == [f"change the firewall: {fresh.summary.firewall}"] and fresh.summary.changes
    assert not fresh.serving.restart  # a firewall change alone restarts nothing
