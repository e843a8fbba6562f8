"""`make status`: what the serving pair is doing now, read-only (status.py, like doctor.py).

Per pair: the probe (`sfl_watch.py probe` on the head, as the watchdog and the doctor run it: a real
completion through the API) and its latency; the API's TLS (/health through the proxy, its certificate
verified with the node's trust bundle, that bundle's fingerprint, the certificate's days left); each rank's unit (active, enabled), container and its
uptime, and the image it runs; each node's watchdog (unit, verdict, generation, restarts in the
window, its last actions); the recipe commit the pair serves (the running image's tag) and what the
head's history (<preflight_data_dir>/recipes/<profile>.history) says of it; the latest benchmark receipt against
the previous one, each figure that dropped by more than receipt_drop_threshold_pct flagged DROP; with
monitoring on, the live figures from the monitoring node's Prometheus (tokens/s, queue, KV cache,
TTFT p50/p95 over 5 minutes, firing alerts). It judges nothing and
changes nothing: `make doctor` is the verdict.
"""
import re
import shlex

from pyinfra import logger
from pyinfra.facts.server import Command

from sparkfleet.model.engine_proof import engine_proof_path, proven_version
from sparkfleet.model.image import history_path
from roles.kernel_cache.checks import commit_of
from roles.monitoring.checks import LiveFigures, live_line, monitoring_node
from roles.receipt.receipt import Receipts, receipt_path
from roles.receipt.receipt import status_lines as receipt_lines
from roles.router import control
from roles.router.node_config import router_node
from roles.serving.facts import UnitState
from roles.tls.checks import ServedTls
from roles.tls.checks import status_line as tls_status_line
from roles.serving.history import RecipeHistory, history_file, last_event, same_commit
from roles.watchdog.facts import RankContainer, WatchdogUnit, WatchProbe, WatchStatus
from sparkfleet.inventory import cluster_from_state, fleet_from_state
from sparkfleet.model.engine import unit_name
from sparkfleet.model.serving import node_profile
from sparkfleet.model.tls import api_base, ca_bundle_path
from sparkfleet.model.watchdog import WATCH_UNIT
from sparkfleet.once import active_hosts, fleet_hosts, once_per_fleet, once_per_run


ACTIONS_SHOWN = 5


def duration(seconds) -> str:
    """42 s, 7 min 05 s, 3 h 02 min, 2 d 4 h."""
    try:
        s = int(seconds)
    except (TypeError, ValueError):
        return "?"
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def probe_latency(line: str) -> str | None:
    m = re.search(r"completion in ([0-9.]+) s", line or "")
    return f"{m[1]} s" if m else None


def rank_line(node, unit: dict, container: dict) -> str:
    role = "head" if node.is_head else "worker"
    text = (f"{role:<6} {unit_name(node)} {unit.get('active') or '?'}, {unit.get('enabled') or 'not installed'} at boot; "
            f"container {container.get('status') or '?'}")
    if container.get("status") == "running":
        text += f", up {duration(container.get('up_s'))} (since {container.get('started_at')})"
    if container.get("image") and container.get("image") != "-":
        text += f"; image {container['image']}"
    return text


def watchdog_lines(node, unit: dict, status: dict) -> list[str]:
    """The node's watchdog in one line, then its last actions (oldest first)."""
    if not node.watchdog_enabled:
        return [f"off (watchdog_enabled is false); {WATCH_UNIT} {unit.get('active') or '?'}"]
    st = status.get("state") or {}
    verdict = status.get("verdict") or (status.get("text") or "").strip() or f"status exit {status.get('rc')}"
    if status.get("rc") == "absent":
        verdict = "not installed (deploy)"
    head = ""
    if node.is_head and st:
        probe = st.get("last_probe") or {}
        head = (f"; generation {st.get('generation')}, want {st.get('want')}, {len(st.get('restarts') or [])} restart(s) "
                f"in the window" + (f"; its last probe {'ok' if probe.get('ok') else 'failed'} at {probe.get('at')}"
                                    f" (latency {probe.get('latency_s')} s)" if probe else ""))
    out = [f"{WATCH_UNIT} {unit.get('active') or '?'}: {verdict}{head}"]
    for action in (st.get("actions") or [])[-ACTIONS_SHOWN:]:
        out.append(f"  {action.get('at')}  {action.get('what')}")
    if not st.get("actions") and status.get("rc") != "absent":
        out.append("  (no action yet)")
    return out


def recipe_line(profile, events, container: dict) -> str:
    """The recipe commit the head runs (its image's tag), what the history says of it, and the
    history's last event when it is another (a failed upgrade, a rollback)."""
    running = commit_of(container.get("image") or "")
    if not running:
        text = "unknown (the head's container is not running)"
    else:
        served = last_event(events, running, "served")
        text = running + (f", last served {served.time or '(time not recorded)'}" if served else
                          ", never recorded as served")
        if not same_commit(running, profile.recipe.commit):
            text += f"; data names {profile.recipe.commit}"
    last = events[-1] if events else None
    if last and not (last.event == "served" and same_commit(last.commit, running)):
        text += f"; last in the history: {last.event} {last.commit} at {last.time or '(time not recorded)'}"
    return text


def engine_line(profile, proof: str | None, container: dict) -> str:
    """The engine version the head's running image ships, as the in-image proof (roles/engine_proof,
    step 7a) recorded it for that image."""
    running = container.get("image") or ""
    version = proven_version(proof, running) if running else None
    if version:
        return f"{profile.engine} {version} (read by the image's own engine at its last deploy)"
    return f"{profile.engine}, version not recorded for {running or 'the running image'} (no engine proof of it)"


