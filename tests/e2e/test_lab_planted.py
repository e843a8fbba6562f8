"""Nothing a peer plants runs or spreads, in the lab: what a worker's engine could leave in its
kernel-cache generation (a raw-disk device node, a setuid-root shell, a symlink to /) is dropped and
named, never merged onto the head or back.
"""
import pytest

from tests.e2e.lab import deploy, on

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
