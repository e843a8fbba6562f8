"""Data of sparkfleet/progress.py: how often a long step (image build, push and pull, the hub fetch,
the fan-out, the prewarm, the engine's start) prints a line while it runs."""
from pydantic import BaseModel, Field


class ProgressData(BaseModel):
    progress_interval_s: int = Field(
        30, ge=1, le=3600, description="seconds between two progress lines of a long step while it runs (bytes "
        "and rate, or the engine's phase), and the least a step must take to print any line at all, its `done in` "
        "line included; see docs/deploy.md#progress-of-long-steps",
    )
