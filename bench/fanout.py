"""Benchmark: weight fan-out throughput over the fabric against the raw link, in one run.

On the lab pair (deployed first): iperf3 measures the fabric (spark-b <- spark-a, TCP, 5 s); then
a blob of BENCH_MIB under the head's weights module is pulled by spark-b exactly as roles/weights
pulls a model (sfl_files.py pull: rsync from the head's daemon, then sha256 against the head's
manifest). Prints both throughputs and their ratio, for the transfer alone and with verification.
Run with `make bench`; nothing here is a test.
"""
import json
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.lab import deploy, on  # noqa: E402

BENCH_MIB = int(os.environ.get("BENCH_MIB", "512"))
HEAD_IP = "198.19.77.1"
SRC = "/var/lib/sparkfleet/models/.bench"
DEST = "/var/tmp/sparkfleet-bench"
SFL = "python3 /usr/local/libexec/sparkfleet/sfl_files.py"


def timed_on(host: str, command: str) -> float:
    """Seconds `command` took on the host, timed there (not the SSH round trip)."""
    timer = ("import subprocess, sys, time; t = time.monotonic(); "
             "subprocess.run(sys.argv[1], shell=True, check=True, stdout=subprocess.DEVNULL); print(time.monotonic() - t)")
    return float(on(host, f"python3 -c {shlex.quote(timer)} {shlex.quote(command)}").strip())


def main() -> int:
    first = deploy()
    if first.returncode != 0:
        sys.exit(f"deploy failed:\n{first.output}")
    size = BENCH_MIB * 1024 * 1024
    on("spark-a", f"mkdir -p {SRC}/blob && head -c {size} /dev/urandom > {SRC}/blob/weights.bin && "
                  f"{SFL} seal {SRC}/blob --manifest {SRC}/blob.manifest")
    try:
        on("spark-a", f"iperf3 -s -B {HEAD_IP} -1 -D")
        time.sleep(1)
        report = json.loads(on("spark-b", f"iperf3 -c {HEAD_IP} -t 5 -J"))
        link = report["end"]["sum_received"]["bits_per_second"] / 8
        on("spark-b", f"rm -rf {DEST} && mkdir -p {DEST}")
        transfer = timed_on("spark-b", f"rsync --archive rsync://{HEAD_IP}:873/weights/.bench/blob/ {DEST}/raw/")
        on("spark-b", f"rm -rf {DEST} && mkdir -p {DEST}")
        pull = timed_on("spark-b", f"{SFL} pull rsync://{HEAD_IP}:873/weights/.bench/blob {DEST}/blob --manifest {DEST}/blob.manifest")
    finally:
        on("spark-a", f"rm -rf {SRC}", check=False)
        on("spark-b", f"rm -rf {DEST}", check=False)
    mib = 1024 * 1024
    print(f"fabric enp1s0f0np0 (lab veth, MTU 9000), {BENCH_MIB} MiB blob, one run")
    print(f"iperf3 TCP, 5 s                 {link / mib:8.1f} MiB/s")
    print(f"fan-out rsync transfer          {size / transfer / mib:8.1f} MiB/s  ({transfer:.2f} s)")
    print(f"fan-out pull + sha256 verify    {size / pull / mib:8.1f} MiB/s  ({pull:.2f} s)")
    print(f"ratio transfer / link           {size / transfer / link:8.2f}")
    print(f"ratio pull+verify / link        {size / pull / link:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
