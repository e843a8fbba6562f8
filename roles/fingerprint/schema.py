"""Data keys of roles/fingerprint: which parts of a node's fingerprint every node of a group shares."""
from typing import Literal, get_args

from pydantic import BaseModel, Field

FingerprintField = Literal["kernel", "gpu_driver", "cx7_firmware", "docker", "image_id", "engine", "nccl"]
FINGERPRINT_FIELDS: tuple[str, ...] = get_args(FingerprintField)


class FingerprintData(BaseModel):
    fingerprint_must_match: list[FingerprintField] = Field(
        default_factory=lambda: list(FINGERPRINT_FIELDS),
        description="fingerprint fields every node of the pair must share (any of "
        + ", ".join(FINGERPRINT_FIELDS) + "); a field listed on any node is checked",
    )
