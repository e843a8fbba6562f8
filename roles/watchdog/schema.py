"""Data of roles/watchdog: the per-node watchdog that keeps the serving pair serving (sfl_watch.py).

Not yet part of sparkfleet/config.py's NodeConfig (nor of README.md's data table): the deploy does
not install the watchdog yet. The node-side program's own defaults (sfl_watch.py DEFAULTS) match these.
"""
from pydantic import BaseModel, Field

# Where roles/watchdog installs the program, its config and its unit on every node.
SFL_WATCH = "/usr/local/libexec/sparkfleet/sfl_watch.py"
WATCH_CONFIG = "/etc/sparkfleet/watchdog.json"
WATCH_UNIT = "sparkfleet-watchdog"
# The module of each node's read-only rsync daemon (roles/fanout) that serves <watchdog_state_dir>.
RSYNC_MODULE = "watchdog"


class WatchdogData(BaseModel):
    watchdog_enabled: bool = Field(
        True, description="run sparkfleet-watchdog on every node: the head probes the pair with a real completion "
        "and restarts it as one when it stops serving; each worker follows the head"
    )
    watchdog_interval_s: int = Field(
        30, ge=5, description="seconds between the head's probes (a 1-token completion through the API, every "
        "rank's container and processes)"
    )
    watchdog_probe_timeout_s: int = Field(
        30, ge=1, description="bound on the probe's completion; a hang is seen after watchdog_failures_before_restart "
        "x (watchdog_interval_s + this)"
    )
    watchdog_failures_before_restart: int = Field(
        3, ge=1, description="consecutive failed probes before the pair restarts"
    )
    watchdog_max_restarts: int = Field(
        3, ge=1, description="restarts within watchdog_window_s after which the watchdog gives up: it stops the "
        "pair and says why in the journal, in make status and in make doctor"
    )
    watchdog_window_s: int = Field(
        7200, ge=60, description="the window the restarts are counted in; keep it above watchdog_max_restarts x "
        "(serving_health_timeout_s + the backoffs), or a pair that never comes back is never given up on"
    )
    watchdog_backoff_s: int = Field(
        60, ge=0, description="the k-th restart within the window waits this x 2^(k-1) after the previous one ended"
    )
    watchdog_startup_grace_s: int = Field(
        1200, ge=0, description="seconds after the head unit starts during which a failed completion is not judged "
        "(a cold start: keep it at least serving_health_timeout_s); a container not running, a stopped process or a "
        "rank restarted alone is judged at once"
    )
    watchdog_state_dir: str = Field(
        "/var/lib/sparkfleet/watchdog", pattern=r"^/", description="where each node's watchdog keeps state.json, "
        "served read-only to the peers by the fabric rsync daemon (module watchdog)"
    )
    watchdog_follow_interval_s: int = Field(
        5, ge=1, description="seconds between a worker's reads of the head's state"
    )
