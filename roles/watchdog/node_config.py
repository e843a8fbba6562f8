"""The JSON config each node's sfl_watch.py reads (/etc/sparkfleet/watchdog.json) and the unit that
runs it: pure functions of the cluster, the node, the served profile and the watchdog data, so a test
renders what a deploy writes (roles/watchdog/tasks.py). `wd` is anything with the watchdog_* keys of
sparkfleet/model/watchdog.py: the node itself in the deploy (NodeConfig includes WatchdogData).

With the watchdog off (watchdog_enabled false) the config is still written: `sfl_watch.py probe` is
the doctor's liveness. The head's then names no worker state (no worker's watchdog writes one, and
the rsync daemons do not serve the module): its probe is the completion and the head's own rank,
and the doctor probes each worker's rank on the worker.
"""
import json

from sparkfleet.model.engine import SGLANG_METRICS, unit_name
from sparkfleet.model.monitoring import WATCHDOG_TEXTFILE
from sparkfleet.model.watchdog import RSYNC_MODULE, SFL_WATCH, WATCH_CONFIG, WATCH_UNIT
from sparkfleet.render import render


def state_source(node, wd) -> str:
    """Where the peers read `node`'s watchdog state: its fabric rsync daemon, module watchdog."""
    return f"rsync://{node.fabric_ip}:{node.fanout_rsync_port}/{RSYNC_MODULE}/state.json"


# The engine's own counters the head's watchdog weighs a failed probe against (sfl_watch.py
# progress_verdict): a rise of any progress counter is progress; the work gauges' sum is the work in
# hand. vLLM 0.33: vllm/v1/metrics/loggers.py PrometheusStatLogger (counters vllm:prompt_tokens,
# vllm:generation_tokens, vllm:request_success, exposed by prometheus_client with _total; gauges
# vllm:num_requests_running, vllm:num_requests_waiting), on the API server's /metrics
# (vllm/entrypoints/serve/instrumentator/metrics.py). SGLang 0.5.23 with --enable-metrics (always
# rendered: sparkfleet/model/engine.py sglang_args): the same counters and gauges by SGLang's names
# (SGLANG_METRICS: sglang:prompt_tokens_total, ... sglang:num_queue_reqs), on /metrics. Neither engine
# holds a key (the API proxy checks it), and neither's key check would guard /metrics anyway
# (vllm/entrypoints/serve/middleware/authenticate.py guards /v1, /v2, /inference, /cohere;
# sglang/srt/utils/auth.py leaves /metrics open).
PROGRESS_METRICS = {
    "vllm": {"path": "/metrics",
             "progress": ["vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total"],
             "work": ["vllm:num_requests_running", "vllm:num_requests_waiting"]},
}
PROGRESS_METRICS["sglang"] = {"path": "/metrics", **{kind: [SGLANG_METRICS[name] for name in PROGRESS_METRICS["vllm"][kind]]
                                                    for kind in ("progress", "work")}}


def watch_config(cluster, node, profile, wd) -> dict:
    config = {
        "role": "head" if node.is_head else "worker",
        "node": node.name,
        "unit": unit_name(node),
        "container": unit_name(node),  # the unit runs `docker run --name <unit>`
        "state_dir": wd.watchdog_state_dir,
        "interval_s": wd.watchdog_interval_s,
        "follow_interval_s": wd.watchdog_follow_interval_s,
        "probe_timeout_s": wd.watchdog_probe_timeout_s,
        "failures_before_restart": wd.watchdog_failures_before_restart,
        "stall_s": wd.watchdog_stall_s,
        "max_restarts": wd.watchdog_max_restarts,
        "window_s": wd.watchdog_window_s,
        "backoff_s": wd.watchdog_backoff_s,
        "startup_grace_s": wd.watchdog_startup_grace_s,
        "recovered_after_s": wd.watchdog_recovered_after_s,
        # A cold start, as the deploy waits for it (roles/serving/ready.py wait_for_health).
        "ready_timeout_s": node.serving_health_timeout_s,
        # systemctl stop/restart waits for docker stop (stop_timeout_s, then SIGKILL): the unit's
        # TimeoutStopSec is stop_timeout_s + 30 (templates/serving_unit.j2).
        "stop_timeout_s": profile.container.stop_timeout_s + 60,
        # rsync's own --timeout/--contimeout for a peer's state (a few hundred bytes).
        "rsync_timeout_s": 10,
        # its restarts and give-ups for Prometheus, where roles/monitoring runs the node exporter
        "metrics_file": WATCHDOG_TEXTFILE if node.monitoring_enabled else None,
    }
    if node.is_head:
        config.update(
            # The engine itself, not the API proxy in front of it (roles/api_proxy): the watchdog judges
            # the pair, and a proxy restart must never restart the pair. No key: the engine holds none.
            port=node.api_proxy_engine_port,
            model=profile.api_model_name,
            progress_metrics=PROGRESS_METRICS.get(profile.engine),
            workers=[{"name": w.name, "state": state_source(w, wd)} for w in cluster.workers] if wd.watchdog_enabled else [],
        )
    else:
        config["head"] = {"name": cluster.head.name, "state": state_source(cluster.head, wd)}
    return config


def watch_config_text(cluster, node, profile, wd) -> str:
    return json.dumps(watch_config(cluster, node, profile, wd), indent=1, sort_keys=True) + "\n"


UNIT_PATH = f"/etc/systemd/system/{WATCH_UNIT}.service"


def unit_text(node) -> str:
    """sparkfleet-watchdog.service on `node`: `sfl_watch.py run` on the config above."""
    return render("watchdog", UNIT_PATH, node=node, unit=unit_name(node), state_dir=node.watchdog_state_dir,
                  program=SFL_WATCH, config=WATCH_CONFIG)
