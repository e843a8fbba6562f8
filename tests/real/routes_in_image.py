"""Print the route table of the real vLLM HTTP app, as `vllm serve` builds it for the head's own
command line, with the image's own vLLM (run in the served image by tests/real/test_real_pair.py):
  python routes_in_image.py '<the head container's Cmd as JSON>'
prints one JSON line, {"version": str, "routes": [[method, path], ...]}.

vLLM's own code: the `vllm serve` parser (vllm/entrypoints/cli/serve.py) on the argv, then build_app
(vllm/entrypoints/launchers/app.py, 0.32.0), which registers every router the parsed flags and the
environment select (vllm/entrypoints/launchers/api_server/routers.py), for every task vLLM knows
(vllm/tasks.py): every route any model could give this server. No engine is started.
"""
import json
import sys
import typing


def main():
    argv = json.loads(sys.argv[1])
    import vllm
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.app import build_app
    from vllm.tasks import SupportedTask
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    ServeSubcommand().subparser_init(subparsers)
    args = parser.parse_args(argv[1:])
    app = build_app(args, supported_tasks=tuple(typing.get_args(SupportedTask)), model_config=None)
    routes = sorted({(m, r.path) for r in app.routes for m in (getattr(r, "methods", None) or ["GET"])})
    print(json.dumps({"version": vllm.__version__, "routes": routes}))


if __name__ == "__main__":
    main()
