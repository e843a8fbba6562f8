"""Engine parity, SGLang half: does the real SGLang accept the command lines sparkfleet renders?

Run by the interpreter of the venv built from tests/parity/sglang.txt (stdlib + sglang only),
never by the project's:

    VENV/bin/python roles/engine_proof/files/check_sglang.py < cases.json

stdin:  {"cases": [{"id": str, "argv": [...], "env": {...},
                    "extensions": [{"name": str, "flag": str, "value": str | null}],
                    "model_files": {"config.json": {...}, ...}}]}      (model_files: optional)
stdout: {"engine": "sglang", "version": ..., "env_known": [...],
         "results": {id: {"errors": [{"flag", "value", "message"[, "raised_in"]}],
                          "accepted_extensions": [...], "unused_extensions": [...],
                          "resolution": {"complete": bool[, "stopped_at", "reason"]}}}}
An error's flag is null where it cannot be determined: argparse names it; for a check of the
resolution it is the one flag of the command line the message names, or whose value it quotes.
"raised_in" is the SGLang file:line that raised it.

Each case runs what `python3 -m sglang.launch_server` runs before it touches a GPU, with SGLang's
own code: prepare_server_args (argparse built by ServerArgs.add_cli_args, then
ServerArgs.from_cli_args), ServerArgs.resolve_once (the resolution pipeline,
sglang/srt/arg_groups/pipeline.py: the checks that the 0.5.23 ServerArgs runs; its __post_init__
is empty at this version) and, when resolution completes, ServerArgs.check_server_args
(sglang/srt/arg_groups/validation_hook.py), in the order of sglang/srt/entrypoints/engine.py.

The model's checkpoint is not on this machine: resolution reads the model's config.json at its
first model-dependent step and stops there. That is reported in "resolution" ({"complete": false,
"stopped_at": step, "reason": ...}), never as an error of the command line; the names those later
steps would check against SGLang's registries (--speculative-algorithm) are then asked of the
registry directly (registry_errors). A case may carry
"model_files" (file name -> JSON object or text, e.g. the checkpoint's config.json and
hf_quant_config.json): they are written to a temporary directory that stands in for --model-path,
and resolution then runs to the end.

--tool-call-parser and --reasoning-parser: SGLang's argparse "choices" for them are its parser
registries, FunctionCallParser.ToolCallParserEnum (sglang/srt/function_call/function_call_parser.py)
and ReasoningParser.DetectorMap (sglang/srt/parser/reasoning_parser.py). Both registries are
imported before the parser is built, so the choices are the registries themselves (not the
static name lists server_args falls back to) and a refusal carries argparse's own wording.

Extensions: a declared (flag, value) (value null: any value) that SGLang refuses is taken off the
command line and the case is checked again; it is listed in accepted_extensions. One SGLang does
not refuse (accepted as is, or not on the command line at all) is listed in unused_extensions.

Isolation: SGLang and its dependencies are imported once; each check (a case, and each re-check
of it without a refused extension) runs in a child forked from that process (copy-on-write), so no
state (argparse, lru caches, os.environ, logging, the resolution's records) crosses checks. The
case's env is applied in the child before parsing: SGLang reads its EnvField values at use
(sglang/srt/environ.py EnvField.get), but a variable read at import time sees this process's
environment instead.
"""
import ast
import json
import shutil
import os
import re
import sys
import tempfile
import traceback

# Nothing here may reach the hub: the checker only reads what the case gives it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

GIB = 1024**3


