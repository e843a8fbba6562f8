"""Supply-chain pins: recipe commits are full SHAs (an abbreviation is refused naming the full one),
remote code only from a revision that cannot move, and the recipe's base images recorded by digest."""
import subprocess

import pytest
import yaml

import sparkfleet.model.serving as schema
from roles.image.checks import base_images, base_record_line, commit_problem, refuse_loose_commit
from roles.image.facts import ResolvedCommit
from sparkfleet.model.serving import load_profile, node_profile
from sparkfleet.config import build_cluster
from sparkfleet.refusal import Refusal
from tests.unit.helpers import pair

FULL = "493cb88fc69f8ba73ac87404f429d763e2739d89"
SHIPPED = schema.PROFILES_DIR


def head_with(**data):
    cluster = build_cluster(pair(**{n: data for n in ("spark-a", "spark-b")}))
    return cluster.head


def test_every_shipped_recipe_commit_is_a_full_sha_or_the_zero_placeholder():
    for name in schema.profile_names():
        commit = load_profile(name).recipe.commit
        assert schema.FULL_SHA.match(commit), f"{name}: {commit}"


def test_a_full_commit_passes_and_an_abbreviated_one_is_refused_naming_the_full_sha_the_head_resolved():
    head = head_with()
    assert commit_problem(head, node_profile(head), None) is None
    head = head_with(serving_recipe_commit="493cb88")
    problem = commit_problem(head, node_profile(head), resolved=FULL)
    assert problem.hosts == ("spark-a",) and problem.key == "serving_recipe_commit"
    assert "'493cb88' is an abbreviated commit" in problem
    assert f'serving_recipe_commit = "{FULL}" (resolved on spark-a)' in problem.fix
    with pytest.raises(Refusal, match="not pinned by a full SHA; nothing was changed"):
        refuse_loose_commit(head, node_profile(head), FULL)


def test_an_abbreviation_the_head_cannot_resolve_is_refused_saying_how_to_find_the_sha():
    head = head_with(serving_recipe_commit="493cb88")
    problem = commit_problem(head, node_profile(head), resolved=None)
    assert "spark-a cannot resolve 493cb88 yet: run `git rev-parse 493cb88` in a clone of" in problem.fix


def test_the_zero_placeholder_of_an_unpinned_profile_is_refused_naming_the_profile_file():
    head = head_with(serving_profile="deepseek-v4-flash")
    problem = commit_problem(head, node_profile(head), None)
    assert problem.key == "recipe.commit" and "is a placeholder: profile deepseek-v4-flash ships no recipe commit" in problem
    assert problem.sources[0].endswith("roles/serving/profiles/deepseek-v4-flash.yaml")
    head = head_with(serving_profile="deepseek-v4-flash", serving_recipe_commit="1" * 40)
    assert commit_problem(head, node_profile(head), None) is None


def test_the_head_resolves_an_abbreviation_from_its_checkout_for_real(tmp_path):
    repo = tmp_path / "recipe"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "start.sh").write_text("echo\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], check=True)
    full = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    fact = ResolvedCommit()

    def resolve(short, path=repo, repository="file:///nonexistent"):
        out = subprocess.run(["sh", "-c", fact.command(path=str(path), short=short, repository=repository)],
                             capture_output=True, text=True)
        return fact.process(out.stdout.splitlines())

    assert resolve(full[:7]) == full
    assert resolve("deadbee") is None
    # No checkout on the head yet: the repository's advertised tips resolve it (git ls-remote).
    assert resolve(full[:9], path=tmp_path / "absent", repository=str(repo)) == full


def remote_code_profile(tmp_path, monkeypatch, **changes):
    data = yaml.safe_load((SHIPPED / "glm-5.3-flash-exl3.yaml").read_text())
    for key, value in changes.items():
        if key == "draft_model_revision":
            data["speculative"][key] = value
        else:
            data[key] = value
    (tmp_path / "pinned.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(schema, "PROFILES_DIR", tmp_path)
    return lambda: load_profile("pinned")


def test_trust_remote_code_needs_every_revision_pinned_by_sha(tmp_path, monkeypatch):
    assert load_profile("glm-5.3-flash-exl3").trust_remote_code  # the shipped profile passes
    load = remote_code_profile(tmp_path, monkeypatch, model_revision="main")
    with pytest.raises(ValueError, match=r"every revision must be a full 40-hex commit SHA.*model_revision 'main'"):
        load()
    load = remote_code_profile(tmp_path, monkeypatch, draft_model_revision="v1.0")
    with pytest.raises(ValueError, match=r"speculative.draft_model_revision 'v1.0'"):
        load()
    load = remote_code_profile(tmp_path, monkeypatch, model_revision="main", trust_remote_code=False)
    assert load().model_revision == "main"  # no hub code runs: a branch is the operator's choice


@pytest.mark.parametrize("dockerfile, build_args, expected", [
    ("FROM nvcr.io/nvidia/vllm:25.09-py3\n", {}, ["nvcr.io/nvidia/vllm:25.09-py3"]),
    ("ARG BASE_IMAGE=a:1\nFROM ${BASE_IMAGE}\n", {}, ["a:1"]),
    ("ARG BASE_IMAGE=a:1\nFROM ${BASE_IMAGE}\n", {"BASE_IMAGE": "b:2"}, ["b:2"]),
    ("ARG V\nFROM img:${V:-3}\n", {}, ["img:3"]),
    ("FROM --platform=linux/arm64 \\\n  base:1 AS build\nFROM build\nFROM scratch\nCOPY --from=build / /\n", {}, ["base:1"]),
    ("# FROM commented:out\nFROM x@sha256:abc AS one\nFROM y:2 as two\nFROM one\n", {}, ["x@sha256:abc", "y:2"]),
])
def test_the_base_images_of_a_dockerfile(dockerfile, build_args, expected):
    assert base_images(dockerfile, build_args) == expected


def test_a_base_record_line_keeps_the_registry_digest_of_the_ref_or_says_none():
    line = base_record_line("nvcr.io/nvidia/vllm:25.09-py3", ["other/x@sha256:9", "nvcr.io/nvidia/vllm@sha256:1"], "sha256:i")
    assert line == "nvcr.io/nvidia/vllm:25.09-py3\tnvcr.io/nvidia/vllm@sha256:1\tsha256:i"
    assert base_record_line("reg:5000/img", ["reg:5000/img@sha256:2"], "sha256:j").split("\t")[1] == "reg:5000/img@sha256:2"
    assert base_record_line("sparkfleet-lab/base:bookworm", [], "sha256:k").split("\t")[1] == "-"
