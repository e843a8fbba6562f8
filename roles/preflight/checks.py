"""Hard requirements a node must meet before sparkfleet changes anything, and the facts table."""
from pyinfra import logger
from pyinfra.api.exceptions import DeployError

from roles.preflight.facts import NodeFacts, PortHalf
from sparkfleet.fabric_others import conflict_failures, fabric_others, renderer_state
from sparkfleet.inventory import cluster_from_state
from sparkfleet.model.fabric import RENDERER_UNITS
from sparkfleet.model.known_bad import Finding, known_bad_findings
from sparkfleet.once import active_hosts, at_once, group_slot, once_per_run, per_host


def requirement_failures(node, facts: dict) -> list[str]:
    """Every hard requirement `node` fails, each naming the host, the number found and the number needed."""
    failures = []
    arch = facts.get("arch", "unknown")
    if arch not in node.preflight_allowed_archs:
        failures.append(
            f"{node.name}: architecture {arch}; allowed (preflight_allowed_archs): "
            f"{', '.join(node.preflight_allowed_archs)}"
        )
    mem = facts.get("mem_total_gib")
    if mem is None or mem < node.preflight_min_mem_total_gib:
        found = "unknown" if mem is None else f"{mem:.2f} GiB"
        failures.append(
            f"{node.name}: MemTotal {found}; needs >= {node.preflight_min_mem_total_gib:.2f} GiB "
            f"(preflight_min_mem_total_gib)"
        )
    free = facts.get("disk_free_gib")
    if free is None or free < node.preflight_min_free_disk_gib:
        found = "unknown" if free is None else f"{free:.1f} GiB"
        failures.append(
            f"{node.name}: {found} free on {facts.get('disk_path', node.preflight_data_dir)} "
            f"(for {node.preflight_data_dir}); needs >= {node.preflight_min_free_disk_gib:.1f} GiB "
            f"(preflight_min_free_disk_gib)"
        )
    if node.gpu_expected and not facts.get("gpu"):
        failures.append(
            f"{node.name}: no GPU visible to nvidia-smi, but gpu_expected is true (a DGX Spark shows NVIDIA GB10)"
        )
    if "netdev_mtu" not in facts:
        failures.append(
            f"{node.name}: fabric netdev {node.fabric_netdev} does not exist (fabric_netdev); "
            f"check the cable and `ibdev2netdev`"
        )
    cabled = cabled_port_failures(node, facts)
    # With the cable in the other port the data's halves are down: that is the one thing to fix.
    failures += cabled or port_failures(node, facts)
    failures += known_bad_failures(node, facts)
    if not facts.get("netplan"):
        failures.append(f"{node.name}: netplan is not installed; the fabric is configured with netplan")
    unit = RENDERER_UNITS[node.netplan_renderer]
    if facts.get("renderer_state") != "active":
        failures.append(
            f"{node.name}: {unit} is {facts.get('renderer_state') or 'unknown'}, but netplan_renderer is "
            f"{node.netplan_renderer}; the renderer's service must be active"
        )
    return failures


# What the field measured with one half of the port: nccl-tests busbw 98 Gb/s with one HCA, 161 Gb/s
# with both (a back-to-back GX10 pair); NVIDIA/dgx-spark-playbooks #102: both HCAs reach the cable's
# maximum (23.74 GB/s busbw with NCCL 2.28.9-1).
ONE_HALF_COST = "NCCL would run over one half of the port: about half of what the cable carries"
# A DGX Spark BIOS older than 2026-04 wires the second CX7 controller at Gen5 x2.
BIOS_FIX = "update the BIOS (`fwupdmgr refresh && fwupdmgr update`, then a power cycle); measure nothing before"


