"""Data of roles/watchdog: the per-node watchdog that keeps the serving pair serving (sfl_watch.py).

Part of sparkfleet/config.py's NodeConfig; the checks across keys (and across roles: the start-up
grace and the window against serving_health_timeout_s) are watchdog_problems(), run with the other
cluster checks before any connection. The node-side program's own defaults (sfl_watch.py DEFAULTS)
match these.
"""
from pydantic import BaseModel, Field

from sparkfleet.refusal import Problem, shared_key_problems

# Where roles/watchdog installs the program, its config and its unit on every node.
SFL_WATCH = "/usr/local/libexec/sparkfleet/sfl_watch.py"
WATCH_CONFIG = "/etc/sparkfleet/watchdog.json"
WATCH_UNIT = "sparkfleet-watchdog"
# The module of each node's read-only rsync daemon (roles/fanout) that serves <watchdog_state_dir>.
RSYNC_MODULE = "watchdog"


class WatchdogData(BaseModel):
    watchdog_enabled: bool = Field(
        True, description="run `sparkfleet-watchdog` on every node: the head probes the pair with a real completion "
        "and restarts it as one when it stops serving, each worker follows the head (false: the unit is stopped and "
        "disabled, the rsync module `watchdog` is not served; the doctor still probes). The same on every node. See "
        "docs/watchdog.md#keeping-the-pair-serving"
    )
    watchdog_interval_s: int = Field(
        30, ge=5, description="seconds between the head's probes (a 1-token completion through the API, every rank's "
        "container and processes)"
    )
    watchdog_probe_timeout_s: int = Field(
        30, ge=1, description="bound on the probe's completion (`max_tokens: 1`); a hang is seen after "
        "`watchdog_failures_before_restart` x (`watchdog_interval_s` + this)"
    )
    watchdog_failures_before_restart: int = Field(
        3, ge=1, description="consecutive failed probes before the pair restarts (a container not running, a stopped "
        "process or a rank restarted alone is judged at once, grace or not)"
    )
    watchdog_stall_s: int = Field(
        60, ge=1, description="with requests in hand, how long the engine's token and request counters may stay flat "
        "before a failed probe counts as a failure: longer than the engine's longest step (a long prompt's prefill, "
        "`max_num_batched_tokens` at a time, rises no counter until it ends); a hang with work in hand is seen this "
        "much later. Engines without counters: unused"
    )
    watchdog_max_restarts: int = Field(
        3, ge=1, description="restarts that did not end the failure (the pair not serving again, or failing again "
        "within `watchdog_recovered_after_s`) within `watchdog_window_s` after which the watchdog gives up: the pair "
        "is stopped, and the journal, `make status` and `make doctor` say why"
    )
    watchdog_window_s: int = Field(
        7200, ge=60, description="the window restarts are counted in; refused unless it holds "
        "`watchdog_max_restarts` cold starts (`serving_health_timeout_s` each) with their backoffs and failed "
        "probes, or a pair that never comes back would never be given up on"
    )
    watchdog_backoff_s: int = Field(
        60, ge=0, description="a restart waits this x 2^f after the previous one ended, f being the restarts in the "
        "window that did not end the failure (this again after one that held)"
    )
    watchdog_recovered_after_s: int = Field(
        600, ge=0, description="a restart ended the failure only if the pair then served this long before failing "
        "again; one that did not counts toward `watchdog_max_restarts` like a restart that never served"
    )
    watchdog_startup_grace_s: int = Field(
        1200, ge=0, description="seconds after the head unit starts in which a failed completion is not judged (a "
        "cold start); refused below `serving_health_timeout_s`; a container not running, a stopped process or a rank "
        "restarted alone is judged at once"
    )
    watchdog_state_dir: str = Field(
        "/var/lib/sparkfleet/watchdog", pattern=r"^/", description="where each node's watchdog keeps `state.json`, "
        "served read-only to the peers by the fabric rsync daemon (module `watchdog`)"
    )
    watchdog_follow_interval_s: int = Field(
        5, ge=1, description="seconds between a worker's reads of the head's state"
    )


