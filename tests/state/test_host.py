"""Host settings of roles/host, checked on the machines: the file the deploy wrote, and the value the
running daemon uses (a file logind never re-read would prove nothing)."""
from sparkfleet.model.host import LOGIND_DROP_IN
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