# ------------------------------------------------------------------------------------------------
# DGX Spark stand-in. The only code of this file that answers for SGLang: what the machine is.
# Installed before SGLang is imported (several SGLang modules evaluate the probes at import, e.g.
# `_is_cuda = is_cuda()`). Every SGLang device probe (sglang/srt/utils/common.py: is_cuda,
# get_device_sm, get_device_capability, _check_cuda_device_version -> is_sm100_supported /
# is_sm120_supported / is_blackwell_supported, is_sm121, get_device_name, get_device_core_count,
# get_nvgpu_memory_capacity -> _cuda_mem_fallback; the same probes behind
# sglang/srt/runtime_context.py PlatformContext and the direct torch.cuda.get_device_capability()
# reads in sglang/srt/arg_groups/{overrides,attention_hook,model_hook}.py) ends in one of these
# torch.cuda functions (torch/cuda/__init__.py, torch/cuda/memory.py), so they are the whole shim.
# torch.version.cuda is the real one of the CUDA build of torch in sglang.txt.
# ------------------------------------------------------------------------------------------------
class SparkProperties:
    """torch.cuda.get_device_properties() of one GB10 (SM 12.1, 48 SMs, unified memory)."""

    name = "NVIDIA GB10"
    major, minor = 12, 1
    multi_processor_count = 48
    total_memory = int(121.69 * GIB)
    is_integrated = 1
    uuid = "GPU-00000000-0000-0000-0000-000000000000"


def install_spark_shim():
    import torch

    if torch.version.cuda is None:
        sys.exit("check_sglang: this venv's torch is a CPU build; SGLang's is_cuda() needs the CUDA "
                 "build (torch.version.cuda). Install tests/parity/sglang.txt.")
    props = SparkProperties()
    cuda = torch.cuda
    cuda.is_available = lambda: True                               # torch/cuda/__init__.py
    cuda.device_count = lambda: 1                                  # one GPU per node
    cuda.current_device = lambda: 0
    cuda.get_device_capability = lambda device=None: (props.major, props.minor)  # SM121
    cuda.get_device_name = lambda device=None: props.name
    cuda.get_device_properties = lambda device=None: props
    # torch/cuda/memory.py: (free, total). Idle machine: all of it free.
    cuda.mem_get_info = lambda device=None: (props.total_memory, props.total_memory)
    # No NVML in this venv (nvidia-ml-py is not in sglang.txt): get_device_sm() falls back to
    # torch.cuda.get_device_capability(). A host nvidia-smi would answer with the host's GPU
    # (get_nvgpu_memory_capacity); GB10's reports no dedicated memory, and SGLang then asks
    # torch.cuda.mem_get_info(), so nvidia-smi is taken off PATH to get the Spark's answer.
    os.environ["PATH"] = os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not os.access(os.path.join(d, "nvidia-smi"), os.X_OK)
    )
    install_kernel_standins()


# SGLang's CUDA kernel packages, imported at module level once is_cuda() is true (e.g.
# sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w8a8_int8.py:
# `from sgl_kernel import int8_scaled_mm`, reached from sglang/srt/configs/model_config.py when the
# resolution pipeline is imported). Their shared objects need the CUDA driver (libcuda.so.1), so
# they cannot load on a machine without a GPU and are not in sglang.txt. Each stands in as an
# empty package whose every name is a kernel that raises when called: argument checks import
# them but never run a kernel, and one that did would be reported as a checker failure.
# flashinfer is NOT stood in: SGLang subclasses its classes at import, so an empty stand-in
# cannot pass. It is simply absent, so is_flashinfer_available() (sglang/srt/utils/common.py) is
# false here, where a Spark's image has it: defaults SGLang derives from it (the attention backend
# it picks when none is given, FlashInfer fusions) resolve as on a Spark without FlashInfer.
KERNEL_PACKAGES = ("sgl_kernel",)


class KernelStandInCalled(RuntimeError):
    pass


class _Kernel:
    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise KernelStandInCalled(f"{self._name}: a CUDA kernel was called; this checker has no GPU")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Kernel(f"{self._name}.{attr}")


def install_kernel_standins():
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types

    roots = {name for name in KERNEL_PACKAGES if importlib.util.find_spec(name) is None}

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname.split(".", 1)[0] in roots:
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            module = types.ModuleType(spec.name)
            module.__path__ = []

            def __getattr__(attr, _name=spec.name):
                if attr.startswith("__"):
                    raise AttributeError(attr)
                return _Kernel(f"{_name}.{attr}")

            module.__getattr__ = __getattr__
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


