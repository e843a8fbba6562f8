"""Lab overrides: the lab hosts are Debian, no GPU and no RDMA, on whatever machine runs the lab (any
architecture, a few GiB of memory and disk to spare). Their netplan renderer is NetworkManager as on
DGX OS, or systemd-networkd: lab/inventory.py sets netplan_renderer to the one the lab runs."""
gpu_expected = False
rdma_hca = None
rdma_twin_hca = None
preflight_allowed_archs = ["x86_64", "aarch64"]
preflight_min_mem_total_gib = 4.0
preflight_min_free_disk_gib = 5.0

# Serving: the lab's own recipe repository (lab/recipe, served by `make lab-up`) at its v1 commit
# (lab/recipe/COMMITS); the stand-in engine answers within seconds; nspawn keeps /proc/sys
# read-only, so the page cache cannot be dropped from inside a lab host.
serving_recipe_repository = "git://198.18.0.1/recipe.git"
serving_recipe_commit = "55cfca41c80ac586177f26b2502b6c49a0c8d6d6"
serving_health_timeout_s = 120
serving_drop_caches = False
# The lab machine's hard RLIMIT_MEMLOCK (8 MiB here) cannot be raised from inside it.
serving_ulimit_memlock = "8388608"
# The lab is a site of its own (this group_data beside lab/inventory.py) and makes the licence choice the
# shipped defaults leave to each site: it serves the shipped profile (DFlash2 drafter, CC-BY-NC-ND-4.0:
# non-commercial, no derivatives) to test sparkfleet itself, which is evaluation, not commercial use.
deployment_purpose = "research"
drafter_license_acknowledged = "CC-BY-NC-ND-4.0"

# The kernel's memory reserve stays the machine's: nspawn keeps /proc/sys read-only, and vm.* is not
# namespaced (set from a lab host, it would be the machine's own). docs/operations.md.
host_vm_min_free_kbytes = None
host_vm_watermark_scale_factor = None

# Weights: the lab's own small stand-in models (lab/model), served by `make lab-up` on the bridge.
weights_source = "http://198.18.0.1:8089"
weights_free_margin_gib = 1.0
# Kernel caches: the stand-in engine "compiles" in milliseconds; a shorter long prompt will do.
kernel_cache_prewarm_timeout_s = 120
kernel_cache_prewarm_long_prompt_words = 1024
# The watchdog at lab speed: the stand-ins start in seconds, so the drills (tests/e2e/test_lab_drills.py)
# see a hang after 2 x (5 + 5) s instead of the production 3 x (30 + 30) s. The grace still covers a
# start (serving_health_timeout_s), and the window fits three restarts with their backoffs.
watchdog_interval_s = 5
watchdog_probe_timeout_s = 5
watchdog_failures_before_restart = 2
# One vLLM CPU step of a 7000-token prefill outlasted a 5 s probe interval on the loaded 2-core
# machine (make test of 311a735: "no progress in 5.4 s with 12 request(s) in hand"): a stall is
# judged after 20 s of flat counters with requests in hand.
watchdog_stall_s = 20
watchdog_backoff_s = 5
watchdog_startup_grace_s = 120
watchdog_window_s = 900
# The drills fault the pair again seconds after each recovery, each a new fault: 0 counts every restart
# that brought the pair back as having ended its failure (tests/unit/test_watchdog.py drives the count
# of restarts the pair failed again soon after; 600 s, the default, would give up at the fourth drill).
watchdog_recovered_after_s = 0

# The fabric's speed: no RDMA here, so iperf3 over each half of the lab's veth port. Its bar is a
# floor a throttled or broken link fails, far below what any machine's veth carries (12-16 Gbit/s
# measured on 2 cores): the verdict follows the link, not this machine's speed. The stand-in
# engine's image has no torch, so no collective here (its runner is tested on recorded output).
fabric_speed_link_test = "iperf3"
fabric_speed_min_tcp_gbits = 1.0
# One second per half: a veth reaches its rate within milliseconds, and the proof runs at every deploy
# that finds no passed record (make test: 16 runs of two halves, four links on the fleet's lab).
fabric_speed_seconds = 1
fabric_speed_collective = False

# Monitoring: the lab hosts are Debian 12, whose archive has node_exporter 1.5.0, Prometheus 2.42.0 and
# Alertmanager 0.25.0.
# The stand-in engines serve no /metrics, so the stand-in lab runs without it; the real vLLM's
# inventory (lab/inventory_vllm_cpu.py) turns it on, and tests/real proves it.
monitoring_enabled = False
monitoring_node_exporter_version = "1.5.0"
monitoring_prometheus_version = "2.42.0"
monitoring_alertmanager_version = "0.25.0"
# The lab's fabric is a veth pair, whose kernel reports 10000 Mbit/s (a Spark's CX7: 200000).
monitoring_alert_fabric_link_mbits = 10000