def port_failures(node, facts: dict) -> list[str]:
    """Both halves of the CX7 port: the twin netdev present; each RDMA device present, its port
    Active, its PCIe controller linked at full width (facts from NodeFacts)."""
    failures = []
    if node.fabric_twin_netdev and "twin_mtu" not in facts:
        failures.append(
            f"{node.name}: the port's twin {node.fabric_twin_netdev} does not exist (fabric_twin_netdev); "
            f"{ONE_HALF_COST}. Check `ibdev2netdev`, or set fabric_twin_netdev = None to run on one half"
        )
    hcas = facts.get("hcas", {})
    bios = " ".join(v for v in (facts.get("bios_version"), facts.get("bios_date")) if v) or "unknown"
    for key, hca in (("rdma_hca", node.rdma_hca), ("rdma_twin_hca", node.rdma_twin_hca)):
        if not hca:
            continue
        dev = hcas.get(hca)
        if dev is None:
            continue  # facts from before the port was read (a recorded fact without it)
        if not dev["present"]:
            failures.append(f"{node.name}: RDMA device {hca} ({key}) does not exist; `ibdev2netdev` lists the "
                            f"port's devices" + (f"; {ONE_HALF_COST}" if key == "rdma_twin_hca" else ""))
            continue
        if "ACTIVE" not in dev["state"].upper():
            failures.append(f"{node.name}: RDMA device {hca} ({key}) port 1 is {dev['state'] or 'unknown'!r}, not "
                            f"'4: ACTIVE' (is the cable in, and the peer up?)"
                            + (f"; {ONE_HALF_COST}" if key == "rdma_twin_hca" else ""))
        width = dev["width"]
        if width is not None and width < node.preflight_min_pcie_link_width:
            failures.append(
                f"{node.name}: RDMA device {hca} ({key}) links at PCIe x{width}"
                f"{' of x' + str(dev['max_width']) if dev['max_width'] else ''} ({dev['speed'] or 'speed unknown'}), "
                f"needs x{node.preflight_min_pcie_link_width} (preflight_min_pcie_link_width); BIOS {bios}: a DGX Spark "
                f"BIOS older than 2026-04 wires the second CX7 controller at x2; {BIOS_FIX}"
            )
    return failures


def _known_bad_line(node, facts: dict, finding: Finding) -> str:
    entry = finding.entry
    evidence = f"; {finding.evidence}" if finding.evidence else ""
    condition = f" without {entry.unless_off}=off on /proc/cmdline" if entry.unless_off else ""
    return f"{node.name}: kernel {facts['kernel']}{condition} is known bad ({entry.id}): {entry.breaks}{evidence}"


def known_bad_failures(node, facts: dict) -> list[str]:
    """Each entry of the known-bad table (sparkfleet/model/known_bad.py) the node matches and data does not
    acknowledge: what breaks, the evidence the node shows, the remedy, the way to acknowledge, the sources."""
    return [f"{_known_bad_line(node, facts, f)}. Fix: {f.entry.remedy}; or acknowledge it with your reason "
            f"(preflight_known_bad_acknowledged: {{\"{f.entry.id}\": \"...\"}}). Sources: {'; '.join(f.entry.sources)}"
            for f in known_bad_findings(facts, node.preflight_known_bad_acknowledged) if f.acknowledged is None]


def known_bad_warnings(node, facts: dict) -> list[str]:
    """Each known-bad entry the node matches that data acknowledges, with the reason given: logged, not refused."""
    return [f"{_known_bad_line(node, facts, f)}; acknowledged in preflight_known_bad_acknowledged: {f.acknowledged}"
            for f in known_bad_findings(facts, node.preflight_known_bad_acknowledged) if f.acknowledged is not None]


def _ports(facts: dict) -> dict[str, list[PortHalf]]:
    """Port -> its halves, the first controller's first (enp1s0... before enP2p1s0..., whatever order
    sysfs or a paste listed them in)."""
    out: dict[str, list[PortHalf]] = {}
    for half in sorted(facts.get("ports", []), key=lambda h: h.netdev.lower()):
        out.setdefault(half.port, []).append(half)
    return out


def _shown(halves: list[PortHalf]) -> str:
    return ", ".join(f"{h.netdev}/{h.hca or '-'} {'up' if h.up else 'down'}" for h in halves)


def port_note(facts: dict) -> str:
    """Each CX7 port as the node shows it, for the doctor: `port 0: enp1s0f0np0/rocep1s0f0 up, ...`."""
    ports = _ports(facts)
    return "; ".join(f"port {p}: {_shown(hs)}" for p, hs in sorted(ports.items())) or "no RDMA device"


