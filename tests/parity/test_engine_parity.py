"""Engine parity: every command line and environment sparkfleet renders, proven against the real
engines, without a GPU, each release in its own virtualenv (tests/parity/<engine>-<version>.txt, one
per entry of SNAPSHOT_VERSIONS in sparkfleet/model/env_readers.py). A profile is proven against the
release its image runs (its engine_version) where that has a snapshot, else against its engine's newest
(parity_version); what reads a snapshot (env_known, the flags, the routes) runs for every version.

For every profile x rank x (real-hardware data, lab data), for the pair (TP 2) and for a four-node
group (TP 2 x PP 2), the exact argv the unit runs goes through the engine's own parser and config
validation (roles/engine_proof/files/check_<engine>.py, run by the engine's own virtualenv), and every variable
of the rank's env file must be read by the engine, by a library of its stack
(sparkfleet/model/env_readers.py), or by the recipe's launcher (the profile's launcher_env). Refusals
owned by a declared recipe extension pass; a declared extension the engine accepts anyway fails.
Needs --parity (make test passes it; `make parity` runs this tier alone).
"""
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from sparkfleet.model.engine import engine_args, rank_env
from sparkfleet.model.env_readers import SNAPSHOT_VERSIONS, library_readers, snapshot_version
from sparkfleet.model.serving import Profile, load_profile, profile_names
from tests.unit.helpers import GROUP_NODES
from tests.unit.test_serving_render import GIDS, PP_VARIANT, cluster, group_cluster, parallel_variants

HERE = Path(__file__).resolve().parent
# The engines' own checkers: the deploy's in-image proof runs the same files (roles/engine_proof).
CHECKERS = HERE.parents[1] / "roles" / "engine_proof" / "files"
ENGINE_NAME = {"vllm": "vLLM", "sglang": "SGLang"}
PROFILES = profile_names()
KINDS = ("spark", "lab")
NODES = ("spark-a", "spark-b")
# Every (engine, version) with a snapshot and a lock: what the snapshot, flag and route tests run for.
VERSIONS = [(engine, version) for engine, versions in SNAPSHOT_VERSIONS.items() for version in versions]
VERSION_IDS = [f"{engine}-{version}" for engine, version in VERSIONS]


def parity_version(profile: Profile) -> str:
    """The release the tier proves `profile`'s command lines against: the snapshot of the release its
    image runs (engine_version); for a version without one (a fork's development build, or none
    established) the engine's newest snapshot, the release such an image moves to. The engine in the
    built image judges the rest (the in-image proof)."""
    found = profile.engine_version and snapshot_version(profile.engine, profile.engine_version)
    return found or SNAPSHOT_VERSIONS[profile.engine][-1]


@cache
def engine_python(engine: str, version: str) -> str:
    """The engine's parity virtualenv at `version` (built once per lock file by venv.sh, cached outside
    the checkout)."""
    out = subprocess.run(["bash", str(HERE / "venv.sh"), engine, version], capture_output=True, text=True)
    assert out.returncode == 0, f"building the {engine} {version} parity virtualenv failed:\n{out.stderr[-3000:]}"
    return out.stdout.strip().splitlines()[-1]


