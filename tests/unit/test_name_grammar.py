"""Every name from data or a profile held to the grammar of what it names (sparkfleet/grammar.py),
refused before any connection naming the key: each key walked with hostile values, real values
passing, and the grammars held to their upstream validators where one runs here (huggingface_hub's
validate_repo_id, git check-ref-format)."""
import subprocess

import pytest
import yaml
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

import sparkfleet.model.serving as schema
from sparkfleet import grammar
from sparkfleet.config import ConfigError, build_cluster
from sparkfleet.model.serving import load_profile, profile_names
from sparkfleet.model.tls import SITE_KEYS
from sparkfleet.values import DIRECTORY_KEYS, OTHER_PATHS
from tests.unit.helpers import pair, run_pyinfra
from tests.unit.test_inventory_refusal import write_inventory

# What an attacker or a slip puts in a name: a path's way out, a shell's substitutions and quotes, a
# second line, a second word, nothing at all.
HOSTILE = ["..", "../x", "$(id)", "`id`", "'", '"', "a\nb", "a b", ""]


def hostile_values(valid: str) -> list[str]:
    """Each hostile value alone, and after a valid value as a path's next component (`<valid>/..`)."""
    return HOSTILE + [f"{valid}/{h}" for h in HOSTILE if h]


def refusals(**data) -> list:
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**{"spark-a": data, "spark-b": data}))
    return err.value.problems


def assert_refused_naming(problems, key: str, shown: str):
    named = [p for p in problems if getattr(p, "key", None) == key or f"key '{key}" in p or f"key {key}" in p]
    assert named, problems
    assert any(shown in p for p in named), (shown, problems)


# Node data keys whose value reaches a path, a unit, an env file, a shell word, a URL or a label:
# key -> (a valid value, how the key holds one string).
NODE_KEYS = {
    **{key: ("/srv/sparkfleet/x", str) for key in DIRECTORY_KEYS},
    **{key: ("/srv/sparkfleet/key", str) for key in OTHER_PATHS},
    "fabric_netdev": ("enp1s0f0np0", str),
    "fabric_twin_netdev": ("enP2p1s0f0np0", str),
    "rdma_hca": ("rocep1s0f0", str),
    "rdma_twin_hca": ("roceP2p1s0f0", str),
    "docker_package": ("docker.io", str),
    "serving_group": ("pair", str),
    "serving_profile": ("glm-5.3-flash-exl3", str),
    "serving_recipe_repository": ("https://github.com/MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks.git", str),
    "serving_recipe_commit": ("493cb88fc69f8ba73ac87404f429d763e2739d89", str),
    "serving_engine_version": ("0.32.0+cpu", str),
    "serving_env_pins": ("NCCL_DEBUG", lambda v: {v: "WARN"}),
    "serving_media_domains": ("images.example.com", lambda v: [v]),
    "weights_source": ("https://mirror.example/models", str),
    "monitoring_remote_write_url": ("https://prometheus.example:9090/api/v1/write", str),
    "monitoring_gpu_exporter_image": ("nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.1-ubuntu22.04", str),
    "drafter_license_acknowledged": ("CC-BY-NC-ND-4.0", str),
    "router_node": ("spark-a", str),
    "monitoring_node": ("spark-a", str),
    "preflight_allowed_archs": ("aarch64", lambda v: [v]),
    "recipe_drift_acknowledged": ("KV_SLOTMAP_PIN", lambda v: [v]),
}
RECEIVERS = "monitoring_alertmanager_receivers"


@pytest.mark.parametrize("key", sorted(NODE_KEYS))
def test_every_node_name_key_refuses_hostile_values_naming_the_key(key):
    valid, shape = NODE_KEYS[key]
    if key in SITE_KEYS:  # a site's certificate: the three keys together, on the head (sparkfleet/model/tls.py)
        build_cluster(pair(**{"spark-a": {k: shape(valid) for k in SITE_KEYS}}))
    else:
        build_cluster(pair(**{n: {key: shape(valid)} for n in ("spark-a", "spark-b")}))  # the valid one passes
    for value in hostile_values(valid):
        assert_refused_naming(refusals(**{key: shape(value)}), key, repr(value))