# ------------------------------------------------------------------------------------------------
# Environment variables SGLang reads.
# ------------------------------------------------------------------------------------------------
# Derived, not listed by hand:
#  1. every EnvField of sglang.srt.environ.Envs (what envs.X.get() reads), with the deprecated
#     names of the *WithAlias fields;
#  2. sglang.srt.environ._DEPRECATED_ENVS (read at import, forwarded to their replacements) and
#     third_party_cache_defaults() (TRITON_CACHE_DIR, ... set by SGLang only when unset);
#  3. every string-literal name in os.getenv(N), os.environ.get(N), os.environ[N] (read),
#     N in os.environ, os.environ.setdefault(N) and SGLang's get_bool_env_var / get_int_env_var /
#     get_float_env_var / get_str_env_var(N) in the installed sglang package, found with ast;
#     tests (sglang/test), benchmarks and the diffusion runtime (sglang/multimodal_gen) excluded.
# Names built at run time (f-strings, variables) cannot be enumerated this way.
ENV_HELPERS = {"get_bool_env_var", "get_int_env_var", "get_float_env_var", "get_str_env_var"}
EXCLUDED_DIRS = {"test", "multimodal_gen", "benchmark"}


def _environ_expr(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _literal(node):
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def env_names_in_source(root: str) -> set[str]:
    names = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root).split(os.sep)
        if rel[0] in EXCLUDED_DIRS or rel[0].startswith("bench_"):
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for filename in filenames:
            if not filename.endswith(".py") or filename.startswith("bench_"):
                continue
            path = os.path.join(dirpath, filename)
            try:
                with open(path, encoding="utf-8") as f:
                    source = f.read()
                if "environ" not in source and "getenv" not in source and "_env_var" not in source:
                    continue
                tree = ast.parse(source)
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                name = None
                if isinstance(node, ast.Call) and node.args:
                    func = node.func
                    if isinstance(func, ast.Attribute) and func.attr == "getenv" and \
                            isinstance(func.value, ast.Name) and func.value.id == "os":
                        name = _literal(node.args[0])
                    elif isinstance(func, ast.Attribute) and func.attr in ("get", "setdefault") and \
                            _environ_expr(func.value):
                        name = _literal(node.args[0])
                    elif (isinstance(func, ast.Name) and func.id in ENV_HELPERS) or \
                            (isinstance(func, ast.Attribute) and func.attr in ENV_HELPERS):
                        name = _literal(node.args[0])
                elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and \
                        _environ_expr(node.value):
                    name = _literal(node.slice)
                elif isinstance(node, ast.Compare) and len(node.ops) == 1 and \
                        isinstance(node.ops[0], (ast.In, ast.NotIn)) and _environ_expr(node.comparators[0]):
                    name = _literal(node.left)
                if name and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    names.add(name)
    return names


def env_known() -> list[str]:
    import sglang
    from sglang.srt import environ

    names = set()
    for attr, field in vars(environ.Envs).items():
        if isinstance(field, environ.EnvField):
            names.add(field.name)
            if getattr(field, "deprecated_name", None):
                names.add(field.deprecated_name)
    names.update(environ._DEPRECATED_ENVS)
    names.update(d.replacement for d in environ._DEPRECATED_ENVS.values() if d.replacement)
    names.update(environ.third_party_cache_defaults())
    names.update(env_names_in_source(os.path.dirname(sglang.__file__)))
    return sorted(names)


# ------------------------------------------------------------------------------------------------
# One case.
# ------------------------------------------------------------------------------------------------
PREFIX = ["python3", "-m", "sglang.launch_server"]


class ArgparseRefusal(Exception):
    """argparse's parser.error(message), raised instead of printing usage and exiting 2."""


def _raise_parser_error(self, message):
    raise ArgparseRefusal(message)


