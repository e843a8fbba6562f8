#!/usr/bin/env python3
"""sparkfleet exact recipe drift: the recorder that stands in for the engine (never used to serve).

At a recipe bump the head runs the recipe's launcher inside the new image with this directory
mounted (roles/image: check_exact_drift). Two roles, one file, Python 3 standard library only
(it runs on the image's own python3):

  python3 <root>/drift_recorder.py launch -- LAUNCHER [ARG...]
      writes the environment the launcher starts with to <root>/out/baseline.json, puts
      <root>/bin first on PATH (a `vllm` that records) and <root>/py first on PYTHONPATH (an
      `sglang.launch_server` that records), then execs the launcher.
  vllm ... / python3 -m sglang.launch_server ...   (the shims in <root>/bin and <root>/py)
      appends {"argv": [...], "env": {...}} to <root>/out/records.jsonl and exits 0: the engine
      command line and environment the launcher built, with this recorder's own PATH and
      PYTHONPATH entries taken out again.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
ENGINE_COMMANDS = {"vllm": ["vllm"], "sglang": ["python3", "-m", "sglang.launch_server"]}


def our_entries(root):
    """The search-path entries the recorder adds: variable -> directory."""
    return {"PATH": root + "/bin", "PYTHONPATH": root + "/py"}


def launcher_env(environ, root):
    """The launcher's environment: the one it was given, with the recorder's directories first."""
    env = dict(environ)
    for var, entry in our_entries(root).items():
        env[var] = entry + (os.pathsep + environ[var] if environ.get(var) else "")
    return env


def strip_ours(environ, root):
    """`environ` without the recorder's own PATH and PYTHONPATH entries (a variable that held
    nothing else is dropped, as it was unset before the recorder set it)."""
    env = dict(environ)
    for var, entry in our_entries(root).items():
        if var in env:
            parts = [p for p in env[var].split(os.pathsep) if p != entry]
            if parts:
                env[var] = os.pathsep.join(parts)
            else:
                del env[var]
    return env


def engine_argv(kind, argv):
    """The command line as sparkfleet renders it: `vllm ...` or `python3 -m sglang.launch_server ...`."""
    return ENGINE_COMMANDS[kind] + list(argv[1:])


def _write(path, text, mode="w"):
    with open(path, mode) as f:
        f.write(text)


def launch(argv, root=ROOT):
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("drift_recorder: launch needs a launcher", file=sys.stderr)
        return 2
    _write(os.path.join(root, "out", "baseline.json"), json.dumps({"env": dict(os.environ)}))
    try:
        os.execve(argv[0], argv, launcher_env(os.environ, root))
    except OSError as e:
        print("drift_recorder: cannot run the launcher %s: %s" % (argv[0], e), file=sys.stderr)
        return 127


def engine(kind, root=ROOT):
    doc = {"argv": engine_argv(kind, sys.argv), "env": strip_ours(os.environ, root)}
    _write(os.path.join(root, "out", "records.jsonl"), json.dumps(doc) + "\n", "a")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["launch"]:
        print("usage: drift_recorder.py launch -- LAUNCHER [ARG...]", file=sys.stderr)
        sys.exit(2)
    sys.exit(launch(sys.argv[2:]))
