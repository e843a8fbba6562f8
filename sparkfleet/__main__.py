"""sparkfleet command line (`sparkfleet`, or `python -m sparkfleet`):
`deploy INVENTORY` validates, prints the plan, asks once (or takes --yes) and deploys with pyinfra's -y;
`plan INVENTORY` prints what a deploy would do and changes nothing; `config INVENTORY` prints the validated
config per host; `capture INVENTORY` writes every fact the deploy and the doctor read, per node, into one
bundle (read-only); `unlock INVENTORY` breaks a deploy lock whose holder's SSH session has ended; `docs` writes docs/data-keys.md from the config model; `--version`.

Every command that acts on machines takes the inventory as its argument: none has a default, so none
reaches the lab (lab/inventory.py) or any machine unnamed. Exit status: sparkfleet/exit_codes.py."""
import argparse
import os
import sys
from pathlib import Path

from sparkfleet.exit_codes import FAILED, OK

REPO = Path(__file__).resolve().parent.parent
LAB_INVENTORY = "lab/inventory.py"


class Parser(argparse.ArgumentParser):
    """argparse, its usage error exiting 1 (argparse's 2 is a plan's "changes": sparkfleet/exit_codes.py)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(FAILED, f"{self.prog}: error: {message}\n")


class Version(argparse.Action):
    """`--version`: the installed package's version and the checkout's commit, read only when asked."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print sparkfleet's version and commit, and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from sparkfleet.capture import version  # the bundle's own record of it

        found = version()
        commit = f" (commit {found['commit']})" if found["commit"] != "unknown" else ""
        print(f"sparkfleet {found['version']}{commit}")
        parser.exit(OK)


def inventory_file(given: str) -> str | None:
    """The inventory as the pyinfra runs (started in the checkout) find it: relative to the checkout when
    it is inside it, else absolute. None when there is no such file: pyinfra would take the name for a
    host to connect to."""
    path = Path(given).resolve()
    if not path.is_file():
        print(f"sparkfleet: no inventory file {given!r} (from {os.getcwd()}): name your machines' inventory, "
              f"e.g. inventory.py, the front of your site (docs/configuration.md; the lab's is {LAB_INVENTORY})",
              file=sys.stderr)
        return None
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def cli_data(pyinfra_args: list[str]) -> tuple[dict, list[str]]:
    """The `--data KEY=VALUE` overrides (parsed as pyinfra parses them) and `--group-data DIR`s among the
    pyinfra arguments, so that validation sees the data the run will."""
    from pyinfra_cli.util import parse_cli_arg

    overrides, group_data, args = {}, [], iter(pyinfra_args)
    for arg in args:
        option, equals, value = arg.partition("=")
        if option not in ("--data", "--group-data"):
            continue
        value = value if equals else next(args, "")
        if option == "--group-data":
            group_data.append(value)
        elif "=" in value:
            key, text = value.split("=", 1)
            overrides[key] = parse_cli_arg(text)
    return overrides, group_data


def validated(inventory: str, pyinfra_args: list[str] = ()):
    """The validated cluster of the inventory with the run's --data and --group-data, or None with the
    refusal printed as one block (the block pyinfra's own run prints)."""
    from sparkfleet.inventory import load_cluster
    from sparkfleet.refusal import Refusal

    overrides, group_data = cli_data(list(pyinfra_args))
    try:
        return load_cluster(REPO / inventory, cwd=str(REPO), overrides=overrides, group_data_dirs=group_data)
    except Refusal as err:
        print(err.block(), file=sys.stderr)
        return None


