"""Nothing a peer plants runs or spreads, in the lab: what a worker's engine could leave in its
kernel-cache generation (a raw-disk device node, a setuid-root shell, a symlink to /) is dropped and
named, never merged onto the head or back; and another image pushed under the served tag to the
head's registry (any fabric peer can push there) between the head's push and a worker's pull is not
what the worker pulls or runs: it pulls, and its unit runs, the digest the head's push printed.
"""
import re

import pytest

from tests.e2e.lab import deploy, on, pause_watchdogs

pytestmark = pytest.mark.lab

CACHE = "/var/lib/sparkfleet/kernel-cache"
PLANTED = ("sda", "rootsh", "root")


@pytest.fixture(scope="module", autouse=True)
def serving_pair():
    run = deploy()
    assert run.returncode == 0, run.output
    yield


def not_regular(host: str, gen: str) -> str:
    """What in the generation on `host` is neither a regular file nor a directory, or is setuid/setgid."""
    return on(host, f"find {CACHE}/{gen} -mindepth 1 \\( \\( ! -type f ! -type d \\) -o -perm /6000 \\) -printf '%y %m %P\\n'")


def test_a_device_a_setuid_file_and_a_symlink_planted_in_a_workers_cache_are_dropped_named_and_never_merged():
    gen = on("spark-b", f"readlink {CACHE}/current").strip()
    assert gen and on("spark-a", f"readlink {CACHE}/current").strip() == gen
    d = f"{CACHE}/{gen}"
    on("spark-b", f"mknod {d}/sda b 8 0 && chmod 0666 {d}/sda && cp /bin/sh {d}/rootsh && chown root:root {d}/rootsh "
                  f"&& chmod 4755 {d}/rootsh && ln -s / {d}/root")
    assert sorted(not_regular("spark-b", gen).splitlines()) == ["b 666 sda", "f 4755 rootsh", "l 777 root"]

    run = deploy()
    assert run.returncode == 0, run.output
    # The plan says why the caches are brought in line; the merge names each entry it dropped, by rank.
    assert "repair without prewarm: spark-b: 3 entries not regular files: root (symlink to / (resolves to /, " \
        "outside the tree)), rootsh (setuid file mode 4755), sda (block device 8,0 mode 0666), never merged" in run.output, run.output
    for rel, kind in (("sda", "block device 8,0 mode 0666"), ("rootsh", "setuid file mode 4755"),
                      ("root", "symlink to / (resolves to /, outside the tree)")):
        assert f"spark-b: dropped {gen}/{rel} ({kind}): refused, never merged" in run.output, run.output
    assert ("Bring the kernel caches in line with the head's", "spark-a") in run.changed()
    for host in ("spark-a", "spark-b"):
        assert not_regular(host, gen) == "", host
        assert on(host, f"cd {d} && for p in {' '.join(PLANTED)}; do [ -e $p ] || [ -L $p ] && echo $p; done; true") == ""
    # Identical again on both ranks, and the next deploy has nothing to drop.
    again = deploy()
    assert again.returncode == 0, again.output
    assert "dropped" not in again.output and again.changed() == []


REGISTRY = "198.19.77.1:5000"
PIN = "/etc/sparkfleet/sparkfleet-worker.image"
# On spark-b, first in PATH (/usr/local/sbin) for the deploy's commands, never for the units (they
# name /usr/bin/docker): just before this node's image pull, a fabric peer (this node) pushes another
# image under the served tag to the head's registry. The pull is the next thing the deploy runs on
# spark-b after the head's push, so the tag names the other image when the worker pulls.
SHIM = """#!/bin/sh
if [ "$1" = pull ]; then
  /usr/bin/docker tag sfl-rogue:latest {remote} && /usr/bin/docker push {remote} > /tmp/sfl-rogue-push.log 2>&1
  /usr/bin/docker rmi {remote} > /dev/null 2>&1
fi
exec /usr/bin/docker "$@"
"""


