"""rsync between nodes, bounded: rsync's own --timeout (fanout_rsync_io_timeout_s) gives up on a
peer that sends nothing, and the whole transfer is bounded by fanout_rsync_timeout_s
(sparkfleet/bounded.py). For commands an operation body runs on a node (the kernel-cache merge);
the weights pull goes through sfl_files.py, which takes the I/O timeout as --io-timeout.
Every one carries regular files and directories only, owned by root and without setuid/setgid
bits on arrival (SAFE_RSYNC, sfl_files.py)."""
import shlex

from roles.fanout.sfl_files import SAFE_RSYNC
from sparkfleet.bounded import bounded
from sparkfleet.run_failure import Advice, journal, on_node


def rsync_pull_command(node, url: str, dest: str, step: str, *options: str, source=None) -> str:
    """`rsync -a SAFE_RSYNC [options] URL DEST` on `node` (the receiving one), bounded by its data;
    `source`: the node whose rsync daemon serves `url`, named in the failure's next step."""
    opts = "".join(f" {shlex.quote(o)}" for o in (*SAFE_RSYNC, *options))
    daemon = (f" ({on_node(source.management_address, 'systemctl status sparkfleet-rsyncd')})" if source is not None
              else "")
    return bounded(
        f"rsync -a --timeout={node.fanout_rsync_io_timeout_s}{opts} {shlex.quote(url)} {shlex.quote(dest)}",
        step=step, host=node.name, limit_s=node.fanout_rsync_timeout_s, key="fanout_rsync_timeout_s",
        advice=Advice(
            log=journal(source.management_address if source is not None else node.management_address,
                        "sparkfleet-rsyncd"),
            key="fanout_rsync_port",
            next_step=f"read rsync's own error above; check that the rsync daemon serving {url} runs{daemon} "
                      f"and that {node.name} reaches it over the fabric; a re-run resumes from what arrived"),
    )
