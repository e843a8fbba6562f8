"""Exact recipe drift: what the recipe's own launcher would start, against what sparkfleet renders.

The units run `docker run ... IMAGE vllm serve ...` with sparkfleet's argv; the recipe's launcher
(its start.sh) is never run by them. A recipe update can still change what its authors run in
ways no launch default shows (a flag added to the launcher's exec line). So at a bump the head
runs the launcher of the new commit inside the new image, with the engine replaced by a recorder
(drift_recorder.py), once per rank with that rank's rendered environment and arguments, and
compares what the recorder saw with what sparkfleet renders for the rank:

- a flag the recipe passes that sparkfleet does not render stops the deploy until it is adopted
  (serving_extra_args in data, or the profile's extra_args) or acknowledged
  (recipe_drift_acknowledged: `--flag` for any value, `--flag=VALUE` for that value);
- a variable the launcher sets or changes that sparkfleet does not render stops it until it is
  pinned (serving_env_pins, the profile's env or launcher_env) or acknowledged (its name);
- what sparkfleet renders itself (a flag's value, a pinned variable, the model path) is reported
  and does not stop: sparkfleet pins it, as with launch defaults (drift.py);
- a launcher that starts no engine, or another one than the profile's, stops the deploy: the
  profile's recipe.launcher or recipe.launcher_args is wrong.

Everything here is pure (unit-tested without a lab); roles/image/checks.py runs it on the head.
"""
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

CONTAINER_ROOT = "/sfl-drift"  # the recorder's directory inside the container (tools; out/ for records)
CONTAINER_RECIPE = "/sfl-recipe"  # the recipe checkout at the new commit, read-only
ENGINE_COMMANDS = {"vllm": ("vllm", "serve"), "sglang": ("python3", "-m", "sglang.launch_server")}
# Maintained by the shell itself, not set by a launcher.
SHELL_VARS = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})
_FLAG = re.compile(r"^(--[A-Za-z0-9]|-[A-Za-z])")


def recorder_files(root: str = CONTAINER_ROOT) -> dict[str, tuple[str, str]]:
    """{path relative to root: (text, mode)}: the recorder and the engine shims that call it."""
    source = (Path(__file__).resolve().parent / "drift_recorder.py").read_text()

    def shim(kind):
        return f"import sys\nsys.path.insert(0, {root!r})\nimport drift_recorder\nsys.exit(drift_recorder.engine({kind!r}))\n"

    return {
        "drift_recorder.py": (source, "0644"),
        "bin/vllm": ("#!/usr/bin/env python3\n" + shim("vllm"), "0755"),
        "py/sglang/__init__.py": ("", "0644"),
        "py/sglang/launch_server.py": (shim("sglang"), "0644"),
    }


def launcher_path(launcher: str) -> str:
    """An absolute launcher is a path in the image; a relative one is in the recipe checkout."""
    return launcher if launcher.startswith("/") else f"{CONTAINER_RECIPE}/{launcher}"


def launcher_argv(launcher: str, launcher_args: str, engine: str, argv: list[str]) -> list[str]:
    """The launcher's command line: `engine` passes what sparkfleet renders after the engine command
    (the lab's start.sh: `exec vllm serve "$@"`), `flags` the same without the model argument,
    `none` nothing (a launcher that builds the engine's command line from its environment)."""
    rest = list(argv[len(ENGINE_COMMANDS[engine]):])
    if launcher_args == "flags":
        first = next((i for i, w in enumerate(rest) if _FLAG.match(w)), len(rest))
        rest = rest[first:]
    elif launcher_args == "none":
        rest = []
    return [launcher_path(launcher), *rest]


def recorder_run(image: str, env_file: str, mount: str, recipe_src: str, weights_dir: str, argv: list[str],
                 name: str, timeout_s: int = 300) -> str:
    """The shell command that runs the launcher in the image, on the head, without GPU work: no
    network, the rank's environment file, the weights read-only as in production, the recorder."""
    docker = [
        "docker", "run", "--rm", "--pull=never", "--name", name, "--network=none",
        f"--env-file={env_file}",
        f"--volume={mount}:{CONTAINER_ROOT}",
        f"--volume={recipe_src}:{CONTAINER_RECIPE}:ro",
        f"--volume={weights_dir}:/models:ro",
        image, "python3", f"{CONTAINER_ROOT}/drift_recorder.py", "launch", "--", *argv,
    ]
    return f"timeout {int(timeout_s)} {shlex.join(docker)}"


