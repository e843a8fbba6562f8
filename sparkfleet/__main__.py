"""sparkfleet command line: `python -m sparkfleet config INVENTORY` prints the validated config per host;
`python -m sparkfleet docs` writes docs/data-keys.md from the config model."""
import argparse
import sys

import yaml

from sparkfleet.inventory import load_cluster
from sparkfleet.refusal import Refusal


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkfleet")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("config", help="print the merged, validated config of every host")
    show.add_argument("inventory", help="inventory file, e.g. inventory.py or lab/inventory.py")
    show.add_argument("--host", help="only this host")
    sub.add_parser("docs", help="write docs/data-keys.md from the config model's field descriptions")
    args = parser.parse_args(argv)

    if args.command == "docs":
        from sparkfleet import datadoc  # only this command needs it

        print(f"sparkfleet: wrote {datadoc.write().relative_to(datadoc.ROOT)}")
        return 0

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
