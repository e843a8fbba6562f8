"""The in-image proof (deploy.py step 7a): the engine the group's image ships judges every rank's
rendered command line and environment before the pair is stopped for the prewarm or a restart.

What the committed snapshots (roles/serving/known_env) check before any connection describes the
engine versions they were taken of; a recipe bump may ship another. So, once the head holds the
group's image, its own engine (files/sfl_engine_proof.py, run with the image's python3, no network,
no model, no GPU work) reads its version from its installed distribution's metadata and runs its
own CLI parser, engine arguments and config classes on each distinct rank (files/check_<engine>.py,
the checker the engine-parity tier runs too), lists the environment names it reads and, for vLLM,
the routes its app registers for the head's command line. Everything here is a pure function of the
rendered ranks and that report.
"""
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from sparkfleet.keyvalue import key_values
from sparkfleet.model.api_proxy import OPEN_PATHS
from sparkfleet.model.engine_advisories import advisories_refused
from sparkfleet.model.engine import SGLANG_METRICS, engine_args, env_file_path
from sparkfleet.model.env_readers import ENGINE_NAMES, ENGINE_PREFIXES, library_readers, release

FILES = Path(__file__).resolve().parent / "files"
# The driver and the checkers it imports, shipped to the head together (one directory, read-only
# into the container).
SHIPPED = ("sfl_engine_proof.py", "check_vllm.py", "check_sglang.py")
PROOF_DIR = "/usr/local/lib/sparkfleet/engine-proof"
CONTAINER_DIR = "/sfl-proof"
CONTAINER = "sparkfleet-engine-proof"

# The routes sparkfleet itself sends requests to, each by its reader: an engine version that no
# longer registers one breaks that reader silently, so the proof refuses it before the restart.
RELIED_ROUTES = {
    ("GET", "/health"): "the deploy's and the watchdog's health checks, smg's (the proxy's open path)",
    # sparkfleet/chat_request.py: the deploy's proof request, the prewarm's warm-up, the receipt's load
    ("POST", "/v1/chat/completions"): "the deploy's proof request, the prewarm and the benchmark receipt",
    # roles/serving/ready.py: the key check after each start (401 without the key, 200 with it)
    ("GET", "/v1/models"): "the deploy's key check",
}
METRICS_ROUTE = ("GET", "/metrics")  # monitoring_enabled: Prometheus scrapes it through the proxy

# Where a flag the engine refuses comes from in data: the profile's field that renders it, else the
# extra args (serving_extra_args, the profile's extra_args).
FLAG_KEYS = {
    "--tensor-parallel-size": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "--distributed-timeout-seconds": "distributed_timeout_s",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-model-len": "max_model_len",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--quantization": "quantization",
    "--speculative-config": "speculative",
    "--tool-call-parser": "tool_call_parser",
    "--reasoning-parser": "reasoning_parser",
    "--served-model-name": "served_model_name",
    "--master-port": "master_port",
}


@dataclass(frozen=True)
class Verdict:
    """What the image's engine said: its version (None: no real engine in the image), every refusal
    (empty: proven), and one line for the run's output."""
    engine: str
    version: str | None
    refusals: tuple[str, ...]
    line: str

    @property
    def proven(self) -> bool:
        return self.version is not None and not self.refusals


def rank_env(files: dict[str, tuple[str, str]], node) -> dict[str, str]:
    """The rank's environment exactly as its env file will carry it (the plan's rendered file)."""
    text = files[env_file_path(node, node.serving_dir)][0]
    return key_values(line for line in text.splitlines() if line and not line.startswith("#"))


def proof_request(profile, cluster, rendered: dict[str, dict[str, tuple[str, str]]]) -> dict:
    """The checker's input: one case per distinct rank (argv and environment as its unit will run
    them; the API key, kept in its own root-only file, is not among them), the head's for routes."""
    cases, seen = [], {}
    for node in cluster.nodes:
        argv = engine_args(profile, cluster, node)
        env = rank_env(rendered[node.name], node)
        key = json.dumps([argv, env], sort_keys=True)
        if key in seen:  # the same command line: judged once
            continue
        seen[key] = node.name
        cases.append({"id": f"rank {node.rank} ({node.name})", "node": node.name, "argv": argv, "env": env,
                      "extensions": [{"name": e.name, "flag": e.flag, "value": e.value} for e in profile.extensions]})
    return {"engine": profile.engine, "cases": cases, "routes_for": cases[0]["id"],
            "metrics": engine_metric_names(profile.engine)}


def engine_metric_names(engine: str) -> list[str]:
    """The engine's metric names sparkfleet reads (the watchdog's progress counters, monitoring's
    rules and live figures: sparkfleet/model/engine.py SGLANG_METRICS), as the engine's code defines
    them: prometheus_client adds _total to a counter and _bucket to a histogram's series."""
    names = SGLANG_METRICS if engine == "vllm" else SGLANG_METRICS.values()
    return sorted({n.removesuffix("_total").removesuffix("_bucket") for n in names})


def request_digest(request: dict) -> str:
    """What the proof judged, as one hash: the same image and request need no second proof."""
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:16]


def _data_key(flag: str | None) -> str:
    key = FLAG_KEYS.get(flag or "")
    return f"the profile's {key}" if key else "serving_extra_args (or the profile's extra_args)"