@pytest.mark.parametrize("where", ["name", "url"])
def test_alertmanager_receivers_names_and_urls_refuse_hostile_values(where):
    def receivers(name="ops", url="http://10.0.0.5:5001/alerts"):
        return {"monitoring_alertmanager_enabled": True,
                RECEIVERS: [{"name": name, "webhook_configs": [{"url": url, "send_resolved": True}]}]}
    build_cluster(pair(**{n: receivers() for n in ("spark-a", "spark-b")}))
    valid = "ops" if where == "name" else "http://10.0.0.5:5001/alerts"
    for value in hostile_values(valid):
        assert_refused_naming(refusals(**receivers(**{where: value})), RECEIVERS, repr(value))


@pytest.mark.parametrize("key, value", [
    ("serving_recipe_repository", "https://ghp_token@github.com/o/r.git"),
    ("serving_recipe_repository", "ssh://git:secret@github.com/o/r.git"),
    ("weights_source", "https://user:pass@mirror.example/models"),
    ("monitoring_remote_write_url", "https://user:pass@prometheus.example/api/v1/write"),
])
def test_credentials_in_a_url_are_refused(key, value):
    problems = refusals(**{key: value})
    assert_refused_naming(problems, key, "carries credentials")


def test_a_receivers_url_with_credentials_is_refused():
    problems = refusals(**{"monitoring_alertmanager_enabled": True, RECEIVERS: [
        {"name": "ops", "webhook_configs": [{"url": "https://bot:hunter2@hooks.example/x"}]}]})
    assert_refused_naming(problems, RECEIVERS, "carries credentials")
    assert any("[0].webhook_configs[0].url" in p for p in problems), problems


def test_a_hostile_name_in_data_is_refused_by_pyinfra_before_any_connection(tmp_path, listener):
    ports, accepted = listener
    code, out = run_pyinfra(write_inventory(tmp_path, ports), "--data",
                            "serving_recipe_repository=https://x.example/../r.git")
    assert code == 2 and accepted == [], out
    assert "Nothing was changed: no host was contacted." in out and "Traceback" not in out, out
    assert "key 'serving_recipe_repository' = 'https://x.example/../r.git': not a URL" in out, out
    assert "no `..` segment" in out, out


# --- The profile's names ----------------------------------------------------------------------------

PROFILE = "glm-5.3-flash-exl3"
# Profile field (a dotted path) -> a valid value. Every field of a profile that reaches a path, a unit,
# a command line, the manifest or the API's name.
PROFILE_FIELDS = {
    "name": "glm-5.3-flash-exl3",
    "image": "sparkfleet/glm-5.3-flash-exl3",
    "model": "brandonmusic/GLM-5.3-Flash-tr3-4bpw",
    "model_revision": "5ab363a8dcf6405955fd5f99671e01a1c9fb124b",
    "served_model_name": "glm-5.3-flash",
    "engine_version": "0.1.dev20051+g487ecf187",  # names its snapshot file (known_env/<engine>-<release>.txt)
    "kv_cache_dtype": "fp8_ds_mla",
    "quantization": "exl3",
    "tool_call_parser": "glm47",
    "reasoning_parser": "glm45",
    "recipe.repository": "https://github.com/MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks.git",
    "recipe.dockerfile": "Dockerfile",
    "recipe.context": "docker",
    "recipe.launch_files": ["start.sh"],
    "recipe.launcher": "start.sh",
    "recipe.build_args": {"EXL3_REF": "v0.0.6"},
    "speculative.method": "dflash",
    "speculative.draft_model": "incoai/GLM-5.3-Flash-DFlash2",
    "speculative.draft_model_revision": "dc77ff1c99eeb2df044ee3d4f0094eb033fee410",
    "speculative.draft_license": "CC-BY-NC-ND-4.0",
    "speculative.draft_kv_cache_dtype": "fp8",
    "container.devices": ["/dev/infiniband"],
}


def with_field(data: dict, field: str, value) -> dict:
    section, _, leaf = field.rpartition(".")
    target = data.setdefault(section, {}) if section else data
    target[leaf] = value
    return data


def profile_refusals(tmp_path, monkeypatch, field: str, value) -> list:
    data = yaml.safe_load((schema.PROFILES_DIR / f"{PROFILE}.yaml").read_text())
    (tmp_path / f"{PROFILE}.yaml").write_text(yaml.safe_dump(with_field(data, field, value)))
    monkeypatch.setattr(schema, "PROFILES_DIR", tmp_path)
    with pytest.raises(ConfigError) as err:
        build_cluster(pair())
    return err.value.problems