def run_checker(engine: str, version: str, cases: list[dict], flags: bool = False) -> dict:
    """The checker's report on `cases` at `version`; with `flags`, the serve parser's option strings too."""
    request = {"cases": cases, **({"flags": True} if flags else {})}
    proc = subprocess.run([engine_python(engine, version), str(CHECKERS / f"check_{engine}.py")],
                          input=json.dumps(request), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"check_{engine}.py ({version}) failed:\n{proc.stderr[-5000:]}"
    output = json.loads(proc.stdout)
    assert output["version"] == version, f"the {engine} {version} parity virtualenv runs {output['version']}"
    return output


# The key the API proxy checks in the route tests (tests/parity/test_routes.py); the engine gets none.
PARITY_KEY = "parity-key-0123456789abcdef"


def render(profile: Profile, kind: str, name: str, c=None) -> dict:
    """One case: the rank's argv and env exactly as its unit and env file carry them (no API key: the
    engine gets none). `c`: the serving group (default: the pair serving the profile)."""
    c = c or cluster(kind, profile.name)
    node = c.node(name)
    argv = engine_args(profile, c, node)
    env = rank_env(profile, c, node, GIDS[name] if node.rdma_hca else None)
    group = "" if len(c.nodes) == 2 else f", {len(c.nodes)}-node group"
    return {
        "id": f"{profile.name} rank {node.rank} ({kind} data, {name}{group})",
        "argv": argv,
        "env": env,
        "extensions": [{"name": e.name, "flag": e.flag, "value": e.value} for e in profile.extensions],
    }


def problems(profile: Profile, case: dict, output: dict) -> list[str]:
    """Everything the engine refused or cannot account for, each naming profile, rank and flag."""
    engine = f"{ENGINE_NAME[output['engine']]} {output['version']}"
    result = output["results"][case["id"]]
    found = [f"{case['id']}: {e['flag'] or '(argv)'}{' ' + str(e['value']) if e['value'] else ''}: {engine} "
             f"refuses it: {e['message']}" for e in result["errors"]]
    found += [f"{case['id']}: extension {name!r} is declared but {engine} accepts its flag and value upstream: "
              f"drop the declaration" for name in result["unused_extensions"]]
    resolution = result.get("resolution", {"complete": True})
    if not result["errors"] and not resolution["complete"] and "no checkpoint" not in resolution.get("reason", ""):
        # Only the checkpoint's absence may stop the engine's own resolution short (SGLang reads
        # config.json at its first model-dependent step); anything else is a refusal unaccounted for.
        found.append(f"{case['id']}: {engine} stopped resolving at {resolution.get('stopped_at')}: "
                     f"{resolution.get('reason', '(no reason given)')}")
    known = set(output["env_known"])
    libraries = library_readers(output["engine"])
    for var in sorted(case["env"]):
        if var not in known and var not in libraries and var not in profile.launcher_env:
            found.append(f"{case['id']}: env {var}: read by neither {engine} nor a library of its stack "
                         f"(sparkfleet/model/env_readers.py), and not declared in the profile's launcher_env")
    return found


def group_cases(name: str) -> list[tuple[Profile, dict]]:
    """Every rank of a four-node serving group of the shipped profile `name` at TP 2 x PP 2 (its
    PP_VARIANT, built and validated as the pair is: tests/unit/test_serving_render.py), both kinds of data."""
    out = []
    with parallel_variants():
        profile = load_profile(name + PP_VARIANT)
        for kind in KINDS:
            c = group_cluster(kind, profile.name)
            out += [(profile, render(profile, kind, node, c)) for node in GROUP_NODES]
    return out


@cache
def shipped(engine: str, version: str) -> tuple[dict, dict]:
    """(cases by id, the checker's output) for every shipped profile proven against `engine` at
    `version` (parity_version), in one run: the pair (TP 2, PP 1) and the four-node group (TP 2 x PP 2).
    The same run judges the tier's broken-on-purpose cases of that release (BROKEN, the four nodes at
    TP 2 x PP 1), each under an id of its own: each run of the checker costs the engine's whole import
    (tens of seconds on two busy cores), so each release is imported once for all of them."""
    cases = {}
    for name in PROFILES:
        profile = load_profile(name)
        if profile.engine == engine and parity_version(profile) == version:
            for kind in KINDS:
                for node in NODES:
                    case = render(profile, kind, node)
                    cases[case["id"]] = (profile, case)
            for group_profile, case in group_cases(name):
                cases[case["id"]] = (group_profile, case)
    extra = [case for _, case in broken_cases(engine, version).values()]
    four = four_nodes_at_tp2_pp1()
    if (engine, version) == (four[0].engine, parity_version(four[0])):
        extra.append(four[1])
    return cases, run_checker(engine, version, [c for _, c in cases.values()] + extra, flags=True)


pytestmark = pytest.mark.parity


@pytest.mark.parametrize("node", NODES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("profile_name", PROFILES)
def test_every_rendered_rank_is_accepted_by_the_real_engine(profile_name, kind, node):
    profile = load_profile(profile_name)
    cases, output = shipped(profile.engine, parity_version(profile))
    [(p, case)] = [v for v in cases.values() if v[1]["id"] == render(profile, kind, node)["id"]]
    assert problems(p, case, output) == []


@pytest.mark.parametrize("profile_name", PROFILES)
def test_every_rank_of_a_four_node_tp2_pp2_group_is_accepted_by_the_real_engine(profile_name):
    """TP 2 x PP 2 over four nodes, one GB10 each: --pipeline-parallel-size / --pp-size 2, --nnodes 4
    and ranks 0..3, for both kinds of data."""
    profile = load_profile(profile_name)
    cases, output = shipped(profile.engine, parity_version(profile))
    mine = [v for v in cases.values() if v[0].name == profile_name + PP_VARIANT]
    assert len(mine) == len(KINDS) * len(GROUP_NODES)
    for p, case in mine:
        assert "--nnodes" in case["argv"] and case["argv"][case["argv"].index("--nnodes") + 1] == "4"
        assert problems(p, case, output) == [], case["id"]


@cache
def four_nodes_at_tp2_pp1() -> tuple[Profile, dict]:
    """A four-node group of deepseek-v4-flash at TP 2 x PP 1, rank 2 (judged in its release's one run, shipped)."""
    with parallel_variants():
        good = load_profile("deepseek-v4-flash" + PP_VARIANT)
        c = group_cluster("spark", good.name)
    profile = good.model_copy(update={"pipeline_parallel_size": 1})
    case = render(profile, "spark", "spark-c", c)
    case["id"] += " [4 nodes at TP 2 x PP 1]"
    return profile, case


def test_vllm_refuses_four_nodes_at_tp2_pp1():
    """The tier sees a group whose TP x PP is not its node count: vLLM's mp executor cannot split two
    ranks over four nodes (serving_problems refuses it first, so the group is built at TP 2 x PP 2)."""
    profile, case = four_nodes_at_tp2_pp1()
    version = parity_version(profile)
    [msg] = problems(profile, case, shipped("vllm", version)[1])
    assert f"--tensor-parallel-size 2: vLLM {version} refuses it" in msg
    assert "world_size (2) must be divisible by nnodes_within_dp (4)" in msg


def site_packages(engine: str, version: str) -> str:
    return subprocess.run([engine_python(engine, version), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("engine, version", VERSIONS, ids=VERSION_IDS)
def test_library_readers_are_found_in_the_installed_libraries(engine, version):
    """Where the engine's virtualenv holds the library, the variable's name is in the file the
    table names: the table cannot claim a reader that does not read it."""
    site = site_packages(engine, version)
    checked, wrong = [], []
    for var, reader in library_readers(engine).items():
        if reader.installed is None:
            continue
        path = Path(site) / reader.installed
        if not path.is_file():
            continue
        checked.append(var)
        if var.encode() not in path.read_bytes():
            wrong.append(f"{var}: not in {reader.installed} ({reader.library})")
    assert wrong == []
    assert checked, f"no library of {engine}'s table is installed in its parity virtualenv"


def test_every_verifiable_library_reader_is_verified_somewhere():
    missing = []
    for var in sorted(set(library_readers("vllm")) | set(library_readers("sglang"))):
        reader = {**library_readers("vllm"), **library_readers("sglang")}[var]
        if reader.installed is None:
            continue
        sites = [site_packages(e, v) for e in reader.engines for v in SNAPSHOT_VERSIONS[e]]
        if not any((Path(s) / reader.installed).is_file() for s in sites):
            missing.append(f"{var}: {reader.installed} is in no parity virtualenv ({', '.join(reader.engines)})")
    assert missing == []


# --- What data may not pin or pass, from the real engines (issue 23). --------------------------

@pytest.mark.parametrize("engine, version", VERSIONS, ids=VERSION_IDS)
def test_the_committed_known_env_snapshot_is_what_the_engine_reads(engine, version):
    """roles/serving/known_env/<engine>-<version>.txt (what a VLLM_*/SGLANG_* pin of a profile whose image
    runs that release is refused against, before any connection) is the checker's env_known of the real
    engine at that version."""
    from sparkfleet.model.env_readers import engine_env_known, known_env_path

    output = shipped(engine, version)[1]  # the profiles proven against it, or none: env_known all the same
    real, committed = set(output["env_known"]), set(engine_env_known(engine, version))
    assert (sorted(real - committed), sorted(committed - real)) == ([], []), (
        f"{known_env_path(engine, version)} differs from {engine} {output['version']} (read but not listed, listed "
        f"but not read): make snapshot ENGINE={engine} VERSION={version} writes the checker's env_known into it")



@cache
def engine_flags(engine: str, version: str) -> frozenset[str]:
    """Every option string of the engine's own serve parser (vLLM's `vllm serve`, SGLang's launch_server),
    as the checker lists them in the release's one run (shipped)."""
    return frozenset(shipped(engine, version)[1]["flags"])


# Flags named like a secret whose value is not one (read in the engines' help at the pinned versions).
NAMED_LIKE_A_SECRET = {
    "--bucket-time-to-first-token": "SGLang: latency histogram buckets (seconds)",
    "--kt-max-deferred-experts-per-token": "SGLang: a count of experts",
}


def _names_a_secret(flag: str) -> bool:
    words = flag.lstrip("-").split("-")
    return words[-1] in ("key", "token", "secret", "password", "passwd") or bool({"secret", "password"} & set(words))


def _secret_prefixes(flags) -> list[str]:
    """The engine flags that are a proper prefix of a secret flag (argparse would expand an abbreviation)."""
    from sparkfleet.model.serving import SECRET_FLAGS

    return sorted(f for f in flags if f not in SECRET_FLAGS and any(s.startswith(f) for s in SECRET_FLAGS))


@pytest.mark.parametrize("engine, version", VERSIONS, ids=VERSION_IDS)
def test_every_secret_flag_of_each_engine_version_is_refused_in_data(engine, version):
    """SECRET_FLAGS (refused in serving_extra_args and a profile's extra_args) holds every flag of the
    engine at this version whose name ends in key/token or carries secret/password; an engine flag that is
    a proper prefix of one is listed as not secret; no other flag is refused."""
    from sparkfleet.model.serving import NOT_SECRET_PREFIXES, SECRET_FLAGS, secret_flag

    flags = engine_flags(engine, version)
    assert sorted(f for f in flags if _names_a_secret(f) and f not in {*SECRET_FLAGS, *NAMED_LIKE_A_SECRET}) == []
    assert sorted(set(_secret_prefixes(flags)) - set(NOT_SECRET_PREFIXES)) == []
    assert [f for f in flags if f not in SECRET_FLAGS and secret_flag(f)] == []
    assert {"vllm": {"--api-key", "--hf-token"},
            "sglang": {"--api-key", "--admin-api-key", "--ssl-keyfile-password"}}[engine] <= flags


def test_every_listed_secret_flag_is_a_flag_of_some_engine_version():
    """No stale entry: SECRET_FLAGS, NAMED_LIKE_A_SECRET and NOT_SECRET_PREFIXES are each some flag of
    a version with a snapshot (the union over SNAPSHOT_VERSIONS)."""
    from sparkfleet.model.serving import NOT_SECRET_PREFIXES, SECRET_FLAGS

    flags = frozenset().union(*(engine_flags(e, v) for e, v in VERSIONS))
    assert sorted(f for f in flags if _names_a_secret(f)) == sorted({*SECRET_FLAGS, *NAMED_LIKE_A_SECRET})
    assert _secret_prefixes(flags) == sorted(NOT_SECRET_PREFIXES)


# --- The tier fails when a profile is broken on purpose, with the engine's own words. ----------

def _with_extension(name, flag, value):
    def update(profile):
        extra = profile.extensions + ((load_profile("glm-5.3-flash-exl3").extensions[0].model_copy(
            update={"name": name, "flag": flag, "value": value})),)
        return {"extensions": extra}
    return update


# name -> (profile, {argv_extra, env_extra, speculative, profile fields or a function of the profile})
BROKEN = {
    "misspelt flag": ("deepseek-v4-flash", {"argv_extra": ["--max-model-lenn", "4096"]}),
    "unknown speculative method": ("glm-5.3-flash-exl3", {"speculative": {"method": "dflash2"}}),
    "tool parser it lacks": ("glm-5.3-flash-exl3", {"tool_call_parser": "glm99"}),
    "reasoning parser it lacks": ("glm-5.3-flash-exl3", {"reasoning_parser": "glm99"}),
    "unknown kv-cache dtype": ("deepseek-v4-flash", {"kv_cache_dtype": "fp7"}),
    # The field report's recipes set it; no vLLM with a snapshot (0.32.0 to 0.34.0) reads it.
    "unread env": ("glm-5.3-flash-exl3", {"env_extra": {"VLLM_ENGINE_ITERATION_TIMEOUT_S": "600"}}),
    "undeclared extension": ("glm-5.3-flash-exl3", {"extensions": ()}),
    "needless extension": ("deepseek-v4-flash", {"update": _with_extension("fp8", "--kv-cache-dtype", "fp8")}),
    "sglang misspelt flag": ("qwen3.8-flash-next", {"argv_extra": ["--context-lenght", "4096"]}),
    "sglang unknown speculative algorithm": ("qwen3.8-flash-next", {"speculative": {"method": "NEXTN2"}}),
    "sglang tool parser it lacks": ("qwen3.8-flash-next", {"tool_call_parser": "qwen99"}),
    "sglang unread env": ("qwen3.8-flash-next", {"env_extra": {"VLLM_HOST_IP": "10.77.77.2"}}),
}


def _broken_case(label, profile_name, change):
    change = dict(change)
    profile = load_profile(profile_name)
    argv_extra, env_extra = change.pop("argv_extra", ()), change.pop("env_extra", {})
    if "speculative" in change:
        change["speculative"] = profile.speculative.model_copy(update=change["speculative"])
    if "update" in change:
        change.update(change.pop("update")(profile))
    profile = profile.model_copy(update=change)
    case = render(profile, "spark", "spark-b")
    case["id"] = f"{case['id']} [{label}]"
    case["argv"] += list(argv_extra)
    case["env"].update(env_extra)
    return profile, case


def proven(profile_name: str) -> str:
    """The engine and release a shipped profile is proven against, as messages name it ("vLLM 0.34.0")."""
    profile = load_profile(profile_name)
    return f"{ENGINE_NAME[profile.engine]} {parity_version(profile)}"


@cache
def broken_cases(engine: str, version: str) -> dict[str, tuple[Profile, dict]]:
    """label -> (profile, case) of every BROKEN case proven against this engine release."""
    return {label: _broken_case(label, name, change) for label, (name, change) in BROKEN.items()
            if load_profile(name).engine == engine and parity_version(load_profile(name)) == version}


def broken_results(engine: str, version: str) -> dict[str, list[str]]:
    """Every broken case proven against one engine release, in that release's one run (shipped): label -> problems."""
    output = shipped(engine, version)[1]
    return {label: problems(profile, case, output) for label, (profile, case) in broken_cases(engine, version).items()}


def broken(label: str) -> str:
    profile = load_profile(BROKEN[label][0])
    found = broken_results(profile.engine, parity_version(profile))[label]
    assert len(found) == 1, found
    return found[0]


def test_vllm_refuses_a_misspelt_flag():
    msg = broken("misspelt flag")
    assert "deepseek-v4-flash rank 1" in msg and "unrecognized arguments: --max-model-lenn" in msg


def test_vllm_refuses_an_unknown_speculative_method():
    msg = broken("unknown speculative method")
    assert "--speculative-config method='dflash2'" in msg and f"{proven('glm-5.3-flash-exl3')} refuses it" in msg
    # pydantic's words on vLLM's SpeculativeMethod Literal (0.32.0, 0.33.0), or 0.34.0's own _validate_method's
    assert ("Input should be" in msg or "Unknown speculative method 'dflash2'. Built-in methods:" in msg), msg
    assert "'dflash'" in msg


def test_vllm_refuses_parsers_it_lacks():
    msg = broken("tool parser it lacks")
    assert "--tool-call-parser glm99" in msg and "invalid tool call parser: glm99" in msg
    msg = broken("reasoning parser it lacks")
    assert "--reasoning-parser glm99" in msg and "invalid reasoning parser: glm99" in msg


def test_vllm_refuses_an_unknown_kv_cache_dtype():
    msg = broken("unknown kv-cache dtype")
    assert "--kv-cache-dtype fp7" in msg and "Invalid kv_cache_dtype: 'fp7'" in msg


def test_an_unread_environment_variable_fails_the_tier():
    msg = broken("unread env")
    assert f"env VLLM_ENGINE_ITERATION_TIMEOUT_S: read by neither {proven('glm-5.3-flash-exl3')}" in msg
    msg = broken("sglang unread env")
    assert "env VLLM_HOST_IP: read by neither SGLang" in msg


def test_an_undeclared_recipe_extension_is_refused_and_a_needless_one_too():
    msg = broken("undeclared extension")
    assert "--quantization exl3" in msg and "Invalid quantization method: exl3" in msg
    msg = broken("needless extension")
    assert f"extension 'fp8' is declared but {proven('deepseek-v4-flash')} accepts" in msg


def test_sglang_refuses_a_misspelt_flag():
    msg = broken("sglang misspelt flag")
    assert "qwen3.8-flash-next rank 1" in msg and "--context-lenght" in msg and "SGLang" in msg


def test_sglang_refuses_an_unknown_speculative_algorithm():
    msg = broken("sglang unknown speculative algorithm")
    assert "NEXTN2" in msg and "SGLang" in msg


def test_sglang_refuses_a_parser_it_lacks():
    msg = broken("sglang tool parser it lacks")
    assert "--tool-call-parser qwen99" in msg and "SGLang" in msg


# --- SGLang's log never carries the API key. -------------------------------------------------

_LOGGING_PROBE = """
import json, logging, sys
from sglang.srt.utils.common import configure_logger
configure_logger(None)  # with SGLANG_LOGGING_CONFIG_PATH set, SGLang's own code loads that file
logging.getLogger("sglang.srt.entrypoints.engine").info("server_args={'api_key': 'KEY-MUST-NOT-APPEAR'}")
logging.getLogger("sglang.srt.managers.scheduler").info("scheduler line stays")
logging.getLogger("sglang.srt.entrypoints.engine").warning("engine warning stays")
"""


def test_sglang_logging_config_silences_the_resolved_arguments_line(tmp_path):
    """SGLang 0.5.23 logs every resolved argument, the API key among them, at INFO from
    sglang/srt/entrypoints/engine.py; the rendered logging config (loaded by SGLang's own
    configure_logger) drops exactly that logger's INFO and keeps everything else."""
    import os

    from sparkfleet.model.engine import SGLANG_LOGGING_CONFIG, sglang_logging_config

    case = render(load_profile("qwen3.8-flash-next"), "spark", "spark-a")
    assert case["env"]["SGLANG_LOGGING_CONFIG_PATH"] == SGLANG_LOGGING_CONFIG
    config = tmp_path / "sglang-logging.json"
    config.write_text(json.dumps(sglang_logging_config()))
    env = {**os.environ, "SGLANG_LOGGING_CONFIG_PATH": str(config)}
    python = engine_python("sglang", parity_version(load_profile("qwen3.8-flash-next")))
    out = subprocess.run([python, "-c", _LOGGING_PROBE], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "KEY-MUST-NOT-APPEAR" not in out.stderr
    assert "scheduler line stays" in out.stderr and "engine warning stays" in out.stderr
    # Without the config SGLang's default logging prints the line: the probe can fail.
    env.pop("SGLANG_LOGGING_CONFIG_PATH")
    plain = subprocess.run([python, "-c", _LOGGING_PROBE.replace("configure_logger(None)",
                            "import types; configure_logger(types.SimpleNamespace(log_level='info'))")],
                           env=env, capture_output=True, text=True, timeout=300)
    assert "KEY-MUST-NOT-APPEAR" in plain.stderr, plain.stderr[-3000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "--parity", "-q"]))
