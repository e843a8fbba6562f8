"""Serve the real vLLM's HTTP app, as `vllm serve` builds it for sparkfleet's rendered head command,
with no engine behind it, and print its route table.

Run by the vLLM parity virtualenv's python (tests/parity/vllm.txt), never by the project's:
  routes_vllm.py PORT < {"argv": ["vllm", "serve", MODEL, ...], "env": {...}}
prints one JSON line, {"version": str, "routes": [[method, path], ...]}, then serves on
127.0.0.1:PORT until killed.

What runs is vLLM's own code: the `vllm serve` parser (vllm/entrypoints/cli/serve.py) on the argv,
then build_app (vllm/entrypoints/launchers/app.py), which registers every router the parsed flags and
environment select (vllm/entrypoints/launchers/api_server/routers.py) and vLLM's own middleware, its
key check among them (vllm/entrypoints/serve/middleware/register.py, authenticate.py). The app is
built for every task vLLM knows (vllm/tasks.py), so the table holds every route any model could
give the server. No engine client is attached: a route that gets past the key check fails in its
handler (500), which is what the caller wants to tell apart from a 401.
"""
import json
import os
import sys
import typing
from pathlib import Path

# The checker the parity tier and the deploy's in-image proof share (roles/engine_proof/files).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "roles" / "engine_proof" / "files"))
from check_vllm import install_spark_platform, serve_parser  # noqa: E402


def main():
    port = int(sys.argv[1])
    case = json.load(sys.stdin)
    os.environ.update(case["env"])
    install_spark_platform()
    import uvicorn
    import vllm
    from vllm.entrypoints.launchers.app import build_app
    from vllm.tasks import SupportedTask

    args = serve_parser().parse_args(case["argv"][1:])
    tasks = tuple(typing.get_args(SupportedTask))
    app = build_app(args, supported_tasks=tasks, model_config=None)
    routes = []
    for route in app.routes:
        for method in sorted(getattr(route, "methods", None) or ["GET"]):
            routes.append([method, route.path])
    print(json.dumps({"version": vllm.__version__, "routes": routes}), flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, lifespan="off", log_level="critical")


if __name__ == "__main__":
    main()
