"""docs/security.md's listener table against `ss -ltnup` (issue 43 item 10): sparkfleet/listeners.py's
parser, tests/listeners.py's reading of the table and its comparison, on `ss -ltnup` captured from the
lab's deployed hosts (tests/unit/fixtures/ss/, tests/unit/fixtures/README.md). The same comparison runs
live on the lab in tests/real/test_real_monitoring.py and tests/fleet/test_lab_fleet.py.
"""
from dataclasses import replace
from pathlib import Path

import pytest

from sparkfleet.inventory import load_cluster
from sparkfleet.listeners import Socket, parse_ss
from tests.listeners import (SECURITY_DOC, capture_header, check_host, compare, host_context, parse_on,
                             table_rows)

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = sorted((Path(__file__).parent / "fixtures" / "ss").glob("*.txt"))
# Captures taken before a change of what listens there: each test of them expected to fail (strict: once
# the lab is captured again and the capture replaced, the marker must go).
STALE: dict[str, str] = {}


def captures_param():
    return [pytest.param(c, id=c.stem, marks=[pytest.mark.xfail(reason=STALE[c.stem], strict=True)]
                         if c.stem in STALE else []) for c in CAPTURES]
# Each tier's inventory: what was deployed on the lab when its hosts were captured.
INVENTORIES = {"real": "lab/inventory_vllm_cpu.py", "fleet": "lab/inventory_fleet.py"}


def lab_test_listeners() -> set[Socket]:
    """Sockets of the lab tiers' own tests, not of a deployed node: tests/real/test_real_monitoring.py's
    webhook catcher on the head's loopback, at the port of lab/inventory_vllm_cpu.py's ALERT_WEBHOOK
    (the real tier's capture was taken while its drills ran; the live test runs before them)."""
    import runpy
    from urllib.parse import urlsplit

    webhook = urlsplit(runpy.run_path(str(ROOT / INVENTORIES["real"]))["ALERT_WEBHOOK"])
    return {Socket("tcp", webhook.hostname, webhook.port, ("python3",))}


def captured(path: Path) -> list[Socket]:
    """The capture's sockets less the lab tests' own (lab_test_listeners)."""
    return [s for s in parse_ss(path.read_text()) if s not in lab_test_listeners()]


def tier_host(path: Path) -> tuple[str, str]:
    tier, _, host = path.stem.partition("-")
    return tier, host


def cluster_of(tier: str):
    return load_cluster(ROOT / INVENTORIES[tier], cwd=str(ROOT))


def context_of(path: Path):
    tier, host = tier_host(path)
    return host_context(cluster_of(tier), host)


def test_the_parser_reads_ss_with_and_without_netid_header_and_process():
    text = """Netid State  Recv-Q Send-Q Local Address:Port  Peer Address:PortProcess
udp   UNCONN 0      0         127.0.0.53%lo:53         0.0.0.0:*    users:(("systemd-resolve",pid=501,fd=13))
tcp   LISTEN 0      4096            0.0.0.0:8000       0.0.0.0:*    users:(("haproxy",pid=8,fd=7),("haproxy",pid=9,fd=7))
tcp   LISTEN 0      128                [::]:22            [::]:*    users:(("sshd",pid=61,fd=4))
tcp   LISTEN 0      4096                  *:9100             *:*
"""
    assert parse_ss(text) == [Socket("udp", "127.0.0.53", 53, ("systemd-resolve",)),
                              Socket("tcp", "0.0.0.0", 8000, ("haproxy", "haproxy")),
                              Socket("tcp", "::", 22, ("sshd",)), Socket("tcp", "*", 9100, ())]
    # -H and one type (the doctor's `ss -Hltnp`): no Netid column, no header
    assert parse_ss(['LISTEN 0 5 198.19.77.1:873 0.0.0.0:* users:(("rsync",pid=3,fd=4))']) == [
        Socket("tcp", "198.19.77.1", 873, ("rsync",))]
    assert parse_ss("# role: head\n") == [] and Socket("tcp", "*", 1, ()).process == "?"


def test_the_doctor_s_fact_reads_through_the_same_parser():
    from roles.api_proxy.checks import Listeners

    lines = ['LISTEN 0 4096 [::1]:9090 [::]:* users:(("prometheus",pid=7,fd=7))',
             'LISTEN 0 4096 127.0.0.53%lo:53 0.0.0.0:* users:(("systemd-resolve",pid=5,fd=14))']
    assert Listeners().process(lines) == [("::1", 9090, "prometheus"), ("127.0.0.53", 53, "systemd-resolve")]


def test_the_table_s_rows_read_as_their_fixed_form():
    rows = {r.service.split(" (")[0]: r for r in table_rows()}
    api = rows["OpenAI-compatible API"]
    assert (api.roles, api.binds, api.ports, api.processes, api.key) == (
        {"head"}, ("all addresses",), ((8000, "tcp"),), {"haproxy"}, "port")
    alertmanager = rows["Alertmanager"]
    assert alertmanager.when == ("monitoring_enabled", "monitoring_alertmanager_enabled")
    assert alertmanager.binds == ("127.0.0.1",) and alertmanager.required
    assert rows["GPU exporter"].roles == {"GPU node"} and rows["GPU exporter"].ports == ((9401, "tcp"),)
    assert not rows["the fabric speed proof's TCP server"].required  # only while a proof runs
    # every port of sparkfleet's is a data key, whose default is the table's port
    from sparkfleet.config import NodeConfig

    for row in table_rows():
        if row.key and row.key not in ("port", "master_port"):
            assert NodeConfig.model_fields[row.key].default == row.ports[0][0], row.service


