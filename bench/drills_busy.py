"""The drills, three times in a row, on a machine kept busy by another job (issue 26).

stress-ng keeps every CPU of this machine busy at the lowest priority (`nice -n 19 stress-ng --cpu N`),
as another job on a shared CI machine would; meanwhile the watchdog's drills run ROUNDS times each,
one pytest session per round: the stand-in's (tests/e2e/test_lab_drills.py: the give-up, a full
disk) and the real vLLM pair's (tests/real/test_real_watchdog.py: each rank killed and frozen, a busy
pair, a reboot, a power cut, a worker dying during the start-up, and a deploy after them that
changes nothing). Every verdict is the pair's behaviour (the journal, a request served), bounded
generously; nothing is timed against a figure. Prints each drill's time to recovery per round and
whether every round passed. Needs the lab up (`make lab-reset`) and `make lab-wheels`; installs
stress-ng from the distribution when it is missing. Run with `make drills-busy`.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ROUNDS = 3
MODULES = ("tests/e2e/test_lab_drills.py", "tests/real/test_real_watchdog.py")
LINE = re.compile(r"^\s+(?:real )?drill:? (?P<what>.*?)(?:: serving again after|: the watchdog gave up after"
                  r"|: the deploy stopped) (?P<took>[0-9.]+) s")


def main() -> int:
    if not shutil.which("stress-ng"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "stress-ng"], check=True)
    stress = subprocess.Popen(["nice", "-n", "19", "stress-ng", "--cpu", str(os.cpu_count() or 2), "--timeout", "4h",
                               "--quiet"])
    results, ok = {}, True
    try:
        for module in MODULES:
            for round_ in range(1, ROUNDS + 1):
                # The real tier's first session proves its prewarm from cold; the rounds after it reuse
                # the pair it left (its deploy then changes nothing), as the drills are about the watchdog.
                env = {**os.environ, **({"SFL_REAL_KEEP_CACHES": "1"} if round_ > 1 else {})}
                run = subprocess.run([str(BIN / "pytest"), module, "-q", "--lab", "-p", "no:cacheprovider", "-rA"],
                                     cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                passed = run.returncode == 0
                ok &= passed
                summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else "no output"
                print(f"{module} round {round_}: {'passed' if passed else 'FAILED'} ({summary})", flush=True)
                if not passed:
                    print(run.stdout[-6000:], flush=True)
                for line in run.stdout.splitlines():
                    if m := LINE.match(line):
                        results.setdefault(m["what"].strip(), {})[round_] = float(m["took"])
    finally:
        stress.terminate()
        stress.wait()
    print(f"\ntime to recovery under `nice -n 19 stress-ng --cpu {os.cpu_count()}` (s), {ROUNDS} rounds:")
    width = max((len(w) for w in results), default=10)
    for what, took in results.items():
        cells = "  ".join(f"{took[r]:7.1f}" if r in took else "      -" for r in range(1, ROUNDS + 1))
        print(f"  {what:<{width}}  {cells}")
    print("every round passed" if ok else "NOT every round passed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