def flag_values(argv: list[str], flag: str) -> list[str]:
    """The tokens given to flag on argv (after it, up to the next option; or after '='); the last
    occurrence, which is the one argparse keeps."""
    for i in range(len(argv) - 1, -1, -1):
        token = argv[i]
        if token == flag:
            values = []
            for nxt in argv[i + 1:]:
                if nxt.startswith("--"):
                    break
                values.append(nxt)
            return values
        if token.startswith(flag + "="):
            return [token.split("=", 1)[1]]
    return []


def flag_value(argv, flag):
    values = flag_values(argv, flag)
    return " ".join(values) if values else None


def argv_flags(argv: list[str]) -> list[str]:
    return [t.split("=", 1)[0] for t in argv if t.startswith("--")]


def argparse_errors(message: str, argv: list[str]) -> list[dict]:
    """argparse's refusal, split by flag: one error per unrecognized option, else the argument it names."""
    if message.startswith("unrecognized arguments: "):
        tokens = message[len("unrecognized arguments: "):].split(" ")
        errors = []
        for token in tokens:
            if token.startswith("-"):
                flag = token.split("=", 1)[0]
                value = token.split("=", 1)[1] if "=" in token else None
                errors.append({"flag": flag, "value": value, "message": message})
            elif errors:
                errors[-1]["value"] = token if errors[-1]["value"] is None else f"{errors[-1]['value']} {token}"
            else:
                errors.append({"flag": None, "value": token, "message": message})
        return errors
    m = re.match(r"argument (\S+?):", message)
    if m:
        names = m.group(1).split("/")
        given = set(argv_flags(argv))
        flag = next((n for n in names if n in given), names[0])
        bad = re.search(r"invalid (?:choice|\S+ value): '(.*?)'", message)
        value = bad.group(1) if bad else flag_value(argv, flag)
        return [{"flag": flag, "value": value, "message": message}]
    m = re.match(r"ambiguous option: (\S+?)(?:=\S*)? could match", message)
    if m:
        return [{"flag": m.group(1), "value": flag_value(argv, m.group(1)), "message": message}]
    m = re.match(r"the following arguments are required: (.*)", message)
    if m:
        return [{"flag": f.strip().split("/")[0], "value": None, "message": message} for f in m.group(1).split(",")]
    return [{"flag": None, "value": None, "message": message}]


def named_flag(message: str, argv: list[str]):
    """The flag of argv an SGLang check's message is about: the one flag of argv it names, else the
    one flag whose value it quotes (a value of 3+ characters, as a whole word); None if not exactly one."""
    given = list(dict.fromkeys(argv_flags(argv)))
    named = [f for f in dict.fromkeys(re.findall(r"--[a-z0-9][a-z0-9-]*", message)) if f in given]
    if named:
        return named[0] if len(named) == 1 else None
    quoted = [f for f in given
              if (v := flag_value(argv, f)) and len(v) >= 3
              and re.search(r"(?<![\w.-])" + re.escape(v) + r"(?![\w-])", message)]
    return quoted[0] if len(quoted) == 1 else None


def stopped_for_missing_checkpoint(err: BaseException, model_path: str):
    """(step, reason) when err is SGLang failing to read a checkpoint that is not on this machine."""
    if model_path is None or os.path.exists(model_path):
        return None
    frames = traceback.extract_tb(err.__traceback__)
    reads_checkpoint = any(
        ("transformers" + os.sep + "utils" + os.sep + "hub.py") in f.filename
        or (os.sep + "huggingface_hub" + os.sep) in f.filename
        or f.filename.endswith(os.path.join("hf_transformers", "config.py"))
        or f.name in ("get_config", "model_config_of", "get_hf_text_config")
        for f in frames
    )
    if not reads_checkpoint:
        return None
    step = None
    for i, f in enumerate(frames):
        if f.name == "run_resolution_pipeline":
            later = [g for g in frames[i + 1:] if g.name not in ("run_hook", "wrapped", "run_post_process_pass")]
            step = later[0].name if later else None
    reason = f"no checkpoint at {model_path} on this machine: {type(err).__name__}: {err}"
    return step, reason


