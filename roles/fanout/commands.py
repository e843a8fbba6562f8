"""rsync between nodes, bounded: rsync's own --timeout (fanout_rsync_io_timeout_s) gives up on a
peer that sends nothing, and the whole transfer is bounded by fanout_rsync_timeout_s
(sparkfleet/bounded.py). For commands an operation body runs on a node (the kernel-cache merge);
the weights pull goes through sfl_files.py, which takes the I/O timeout as --io-timeout.
Every one carries regular files and directories only, owned by root and without setuid/setgid
bits on arrival (SAFE_RSYNC, sfl_files.py)."""
import shlex

from roles.fanout.sfl_files import SAFE_RSYNC
from sparkfleet.bounded import bounded


def rsync_pull_command(node, url: str, dest: str, step: str, *options: str) -> str:
    """`rsync -a SAFE_RSYNC [options] URL DEST` on `node` (the receiving one), bounded by its data."""
    opts = "".join(f" {shlex.quote(o)}" for o in (*SAFE_RSYNC, *options))
    return bounded(
        f"rsync -a --timeout={node.fanout_rsync_io_timeout_s}{opts} {shlex.quote(url)} {shlex.quote(dest)}",
        step=step, host=node.name, limit_s=node.fanout_rsync_timeout_s, key="fanout_rsync_timeout_s",
    )
