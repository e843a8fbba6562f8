"""Data of roles/image: how long each of its network-bound steps may take (sparkfleet/bounded.py).

A step past its limit stops the deploy naming the step, the host, the limit and the key; a re-run
resumes (the fetch keeps what arrived, docker build its layer cache, push and pull the layers
already there)."""
from pydantic import BaseModel, Field

# The head's registry unit, retried until the fabric address binds (templates beside this file).
REGISTRY_DROPIN = "/etc/systemd/system/docker-registry.service.d/50-sparkfleet.conf"
# Where the head's registry keeps what is pushed to it (its config's storage root; the Debian
# package's own): the push's progress is this filesystem growing (sparkfleet/progress.py).
REGISTRY_ROOT = "/var/lib/docker-registry"


class ImageData(BaseModel):
    image_git_fetch_timeout_s: int = Field(
        600, ge=1, description="seconds the head's `git fetch` of the recipe may take (a recipe repository fetches "
        "in seconds; 10 min allows a slow mirror); see docs/deploy.md#time-limits",
    )
    image_build_timeout_s: int = Field(
        7200, ge=1, description="seconds the head's `docker build` of the overlay may take (a cold vLLM overlay "
        "build on a Spark can take an hour; a re-run reuses the layer cache)",
    )
    image_push_timeout_s: int = Field(
        1800, ge=1, description="seconds the head's `docker push` to its own fabric registry may take (the overlay "
        "is tens of GiB; compressing it is the slow part)",
    )
    image_pull_timeout_s: int = Field(
        1800, ge=1, description="seconds a worker's `docker pull` from the head's registry over the fabric may take "
        "(tens of GiB; decompressing is the slow part)",
    )


def history_path(node, profile) -> str:
    """The recipe commits this pair has served (written by roles/serving once /health is 200)."""
    return f"{node.preflight_data_dir}/recipes/{profile.name}.deployed"