def registry_errors(server_args, argv: list[str]) -> list[dict]:
    """Names that only the model-dependent part of resolution checks, asked of SGLang's own registry
    when a missing checkpoint stopped resolution before it (argparse already checked the parsers).
    --speculative-algorithm has no argparse choices at 0.5.23: resolution refuses an unknown one in
    SpeculativeAlgorithm.from_string (sglang/srt/speculative/spec_info.py), from
    sglang/srt/arg_groups/speculative_hook.py, which runs after the checkpoint's config is read."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    errors = []
    if server_args.speculative_algorithm is not None:
        try:
            SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
        except ValueError as err:
            errors.append({"flag": "--speculative-algorithm", "value": server_args.speculative_algorithm,
                           "message": f"ValueError: {err}", "raised_in": "sglang/srt/speculative/spec_info.py "
                           "(SpeculativeAlgorithm.from_string, asked directly: resolution stopped at the checkpoint)"})
    return errors


def check_once(argv: list[str]) -> tuple[list[dict], dict]:
    """SGLang's launch sequence up to the GPU; (errors, resolution)."""
    import argparse

    from sglang.srt.server_args import prepare_server_args

    argparse.ArgumentParser.error = _raise_parser_error
    try:
        server_args = prepare_server_args(list(argv))
    except ArgparseRefusal as err:
        return argparse_errors(str(err), argv), {"complete": False, "stopped_at": "argparse"}
    except SystemExit as err:
        return [{"flag": None, "value": None, "message": f"exited with code {err.code}"}], \
            {"complete": False, "stopped_at": "argparse"}
    except Exception as err:  # ServerArgs construction
        flag = named_flag(str(err), argv)
        return [{"flag": flag, "value": flag_value(argv, flag) if flag else None,
                 "message": f"{type(err).__name__}: {err}"}], {"complete": False, "stopped_at": "construction"}
    try:
        server_args.resolve_once()
        server_args.check_server_args()
    except Exception as err:
        stop = stopped_for_missing_checkpoint(err, server_args.model_path)
        if stop:
            return registry_errors(server_args, argv), {"complete": False, "stopped_at": stop[0], "reason": stop[1]}
        frames = traceback.extract_tb(err.__traceback__)
        if isinstance(err, (ImportError, KernelStandInCalled)) or frames[-1].name == "<module>":
            # Not SGLang refusing the command line: this venv lacks a package, a module failed to
            # import, or a check ran a kernel. An error all the same, so the tier fails instead of
            # passing unchecked.
            return [{"flag": None, "value": None,
                     "message": f"checker failure, not an SGLang refusal: {type(err).__name__}: {err}"}], \
                {"complete": False, "stopped_at": "checker"}
        flag = named_flag(str(err), argv)
        site = os.path.dirname(os.path.dirname(sys.modules["sglang"].__file__))
        where = f"{os.path.relpath(frames[-1].filename, site)}:{frames[-1].lineno} ({frames[-1].name})"
        return [{"flag": flag, "value": flag_value(argv, flag) if flag else None,
                 "message": f"{type(err).__name__}: {err}", "raised_in": where}], \
            {"complete": False, "stopped_at": "resolution"}
    return [], {"complete": True}


