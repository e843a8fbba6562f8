"""Weights and kernel caches as roles/weights and roles/kernel_cache promise them, on the machines.

Weights: sizes and manifests (hashing ~164 GiB per check run would take minutes; the deploy hashes
after every transfer). Kernel caches are small: their files are hashed here against the manifest.
"""
import pytest

from roles.fanout.sfl_files import absent, parse_manifest
from roles.kernel_cache.checks import warmed_caches
from sparkfleet.model.kernel_cache import cache_vars
from sparkfleet.model.engine import CONTAINER_WEIGHTS_ROOT, unit_name
from roles.weights.checks import manifest_path, profile_models
from sparkfleet.model.weights import model_dir


def manifest_of(host, path):
    f = host.file(path)
    return f.content_string if f.exists else None


def sizes_on_disk(host, root):
    out = host.run(f"find {root} \\( -name .sparkfleet-partial -o -name .cache \\) -prune -o -type f -printf '%s\\t%P\\n'")
    return {rel: int(size) for size, rel in (l.split("\t", 1) for l in out.stdout.splitlines() if "\t" in l)}


@pytest.fixture(scope="module")
def models(profile):
    return profile_models(profile)


def test_weight_manifests_are_equal_on_every_node_and_match_the_files(node, cluster, node_hosts, models):
    head = cluster.head
    for model, revision in models:
        reference = manifest_of(node_hosts[head.name], manifest_path(head, model))
        assert reference, f"{head.name}: no manifest for {model} at {manifest_path(head, model)}"
        header, entries = parse_manifest(reference)
        assert entries and header.get("revision") == revision, f"{head.name}: {model} manifest: {header}"
        for name, peer in node_hosts.items():
            n = cluster.node(name)
            assert manifest_of(peer, manifest_path(n, model)) == reference, f"{name}: {model} manifest differs from the head's"
            on_disk = sizes_on_disk(peer, model_dir(n, model))
            wrong = absent(entries, on_disk)
            assert not wrong, f"{name}: {model}: missing or resized: {', '.join(sorted(wrong))}"


def test_the_heads_weights_http_server_answers_a_worker_over_the_fabric_with_its_manifest(node, cluster, node_hosts,
                                                                                         models):
    """What a worker's weights pull asks first (roles/weights pull_command): the head's manifest, over
    the fabric, from its sfl_files.py serve; the same bytes as the worker's own copy of it."""
    if node.is_head:
        pytest.skip("a worker pulls; the head serves")
    head = cluster.head
    for model, _ in models:
        url = f"http://{head.fabric_ip}:{head.fanout_http_port}/{model}.manifest"
        got = node_hosts[node.name].run(f"curl -sS -m 10 --noproxy '*' {url}")
        assert got.rc == 0, f"{node.name}: {url}: {got.stderr}"
        assert got.stdout == manifest_of(node_hosts[node.name], manifest_path(node, model)), \
            f"{node.name}: {url} is not the manifest {node.name} holds"


def cache_manifest(host, node):
    gen = host.check_output(f"readlink {node.kernel_cache_dir}/current")
    return gen, manifest_of(host, f"{node.kernel_cache_dir}/{gen}.manifest")


def test_cache_manifests_are_non_empty_and_equal_on_every_rank(node, cluster, node_hosts, profile):
    head_gen, reference = cache_manifest(node_hosts[cluster.head.name], cluster.head)
    assert reference and parse_manifest(reference)[1], f"{cluster.head.name}: no cache manifest for {head_gen}"
    caches = parse_manifest(reference)[0].get("caches")
    assert caches == warmed_caches(profile.engine), f"{cluster.head.name}: {head_gen} was warmed for {caches}"
    for name, peer in node_hosts.items():
        gen, text = cache_manifest(peer, cluster.node(name))
        assert gen == head_gen, f"{name}: current cache generation {gen}, the head's {head_gen}"
        assert text == reference, f"{name}: cache manifest of {gen} differs from the head's"


def test_every_cache_file_of_the_manifest_is_on_this_rank(host, node):
    gen, text = cache_manifest(host, node)
    assert text, f"{node.name}: no cache manifest for generation {gen}"
    out = host.run(f"cd {node.kernel_cache_dir}/{gen} && python3 /usr/local/libexec/sparkfleet/sfl_files.py "
                   f"verify . ../{gen}.manifest")
    assert out.rc == 0, f"{node.name}: kernel cache {gen} differs from its manifest:\n{out.stdout}{out.stderr}"


def test_the_container_sees_the_cache_and_weight_paths_its_environment_names(host, node, profile):
    container = unit_name(node)
    caches = cache_vars(profile.engine)  # exactly the served engine's JIT caches (sparkfleet/model/kernel_cache.py)
    script = "; ".join(f'echo "{v}=${{{v}}}"' for v in caches)
    env = dict(l.split("=", 1) for l in host.check_output(f"docker exec {container} sh -c '{script}'").splitlines())
    gen = host.check_output(f"readlink {node.kernel_cache_dir}/current")
    for var, sub in caches.items():
        inside = host.run(f"docker exec {container} sh -c 'cd \"${var}\" && find . -type f | sort'")
        assert inside.rc == 0, f"{node.name}: {var}={env.get(var)} is not a directory in {container}"
        outside = host.check_output(f"cd {node.kernel_cache_dir}/{gen}/{sub} && find . -type f | sort")
        assert inside.stdout.strip() == outside.strip(), f"{node.name}: {var} in {container} is not {gen}/{sub}"
    model_path = f"{CONTAINER_WEIGHTS_ROOT}/{profile.model}"  # what the engine's argv names
    inside = host.run(f"docker exec {container} sh -c 'cd {model_path} && find . -type f ! -path \"./.*\" | sort'")
    outside = host.check_output(f"cd {model_dir(node, profile.model)} && find . -type f ! -path './.*' | sort")
    assert inside.rc == 0 and inside.stdout.strip() == outside.strip(), f"{node.name}: {model_path} in {container} differs"
