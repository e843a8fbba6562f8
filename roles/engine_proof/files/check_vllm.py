"""Feed sparkfleet's rendered `vllm serve` command lines to the real vLLM and report what it refuses.

Run by a vLLM's own python, never by the project's: it imports vLLM itself. Two callers:
- the engine-parity tier (tests/parity), in the parity virtualenv of each snapshot version, with the
  DGX Spark platform stand-in below (there is no GPU on the controller);
- the deploy's in-image proof (roles/engine_proof, step 7a), inside the group's own image on its head,
  with "platform": "own": the platform the image's vLLM detects itself, and "routes_for": the head
  case whose app's route table is reported too (build_app, as `vllm serve` builds it).
Input on stdin, output on stdout, both JSON:

  in:  {"cases": [{"id": str, "argv": ["vllm", "serve", MODEL, ...], "env": {...},
                   "extensions": [{"name": str, "flag": str, "value": str}]}],
        "platform": "spark" (default) | "own", "routes_for": case id (optional)}
  out: {"engine": "vllm", "version": str, "env_known": [...],
        "results": {id: {"errors": [{"flag", "value", "message"}], "accepted_extensions": [...],
                         "unused_extensions": [...]}},
        "routes": [[method, path], ...] (with routes_for)}

What runs is vLLM's own code, in the order `vllm serve` runs it before it needs a GPU or weights:
1. the `vllm serve` subcommand's parser (vllm/entrypoints/cli/serve.py, ServeSubcommand.subparser_init)
2. validate_parsed_serve_args (vllm/entrypoints/common/cli_args.py; 0.32.0: .../launchers/cli_args.py)
3. AsyncEngineArgs.from_cli_args (vllm/engine/arg_utils.py), and its
   create_structured_outputs_config, which carries --reasoning-parser where the next step reads it
4. validate_api_server_args (vllm/entrypoints/common/cli_args.py; 0.32.0: .../launchers/launcher.py):
   the tool-call and reasoning parser names registered in this version (ToolParserManager,
   ReasoningParserManager)
5. the config classes that validate what the flags carry, each built from the parsed values:
   CacheConfig (vllm/config/cache.py: --kv-cache-dtype, --gpu-memory-utilization),
   ParallelConfig (vllm/config/parallel.py: TP, PP, nnodes, node rank, master address and port, the
   distributed timeout) with the mp executor's _get_parallel_sizes on it (vllm/v1/executor/
   multiproc_executor.py: TP x PP split evenly over the nodes), SpeculativeConfig's fields
   (vllm/config/speculative.py: every key of --speculative-config against its declared type, the
   method Literal among them), and the quantization registry
   (vllm/model_executor/layers/quantization/__init__.py).
Building SpeculativeConfig or ModelConfig whole needs the model's config.json and a GPU; those
steps are left to the pair itself.

The one stand-in: vLLM picks its platform by asking NVML for a GPU. There is none here, so the
platform is set to a CUDA one that answers as a DGX Spark's GB10 does (SM 12.1, 121.69 GiB), the
machine the command is rendered for. vllm/platforms/cuda.py itself cannot be imported without
libcuda, hence a subclass of the platform interface (vllm/platforms/interface.py).
"""
import argparse
import contextlib
import io
import json
import os
import sys
import typing


def install_spark_platform():
    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class DGXSparkPlatform(Platform):
        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"
        dispatch_key = "CUDA"
        ray_device_key = "GPU"
        dist_backend = "nccl"
        device_control_env_var = "CUDA_VISIBLE_DEVICES"

        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(12, 1)  # GB10: SM121

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "NVIDIA GB10"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return int(121.69 * 2**30)

    platforms._current_platform = DGXSparkPlatform()


class Refused(Exception):
    def __init__(self, flag, value, message):
        super().__init__(message)
        self.flag, self.value, self.message = flag, value, message


def serve_parser():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        # argparse reports by exiting; the refusal and its own words are what we want.
        def error(self, message):
            raise Refused(_flag_in(message), None, message)

    parser = Parser(prog="vllm")
    subparsers = parser.add_subparsers(required=True, dest="subparser", parser_class=Parser)
    ServeSubcommand().subparser_init(subparsers)
    return parser