def without_flag(argv: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for token in argv:
        if skip and not token.startswith("--"):
            continue
        skip = False
        if token == flag:
            skip = True
            continue
        if token.startswith(flag + "="):
            continue
        out.append(token)
    return out


def matches(ext: dict, error: dict) -> bool:
    return error["flag"] == ext["flag"] and (ext.get("value") is None or error["value"] == ext["value"])


def check_in_child(argv: list[str], env: dict, model_files: dict | None) -> tuple[list[dict], dict]:
    """One check, in a forked child: the case's environment and model stand-in are the child's."""
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    stand_in = None
    if model_files:
        stand_in = tempfile.mkdtemp(prefix="sglang-parity-model-")
        for name, content in model_files.items():
            with open(os.path.join(stand_in, name), "w") as f:
                f.write(content if isinstance(content, str) else json.dumps(content))
        original = flag_value(argv, "--model-path")
        argv = [stand_in if t == original else t for t in argv]
    try:
        return check_once(argv)
    finally:
        if stand_in:
            shutil.rmtree(stand_in, ignore_errors=True)


def run_case(case: dict) -> dict:
    argv = list(case["argv"])
    if argv[:len(PREFIX)] == PREFIX:
        argv = argv[len(PREFIX):]
    env, model_files = case.get("env") or {}, case.get("model_files")
    extensions = list(case.get("extensions") or [])
    accepted = []
    errors, resolution = forked(check_in_child, argv, env, model_files)
    # Take each refused extension off the command line and check again, until none is refused.
    for _ in range(len(extensions)):
        refused = [e for e in extensions if e["name"] not in accepted and any(matches(e, err) for err in errors)]
        if not refused:
            break
        for ext in refused:
            accepted.append(ext["name"])
            argv = without_flag(argv, ext["flag"])
        errors, resolution = forked(check_in_child, argv, env, model_files)
    return {
        "errors": errors,
        "accepted_extensions": accepted,
        "unused_extensions": [e["name"] for e in extensions if e["name"] not in accepted],
        "resolution": resolution,
    }


def forked(fn, *args) -> tuple[list[dict], dict]:
    """fn(*args) in a child of this (already imported) process; the child's state dies with it."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        os.dup2(2, 1)  # whatever SGLang prints goes to stderr; stdout is the report's
        try:
            result = fn(*args)
        except BaseException as err:  # the checker's own failure: report it, never hide it
            result = ([{"flag": None, "value": None, "message": f"checker failure: {type(err).__name__}: {err}",
                        "traceback": traceback.format_exc()}], {"complete": False, "stopped_at": "checker"})
        with os.fdopen(write_fd, "w") as out:
            json.dump(result, out)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return ([{"flag": None, "value": None, "message": f"checker failure: child died (wait status {status})"}],
                {"complete": False, "stopped_at": "checker"})
    errors, resolution = json.loads(data)
    return errors, resolution


def main() -> int:
    request = json.load(sys.stdin)
    report_fd = os.dup(1)
    os.dup2(2, 1)  # imports and plugins print; keep stdout for the report
    report = run(request)
    with os.fdopen(report_fd, "w") as out:
        json.dump(report, out, indent=1, sort_keys=True)
        out.write("\n")
    return 0


def run(request: dict) -> dict:
    """The report for `request`'s cases. "platform": "own" (the deploy's in-image proof, inside a
    real SGLang image on its node, GPU attached): SGLang's own device detection and its real
    kernels; else the DGX Spark stand-ins above (the parity virtualenv on a machine with no GPU)."""
    if request.get("platform", "spark") == "spark":
        install_spark_shim()
    import sglang
    from sglang.srt.plugins import load_plugins

    load_plugins()  # as launch_server does before parsing: plugins may register parsers
    # The registries, so that argparse's choices for the two parser flags are theirs.
    import sglang.srt.function_call.function_call_parser  # noqa: F401
    import sglang.srt.parser.reasoning_parser  # noqa: F401

    results = {}
    for case in request["cases"]:
        if case["id"] in results:
            raise SystemExit(f"check_sglang: duplicate case id {case['id']!r}")
        results[case["id"]] = run_case(case)
    report = {"engine": "sglang", "version": sglang.__version__, "env_known": env_known(), "results": results}
    if request.get("flags"):  # the parity tier's secret-flag check asks; the in-image proof does not
        import argparse

        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        report["flags"] = sorted({o for a in parser._actions for o in a.option_strings})
    return report


if __name__ == "__main__":
    sys.exit(main())
