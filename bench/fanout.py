"""Benchmark: weight fan-out throughput over the fabric against the raw link, in one run.

On the lab pair (deployed first, so the hosts run this tree's sfl_files.py and the head its HTTP
server of the weights), spark-b <- spark-a: a model-shaped blob (BENCH_SHARDS shards totalling
BENCH_MIB MiB, and a config.json) is sealed under the head's weights directory, then measured:

  iperf3 -P N         TCP over the fabric, N parallel streams, 5 s (N = 1, 2, 4)
  rsync alone, N      N concurrent `rsync --archive` from the head's daemon over disjoint shard sets,
                      no verification: what an rsync transfer costs by itself
  verified copy, N    `sfl_files.py pull --streams N` exactly as roles/weights runs it on a worker,
                      from the head's HTTP server (sparkfleet-fanout-http, `sfl_files.py serve`):
                      the head's manifest fetched, disk checked, the shards received by sendfile(2),
                      every byte's sha256 taken as it arrives and checked against the head's manifest,
                      installed, the manifest written; its whole wall time on spark-b (not the SSH
                      round trip)
  rsync pull, N       the same pull from the head's rsync daemon (an rsync:// URL, the transport the
                      deploy used before): rsync's streams, each file hashed again once it is whole

Each figure is the median of BENCH_REPEAT runs (default 3). Throughput is the blob's bytes / wall
time, so each transport's connection cost (rsync's ~0.15 s of handshakes; a pull's streams connect
while its manifest crosses) is in every figure, as it is in a deploy. BENCH_MIB is 2048 by default:
the pull's fixed costs (Python's start and imports, about 0.07 s, and the manifest's round trip) were
14 % of a 512 MiB blob's copy and are 4 % of 2 GiB's; a Spark's 164 GiB of weights pay them once. 2 GiB
also writes enough for the worker's page cache to matter where the pull writes through it.

Ratios printed:
  verified / iperf3 -P1   the headline: the deploy's verified copy over one TCP stream's throughput,
                          for the default stream count (sfl_files.STREAMS) and for the best of 1, 2, 4
  verified / iperf3 -PN   the same copy against the link at as many TCP streams as the pull's
  rsync pull / verified   the rsync pull's time over the HTTP pull's: what the transport change bought
  rsync alone / -P1       an rsync transfer without verification
"cpu" is the cores busy on the machine during the run (/proc/stat): the two lab hosts are containers
sharing its cores, so iperf3, both ends of a transfer and sha256 all compete for them.
Run with `make bench`; nothing here is a test.
"""
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from roles.fanout import sfl_files  # noqa: E402
from tests.e2e.lab import deploy, on  # noqa: E402

BENCH_MIB = int(os.environ.get("BENCH_MIB", "2048"))
BENCH_SHARDS = int(os.environ.get("BENCH_SHARDS", "8"))
BENCH_REPEAT = int(os.environ.get("BENCH_REPEAT", "3"))
STREAMS = (1, 2, 4)
HEAD_IP = "198.19.77.1"
SRC = "/var/lib/sparkfleet/models/.bench"
URL = f"rsync://{HEAD_IP}:873/weights/.bench/blob"
DEST = "/var/tmp/sparkfleet-bench"
# The options every sparkfleet rsync carries, and without which the head's daemon refuses a client.
RSYNC = shlex.join(["rsync", "--archive", *sfl_files.SAFE_RSYNC])
SFL = "python3 /usr/local/libexec/sparkfleet/sfl_files.py"
HTTP_URL = f"http://{HEAD_IP}:8874/.bench/blob"  # the head's sparkfleet-fanout-http (fanout_http_port)
MIB = 1024 * 1024


def shard(i: int) -> str:
    return f"model-{i:05d}-of-{BENCH_SHARDS:05d}.safetensors"


def timed_on(host: str, command: str) -> tuple[float, float]:
    """(seconds, cores busy) while `command` ran on the host, timed there (not the SSH round trip)."""
    timer = (
        "import subprocess, sys, time\n"
        "def cpu():\n"
        "    v = [int(x) for x in open('/proc/stat').readline().split()[1:]]\n"
        "    return sum(v), v[3] + v[4]\n"
        "c0 = cpu(); t = time.monotonic()\n"
        "subprocess.run(sys.argv[1], shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "dt = time.monotonic() - t; c1 = cpu()\n"
        "total, idle = c1[0] - c0[0], c1[1] - c0[1]\n"
        "print(dt, (total - idle) / max(total, 1) * __import__('os').cpu_count())\n"
    )
    seconds, cores = on(host, f"python3 -c {shlex.quote(timer)} {shlex.quote(command)}").split()
    return float(seconds), float(cores)


