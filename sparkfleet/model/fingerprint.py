"""Data keys of roles/fingerprint: which parts of a node's fingerprint every node of a group shares."""
from typing import Literal, get_args

from pydantic import BaseModel, Field

FingerprintField = Literal["kernel", "gpu_driver", "cx7_firmware", "docker", "image_id", "engine", "nccl"]
FINGERPRINT_FIELDS: tuple[str, ...] = get_args(FingerprintField)


class FingerprintData(BaseModel):
    fingerprint_must_match: list[FingerprintField] = Field(
        default_factory=lambda: list(FINGERPRINT_FIELDS),
        description="fingerprint fields every node of the pair must share (kernel, GPU driver, CX7 firmware, Docker, "
        "and the image's ID, engine and NCCL versions); the deploy refuses a mismatch on kernel, gpu_driver, "
        "cx7_firmware or docker at prepare, before any change, with a table (the image's fields are roles/image's to "
        "ship and check; the doctor compares every field). Absent on every node is a match, absent on some is not",
    )
