"""Defaults for every node of a sparkfleet cluster: one flat place, one line per setting.

Every key here is validated by the config model (sparkfleet/config.py and sparkfleet/model/);
an unknown key stops the deploy before any host is touched. Per-node values (rank,
fabric_address, ssh_hostname) live in the inventory. This file is sparkfleet's, replaced by an
upgrade: your settings go in your site's group_data/all.py (site.example/, docs/configuration.md), which
pyinfra reads after this one. `python -m sparkfleet config inventory.py` prints what each node ends
up with. docs/data-keys.md lists every key with its default and meaning.
"""

# --- roles/fabric: the ConnectX-7 link ---------------------------------------------------------
# The CX7 port cabled to the peer: one cable is two PCIe Gen5 x4 endpoints, two netdevs. NCCL over one
# half reaches about half of what the cable carries (98 vs 161 Gb/s busbw measured on a GX10 pair), so
# both are configured, each with its address (the inventory's fabric_address, fabric_twin_address).
fabric_netdev = "enp1s0f0np0"
fabric_twin_netdev = "enP2p1s0f0np0"
# Jumbo frames: NVIDIA's NCCL guide measures ~20-24 GB/s bus bandwidth with 9000 and ~3 GB/s without.
fabric_mtu = 9000
# DGX OS networking is netplan with the NetworkManager renderer.
netplan_renderer = "NetworkManager"
# RDMA device behind fabric_netdev (ibdev2netdev: "rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)").
rdma_hca = "rocep1s0f0"
rdma_twin_hca = "roceP2p1s0f0"

# --- roles/fabric_speed: the fabric proves its speed (after a deploy that (re)configured it) ------
# ib_write_bw over both HCAs of each link at once, four QPs each, each half held to NVIDIA's 175 Gbit/s
# for the port halved; then all_gather across the group in the serving image (NCCL through torch),
# held to NVIDIA's pass bar for two Sparks (21.875 GB/s at 16 GiB, dgx-spark-playbooks) scaled to the
# size it gathers by a healthy pair's curve (sparkfleet/model/fabric_speed.py, docs/fabric.md).
fabric_speed_link_test = "ib_write_bw"
fabric_speed_min_rdma_half_gbits = 87.5
fabric_speed_rdma_qps = 4
fabric_speed_collective = True
fabric_speed_busbw_bars_gbytes = {512: 17.28, 1024: 18.676, 2048: 20.419, 4096: 21.241, 8192: 21.629, 16384: 21.875}
# The collective's buffer: at most 2 GiB, and within MemAvailable minus this (the playbook's 16 GB
# test took ~32 GB of unified memory and froze a Spark).
fabric_speed_max_buffer_mib = 2048
fabric_speed_headroom_gib = 8.0

# --- the management address (sparkfleet/addresses.py): what the router, Prometheus and the firewall name
# Each node's ssh_hostname is an IP address, or a name resolved once on the controller and pinned. An
# mDNS name (*.local) is refused: any host on the LAN can answer for it, and the answer decides where the
# fleet key and live prompts go. True (per node, with ssh_strict_host_key_checking = "yes") accepts the
# controller's one answer; giving the address is better.
management_resolve_mdns_once = False

# --- roles/firewall: nftables table inet sparkfleet (SSH is never filtered) ------------------------
firewall_enabled = True
# Who may reach the head's API port; None: the management subnet (the connected subnet of the
# address the deploy's SSH session arrives at on each node). E.g. ["192.168.1.0/24"].
firewall_api_allowed_networks = None

# --- roles/api_proxy: the API key on every route (HAProxy on the profile's port) ------------------
# The engine's own HTTP port, on the head's 127.0.0.1 only (vLLM and SGLang each leave routes open).
api_proxy_engine_port = 18000
# A request that is not streamed sends nothing until it is done: the proxy waits this long for a byte.
api_proxy_timeout_s = 3600

# --- roles/tls: TLS on every head's API (the API proxy terminates it) ------------------------------
# A private CA per fleet, created once on tls_ca_node (None: the first serving group's head), its key
# root-only there and never copied; each head's certificate names its management address (an IP SAN)
# and is issued again by a deploy within tls_renew_before_days of its end. Off only with a reason:
# tls_enabled = False, tls_disabled_reason = "...". A site's own certificate per head instead:
# tls_cert_file, tls_key_file (root-only) and tls_cert_ca_file, in the inventory. docs/security.md.
tls_enabled = True
tls_disabled_reason = None
tls_ca_node = None
tls_ca_days = 3650
tls_cert_days = 365
tls_renew_before_days = 30