def median_run(host: str, setup: str, command: str) -> tuple[float, float]:
    runs = []
    for _ in range(BENCH_REPEAT):
        on(host, setup)
        runs.append(timed_on(host, command))
    on(host, setup)
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def iperf3(streams: int) -> float:
    on("spark-a", f"iperf3 -s -B {HEAD_IP} -1 -D")
    time.sleep(1)
    report = json.loads(on("spark-b", f"iperf3 -c {HEAD_IP} -t 5 -P {streams} -J"))
    return report["end"]["sum_received"]["bits_per_second"] / 8


def rsync_alone(streams: int) -> str:
    """N concurrent rsyncs over the shards dealt round-robin (equal sizes); fails if any fails."""
    parts = []
    for k in range(streams):
        files = " ".join(f"{URL}/{shard(i)}" for i in range(k, BENCH_SHARDS, streams))
        parts.append(f"{RSYNC} {files} {DEST}/raw/ & p{k}=$!")
    return "; ".join(parts) + "; " + " && ".join(f"wait $p{k}" for k in range(streams))


def main() -> int:
    first = deploy()
    if first.returncode != 0:
        sys.exit(f"deploy failed:\n{first.output}")
    size = BENCH_MIB * MIB
    per = size // BENCH_SHARDS
    total = per * BENCH_SHARDS + 3
    on("spark-a", f"rm -rf {SRC} && mkdir -p {SRC}/blob && "
                  + " && ".join(f"head -c {per} /dev/urandom > {SRC}/blob/{shard(i)}" for i in range(BENCH_SHARDS))
                  + f" && echo {{}} > {SRC}/blob/config.json && {SFL} seal {SRC}/blob --manifest {SRC}/blob.manifest")
    fresh = f"rm -rf {DEST} && mkdir -p {DEST}/raw"
    try:
        link = {n: iperf3(n) for n in STREAMS}
        connect, _ = median_run("spark-b", fresh, f"{RSYNC} {URL}/config.json {DEST}/raw/")
        alone = {n: median_run("spark-b", fresh, rsync_alone(n)) for n in STREAMS}
        verified = {n: median_run("spark-b", fresh, f"{SFL} pull {HTTP_URL} {DEST}/blob --manifest {DEST}/blob.manifest "
                                                     f"--streams {n}") for n in STREAMS}
        over_rsync = {n: median_run("spark-b", fresh, f"{SFL} pull {URL} {DEST}/blob --manifest {DEST}/blob.manifest "
                                                       f"--streams {n}") for n in STREAMS}
    finally:
        on("spark-a", f"rm -rf {SRC} {SRC}.manifest", check=False)
        on("spark-b", f"rm -rf {DEST}", check=False)
    rate = lambda s: total / s  # noqa: E731
    cores = os.cpu_count()
    print(f"fabric enp1s0f0np0 (lab veth, MTU 9000); {BENCH_MIB} MiB in {BENCH_SHARDS} shards + config.json; "
          f"median of {BENCH_REPEAT}; both lab hosts share this machine's {cores} cores")
    for n in STREAMS:
        print(f"iperf3 TCP -P{n}, 5 s            {link[n] / MIB:8.1f} MiB/s")
    print(f"rsync connection (config.json)   {connect:8.2f} s   (a pull pays it for its manifest, its streams connecting meanwhile)")
    print()
    print("streams   verified copy (sfl_files.py pull http://)   verified/iperf3-P1   verified/iperf3-PN   "
          "rsync pull (rsync://)         rsync pull/verified   rsync alone          rsync alone/iperf3-P1")
    for n in STREAMS:
        (tv, cv), (tr, cr), (ta, ca) = verified[n], over_rsync[n], alone[n]
        print(f"{n:7d}   {rate(tv) / MIB:6.0f} MiB/s {tv:5.2f} s cpu {cv:3.1f}         {rate(tv) / link[1]:5.2f}"
              f"                {rate(tv) / link[n]:5.2f}                {rate(tr) / MIB:6.0f} MiB/s {tr:5.2f} s cpu {cr:3.1f}"
              f"   {tr / tv:5.2f}                 {rate(ta) / MIB:6.0f} MiB/s cpu {ca:3.1f}   {rate(ta) / link[1]:5.2f}")
    best = max(STREAMS, key=lambda n: rate(verified[n][0]))
    default = sfl_files.STREAMS
    print()
    if default in verified:
        print(f"headline: verified copy at the default {default} streams / iperf3 -P1 = "
              f"{rate(verified[default][0]) / link[1]:.2f}")
    print(f"best:     verified copy at {best} streams / iperf3 -P1 = {rate(verified[best][0]) / link[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
