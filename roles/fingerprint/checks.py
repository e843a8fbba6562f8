"""Whether the nodes of a group share their fingerprint: a refusal with a table at prepare, doctor rows.

Pure functions over {node name: fingerprint} (roles/fingerprint/facts.py) so the table and the
verdicts have unit tests; `check_fingerprint` and `doctor_rows` read the live facts.
"""
from pyinfra import logger

from roles.fingerprint.facts import Fingerprint
from sparkfleet.model.engine import unit_name
from sparkfleet.model.monitoring import TEXTFILE_DIR
from sparkfleet.render import render
from sparkfleet.model.fingerprint import FINGERPRINT_FIELDS
from sparkfleet.model.serving import node_profile
from sparkfleet.inventory import cluster_from_state
from sparkfleet.once import active_hosts, once_per_run, per_host
from sparkfleet.refusal import Problem, Refusal

# The image's fields are roles/image's to bring into line: it pulls the head's image onto every
# worker whose image ID differs and checks the IDs after. Refusing them before it runs would keep
# the deploy from repairing a stale worker, so only the doctor (after a deploy) compares them.
IMAGE_FIELDS = ("image_id", "engine", "nccl")
# A node without Docker gets `docker_package` from roles/docker: no version to compare before it.
INSTALLED_BY_THE_DEPLOY = ("docker",)

FIX = {
    "kernel": "boot {nodes} into kernel {value} (or the other way round)",
    "gpu_driver": "install GPU driver {value} on {nodes} (or the other way round)",
    "cx7_firmware": "flash CX7 firmware {value} on {nodes} (or the other way round; mlxfwmanager, then a reboot)",
    "docker": "install Docker {value} on {nodes} (or the other way round)",
    "image_id": "deploy again: roles/image ships the head's image ({value}) to {nodes}",
    "engine": "deploy again: roles/image ships the head's image ({value}) to {nodes}",
    "nccl": "deploy again: roles/image ships the head's image ({value}) to {nodes}",
}


def must_match(nodes) -> list[str]:
    """The fields a group checks: every field any of its nodes lists, in the fingerprint's order."""
    listed = {f for node in nodes for f in node.fingerprint_must_match}
    return [f for f in FINGERPRINT_FIELDS if f in listed]


def shown(field: str, value: str | None) -> str:
    if value is None:
        return "-"
    return value[:19] if field == "image_id" else value  # sha256: and 12 hex, as `docker images` shows


def mismatches(prints: dict[str, dict], fields, absent_ok=()) -> list[str]:
    """The fields on which the nodes differ. Absent everywhere is a match; absent on some nodes and
    present on others is not, except for the `absent_ok` fields (only present values are compared)."""
    out = []
    for field in fields:
        values = [fp.get(field) for fp in prints.values()]
        if field in absent_ok:
            values = [v for v in values if v is not None]
        if len(set(values)) > 1:
            out.append(field)
    return out


def table(prints: dict[str, dict], marked, checked) -> str:
    """Rows = fields, columns = nodes; `!` marks a must-match field the nodes differ on, and fields
    no node must match are shown in parentheses."""
    names = list(prints)
    cells = [["", "field", *names]]
    for field in FINGERPRINT_FIELDS:
        label = field if field in checked else f"({field})"
        cells.append(["!" if field in marked else "", label, *(shown(field, prints[n].get(field)) for n in names)])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def problems(prints: dict[str, dict], fields, reference: str, absent_ok=()) -> list[Problem]:
    """One problem per differing field, naming the nodes that differ from `reference` (the group's
    first node: the head builds the image and serves the API) and how to make them match."""
    out = []
    for field in mismatches(prints, fields, absent_ok):
        ref = reference
        if field in absent_ok and prints[ref].get(field) is None:
            ref = next(n for n, fp in prints.items() if fp.get(field) is not None)
        want = prints[ref].get(field)
        nodes = [n for n, fp in prints.items() if fp.get(field) != want
                 and not (field in absent_ok and fp.get(field) is None)]
        values = {shown(field, prints[n].get(field)) for n in nodes}
        found = (values.pop() if len(values) == 1
                 else ", ".join(f"{shown(field, prints[n].get(field))} on {n}" for n in nodes))
        fix = FIX[field].format(nodes=", ".join(nodes), value=shown(field, want))
        out.append(Problem(
            f"{field} {found}, {ref} has {shown(field, want)}", nodes, key="fingerprint_must_match",
            fix=f"{fix}, or drop '{field}' from fingerprint_must_match",
        ))
    return out


