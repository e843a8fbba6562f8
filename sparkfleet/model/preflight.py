"""Data keys of roles/preflight: what a node must offer before anything is changed on it."""
from pydantic import BaseModel, Field


class PreflightData(BaseModel):
    gpu_expected: bool = Field(
        True,
        description="a GPU must be visible to `nvidia-smi` on this node (DGX Spark: NVIDIA GB10); false only where "
        "there is none on purpose (the lab)",
    )
    preflight_data_dir: str = Field(
        "/var/lib/sparkfleet",
        pattern=r"^/",
        description="where images, weights and caches will live; its free space is checked",
    )
    preflight_min_free_disk_gib: float = Field(
        200.0,
        ge=0,
        description="free GiB needed under the data dir (the field report's weights alone are ~164 GiB)",
    )
    preflight_min_mem_total_gib: float = Field(
        100.0,
        ge=0,
        description="MemTotal needed (a DGX Spark shows ~121.69 GiB of its 128 GB unified memory)",
    )
    preflight_min_pcie_link_width: int = Field(
        4,
        ge=1,
        le=16,
        description="PCIe lanes each RDMA device of the port must link at (sysfs `current_link_width`; a DGX Spark's "
        "two CX7 controllers are Gen5 x4 each, and a BIOS older than 2026-04 wires the second at x2: update it with "
        "`fwupdmgr`); checked on RDMA nodes only",
    )
    preflight_allowed_archs: list[str] = Field(
        ["aarch64"],
        min_length=1,
        description="accepted `uname -m` values (DGX Spark is aarch64)",
    )
