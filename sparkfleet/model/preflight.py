"""Data keys of roles/preflight: what a node must offer before anything is changed on it."""
from pydantic import BaseModel, Field, field_validator

from sparkfleet.model.known_bad import KNOWN_BAD_IDS


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
    preflight_known_bad_acknowledged: dict[str, str] = Field(
        default_factory=dict,
        description="entries of the known-bad table (sparkfleet/model/known_bad.py: a release the field saw break a "
        "Spark pair, with its remedy and sources) accepted on this node, each id with your reason "
        f"({', '.join(KNOWN_BAD_IDS)}); preflight refuses a node an entry matches unless it is here, and then "
        "passes it with a warning",
    )

    @field_validator("preflight_known_bad_acknowledged")
    @classmethod
    def _known_ids_with_reasons(cls, acknowledged: dict[str, str]) -> dict[str, str]:
        unknown = sorted(k for k in acknowledged if k not in KNOWN_BAD_IDS)
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not in the known-bad table; known ids: {', '.join(KNOWN_BAD_IDS)}")
        empty = sorted(k for k, reason in acknowledged.items() if not reason.strip())
        if empty:
            raise ValueError(f"{', '.join(empty)}: no reason given; say why the node may run it (it is printed "
                             f"at every deploy)")
        return acknowledged