def shaped(field: str, value):
    """`value` as the field holds it: an item of a list, a key of build_args."""
    valid = PROFILE_FIELDS[field]
    if isinstance(valid, list):
        return [value]
    if isinstance(valid, dict):
        return {value: "1"}
    return value


@pytest.mark.parametrize("field", sorted(PROFILE_FIELDS))
def test_every_profile_name_field_refuses_hostile_values_naming_the_profile_and_field(field, tmp_path,
                                                                                     monkeypatch):
    data = yaml.safe_load((schema.PROFILES_DIR / f"{PROFILE}.yaml").read_text())
    (tmp_path / f"{PROFILE}.yaml").write_text(yaml.safe_dump(with_field(data, field, PROFILE_FIELDS[field])))
    monkeypatch.setattr(schema, "PROFILES_DIR", tmp_path)
    build_cluster(pair())  # the valid value passes
    valid = PROFILE_FIELDS[field]
    plain = valid[0] if isinstance(valid, list) else next(iter(valid)) if isinstance(valid, dict) else valid
    values = hostile_values(plain)
    if field == "recipe.build_args":  # a key: a name, never a path (a `/` alone is no variable name)
        values = HOSTILE
    for value in values:
        problems = profile_refusals(tmp_path, monkeypatch, field, shaped(field, value))
        assert_refused_naming(problems, "serving_profile", f"{field}")
        assert any(repr(value) in p for p in problems), (field, value, problems)


def test_a_profile_name_refusal_names_the_file_line_and_grammar(tmp_path, monkeypatch):
    [problem] = profile_refusals(tmp_path, monkeypatch, "model", "../../etc")
    assert problem.startswith("spark-a, spark-b: key 'serving_profile' = 'glm-5.3-flash-exl3': profile "), problem
    assert "model = '../../etc': Value error, '../../etc': not a hub repository id `owner/name`" in problem, problem


def test_a_newline_in_a_revision_cannot_forge_a_manifest_line(tmp_path, monkeypatch):
    """The revision is a line of the weights manifest (roles/weights/checks.py manifest_header)."""
    problems = profile_refusals(tmp_path, monkeypatch, "model_revision", "main\nsource: /etc")
    assert any("model_revision = 'main\\nsource: /etc'" in p and "not a commit (40 hex)" in p for p in problems)


# --- Real values pass; the grammars against their upstream validators ------------------------------

@pytest.mark.parametrize("profile", profile_names())
def test_every_shipped_profile_builds_a_pair(profile):
    c = build_cluster(pair(**{n: {"serving_profile": profile} for n in ("spark-a", "spark-b")}))
    assert load_profile(profile).name == profile and c.head.serving_profile == profile


SHIPPED_IDS = sorted({m for p in profile_names() for m, _ in schema.profile_models(load_profile(p))})
REAL_IDS = ["Qwen/Qwen3-30B-A3B", "meta-llama/Llama-3.1-8B-Instruct", "openai/gpt-oss-120b",
            "nvidia/Llama-3.3-70B-Instruct-FP4", "deepseek-ai/DeepSeek-V3.1", "RedHatAI/Qwen3-8B-FP8-dynamic",
            *SHIPPED_IDS]
# Each a candidate both validators judge: ours may refuse more (a single name: sparkfleet asks for owner/name).
CANDIDATE_IDS = REAL_IDS + [
    "gpt2", "a/b", "_a/_b", "a_/b_", "A.B/c-d", "a--b/c", "a/b..c", "a/b.git", "a/.b", "a/b.", "-a/b", "a/-b",
    "a/b/c", "a b/c", "a/$(id)", "a/`id`", "a/b'", "a/b\n", "", "/b", "a/", "../x", "..", "a/" + "x" * 96,
    "a/" + "x" * 97, "café/x",
]


@pytest.mark.parametrize("repo_id", REAL_IDS)
def test_real_hub_ids_pass(repo_id):
    assert grammar.hub_repo_id_problem(repo_id) is None


