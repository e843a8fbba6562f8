"""Workers pull and run the image by the digest the head pushed, never by the tag (a tag on the
head's registry is anyone's on the fabric to push): the digest taken from the push's own output,
the worker's pin file, and the plan's verdict of who pulls. The lab e2e (tests/e2e/test_lab_planted.py)
re-pushes another image under the tag between the head's push and the worker's pull."""
import pytest


from roles.image.checks import decide, digest_ref, image_facts, pin_of, pushed_digest
from sparkfleet.image_pin import pin_text
from roles.image.facts import ImagePin, RepoDigests
from sparkfleet.model.serving import node_profile
from sparkfleet.config import build_cluster
from tests.unit.helpers import pair
from tests.unit.test_noop_path import Host, fake_state

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64

# docker 20.10's `docker push` (the lab's), the digest line last
PUSH_OUTPUT = """The push refers to repository [10.77.77.1:5000/sparkfleet/glm-5.3-flash-exl3]
5f70bf18a086: Layer already exists
a1b2c3d4e5f6: Pushed
493cb88fc69f8ba73ac87404f429d763e2739d89: digest: sha256:""" + "1" * 64 + """ size: 1787
"""


def test_the_digest_is_the_one_the_push_printed():
    assert pushed_digest(PUSH_OUTPUT) == D1
    assert pushed_digest("The push refers to repository [x]\nerror: denied\n") is None


def test_the_pin_file_names_a_reference_by_digest_and_nothing_else():
    ref = f"10.77.77.1:5000/sparkfleet/m@{D1}"
    assert pin_text(ref) == f"SPARKFLEET_IMAGE={ref}\n" and pin_of(pin_text(ref)) == ref
    assert ImagePin().process(pin_text(ref).splitlines()) == ref
    for text in ("", "SPARKFLEET_IMAGE=10.77.77.1:5000/sparkfleet/m:493cb88", f"OTHER={ref}",
                 "SPARKFLEET_IMAGE=10.77.77.1:5000/sparkfleet/m@sha256:abc"):
        assert pin_of(text) is None, text


def test_repo_digests_reads_dockers_json_list():
    assert RepoDigests().process([f'["10.77.77.1:5000/sparkfleet/m@{D2}","docker.io/x@{D1}"]']) == \
        [f"10.77.77.1:5000/sparkfleet/m@{D2}", f"docker.io/x@{D1}"]
    assert RepoDigests().process([]) == [] and RepoDigests().process(["[]"]) == []


@pytest.fixture
def plan_of(monkeypatch):
    cluster = build_cluster(pair())
    profile = node_profile(cluster.head)
    pushed = digest_ref(cluster, profile, D1)

    def plan(head_id="sha256:aa", worker_id="sha256:aa", head_digests=(pushed,), worker_pin=pushed, worker_digests=()):
        hosts = [Host("spark-a", {"DockerImageId": head_id, "RepoDigests": list(head_digests)}),
                 Host("spark-b", {"DockerImageId": worker_id, "ImagePin": worker_pin,
                                  "RepoDigests": list(worker_digests)})]
        state = fake_state(cluster, hosts)
        return decide(image_facts(state, profile), cluster, profile)  # the facts as read, then the verdict

    return plan, cluster, profile


def test_a_worker_pinned_to_a_digest_the_head_pushed_with_the_same_id_pulls_nothing(plan_of):
    plan, cluster, profile = plan_of
    assert digest_ref(cluster, profile, D1) == f"10.77.77.1:5000/{profile.image}@{D1}"
    assert plan().in_sync and plan().ship == []


@pytest.mark.parametrize("why", [
    {"worker_pin": None},  # never pinned (a first deploy, or one by a sparkfleet that pulled by tag)
    {"head_digests": ()},  # the head never pushed it (the registry was emptied, say)
    {"worker_id": "sha256:bb"},  # another image under the tag
    {"worker_id": None},  # no image
    {"head_id": None},  # the head builds in this run
])
def test_a_worker_pulls_by_digest_unless_pinned_to_what_the_head_pushed(plan_of, why):
    plan, cluster, profile = plan_of
    assert plan(**why).ship == ["spark-b"]


def test_a_pin_to_another_registry_or_repository_is_not_the_heads(plan_of):
    plan, cluster, profile = plan_of
    elsewhere = f"docker.io/{profile.image}@{D1}"
    assert plan(head_digests=(elsewhere,), worker_pin=elsewhere).ship == ["spark-b"]
    assert plan(worker_pin=digest_ref(cluster, profile, D2)).ship == ["spark-b"]


def test_a_worker_holding_the_heads_digest_under_another_pin_is_pinned_again_not_shipped(plan_of):
    """A rollback to a commit every node kept: the worker's copy came by the head's digest, its pin
    names the newer commit's. Its pin is written again; nothing is pulled or pushed."""
    plan, cluster, profile = plan_of
    old, new = digest_ref(cluster, profile, D1), digest_ref(cluster, profile, D2)
    back = plan(worker_pin=new, worker_digests=(old,))
    assert back.ship == [] and back.repin == {"spark-b": old} and back.in_sync
    # Another ID under the tag, or a copy holding none of the head's digests: shipped.
    assert plan(worker_pin=new, worker_digests=(old,), worker_id="sha256:bb").ship == ["spark-b"]
    assert plan(worker_pin=new, worker_digests=(new,)).ship == ["spark-b"]
