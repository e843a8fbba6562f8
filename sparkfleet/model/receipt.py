"""Data of roles/receipt: the benchmark receipt taken after every deploy that (re)started a pair."""
from typing import Annotated

from pydantic import BaseModel, Field


class ReceiptData(BaseModel):
    receipt_enabled: bool = Field(
        True, description="after every deploy that (re)started the pair, a short fixed load through the API with the "
        "key, and a receipt kept on the head (false: none). See docs/performance.md#performance"
    )
    receipt_prompt_tokens: int = Field(
        512, ge=16, le=32768, description="prompt tokens of each request of the receipt's load"
    )
    receipt_decode_tokens: int = Field(
        64, ge=8, le=4096, description="tokens each request decodes (`min_tokens` = `max_tokens`, `ignore_eos`: the "
        "same load every time)"
    )
    receipt_concurrency: list[Annotated[int, Field(ge=1, le=256)]] = Field(
        [1, 4], min_length=1, max_length=4, description="concurrent requests of each pass of the load (one pass per "
        "value): the receipt compares per-request and aggregate decode tokens/s across them"
    )
    receipt_runs: int = Field(
        2, ge=1, le=10, description="measured runs per concurrency, after one warm-up run each"
    )
    receipt_timeout_s: int = Field(
        300, ge=10, description="bound on the whole load; at the limit the deploy stops naming the step"
    )
    receipt_drop_threshold_pct: float = Field(
        10.0, gt=0, le=100, description="`make status` flags DROP when a figure of the latest receipt is worse than "
        "the previous one's by more than this (decode tokens/s lower, time to first token higher)"
    )
    receipt_keep: int = Field(
        20, ge=2, description="receipts kept per profile on the head; older ones are removed"
    )
    receipt_dir: str = Field(
        "/var/lib/sparkfleet/receipts", pattern=r"^/", description="where the head keeps them: "
        "`<receipt_dir>/<profile>/<UTC time>.json`"
    )