def cabled_port_failures(node, facts: dict) -> list[str]:
    """The cable in the other QSFP port: every half of the port data names (the one fabric_netdev is in)
    down while a half of another port is up. Names the data keys to set, each with the other port's half
    on the same PCIe controller. A node whose fabric netdev is not a CX7 half (the lab's veth) or that
    shows no port up anywhere (the port checks name that) passes."""
    ports = _ports(facts)
    mine = next((h for hs in ports.values() for h in hs if h.netdev == node.fabric_netdev), None)
    if mine is None or any(h.up for h in ports[mine.port]):
        return []
    live = [p for p, hs in sorted(ports.items()) if p != mine.port and any(h.up for h in hs)]
    if not live:
        return []
    there = ports[live[0]]
    wanted = []
    for key, value, field in (("fabric_netdev", node.fabric_netdev, "netdev"),
                              ("fabric_twin_netdev", node.fabric_twin_netdev, "netdev"),
                              ("rdma_hca", node.rdma_hca, "hca"), ("rdma_twin_hca", node.rdma_twin_hca, "hca")):
        half = next((h for h in ports[mine.port] if value and getattr(h, field) == value), None)
        other = half and next((h for h in there if h.controller == half.controller), None)
        if other and getattr(other, field):
            wanted.append(f"{key} = {getattr(other, field)!r}")
    keys = f"set {', '.join(wanted)}, or " if wanted else ""
    return [f"{node.name}: the cable is in CX7 port {live[0]} ({_shown(there)}), not in port {mine.port}, which data "
            f"names ({_shown(ports[mine.port])}); {keys}move the cable to port {mine.port}"]


def _gib(value) -> str:
    return "?" if value is None else f"{value:.1f}"


def facts_table(rows: list[tuple]) -> str:
    """One compact table: a row per node, sorted by rank. rows: (node, facts, failures)."""
    header = ("host", "rank", "os", "kernel", "arch", "mem GiB total/avail", "free GiB", "gpu", "fabric", "verdict")
    lines = [header]
    for node, facts, failures in sorted(rows, key=lambda r: r[0].rank):
        fabric = (
            f"{node.fabric_netdev} mtu {facts['netdev_mtu']} {facts['netdev_state']}"
            if "netdev_mtu" in facts
            else f"{node.fabric_netdev} missing"
        )
        if node.fabric_twin_netdev:
            fabric += (f", {node.fabric_twin_netdev} mtu {facts['twin_mtu']} {facts['twin_state']}"
                       if "twin_mtu" in facts else f", {node.fabric_twin_netdev} missing")
        lines.append(
            (
                node.name,
                str(node.rank),
                facts.get("os", "?"),
                facts.get("kernel", "?"),
                facts.get("arch", "?"),
                f"{_gib(facts.get('mem_total_gib'))}/{_gib(facts.get('mem_available_gib'))}",
                f"{_gib(facts.get('disk_free_gib'))} {facts.get('disk_path', '')}".strip(),
                facts.get("gpu") or "none",
                fabric,
                "ok" if not failures else f"FAIL ({len(failures)})",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def preflight_rows(state) -> list[tuple]:
    """(node, facts, failures) for every active node, once per run; read-only, never raises on a failure."""
    with group_slot(state, "preflight-rows") as slot:
        if slot.done:
            return slot.value
        cluster = cluster_from_state(state)

        def node_facts(node_host):
            node = cluster.node(node_host.name)
            return node_host.get_fact(NodeFacts, data_dir=node.preflight_data_dir, netdev=node.fabric_netdev,
                                      twin=node.fabric_twin_netdev or "", hcas=" ".join(node.rdma_hcas))

        # Every node's facts and the fabric's other configurations, all at once.
        facts, others = at_once(lambda: per_host(state, node_facts), lambda: fabric_others(state))
        rows = []
        for node_host in active_hosts(state):
            node = cluster.node(node_host.name)
            raw_others, configs = others[node_host.name]
            # The renderer's unit state comes with the other configurations (one systemctl, not two).
            f = {**facts[node_host.name], "renderer_state": renderer_state(node, raw_others)}
            rows.append((node, f, requirement_failures(node, f) + conflict_failures(node, configs)))
        return slot.fill(rows)


def _gather_and_check(state) -> dict[str, dict]:
    rows = preflight_rows(state)
    logger.info("--> sparkfleet preflight:\n" + facts_table(rows) + "\n")
    for node, facts, _ in rows:
        for warning in known_bad_warnings(node, facts):
            logger.warning(f"--> sparkfleet preflight: {warning}")
    failures = [f for _, _, fs in rows for f in fs]
    if failures:
        raise DeployError("preflight failed, nothing was changed:\n  " + "\n  ".join(failures))
    return {node.name: facts for node, facts, _ in rows}


def gather_and_check(state) -> dict[str, dict]:
    """Every active node's facts by name; raises DeployError (before any change) on a hard failure."""
    return once_per_run(state, "preflight", lambda: _gather_and_check(state))