def test_a_cell_outside_the_form_is_refused_naming_what_is_allowed():
    with pytest.raises(ValueError, match="unknown role.*'the head'.*allowed: every node, head"):
        parse_on("the head")
    with pytest.raises(ValueError, match="none of"):
        parse_on("head; sometimes")
    text = SECURITY_DOC.read_text().replace("| head | all addresses | 8000/tcp", "| head | everywhere | 8000/tcp", 1)
    with pytest.raises(ValueError, match="bind 'everywhere'"):
        table_rows(text)


@pytest.mark.parametrize("capture", captures_param())
def test_the_table_explains_every_captured_socket_and_every_required_row_listens(capture):
    text = capture.read_text()
    tier, host = tier_host(capture)
    context = context_of(capture)
    # the capture's own header says the roles the inventory gives that host
    said = {w.split(" (")[0].strip() for w in capture_header(text)["role"].split(",")}
    assert said == context.roles - {"every node"}, (said, context.roles)
    differences = check_host(text, cluster_of(tier), host)
    # what no row explains is the lab tests' own listener, and nothing else
    assert set(differences.unexplained) <= lab_test_listeners() and not differences.missing, \
        f"{capture.name}:\n{differences}"
    assert not compare(captured(capture), table_rows(), context)


def _applies_somewhere(row) -> list[Path]:
    """The captures in which `row` explains a socket."""
    from tests.listeners import applies, explains, resolved_ports

    found = []
    for capture in (c for c in CAPTURES if c.stem not in STALE):
        context = context_of(capture)
        mine = [r for r in table_rows() if applies(r, context)]
        fixed = {(p, proto) for r in mine for p, proto in resolved_ports(r, context) if p is not None}
        if any(explains(row, s, context, fixed) for s in captured(capture)):
            found.append(capture)
    return found


@pytest.mark.parametrize("index", range(len(table_rows())), ids=lambda i: table_rows()[i].service[:40])
def test_removing_a_row_that_explains_a_captured_socket_fails_the_comparison(index):
    rows = table_rows()
    row = rows[index]
    where = _applies_somewhere(row)
    if not where:
        pytest.skip(f"no capture has a socket of this row ({'/'.join(sorted(row.roles))}"
                    f"{'; when ' + ', '.join(row.when) if row.when else ''})")
    without = rows[:index] + rows[index + 1:]
    for capture in where:
        differences = compare(captured(capture), without, context_of(capture))
        assert differences.unexplained, f"{capture.name}: without {row.service!r} every socket is still explained"


def test_an_engine_port_beyond_loopback_and_a_missing_listener_are_both_found():
    capture = next(c for c in CAPTURES if "head" in capture_header(c.read_text())["role"] and c.stem not in STALE)
    context, rows = context_of(capture), table_rows()
    sockets = captured(capture)
    engine = next(s for s in sockets if s.port == context.ports["api_proxy_engine_port"])
    # the engine's own port on every address: no row explains it, not even the engine's ephemeral ones
    exposed = compare(sockets + [engine._replace(address="0.0.0.0")], rows, context)
    assert [(s.address, s.port) for s in exposed.unexplained] == [("0.0.0.0", engine.port)] and not exposed.missing
    # the API proxy gone: its row (8000) has no socket
    no_api = compare([s for s in sockets if s.port != context.ports["port"]], rows, context)
    assert [(r.service.split(" (")[0], p) for r, p, _ in no_api.missing] == [("OpenAI-compatible API", 8000)]
    # a row's port comes from data: the same sockets with api_proxy_engine_port moved leave 18000 unexplained
    moved = replace(context, ports={**context.ports, "api_proxy_engine_port": 18001})
    assert any(s.port == engine.port for s in compare(sockets, rows, moved).unexplained)


def test_a_head_s_listener_on_a_worker_is_explained_by_no_row():
    capture = next(c for c in CAPTURES if capture_header(c.read_text())["role"] == "worker" and c.stem not in STALE)
    context = context_of(capture)
    sockets = captured(capture)
    api = Socket("tcp", "0.0.0.0", 8000, ("haproxy",))  # the API proxy left on a node that is no head
    assert compare(sockets + [api], table_rows(), context).unexplained == [api]


def test_the_router_nodes_rows_explain_the_gate_and_smg_on_loopback_and_nothing_beyond():
    """spark-a's capture (the router node, captured with the gate in place): the gate, HAProxy, on every
    address at router_port and smg on loopback at router_smg_port, as captured, are explained by the
    table with nothing missing; smg on every address, as before the gate, would not be; and with smg's
    socket gone its row is missing."""
    capture = next(c for c in CAPTURES if c.stem == "fleet-spark-a")
    context = context_of(capture)
    assert "router node" in context.roles
    ports = context.ports
    sockets = captured(capture)
    gate = [Socket("tcp", "0.0.0.0", ports["router_port"], ("haproxy",)),
            Socket("tcp", "127.0.0.1", ports["router_smg_port"], ("python",))]
    assert [s for s in sockets if s.port in (ports["router_port"], ports["router_smg_port"])] == \
        sorted(gate, key=sockets.index), sockets  # as captured, and nothing else at either port
    differences = compare(sockets, table_rows(), context)
    assert not differences.unexplained and not differences.missing, differences
    others = [s for s in sockets if s not in gate]
    old = Socket("tcp", "0.0.0.0", ports["router_smg_port"], ("python",))  # smg on every address
    assert compare(others + [gate[0], old], table_rows(), context).unexplained
    missing = compare(others + gate[:1], table_rows(), context).missing
    assert [p for _, p, _ in missing] == [ports["router_smg_port"]]