def group_verdict(prints: dict[str, dict], fields, absent_ok=()) -> Refusal | None:
    """The refusal of a group whose nodes differ on a must-match field, or None when they match."""
    found = problems(prints, fields, next(iter(prints)), absent_ok)
    if not found:
        return None
    marked = mismatches(prints, fields, absent_ok)
    return Refusal(
        f"the nodes' fingerprints differ on {', '.join(marked)} (fingerprint_must_match); nothing was changed",
        found, "fingerprint (! differs, - absent, (field) not must-match):\n" + table(prints, marked, fields),
    )


def summary(prints: dict[str, dict], fields, skipped) -> str:
    present = [f for f in fields if any(fp.get(f) is not None for fp in prints.values())]
    absent = [f for f in fields if f not in present]
    line = f"{len(prints)} nodes match on {', '.join(present) or 'nothing present'}"
    if absent:
        line += f"; absent on every node: {', '.join(absent)}"
    if skipped:
        line += f"; {', '.join(skipped)} checked after roles/image ships the head's image (and by the doctor)"
    return line


def fingerprints(state, hosts=None) -> dict[str, dict]:
    """{node name: fingerprint} of the given hosts (every active host by default), in rank order,
    one fact per node, all nodes at once."""
    cluster = cluster_from_state(state)

    def one(node_host):
        node = cluster.node(node_host.name)
        profile = node_profile(node)
        return node_host.get_fact(Fingerprint, netdev=node.fabric_netdev, ref=profile.image_ref, engine=profile.engine)

    hosts = sorted(active_hosts(state) if hosts is None else hosts, key=lambda h: cluster.node(h.name).rank)
    return once_per_run(state, "fingerprint:" + ",".join(h.name for h in hosts), lambda: per_host(state, one, hosts))


def groups(state) -> list[list]:
    """The serving groups, as lists of hosts: today one inventory serves one model across all its nodes."""
    return [active_hosts(state)]


def _check(state) -> None:
    cluster = cluster_from_state(state)
    for group in groups(state):
        prints = fingerprints(state, group)
        fields = must_match(cluster.node(name) for name in prints)
        prepare_fields = [f for f in fields if f not in IMAGE_FIELDS]
        refusal = group_verdict(prints, prepare_fields, absent_ok=INSTALLED_BY_THE_DEPLOY)
        if refusal:
            raise refusal
        skipped = [f for f in fields if f in IMAGE_FIELDS]
        logger.info(f"--> sparkfleet fingerprint: {summary(prints, prepare_fields, skipped)}")


def check_fingerprint(state) -> None:
    """Prepare time, before any change: refuse a group whose nodes differ on a must-match field."""
    once_per_run(state, "fingerprint-check", lambda: _check(state))


def note(fp: dict) -> str:
    return ", ".join(f"{field} {shown(field, fp.get(field))}" for field in FINGERPRINT_FIELDS)


def doctor_rows(state) -> list[tuple[str, str, list[str], str]]:
    """A `fingerprint` row per node: its values; failing where it differs from the group's first
    node on a must-match field (every field, the image's included: after a deploy they all match)."""
    cluster = cluster_from_state(state)
    rows = []
    for group in groups(state):
        prints = fingerprints(state, group)
        fields = must_match(cluster.node(name) for name in prints)
        reference = next(iter(prints))
        found = problems(prints, fields, reference)
        for name, fp in prints.items():
            mine = [f"{p}; {p.fix}" for p in found if name in p.hosts]
            rows.append(("fingerprint", name, mine, note(fp)))
    return rows


# Monitoring on: each node writes its fingerprint now for the node exporter's textfile collector, every
# monitoring_fingerprint_interval_s (sfl_fingerprint.py, the program the deploy's fact parses with).
METRICS_UNIT = "sparkfleet-fingerprint-metrics"
METRICS_SCRIPT = "/usr/local/lib/sparkfleet/sfl_fingerprint.py"
METRICS_TEXTFILE = f"{TEXTFILE_DIR}/sparkfleet-fingerprint.prom"


def metrics_files(node) -> dict[str, str]:
    """{path: text} of the fingerprint timer and its service on `node`; none with monitoring off."""
    if not node.monitoring_enabled:
        return {}
    base = f"/etc/systemd/system/{METRICS_UNIT}"
    return {
        f"{base}.service": render("fingerprint", f"{base}.service", script=METRICS_SCRIPT, netdev=node.fabric_netdev,
                                  engine=node_profile(node).engine, container=unit_name(node),
                                  textfile=METRICS_TEXTFILE),
        f"{base}.timer": render("fingerprint", f"{base}.timer", interval_s=node.monitoring_fingerprint_interval_s),
    }
