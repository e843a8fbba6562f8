"""Lab overrides: the lab hosts are Debian with systemd-networkd, no GPU and no RDMA, on whatever
machine runs the lab (any architecture, a few GiB of memory and disk to spare)."""
netplan_renderer = "networkd"
gpu_expected = False
rdma_hca = None
preflight_allowed_archs = ["x86_64", "aarch64"]
preflight_min_mem_total_gib = 4.0
preflight_min_free_disk_gib = 5.0