def judge(report: dict, request: dict, group: str, profile, monitoring: bool, image: str,
          acknowledged: dict[str, str] | None = None) -> Verdict:
    """The image's engine's report -> the verdict. Refused: a flag or value it refuses (its own
    message quoted), a VLLM_*/SGLANG_* name it does not read, a route sparkfleet relies on that its
    app does not register. Each names the group, the rank and the data key to change."""
    engine = profile.engine
    name = ENGINE_NAMES[engine]
    version = report.get("version")
    if version is None:
        have = ", ".join(report.get("distributions", [])[:12]) or "none"
        return Verdict(engine, None, (), f"{group}: {image} carries no {name} distribution (installed: {have}): a "
                                          f"stand-in image; nothing was proven by the engine")
    who = f"{name} {version} (in {image})"
    refusals = []
    known = set(report.get("env_known", []))
    libraries = library_readers(engine)
    for case in request["cases"]:
        result = report["results"][case["id"]]
        where = f"{group} {case['id']}"
        for e in result["errors"]:
            value = f" {e['value']}" if e.get("value") not in (None, "") else ""
            refusals.append(f"{where}: {e.get('flag') or '(argv)'}{value}: {who} refuses it: {e['message']}; "
                            f"change {_data_key(e.get('flag'))}")
        for ext in result.get("unused_extensions", []):
            refusals.append(f"{where}: extension {ext!r} is declared but {who} accepts its flag and value: "
                            f"drop it from the profile's extensions")
        for var in sorted(case["env"]):
            if var.startswith(ENGINE_PREFIXES) and var not in known and var not in libraries \
                    and var not in profile.launcher_env:
                refusals.append(f"{where}: env {var}: {who} does not read it (a pin that would silently do "
                                f"nothing); remove it from serving_env_pins or the profile's env")
    # Known-vulnerable releases (sparkfleet/model/engine_advisories.py), for the version the image ships.
    refusals += [f"{group}: {line}; or acknowledge it in serving_engine_advisories_acknowledged with a reason"
                 for line in advisories_refused(engine, version, acknowledged or {})]
    defined = report.get("metrics_defined")
    if defined is not None:
        for metric in sorted(set(request.get("metrics", [])) - set(defined)):
            refusals.append(f"{group}: {who} defines no metric {metric}, which the watchdog's progress check and "
                            f"monitoring's rules read; pin an image whose engine does, or keep the image serving now")
    routes = report.get("routes")
    if routes is not None:
        registered = {tuple(r) for r in routes}
        relied = dict(RELIED_ROUTES)
        relied.update({(m, p): "the API proxy's open path" for p, ms in OPEN_PATHS.items() for m in ms if m == "GET"})
        if monitoring:
            relied[METRICS_ROUTE] = "Prometheus' scrape of the engine through the proxy (monitoring_enabled)"
        for (method, path), reader in sorted(relied.items()):
            if (method, path) not in registered:
                refusals.append(f"{group}: {who} registers no {method} {path}, which {reader} sends; pin an "
                                f"image whose engine serves it (the profile's recipe)")
    ranks = len(request["cases"])
    routes_said = f", {len(routes)} routes" if routes is not None else ""
    line = (f"{group}: {who} judged {ranks} distinct rank command line(s){routes_said}: "
            + ("accepted" if not refusals else f"{len(refusals)} refusal(s)"))
    declared = profile.engine_version
    if declared and release(declared) != release(version):
        # Not refused: the image's engine judged the pins itself. But the label is what the checks before
        # any connection and the compile keys read, so it is named for the data to follow the image.
        line += (f"; the data says {ENGINE_NAMES[engine]} {declared} (engine_version): set serving_engine_version "
                 f"= {version} so that the checks before any connection and the compile keys read the image's release")
    return Verdict(engine, version, tuple(refusals), line)


def _version_of(engine_field: str | None, engine: str) -> str | None:
    """The version in a fingerprint's engine field ("vllm 0.32.0+cpu", or "vllm 0.33.0 (env)")."""
    for part in (engine_field or "").split(","):
        words = part.split()
        if len(words) >= 2 and words[0] in (engine, f"{engine}_cpu", f"{engine}-cpu"):
            return words[1]
    return None


@dataclass(frozen=True)
class EngineMove:
    """The engine's version before the run (the image the head's unit runs) and after it (the image
    this run serves), and which proof judges the command lines: the plan's line."""
    before: str | None
    after: str | None
    judged_by: str

    def line(self, engine: str) -> str:
        name = ENGINE_NAMES[engine]
        after = self.after or "? (the image is built in this run)"
        move = f"{name} {self.before} -> {after}" if self.before and self.before != self.after else f"{name} {after}"
        return f"{move}; judged by {self.judged_by}"


def engine_move(versions: dict, profile, moves: bool, snapshot_version) -> EngineMove:
    """Pure: `versions` as the EngineVersions fact read it, whether the run moves the pair, and the
    snapshot lookup (sparkfleet/model/env_readers.py) -> what the plan says of the engine."""
    before, after = (_version_of(versions.get(k), profile.engine) for k in ("running", "image"))
    claimed = after or profile.engine_version
    snap = snapshot_version(profile.engine, claimed) if claimed else None
    if snap:
        fast = f"the {snap} snapshot before any connection"
    elif claimed:
        fast = f"no snapshot ({ENGINE_NAMES[profile.engine]} {claimed} is new to sparkfleet)"
    else:
        fast = "no version before the image is built"
    proof = "the image's own engine before the pair stops" if moves else "no in-image proof (nothing restarts)"
    return EngineMove(before=before, after=after, judged_by=f"{fast}; {proof}")
