"""Data keys of roles/engine_proof: the engine in the group's image judges the group's command lines
(deploy.py step 7a), and the record of what it proved on the head.

The snapshots checked before any connection (roles/serving/known_env) describe the engine versions
they were taken of; the image a recipe builds may ship another. The proof runs the image's own engine
on every distinct rank's rendered argv and environment before anything stops the pair.
"""
import json

from pydantic import BaseModel, Field

# The head's record of the last proof: which image, which engine and version, what was judged. The
# benchmark receipt and `make status` name the version from it.
ENGINE_PROOF_NAME = "engine-proof.json"


def engine_proof_path(node) -> str:
    return f"{node.preflight_data_dir}/{ENGINE_PROOF_NAME}"


def record_text(image: str, engine: str, version: str | None, digest: str, proven: bool) -> str:
    return json.dumps({"image": image, "engine": engine, "version": version, "request": digest,
                       "proven": proven}, sort_keys=True) + "\n"


def read_record(text: str | None) -> dict | None:
    """The record's fields, or None when absent or not one sparkfleet wrote."""
    try:
        record = json.loads(text or "")
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and {"image", "engine", "version"} <= set(record) else None


def proven_version(text: str | None, image: str) -> str | None:
    """The engine version the record names for `image` (None: no record, another image's, or a stand-in's)."""
    record = read_record(text)
    return record["version"] if record and record["image"] == image else None


class EngineProofData(BaseModel):
    engine_proof_timeout_s: int = Field(
        600, ge=30, le=3600,
        description="the bound on the in-image proof (step 7a): one `docker run` of the group's image that "
        "imports its engine and runs its own parser and config classes on each distinct rank's command line "
        "(no model, no GPU work). vLLM's import alone takes tens of seconds on a cold page cache; 600 s leaves "
        "room for a slow disk without letting a hung container hold the deploy for long",
    )