# The pair has one watchdog: the head's config carries the follow interval its staleness bound is
# computed from, and a worker whose watchdog is off never restarts when the head asks. Each node
# keeps its own state directory (the peers read it through the rsync module, not by path).
SHARED_WATCHDOG_KEYS = tuple(k for k in WatchdogData.model_fields if k != "watchdog_state_dir")


def hang_seen_after_s(node) -> int:
    """Seconds after which the head's watchdog calls a pair that stopped answering hung (and restarts
    it): watchdog_failures_before_restart probes, each up to watchdog_probe_timeout_s, one every
    watchdog_interval_s, after watchdog_stall_s of flat counters when requests are in hand (the
    engine's counters are read on both engines sparkfleet serves: roles/watchdog/node_config.py)."""
    return node.watchdog_stall_s + node.watchdog_failures_before_restart * (
        node.watchdog_interval_s + node.watchdog_probe_timeout_s)


def give_up_span_s(node) -> int:
    """Seconds from the first of watchdog_max_restarts restarts of a pair that never comes back to the
    judgement that gives up (sfl_watch.py Head.tick): each restart waits up to serving_health_timeout_s
    for the pair (a cold start); restart k >= 2 starts once watchdog_failures_before_restart probes
    failed again and its backoff (watchdog_backoff_s x 2^(k-1)) passed; the give-up needs those
    failed probes once more. All of it must fall within watchdog_window_s."""
    failed_probes = hang_seen_after_s(node)
    restarts = node.watchdog_max_restarts
    waits = sum(max(failed_probes, node.watchdog_backoff_s * 2 ** (k - 1)) for k in range(2, restarts + 1))
    return restarts * node.serving_health_timeout_s + waits + failed_probes


def watchdog_problems(nodes) -> list[Problem]:
    """What the schema alone cannot refuse: one watchdog setting for the pair, a start-up grace that
    covers a cold start, and a window that holds watchdog_max_restarts of them (else a pair that
    never comes back is restarted forever, never given up on)."""
    problems: list[Problem] = shared_key_problems(
        nodes, SHARED_WATCHDOG_KEYS, "the pair has one watchdog: the head drives it and every worker follows")
    if problems:
        return problems
    for n in nodes:
        if not n.watchdog_enabled:
            continue
        if n.watchdog_startup_grace_s < n.serving_health_timeout_s:
            problems.append(Problem(
                f"key 'watchdog_startup_grace_s' = {n.watchdog_startup_grace_s}: must be at least "
                f"serving_health_timeout_s ({n.serving_health_timeout_s}): a cold start that the deploy waits for "
                f"would be judged failed, and the pair restarted, before it could serve", [n.name],
                key="watchdog_startup_grace_s",
                fix=f"set watchdog_startup_grace_s to {n.serving_health_timeout_s} or more (or lower "
                    f"serving_health_timeout_s)",
            ))
        span = give_up_span_s(n)
        if n.watchdog_window_s <= span:
            problems.append(Problem(
                f"key 'watchdog_window_s' = {n.watchdog_window_s}: must be more than {span} s, what "
                f"watchdog_max_restarts ({n.watchdog_max_restarts}) restarts of a pair that never comes back take "
                f"before the give-up ({n.watchdog_max_restarts} x serving_health_timeout_s "
                f"{n.serving_health_timeout_s}, the backoffs of watchdog_backoff_s {n.watchdog_backoff_s} and "
                f"watchdog_stall_s + watchdog_failures_before_restart x (watchdog_interval_s + "
                f"watchdog_probe_timeout_s) between them); with less the first restart leaves the window first, "
                f"and the watchdog never gives up",
                [n.name], key="watchdog_window_s",
                fix=f"set watchdog_window_s above {span} (or lower watchdog_max_restarts, watchdog_backoff_s or "
                    f"serving_health_timeout_s)",
            ))
    return problems