def main(argv=None) -> int:
    parser = Parser(prog="sparkfleet", description="sparkfleet: DGX Spark pairs provisioned and proven",
                    epilog="exit status: 0 done or nothing to change, 1 not done (refused, failed, not "
                           "confirmed, bad usage), 2 plan only: a deploy would change something")
    parser.add_argument("-V", "--version", action=Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    example = (f"inventory file of the machines: inventory.py (the front of your site: $SPARKFLEET_SITE, else site/) "
               f"or SITE/inventory.py (the lab's: {LAB_INVENTORY})")
    deploy = sub.add_parser(
        "deploy", help="validate, print the plan, ask once (or --yes), then deploy with pyinfra -y: any failure "
        "stops the whole run; exit 0 deployed or nothing to change, 1 not",
        description="The plan printed is the plan of that moment: the deploy reads the facts again and prints "
                    "its own plan table before any operation; that is what runs.")
    deploy.add_argument("inventory", help=example)
    deploy.add_argument("--yes", "-y", action="store_true", help="deploy the plan without asking (no terminal "
                        "needs this: without it and a terminal nothing is deployed)")
    deploy.add_argument("pyinfra_args", nargs=argparse.REMAINDER,
                        help="passed to the plan and the deploy as given, e.g. --data KEY=VALUE or --limit")
    plan = sub.add_parser("plan", help="what a deploy would do, changing nothing: exit 0 nothing, 2 changes, 1 error")
    plan.add_argument("inventory", help=example)
    plan.add_argument("pyinfra_args", nargs=argparse.REMAINDER,
                      help="passed to the deploy as given, e.g. --data serving_recipe_commit=<sha> or --limit")
    show = sub.add_parser("config", help="print the merged, validated config of every host: exit 0, 1 refused")
    show.add_argument("inventory", help=example)
    show.add_argument("--host", help="only this host")
    capture = sub.add_parser("capture", help="read-only: every fact command the deploy and the doctor read, run on "
                             "every node, raw outputs in one bundle (no secret): exit 0 written, 1 not")
    capture.add_argument("inventory", help=example)
    capture.add_argument("--out", help="the bundle's path (default: sparkfleet-capture-<UTC time>.json here)")
    unlock = sub.add_parser("unlock", help="break the deploy lock a dead run left: only where its holder's SSH "
                            "session on the node has ended; a live holder is named and left alone: exit 0 none "
                            "live, 1 a live holder (or unreachable)")
    unlock.add_argument("inventory", help=example)
    unlock.add_argument("--host", help="only this host")
    sub.add_parser("docs", help="write docs/data-keys.md from the config model's field descriptions")
    args = parser.parse_args(argv)

    if args.command == "docs":
        from sparkfleet import datadoc  # only this command needs it

        print(f"sparkfleet: wrote {datadoc.write().relative_to(datadoc.ROOT)}")
        return OK

    inventory = inventory_file(args.inventory)
    if inventory is None:
        return FAILED

    if args.command == "capture":
        from sparkfleet import capture as capture_command  # only this command needs it

        return capture_command.main(inventory, args.out)

    if args.command == "unlock":
        from sparkfleet import unlock_command  # only this command needs it

        cluster = validated(inventory)
        if cluster is None:
            return FAILED
        return unlock_command.main(inventory, args.host, list(cluster.as_data()))

    if args.command == "plan":
        from sparkfleet import plan_command  # only this command needs it

        return plan_command.main(inventory, args.pyinfra_args)

    if args.command == "deploy":
        from sparkfleet import deploy_command

        extra = [arg for arg in args.pyinfra_args if arg not in deploy_command.YES_FLAGS]
        if validated(inventory, extra) is None:
            return FAILED
        yes = args.yes or len(extra) < len(args.pyinfra_args)
        return deploy_command.main(inventory, extra, yes=yes)

    import yaml  # the commands above start without the config model (a plan's time is the deploy's own)

    cluster = validated(inventory)
    if cluster is None:
        return FAILED
    data = cluster.as_data()
    if args.host:
        if args.host not in data:
            print(f"sparkfleet: no host {args.host!r} in {args.inventory} ({', '.join(data)})", file=sys.stderr)
            return FAILED
        data = {args.host: data[args.host]}
    yaml.safe_dump(data, sys.stdout, sort_keys=False, default_flow_style=False)
    return OK


if __name__ == "__main__":
    sys.exit(main())