def env_file_values(text: str) -> dict[str, str]:
    """KEY=VALUE lines of a docker --env-file (comments and blank lines skipped)."""
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value
    return out


@dataclass(frozen=True)
class Command:
    command: tuple[str, ...]
    positionals: tuple[str, ...]
    flags: dict  # --name -> [value words tuple, ...] in order of first occurrence, distinct


def parse_command(engine: str, argv: list[str]) -> Command:
    """Split an engine command line: the command (`vllm serve`), the positional arguments before
    the first flag, and every flag with the words that follow it up to the next flag
    (`--x=v` is `--x v`; `--max_num_seqs` is `--max-num-seqs`, as vLLM reads both)."""
    n = len(ENGINE_COMMANDS[engine])
    command, words = tuple(argv[:n]), argv[n:]
    positionals, flags, current = [], {}, None
    for word in words:
        if _FLAG.match(word):
            name, eq, value = word.partition("=")
            name = name.replace("_", "-") if name.startswith("--") else name
            current = [name, [value] if eq else []]
            flags.setdefault(name, [])
            flags[name].append(current)
        elif current is not None:
            current[1].append(word)
        else:
            positionals.append(word)
    distinct = {}
    for name, occurrences in flags.items():
        values = []
        for _, words_ in occurrences:
            if tuple(words_) not in values:
                values.append(tuple(words_))
        distinct[name] = values
    return Command(command, tuple(positionals), distinct)


def _shown(name: str, value: tuple[str, ...]) -> str:
    return shlex.join([name, *value]) if name.startswith("-") else f"{name}={shlex.join(value)}"


@dataclass(frozen=True)
class Finding:
    """One difference on one rank. `accepts`: the recipe_drift_acknowledged entries that explain
    it; `stops`: whether it stops the deploy unless one of them is in data."""
    kind: str  # "run", "command", "positional", "flag", "env"
    name: str
    text: str
    stops: bool
    accepts: tuple[str, ...] = ()
    value: tuple[str, ...] = ()


def _flag_findings(recipe: Command, ours: Command) -> list[Finding]:
    out = []
    for name in sorted(set(recipe.flags) | set(ours.flags)):
        theirs, mine = recipe.flags.get(name, []), ours.flags.get(name, [])
        if set(theirs) == set(mine):
            continue
        if not mine:
            for value in theirs:
                shown = _shown(name, value)
                out.append(Finding("flag", name, f"{shown}: the recipe passes it, sparkfleet does not", True,
                                   (name, f"{name}={' '.join(value)}" if value else name), value))
        elif not theirs:
            shown = " | ".join(_shown(name, v) for v in mine)
            out.append(Finding("flag", name, f"{shown}: sparkfleet passes it, the recipe does not (sparkfleet's own)",
                               False))
        else:
            extra = [v for v in theirs if v not in mine] or theirs
            out.append(Finding(
                "flag", name,
                f"{name}: the recipe passes {' | '.join(shlex.join(v) or '(no value)' for v in extra)}, sparkfleet "
                f"{' | '.join(shlex.join(v) or '(no value)' for v in mine)} (pinned by sparkfleet)", False))
    return out


def _env_findings(rendered: dict[str, str], baseline: dict[str, str], seen: dict[str, str]) -> list[Finding]:
    out = []
    for name in sorted((set(baseline) | set(seen)) - SHELL_VARS):
        before, after = baseline.get(name), seen.get(name)
        if before == after:
            continue
        did = f"the launcher sets {after}" if after is not None else "the launcher unsets it"
        if name in rendered:
            out.append(Finding("env", name, f"{name}: {did}, sparkfleet renders {rendered[name]} "
                                            f"(pinned by sparkfleet to {rendered[name]})", False))
        else:
            had = f" (the image has {before})" if before is not None else ""
            out.append(Finding("env", name, f"{name}: {did}{had}, sparkfleet does not", True, (name,),
                               (after,) if after is not None else ()))
    return out


