"""roles/host: host settings every node needs for a pair to stay up, each a file the deploy writes
(templates/ mirrors the target path) and a state test checks; applied only when the file changes."""
from io import StringIO

from pyinfra import host, state
from pyinfra.operations import server

from sparkfleet.model.host import LOGIND_DROP_IN, MEMORY_SYSCTL_DROP_IN, memory_sysctls
from sparkfleet import unchanged
from sparkfleet.inventory import cluster_from_state
from sparkfleet.render import render

cluster = cluster_from_state(state)
node = cluster.node(host.name)

# 1. logind keeps the engines' IPC across SSH logouts (RemoveIPC=no); logind reads it when it restarts.
unchanged.directory(name="Create /etc/systemd/logind.conf.d", path="/etc/systemd/logind.conf.d", mode="0755")
logind = unchanged.put(
    name=f"Write {LOGIND_DROP_IN} (RemoveIPC)",
    src=StringIO(render("host", LOGIND_DROP_IN, node=node)),
    dest=LOGIND_DROP_IN,
    user="root",
    group="root",
    mode="0644",
)
# try-restart: logind restarts in place (sessions survive it since systemd 230); not started if absent.
server.shell(
    name="Restart systemd-logind (its drop-in changed)",
    commands=["systemctl try-restart systemd-logind.service"],
    _if=logind.did_change,
)

# 2. The kernel's free-memory reserve, only what data sets (nothing by default: docs/operations.md). The
#    drop-in is what boots apply (systemd-sysctl); `sysctl -p` applies it now, when it changed. With data
#    unset again, a drop-in an earlier deploy wrote stays (docs/operations.md: remove it by hand).
sysctls = memory_sysctls(node)
if sysctls:
    unchanged.directory(name="Create /etc/sysctl.d", path="/etc/sysctl.d", mode="0755")
    reserve = unchanged.put(
        name=f"Write {MEMORY_SYSCTL_DROP_IN} ({', '.join(sysctls)})",
        src=StringIO(render("host", MEMORY_SYSCTL_DROP_IN, node=node, sysctls=sysctls)),
        dest=MEMORY_SYSCTL_DROP_IN,
        user="root",
        group="root",
        mode="0644",
    )
    server.shell(
        name=f"Apply {MEMORY_SYSCTL_DROP_IN} (it changed)",
        commands=[f"sysctl -p {MEMORY_SYSCTL_DROP_IN}"],
        _if=reserve.did_change,
    )