def registry_digest(repo: str, tag: str) -> str:
    """What the head's registry says the tag names now (Docker-Content-Digest of its manifest)."""
    out = on("spark-a", f"curl -sSf -o /dev/null -D - -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' "
                        f"http://{REGISTRY}/v2/{repo}/manifests/{tag}")
    return re.search(r"(?im)^docker-content-digest: (sha256:[0-9a-f]{64})", out)[1]


def test_a_tag_re_pushed_between_the_heads_push_and_the_workers_pull_is_not_what_the_worker_runs():
    ref = on("spark-a", "docker inspect --format '{{.Config.Image}}' sparkfleet-head").strip()
    repo, tag = ref.rsplit(":", 1)
    remote = f"{REGISTRY}/{ref}"
    head_id = on("spark-a", f"docker image inspect --format '{{{{.Id}}}}' {ref}").strip()
    pause_watchdogs()
    on("spark-b", "systemctl stop sparkfleet-worker")
    # Another image (a label more: another ID), ready to push; then the worker loses the served one,
    # so this deploy ships it again: the head pushes, the worker pulls.
    on("spark-b", f"printf 'FROM %s\\nLABEL sparkfleet.test=rogue\\n' {ref} | docker build -q -t sfl-rogue:latest -")
    rogue_id = on("spark-b", "docker image inspect --format '{{.Id}}' sfl-rogue:latest").strip()
    assert rogue_id.startswith("sha256:") and rogue_id != head_id
    # The plain tag, and the registry's when an older pull by tag left it (the digest reference stays).
    on("spark-b", f"docker rmi {ref} && {{ docker rmi {remote} 2>/dev/null; rm -f {PIN} /tmp/sfl-rogue-push.log; }}")
    assert on("spark-b", f"docker image inspect {ref} >/dev/null 2>&1 || echo gone").strip() == "gone"
    on("spark-b", f"cat > /usr/local/sbin/docker <<'EOF'\n{SHIM.format(remote=remote)}EOF\nchmod 0755 /usr/local/sbin/docker")
    try:
        run = deploy()
        tag_now = registry_digest(repo, tag)
        rogue_push = on("spark-b", "cat /tmp/sfl-rogue-push.log", check=False)
    finally:
        on("spark-b", "rm -f /usr/local/sbin/docker; docker rmi sfl-rogue:latest >/dev/null 2>&1; true")
        on("spark-a", f"docker push {remote} >/dev/null")  # the tag back to the head's image, for later runs
    assert run.returncode == 0, run.output
    pushed = re.search(rf"\[spark-a\] pushed {re.escape(remote)} as (sha256:[0-9a-f]{{64}})", run.output)
    assert pushed, run.output
    digest = pushed[1]
    # The other image was pushed under the tag after the head's push and before the worker's pull:
    # the tag named it when the worker pulled (nothing else pushed in between or after).
    rogue = re.search(r"digest: (sha256:[0-9a-f]{64})", rogue_push)
    assert rogue and rogue[1] != digest and tag_now == rogue[1], (rogue_push, tag_now)
    # The worker pulled the head's manifest by digest: the head's image ID, not the other one.
    assert on("spark-b", f"docker image inspect --format '{{{{.Id}}}}' {ref}").strip() == head_id != rogue_id
    assert on("spark-b", f"cat {PIN}") == f"SPARKFLEET_IMAGE={REGISTRY}/{repo}@{digest}\n"
    assert f"{REGISTRY}/{repo}@{digest}" in on("spark-a", f"docker image inspect --format '{{{{json .RepoDigests}}}}' {ref}")
    # Its unit runs that digest: the unit reads the pin file, the container was started from the digest.
    unit = on("spark-b", "systemctl cat sparkfleet-worker")
    assert f"EnvironmentFile={PIN}" in unit and "${SPARKFLEET_IMAGE} " in unit
    assert on("spark-b", "docker inspect --format '{{.Config.Image}} {{.Image}}' sparkfleet-worker").split() == \
        [f"{REGISTRY}/{repo}@{digest}", head_id]
    # Idempotent: the same digest, the same unit; nothing to pull or restart.
    again = deploy()
    assert again.returncode == 0, again.output
    assert again.changed() == [], again.changed()