def rank_findings(engine: str, rendered_argv: list[str], rendered_env: dict[str, str], baseline: dict | None,
                  records: list[dict], exit_status: int | None = None, log_tail: str = "") -> list[Finding]:
    """Every difference on one rank between what the recorder saw and what sparkfleet renders.
    `baseline`: the environment the launcher started with; `records`: what the recorder wrote
    (one per engine start); the last start of the profile's engine is the one compared."""
    expected = ENGINE_COMMANDS[engine]
    starts = [r for r in records if tuple(r.get("argv", [])[:len(expected)]) == expected]
    if not starts:
        if records:
            seen = " / ".join(shlex.join(r.get("argv", [])[:3]) for r in records)
            return [Finding("command", "", f"the launcher started `{seen}`, not `{' '.join(expected)}` (the "
                                          f"profile's engine is {engine})", True)]
        why = f"exited with {exit_status}" if exit_status is not None else "ended"
        tail = f"; its last output: {log_tail.strip()[-600:]}" if log_tail.strip() else ""
        return [Finding("run", "", f"the launcher {why} without starting the engine through `{expected[0]}` on "
                                   f"PATH or sglang.launch_server on PYTHONPATH{tail}", True)]
    record = starts[-1]
    recipe, ours = parse_command(engine, record["argv"]), parse_command(engine, rendered_argv)
    out = []
    if recipe.positionals != ours.positionals:
        out.append(Finding("positional", "", f"model argument: the recipe passes {shlex.join(recipe.positionals) or '(none)'}, "
                                            f"sparkfleet {shlex.join(ours.positionals) or '(none)'} (sparkfleet's own)",
                           False))
    out += _flag_findings(recipe, ours)
    out += _env_findings(rendered_env, (baseline or {}).get("env", {}), record.get("env", {}))
    return out


def exact_report(findings: dict[str, list[Finding]], acknowledged) -> tuple[list[str], list[Finding]]:
    """(one line per difference, naming the ranks that have it; the differences that stop).
    `findings`: rank label -> its findings."""
    acknowledged = set(acknowledged)
    ranks: dict[str, list[str]] = {}
    first: dict[str, Finding] = {}
    for label, items in findings.items():
        for f in items:
            ranks.setdefault(f.text, []).append(label)
            first.setdefault(f.text, f)
    lines, stops = [], []
    for text, labels in ranks.items():
        f = first[text]
        where = "every rank" if len(labels) == len(findings) > 1 else ", ".join(labels)
        if not f.stops:
            lines.append(f"{text} [{where}]")
        elif f.accepts and acknowledged & set(f.accepts):
            lines.append(f"{text} [{where}] (acknowledged in recipe_drift_acknowledged)")
        else:
            lines.append(f"{text} [{where}] ({'NOT adopted' if f.kind == 'flag' else 'NOT pinned' if f.kind == 'env' else 'STOP'})")
            stops.append(f)
    return lines, stops


def stop_message(commit: str, launcher: str, image: str, lines: list[str], stops: list[Finding]) -> str:
    """What the operator reads when exact drift stops the deploy: what, where, and what to do."""
    flags = [f for f in stops if f.kind == "flag"]
    env = [f for f in stops if f.kind == "env"]
    other = [f for f in stops if f.kind not in ("flag", "env")]
    todo = []
    if flags:
        words = [w for f in flags for w in (f.name, *f.value)]
        todo.append(f"adopt {'it' if len(flags) == 1 else 'them'} (data: serving_extra_args: {json.dumps(words)}, or "
                    f"the profile's extra_args) or acknowledge "
                    f"(recipe_drift_acknowledged: {json.dumps([f.accepts[-1] for f in flags])})")
    if env:
        pins = {f.name: f.value[0] for f in env if f.value}
        todo.append(f"pin (serving_env_pins: {json.dumps(pins) if pins else '{...}'}) or acknowledge "
                    f"(recipe_drift_acknowledged: {json.dumps([f.name for f in env])})")
    if other:
        todo.append("check the profile's recipe.launcher and recipe.launcher_args (docs/configuration.md#exact-recipe-drift)")
    stopped = "; ".join(dict.fromkeys(f.text for f in stops))
    return (
        f"exact recipe drift at {commit[:12]}: the recipe's launcher {launcher} (run in {image} with the engine "
        f"replaced by a recorder) differs from what sparkfleet renders: {stopped}. To go on: " + "; ".join(todo)
        + f". {image} is built on the head; nothing was pushed or restarted.\n  " + "\n  ".join(lines)
    )