@pytest.mark.parametrize("repo_id", CANDIDATE_IDS)
def test_the_hub_id_grammar_is_never_looser_than_huggingface_hubs(repo_id):
    try:
        validate_repo_id(repo_id)
        hub_accepts = bool(repo_id)  # validate_repo_id passes "" through (no repo id given)
    except HFValidationError:
        hub_accepts = False
    ours = grammar.hub_repo_id_problem(repo_id) is None
    assert not ours or hub_accepts, repo_id
    if hub_accepts and repo_id.count("/") == 1:  # owner/name: exactly the hub's rule
        assert ours, repo_id


REVISIONS = ["main", "v1.0", "refs/pr/1", "release/2026-01", "5ab363a8dcf6405955fd5f99671e01a1c9fb124b", "v0.0.6"]
BAD_REVISIONS = ["", "..", "a..b", "../x", "a/", "/a", "a//b", "a.lock", "a.", ".a", "-a", "a b", "a~1", "a^",
                 "a:b", "a?", "a*", "a[", "a\\b", "a@{1}", "$(id)", "`id`", "'", '"', "a\nb"]


@pytest.mark.parametrize("revision", REVISIONS + BAD_REVISIONS)
def test_the_revision_grammar_is_never_looser_than_git_check_ref_format(revision):
    ours = grammar.revision_problem(revision) is None
    git = subprocess.run(["git", "check-ref-format", "--allow-onelevel", revision], capture_output=True).returncode == 0
    branch = subprocess.run(["git", "check-ref-format", "--branch", revision], capture_output=True,
                            cwd="/").returncode == 0 if revision else False
    assert ours == (revision in REVISIONS), revision
    if ours:
        assert git and branch, revision


@pytest.mark.parametrize("problem, value", [
    (grammar.served_name_problem, "glm-5.3-flash"),
    (grammar.served_name_problem, "qwen3:30b"),
    (grammar.served_name_problem, "tiny-llama"),
    (grammar.image_path_problem, "sparkfleet/glm-5.3-flash-exl3"),
    (grammar.image_path_problem, "sparkfleet-lab/vllm-cpu"),
    (grammar.image_path_problem, "a__b/c---d"),
    (grammar.image_reference_problem, "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.1-ubuntu22.04"),
    (grammar.image_reference_problem, "localhost:5000/sparkfleet/x:493cb88fc69f8ba73ac87404f429d763e2739d89"),
    (grammar.image_reference_problem, "nvcr.io/nvidia/vllm@sha256:" + "a" * 64),
    (grammar.image_reference_problem, "ubuntu:24.04"),
    (grammar.url_problem, "http://127.0.0.1:5099/sparkfleet-alerts"),
    (grammar.url_problem, "https://hooks.example/services/x?a=1&b=%27"),
    (grammar.git_repository_problem, "git://198.18.0.1/recipe.git"),
    (grammar.git_repository_problem, "ssh://git@github.com/o/r.git"),
    (grammar.git_repository_problem, "/srv/mirrors/recipe.git"),
    (grammar.spdx_problem, "Apache-2.0"),
    (grammar.spdx_problem, "GPL-2.0+"),
    (grammar.relative_path_problem, "vllm-cpu/Dockerfile"),
])
def test_real_values_pass(problem, value):
    assert problem(value) is None


@pytest.mark.parametrize("problem, value", [
    (grammar.served_name_problem, "Qwen/Qwen3-30B-A3B"),  # the hub id: leave served_model_name out
    (grammar.image_path_problem, "Sparkfleet/x"),  # upper case
    (grammar.image_path_problem, "localhost:5000/x"),  # the registry is the head's, added by sparkfleet
    (grammar.image_path_problem, "a/" + "b" * 254),  # longer than 255
    (grammar.image_reference_problem, "nvcr.io/nvidia/dcgm-exporter"),  # no tag
    (grammar.image_reference_problem, "x:" + "t" * 129),
    (grammar.image_reference_problem, "x:-t"),
    (grammar.image_reference_problem, "x@sha256:abc"),
    (grammar.url_problem, "ftp://x.example/"),
    (grammar.url_problem, "http://x.example:99999/"),
    (grammar.url_problem, "http:///path"),
    (grammar.url_problem, "https://x.example/a/../b"),
    (grammar.git_repository_problem, "-oProxyCommand=x"),
    (grammar.git_repository_problem, "file:///srv/r.git"),
    (grammar.relative_path_problem, "/etc/passwd"),
    (grammar.relative_path_problem, "a/../../b"),
])
def test_values_outside_the_grammar_are_refused(problem, value):
    assert problem(value) is not None
