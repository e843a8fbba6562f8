"""Host settings of roles/host, checked on the machines: the file the deploy wrote, and the value the
running daemon or kernel uses (a file logind never re-read, or sysctl never applied, would prove nothing)."""
from sparkfleet.model.host import LOGIND_DROP_IN, MEMORY_SYSCTL_DROP_IN, memory_sysctls
from sparkfleet.render import render


def test_the_logind_drop_in_is_the_rendered_one(host, node):
    drop_in = host.file(LOGIND_DROP_IN)
    assert drop_in.exists and drop_in.user == "root" and drop_in.mode == 0o644, f"{node.name}: {LOGIND_DROP_IN}"
    assert drop_in.content_string == render("host", LOGIND_DROP_IN, node=node), f"{node.name}: {LOGIND_DROP_IN} differs"


def test_logind_runs_with_the_remove_ipc_data_gives(host, node):
    out = host.run("busctl get-property org.freedesktop.login1 /org/freedesktop/login1 "
                   "org.freedesktop.login1.Manager RemoveIPC")
    assert out.rc == 0, f"{node.name}: logind not reachable: {out.stderr}"
    want = "b true" if node.host_logind_remove_ipc else "b false"
    assert out.stdout.strip() == want, f"{node.name}: logind RemoveIPC is {out.stdout.strip()!r}, data says {want!r}"


def test_the_memory_reserve_is_the_one_data_sets_in_the_drop_in_and_in_the_running_kernel(host, node):
    """Where data sets the kernel's memory reserve: the drop-in as rendered and the live value of each
    setting (a drop-in a later-sorted file overrides at boot shows here); where it sets none (the lab's
    data: docs/operations.md), no drop-in was written."""
    sysctls = memory_sysctls(node)
    drop_in = host.file(MEMORY_SYSCTL_DROP_IN)
    if not sysctls:
        assert not drop_in.exists, f"{node.name}: {MEMORY_SYSCTL_DROP_IN} exists though data sets no memory reserve"
        return
    assert drop_in.exists and drop_in.user == "root" and drop_in.mode == 0o644, f"{node.name}: {MEMORY_SYSCTL_DROP_IN}"
    assert drop_in.content_string == render("host", MEMORY_SYSCTL_DROP_IN, node=node, sysctls=sysctls), \
        f"{node.name}: {MEMORY_SYSCTL_DROP_IN} differs"
    for name, value in sysctls.items():
        live = host.run(f"sysctl -n {name}")
        assert live.rc == 0 and live.stdout.strip() == str(value), \
            f"{node.name}: {name} is {live.stdout.strip() or live.stderr.strip()!r}, data says {value}"