def serve_flags() -> list[str]:
    """Every option string of `vllm serve`, as its own parser builds them (asked for by the parity
    tier's secret-flag check, "flags": true; the in-image proof does not ask)."""
    serve = next(a for a in serve_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    return sorted({o for a in serve._actions for o in a.option_strings})


def _flag_in(message: str):
    for word in message.replace(",", " ").replace(":", " ").replace("/", " ").split():
        if word.startswith("--"):
            return word
    return None


def _value_of(argv: list[str], flag: str):
    if flag in argv:
        i = argv.index(flag)
        return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
    return None


def config_checks(argv: list[str], ns, engine_args) -> list[Refused]:
    """Each config class that validates what a flag carries, built from the parsed values."""
    import pydantic
    from vllm.config.cache import CacheConfig
    from vllm.config.parallel import ParallelConfig
    from vllm.config.speculative import SpeculativeConfig
    from vllm.model_executor.layers.quantization import get_quantization_config

    refusals = []

    def attempt(flag, value, build):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                build()
        except (pydantic.ValidationError, ValueError, TypeError, KeyError, AssertionError) as err:
            refusals.append(Refused(flag, value, f"{type(err).__name__}: {err}"))

    attempt("--kv-cache-dtype", engine_args.kv_cache_dtype, lambda: CacheConfig(
        cache_dtype=engine_args.kv_cache_dtype, gpu_memory_utilization=engine_args.gpu_memory_utilization))
    def parallel():
        config = ParallelConfig(
            tensor_parallel_size=engine_args.tensor_parallel_size,
            pipeline_parallel_size=engine_args.pipeline_parallel_size,
            distributed_executor_backend=engine_args.distributed_executor_backend,
            nnodes=engine_args.nnodes, node_rank=engine_args.node_rank,
            master_addr=engine_args.master_addr, master_port=engine_args.master_port,
            distributed_timeout_seconds=engine_args.distributed_timeout_seconds)
        # The mp executor's own first step across nodes (vllm/v1/executor/multiproc_executor.py
        # _get_parallel_sizes, from _init_executor): TP x PP must split evenly over --nnodes, each
        # node starting local_world_size workers. Run on a bare executor: nothing else of it is built.
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        executor = MultiprocExecutor.__new__(MultiprocExecutor)
        executor.parallel_config = config
        executor._get_parallel_sizes()

    attempt("--tensor-parallel-size", _value_of(argv, "--tensor-parallel-size"), parallel)
    if engine_args.quantization is not None:
        attempt("--quantization", engine_args.quantization, lambda: get_quantization_config(engine_args.quantization))

    spec = engine_args.speculative_config
    if spec:
        fields = SpeculativeConfig.__pydantic_fields__
        for key, value in spec.items():
            if key not in fields:
                refusals.append(Refused("--speculative-config", f"{key}={value!r}",
                                        f"SpeculativeConfig has no field {key!r} (fields: {', '.join(sorted(fields))})"))
                continue
            field = fields[key]
            annotation = typing.Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
            flag_value = f"{key}={value!r}"
            before = len(refusals)
            attempt("--speculative-config", flag_value,
                    lambda a=annotation, v=value: pydantic.TypeAdapter(a).validate_python(v))
            # Then the class's own "after" validators of that field, which the type alone does not run:
            # vLLM 0.34.0 types `method` as SpeculativeMethod | str and names the allowed ones in
            # _validate_method (built in, or registered by a plugin); 0.32.0 and 0.33.0 have none.
            for validator in SpeculativeConfig.__pydantic_decorators__.field_validators.values():
                if len(refusals) == before and key in validator.info.fields and validator.info.mode == "after":
                    attempt("--speculative-config", flag_value, lambda f=validator.func, v=value: f(v))
        if "kv_cache_dtype" in spec and spec["kv_cache_dtype"] is not None:
            attempt("--speculative-config", f"kv_cache_dtype={spec['kv_cache_dtype']!r}",
                    lambda: CacheConfig(cache_dtype=spec["kv_cache_dtype"]))
        if spec.get("quantization"):
            attempt("--speculative-config", f"quantization={spec['quantization']!r}",
                    lambda: get_quantization_config(spec["quantization"]))
    return refusals


def check(case: dict) -> list[Refused]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    try:  # vLLM 0.33.0 on: both in one module
        from vllm.entrypoints.common.cli_args import validate_api_server_args, validate_parsed_serve_args
    except ModuleNotFoundError:  # 0.32.0: the same two functions, in the launcher's modules
        from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
        from vllm.entrypoints.launchers.launcher import validate_api_server_args

    argv = list(case["argv"])
    if argv[:2] != ["vllm", "serve"]:
        return [Refused(None, " ".join(argv[:2]), "not a `vllm serve` command line")]
    try:
        ns = serve_parser().parse_args(argv[1:])
        if getattr(ns, "model_tag", None) is not None:  # what ServeSubcommand.cmd does first
            ns.model = ns.model_tag
        validate_parsed_serve_args(ns)
        engine_args = AsyncEngineArgs.from_cli_args(ns)
    except Refused as refusal:
        return [refusal]
    except (ValueError, TypeError, KeyError) as err:
        return [Refused(_flag_in(str(err)), None, f"{type(err).__name__}: {err}")]
    refusals = []
    try:
        # What create_engine_config does first: the --reasoning-parser value moves into the
        # structured-outputs config the namespace shares, which validate_api_server_args reads.
        if hasattr(engine_args, "create_structured_outputs_config"):  # 0.32.0 and later
            engine_args.create_structured_outputs_config()
        else:  # 0.31.0: create_engine_config does the same inline (vllm/engine/arg_utils.py)
            if engine_args.reasoning_parser:
                engine_args.structured_outputs_config.reasoning_parser = engine_args.reasoning_parser
            if engine_args.reasoning_parser_plugin:
                engine_args.structured_outputs_config.reasoning_parser_plugin = engine_args.reasoning_parser_plugin
        validate_api_server_args(ns)
    except KeyError as err:
        message = str(err).strip("\"'")
        flag = "--tool-call-parser" if "tool call parser" in message else "--reasoning-parser"
        refusals.append(Refused(flag, _value_of(argv, flag), f"KeyError: {message}"))
    return refusals + config_checks(argv, ns, engine_args)


def _matches(extension: dict, refusal: Refused) -> bool:
    if extension["flag"] != refusal.flag:
        return False
    value = extension.get("value")
    return value is None or (refusal.value is not None and value in str(refusal.value))


@contextlib.contextmanager
def case_env(env: dict):
    """The case's environment while vLLM parses it (vllm/envs.py reads os.environ when asked)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def routes(case: dict) -> list[list[str]]:
    """Every (method, path) the real app registers for the case's command line: the `vllm serve`
    parser, then build_app (vllm/entrypoints/launchers/app.py) for every task vLLM knows
    (vllm/tasks.py SupportedTask). No engine is started."""
    from vllm.entrypoints.launchers.app import build_app
    from vllm.tasks import SupportedTask

    with case_env(case["env"]):
        args = serve_parser().parse_args(case["argv"][1:])
        app = build_app(args, supported_tasks=tuple(typing.get_args(SupportedTask)), model_config=None)
    return sorted({(m, r.path) for r in app.routes for m in (getattr(r, "methods", None) or ["GET"])})


def run(request: dict) -> dict:
    if request.get("platform", "spark") == "spark":
        install_spark_platform()
    import vllm
    import vllm.envs

    # In the image (the weights mounted as the units mount them) each case is judged in the environment
    # its unit gives it. The parity tier has no weights: HF_HUB_OFFLINE=1 there would make vLLM take the
    # absent model path for a hub repository id and refuse every case for that alone.
    own = request.get("platform", "spark") == "own"
    results = {}
    for case in request["cases"]:
        with case_env(case.get("env", {}) if own else {}):
            refusals = check(case)
        extensions = case.get("extensions", [])
        errors, accepted = [], set()
        for refusal in refusals:
            owners = [e["name"] for e in extensions if _matches(e, refusal)]
            if owners:
                accepted.update(owners)
            else:
                errors.append({"flag": refusal.flag, "value": refusal.value, "message": refusal.message})
        results[case["id"]] = {
            "errors": errors,
            "accepted_extensions": sorted(accepted),
            "unused_extensions": sorted(e["name"] for e in extensions if e["name"] not in accepted),
        }
    report = {
        "engine": "vllm",
        "version": vllm.__version__,
        # Every variable vLLM reads through vllm/envs.py; unknown VLLM_* names only log a warning.
        "env_known": sorted(vllm.envs.environment_variables),
        "results": results,
    }
    if request.get("flags"):
        report["flags"] = serve_flags()
    head = [c for c in request["cases"] if c["id"] == request.get("routes_for")]
    if head and not results[head[0]["id"]]["errors"]:  # a command line its parser refused builds no app
        report["routes"] = routes(head[0])
    return report


def main():
    request = json.load(sys.stdin)
    report_fd = os.dup(1)
    os.dup2(2, 1)  # vLLM's imports and config classes print; stdout is kept for the report
    report = run(request)
    with os.fdopen(report_fd, "w") as out:
        json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
