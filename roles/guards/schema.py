"""Data of roles/guards: what the failure-mode guards allow, and what an operator acknowledged."""
from typing import Literal

from pydantic import BaseModel, Field


class GuardsData(BaseModel):
    deployment_purpose: Literal["production", "research"] = Field(
        "production",
        description="production refuses drafters with non-commercial licenses; research needs an acknowledgement",
    )
    drafter_license_acknowledged: str | None = Field(
        None, description="research only: the drafter license (e.g. CC-BY-NC-ND-4.0) you accept, spelled as the profile has it"
    )
    allow_ray_backend: bool = Field(
        False, description="allow Ray as executor backend (its memory monitor killed the head on unified memory)"
    )
    recipe_drift_acknowledged: list[str] = Field(
        default_factory=list,
        description="recipe launch defaults allowed to change upstream without a pin (names, e.g. KV_SLOTMAP_PIN)",
    )
    guard_kv_reserve_gib: float = Field(
        4.0, ge=0, description="memory per rank the engine needs besides weights and KV cache (activations, graphs, NCCL)"
    )
    guard_min_headroom_gib: float = Field(
        0.0, ge=0, description="memory to keep free beyond utilization x MemTotal when the pair starts"
    )