# --- roles/preflight: hard requirements checked before anything changes --------------------------
gpu_expected = True
preflight_allowed_archs = ["aarch64"]
preflight_data_dir = "/var/lib/sparkfleet"
# Weights (~164 GiB for the field report's model), the overlay image and kernel caches.
preflight_min_free_disk_gib = 200.0
# A DGX Spark reports ~121.69 GiB MemTotal.
preflight_min_mem_total_gib = 100.0

# --- roles/guards: the field report's failure modes ---------------------------------------------
# The shipped profile's DFlash2 drafter is licensed CC-BY-NC-ND-4.0: non-commercial use only, no
# derivatives. sparkfleet accepts no licence on your behalf: until your site's group_data sets
# drafter_license_acknowledged = "CC-BY-NC-ND-4.0" (you accept those terms: research or evaluation), a
# profile with that drafter is refused before any host is touched. A commercial pair sets
# deployment_purpose = "production" and serves the MTP variant (profile glm-5.3-flash-exl3-mtp).
deployment_purpose = "research"
drafter_license_acknowledged = None

# --- roles/host: host settings a pair needs to stay up --------------------------------------------
# The kernel's free-memory reserve is not pinned: the field's pair (vm.min_free_kbytes=1048576,
# vm.watermark_scale_factor=200) cost 20-22 % throughput where it was measured, and takes ~5.6 GiB
# more out of MemAvailable, which the engine's start needs (docs/operations.md). None: the kernel's own.
host_vm_min_free_kbytes = None
host_vm_watermark_scale_factor = None

# --- roles/serving: the API ----------------------------------------------------------------------
# Root-only file on the head with the API key; None: sparkfleet generates /etc/sparkfleet/api-key
# on the first deploy. Clients send "Authorization: Bearer <its content>".
serving_api_key_file = None
# Vision profiles: hostnames the engine may fetch image/video URLs from; []: none (data: URLs only).
serving_media_domains = []
# The site directory (your inventory, group_data/, profiles/: docs/configuration.md): sparks() sets it on
# each node to the inventory file's directory, so a site's profiles/NAME.yaml replaces the shipped one
# wherever the site lives. None here: an inventory without sparks() has no site profiles.
serving_site = None

# --- roles/monitoring: node exporter everywhere, Prometheus with sparkfleet's alerts on one node ---
# Prometheus runs on monitoring_node (None: the router node, else the first group's head), on its
# 127.0.0.1 only; the exporters answer that node alone (the firewall). docs/monitoring.md.
monitoring_enabled = True
# Upstream versions of the OS's packages (DGX OS 7 = Ubuntu 24.04's archive); another on offer stops
# the deploy before it installs anything, naming what is offered.
monitoring_node_exporter_version = "1.7.0"
monitoring_prometheus_version = "2.45.3"
monitoring_scrape_interval_s = 15
monitoring_retention = "30d"
# Below this much MemAvailable a Spark is close to the freeze that no OOM kill precedes.
monitoring_alert_memory_headroom_gib = 8.0
# Every task that needs memory waiting for it 60 % of the time for 30 s: systemd-oomd's own bar (oomd.conf(5));
# no field figure of a Spark's PSI before its freeze was found.
monitoring_alert_memory_pressure = 0.6
monitoring_alert_memory_pressure_for_s = 30
# Time to first token p95 over this many times the last benchmark receipt's, for 10 minutes.
monitoring_alert_ttft_factor = 2.0
# GPU nodes (gpu_expected): NVIDIA's dcgm-exporter, the release reported live on a Spark, pinned by the digest
# NVIDIA's GPU Operator pairs with its tag (sparkfleet/model/monitoring.py GPU_EXPORTER_IMAGE), with only the
# DCGM fields that report on GB10 (utilization, SM clock, temperature, power, energy, XID, PCIe replays).
monitoring_gpu_exporter_image = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.1-ubuntu22.04@sha256:ecb867c5787e44f1889b257e6c03b07748689a7b293c8f1affb1d4cb449b235c"
# A busy GB10 runs at 2400-2500 MHz; capped by its power supply (USB-PD) or by heat, at 500-850 MHz.
monitoring_alert_gpu_clock_mhz = 1400

# --- sparkfleet/progress.py: progress of the long steps while they run ------------------------------
# A cold image build or hub fetch on a Spark takes up to an hour: every this many seconds such a step
# prints its bytes and rate (or the engine's phase), and `done in` when it ends; a step faster than this
# prints nothing. 30 s: a line often enough to see a transfer move, rare enough not to drown the plan.
progress_interval_s = 30
