"""sparkfleet command line: `python -m sparkfleet config INVENTORY` prints the validated config per host;
`python -m sparkfleet docs` writes docs/data-keys.md from the config model; `python -m sparkfleet plan
INVENTORY` prints what a deploy would do and changes nothing (exit 0 nothing, 2 changes, 1 error);
`python -m sparkfleet capture INVENTORY` writes every fact the deploy and the doctor read, per node, into
one bundle (read-only; exit 0 written, 1 not)."""
import argparse
import sys



def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkfleet")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("config", help="print the merged, validated config of every host")
    show.add_argument("inventory", help="inventory file, e.g. inventory.py or lab/inventory.py")
    show.add_argument("--host", help="only this host")
    sub.add_parser("docs", help="write docs/data-keys.md from the config model's field descriptions")
    plan = sub.add_parser("plan", help="what a deploy would do, changing nothing: exit 0 nothing, 2 changes, 1 error")
    plan.add_argument("inventory", help="inventory file, e.g. inventory.py or lab/inventory.py")
    plan.add_argument("pyinfra_args", nargs=argparse.REMAINDER,
                      help="passed to the deploy as given, e.g. --data serving_recipe_commit=<sha> or --limit")
    capture = sub.add_parser("capture", help="read-only: every fact command the deploy and the doctor read, run on "
                             "every node, raw outputs in one bundle (no secret): exit 0 written, 1 not")
    capture.add_argument("inventory", help="inventory file of the machines to capture")
    capture.add_argument("--out", help="the bundle's path (default: sparkfleet-capture-<UTC time>.json here)")
    args = parser.parse_args(argv)

    if args.command == "capture":
        from sparkfleet import capture as capture_command  # only this command needs it

        return capture_command.main(args.inventory, args.out)

    if args.command == "plan":
        from sparkfleet import plan_command  # only this command needs it

        return plan_command.main(args.inventory, args.pyinfra_args)

    if args.command == "docs":
        from sparkfleet import datadoc  # only this command needs it

        print(f"sparkfleet: wrote {datadoc.write().relative_to(datadoc.ROOT)}")
        return 0

    import yaml  # the commands above start without the config model (a plan's time is the deploy's own)

    from sparkfleet.inventory import load_cluster
    from sparkfleet.refusal import Refusal

    try:
        cluster = load_cluster(args.inventory)
    except Refusal as err:
        print(err.block(), file=sys.stderr)
        return 2
    data = cluster.as_data()
    if args.host:
        if args.host not in data:
            print(f"sparkfleet: no host {args.host!r} in {args.inventory} ({', '.join(data)})", file=sys.stderr)
            return 2
        data = {args.host: data[args.host]}
    yaml.safe_dump(data, sys.stdout, sort_keys=False, default_flow_style=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
