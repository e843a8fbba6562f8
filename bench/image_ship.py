"""Benchmark: the overlay image's ship from the head to the worker, gzip's against uncompressed, in one run.

On the two-host lab, with the pair deployed (deploy.py on BENCH_INVENTORY, default the real engine's,
lab/inventory_vllm_cpu.py, whose image is 3.4 GB; the lab's stand-in image is 0.7 GB), the image the
head serves is shipped BENCH_ROUNDS times each way, interleaved:

  docker push + pull   what roles/image runs: `docker push` to the head's registry (Docker gzips every
                       layer), then the worker's `docker pull` by the digest it printed
  sfl_push.py + pull   roles/image/sfl_push.py (docker save's layers, uncompressed; copied to the head,
                       the deploy does not run it), then the same `docker pull` by digest

Before each ship the head's registry is emptied (its storage moved aside for the run and put back
after) and the worker's copy of the image removed, so each ship carries every layer; the head's own
image is never touched. Each prints push, pull and their sum (the ship), the registry's size, and the
worker's image ID (the head's, each time). Last the ratio of the medians, uncompressed / gzip.
Then the pair is deployed again (the worker's pin and units as the deploy leaves them).
Run with `make bench`; nothing here is a test.
"""
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkfleet.model.image import REGISTRY_ROOT  # noqa: E402
from tests.e2e.lab import SSH_CONFIG, deploy  # noqa: E402
from tests.e2e.lab import on as lab_on  # noqa: E402

BENCH_INVENTORY = os.environ.get("BENCH_INVENTORY", "lab/inventory_vllm_cpu.py")
BENCH_ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
REGISTRY = "198.19.77.1:5000"  # the lab head's fabric address and docker_registry_port
KEPT = f"{REGISTRY_ROOT}.bench-kept"
RECORD = "/var/tmp/sparkfleet-bench-pushed"  # the bench's pushes are not the deploy's record
# roles/image/sfl_push.py, which the deploy does not install (it pushes with docker push: a later push
# of sfl_push.py re-saves the whole image, docs/performance.md): copied to the head for the bench.
PUSHER = REPO / "roles" / "image" / "sfl_push.py"
SFL_PUSH = "/var/tmp/sparkfleet-bench-sfl_push.py"


def on(host: str, command: str, check: bool = True) -> str:
    return lab_on(host, command, check=check, timeout=1800)  # a gzip push of the real image takes minutes


def fresh(repo: str) -> None:
    on("spark-a", f"systemctl stop docker-registry && rm -rf {REGISTRY_ROOT} && "
                  f"install -d -o docker-registry -g docker-registry {REGISTRY_ROOT} && systemctl start docker-registry && "
                  f"until curl -sf http://{REGISTRY}/v2/ >/dev/null; do sleep 0.2; done")
    on("spark-b", f"docker rm -f sparkfleet-worker >/dev/null 2>&1; "
                  f"ids=$({{ docker images -q {REGISTRY}/{repo}; docker images -q {repo}; }} | sort -u); "
                  f"[ -z \"$ids\" ] || docker rmi -f $ids >/dev/null; docker image prune -f >/dev/null; "
                  f"! docker images -q | grep -qxF \"$ids\"")  # the worker holds no copy of it


def ship(way: str, image: str) -> dict:
    repo, tag = image.rsplit(":", 1)
    fresh(repo)
    began = time.monotonic()
    if way == "gzip":
        out = on("spark-a", f"docker tag {image} {REGISTRY}/{image} && docker push {REGISTRY}/{image} && "
                            f"docker rmi {REGISTRY}/{image} >/dev/null")
    else:
        out = on("spark-a", f"python3 {SFL_PUSH} {image} {REGISTRY} {repo} {tag} --record {RECORD}")
    pushed = time.monotonic()
    digest = out.split("digest: ")[-1].split()[0]
    on("spark-b", f"docker pull -q {REGISTRY}/{repo}@{digest} >/dev/null")
    pulled = time.monotonic()
    return {"push": pushed - began, "pull": pulled - pushed, "ship": pulled - began,
            "registry": on("spark-a", f"du -sh {REGISTRY_ROOT} | cut -f1").strip(),
            "id": on("spark-b", f"docker image inspect --format '{{{{.Id}}}}' {REGISTRY}/{repo}@{digest}").strip()}


def main() -> int:
    image = on("spark-a", "docker inspect --format '{{.Config.Image}}' sparkfleet-head", check=False).strip()
    if not image:
        print(f"image ship: no sparkfleet-head on spark-a; deploy {BENCH_INVENTORY} first")
        return 1
    head_id = on("spark-a", f"docker image inspect --format '{{{{.Id}}}}' {image}").strip()
    size = int(on("spark-a", f"docker image inspect --format '{{{{.Size}}}}' {image}"))
    subprocess.run(["ssh", "-F", str(SSH_CONFIG), "spark-a", f"cat > {SFL_PUSH}"], input=PUSHER.read_bytes(), check=True)
    for h, unit in (("spark-a", "sparkfleet-head"), ("spark-b", "sparkfleet-worker")):
        on(h, f"systemctl stop sparkfleet-watchdog 2>/dev/null; systemctl stop {unit}; true")
    on("spark-a", f"systemctl stop docker-registry && mv {REGISTRY_ROOT} {KEPT}")
    runs = {"gzip": [], "plain": []}
    try:
        print(f"image ship: {image} ({size / 1e9:.2f} GB as docker sizes it), spark-a -> spark-b over the fabric")
        print(f"{'round':>5}  {'way':<20} {'push s':>7} {'pull s':>7} {'ship s':>7}  registry  worker's image ID")
        for n in range(1, BENCH_ROUNDS + 1):
            for way, name in (("gzip", "docker push + pull"), ("plain", "sfl_push.py + pull")):
                r = ship(way, image)
                runs[way].append(r)
                same = "the head's" if r["id"] == head_id else f"{r['id'][:19]} (NOT the head's)"
                print(f"{n:>5}  {name:<20} {r['push']:7.1f} {r['pull']:7.1f} {r['ship']:7.1f}  {r['registry']:>8}  {same}")
    finally:
        on("spark-a", f"systemctl stop docker-registry; rm -rf {REGISTRY_ROOT} {RECORD} {SFL_PUSH}; mv {KEPT} {REGISTRY_ROOT} && "
                      "systemctl start docker-registry")
    med = {way: {k: statistics.median(r[k] for r in rs) for k in ("push", "pull", "ship")} for way, rs in runs.items()}
    print(f"medians: gzip push {med['gzip']['push']:.1f} s pull {med['gzip']['pull']:.1f} s; uncompressed push "
          f"{med['plain']['push']:.1f} s pull {med['plain']['pull']:.1f} s")
    print(f"uncompressed / gzip, the ship: {med['plain']['ship'] / med['gzip']['ship']:.2f}")
    back = deploy(inventory=BENCH_INVENTORY, timeout=1800)
    print(f"the pair deployed again: exit {back.returncode}")
    return 0 if back.returncode == 0 and all(r["id"] == head_id for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
