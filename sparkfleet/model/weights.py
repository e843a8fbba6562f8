"""Data of roles/weights: where a profile's model (and drafter) comes from and where it lives."""
import re

from pydantic import BaseModel, Field, field_validator

SOURCE_FORMS = "'hub' (the Hugging Face hub), an absolute directory on the head, or an http(s):// URL"


class WeightsData(BaseModel):
    weights_dir: str = Field(
        "/var/lib/sparkfleet/models",
        pattern=r"^/",
        description="where every node keeps weights: `<weights_dir>/<model id>/`, its manifest `<model id>.manifest` "
        "beside it",
    )
    weights_source: str = Field(
        "hub",
        description="where the head fetches weights: `hub` (Hugging Face, at the profile's pinned revision), an "
        "absolute directory on the head holding `<model id>/`, or an `http(s)://` URL serving `<model id>/...` and "
        "`<model id>.manifest`",
    )
    weights_hf_token_file: str = Field(
        "/etc/sparkfleet/hf-token",
        pattern=r"^/",
        description="root-only file on the head with the hub token; read by the hub client through `HF_TOKEN_PATH`, "
        "never on a command line; absent: anonymous",
    )
    weights_free_margin_gib: float = Field(
        10.0, ge=0, description="GiB that must stay free after a download or fan-out; a shortfall stops before the "
        "first byte, with the numbers"
    )
    weights_fetch_timeout_s: int = Field(
        21600, ge=1, description="seconds the head's fetch of one model from `weights_source` may take, hashing "
        "included (~170 GiB from the hub: 6 h is ~8 MiB/s); a re-run resumes from what arrived",
    )

    @field_validator("weights_source")
    @classmethod
    def _known_source(cls, value: str) -> str:
        if value == "hub" or value.startswith("/") or re.match(r"^https?://[^/\s]+", value):
            return value.rstrip("/") if value != "/" else value
        raise ValueError(f"must be {SOURCE_FORMS}")


def model_dir(node, model: str) -> str:
    return f"{node.weights_dir}/{model}"