def status_lines(cluster, profile, probe: dict, units: dict, containers: dict, watch_units: dict,
                 statuses: dict, events, receipts: list | None = None, live: dict | None = None,
                 proof: str | None = None, tls: dict | None = None) -> list[str]:
    """The report, from facts (node name -> fact value); pure, for the tests."""
    head = cluster.head
    names = " + ".join(n.name for n in cluster.nodes)
    what = f"serving group {cluster.group} ({names})" if cluster.group not in (None, "pair") else f"pair {names}"
    lines = [f"{what}: profile {profile.name} ({profile.engine}), {profile.api_model_name!r} on port {profile.port}"]
    latency = probe_latency(probe.get("line", ""))
    result = probe.get("line") or "no answer"
    if probe.get("rc") == "absent":
        result = "not installed (deploy)"
    lines.append(f"  {'probe':<9} {head.name:<10} {result}" + (f"  [latency {latency}]" if latency else ""))
    lines.append(f"  {'tls':<9} {head.name:<10} {tls_status_line(head, api_base(head, profile.port), tls)}")
    for node in cluster.nodes:
        lines.append(f"  {'rank':<9} {node.name:<10} {rank_line(node, units.get(node.name, {}), containers.get(node.name, {}))}")
    for node in cluster.nodes:
        first, *rest = watchdog_lines(node, watch_units.get(node.name, {}), statuses.get(node.name, {}))
        lines.append(f"  {'watchdog':<9} {node.name:<10} {first}")
        lines += [f"  {'':<9} {'':<10} {r}" for r in rest]
    lines.append(f"  {'recipe':<9} {head.name:<10} {recipe_line(profile, events, containers.get(head.name, {}))}")
    lines.append(f"  {'engine':<9} {head.name:<10} {engine_line(profile, proof, containers.get(head.name, {}))}")
    first, *rest = receipt_lines(receipts or [], head.receipt_drop_threshold_pct)
    lines.append(f"  {'receipt':<9} {head.name:<10} {first}")
    lines += [f"  {'':<9} {'':<10} {r}" for r in rest]
    if head.monitoring_enabled:
        lines.append(f"  {'live':<9} {head.name:<10} {live_line(live, head.serving_group)}")
    return lines


def _status(state) -> None:
    cluster = cluster_from_state(state)
    profile = node_profile(cluster.head)
    hosts = {h.name: h for h in active_hosts(state)}
    units, containers, watch_units, statuses = {}, {}, {}, {}
    for name, h in hosts.items():
        node = cluster.node(name)
        units[name] = h.get_fact(UnitState, unit=unit_name(node))
        containers[name] = h.get_fact(RankContainer, unit=unit_name(node))
        watch_units[name] = h.get_fact(WatchdogUnit)
        statuses[name] = h.get_fact(WatchStatus)
    head = hosts.get(cluster.head.name)
    probe = head.get_fact(WatchProbe) if head else {"line": f"{cluster.head.name} not in this run"}
    events = head.get_fact(RecipeHistory, path=history_file(cluster.head, profile),
                           deployed=history_path(cluster.head, profile)) if head else []
    receipts = head.get_fact(Receipts, directory=receipt_path(cluster.head, profile)) if head else []
    proof = head.get_fact(Command, command=f"cat {shlex.quote(engine_proof_path(cluster.head))} 2>/dev/null || true") \
        if head else None
    monitor = monitoring_node(fleet_from_state(state))
    prom = state.inventory.get_host(monitor.name) if monitor else None
    live = (prom.get_fact(LiveFigures, group=cluster.head.serving_group, port=monitor.monitoring_prometheus_port)
            if prom is not None and prom.name in {h.name for h in fleet_hosts(state)} else None)
    tls = (head.get_fact(ServedTls, api=api_base(cluster.head, profile.port), bundle=ca_bundle_path(cluster.head),
                         port=profile.port) if head and cluster.head.tls_enabled else None)
    lines = status_lines(cluster, profile, probe, units, containers, watch_units, statuses, events, receipts, live,
                         proof, tls)
    logger.info("--> sparkfleet status (read-only):\n" + "\n".join(lines) + "\n")


def _router_status(state) -> None:
    """The router's verdict on every group it routes to (router_node set and in this run): a row per
    group, routed, unhealthy, draining or drained."""

    router = router_node(fleet_from_state(state))
    if router is None or router.name not in {h.name for h in fleet_hosts(state)}:
        return
    groups = control.groups_by_url(fleet_from_state(state), router)
    try:
        rows = [f"  {groups.get(b['url'], '-'):<8} {b['url']:<28} {b['state']}"
                for b in control.routing(state.inventory.get_host(router.name))]
    except control.RouterError as e:
        rows = [f"  not answering: {e}"]
    # The router's gate as a client reaches it: https://<the router node's address>:router_port/health, its
    # certificate verified with the node's trust bundle (roles/tls), and for how long it is valid.
    api = api_base(router, router.router_port)
    served = (state.inventory.get_host(router.name).get_fact(ServedTls, api=api, bundle=ca_bundle_path(router),
                                                               port=router.router_port) if router.tls_enabled else None)
    rows.append(f"  {'gate':<8} {tls_status_line(router, api, served)}")
    logger.info(f"--> sparkfleet router on {router.name} (read-only):\n" + "\n".join(rows) + "\n")


def run_status(state) -> None:
    """Every host loads status.py; the report is gathered, and printed, once per serving group; the
    router's routing once per run."""
    once_per_run(state, "status", lambda: _status(state))
    once_per_fleet(state, "status-router", lambda: _router_status(state))
