"""Data of roles/guards: what the failure-mode guards allow, and what an operator acknowledged."""
import re
from typing import Literal

from pydantic import BaseModel, Field, field_validator

_ACKNOWLEDGED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*|--[A-Za-z0-9][A-Za-z0-9_-]*(=.*)?)$")


class GuardsData(BaseModel):
    deployment_purpose: Literal["production", "research"] = Field(
        "production",
        description="`production` refuses a drafter with a non-commercial license; `research` needs the license "
        "acknowledged",
    )
    drafter_license_acknowledged: str | None = Field(
        None, description="research only: the drafter license you accept, spelled as the profile has it "
        "(`CC-BY-NC-ND-4.0` for DFlash2)"
    )
    allow_ray_backend: bool = Field(
        False, description="allow Ray as vLLM executor backend (its memory monitor killed the head on unified memory)"
    )
    recipe_drift_acknowledged: list[str] = Field(
        default_factory=list,
        description="recipe differences accepted without a pin: a launch default or a variable the launcher sets "
        "(its name), a flag the launcher passes (`--flag` for any value, `--flag=VALUE` for that value)",
    )

    @field_validator("recipe_drift_acknowledged")
    @classmethod
    def _acknowledged_names_or_flags(cls, entries: list[str]) -> list[str]:
        bad = [e for e in entries if not _ACKNOWLEDGED.match(e)]
        if bad:
            raise ValueError(f"{bad}: each entry is a variable name (KV_SLOTMAP_PIN), a flag (--max-num-seqs) or a "
                             f"flag with its value (--max-num-seqs=64)")
        return entries
    guard_kv_reserve_gib: float = Field(
        4.0, ge=0, description="memory per rank the engine needs besides weights and KV cache, in the KV budget "
        "estimate"
    )
    guard_min_headroom_gib: float = Field(
        0.0, ge=0, description="memory to keep free beyond utilization x MemTotal when a rank's engine starts"
    )
