"""Data of roles/fanout: the one path bulk data (weights, kernel caches) takes between nodes."""
from pydantic import BaseModel, Field

# Where roles/fanout installs sfl_files.py on every node (weights and kernel caches call it there).
SFL_FILES = "/usr/local/libexec/sparkfleet/sfl_files.py"


class FanoutData(BaseModel):
    fanout_rsync_port: int = Field(
        873, ge=1, le=65535, description="port of each node's read-only rsync daemon, bound to its fabric address "
        "only"
    )
    fanout_http_port: int = Field(
        8874, ge=1, le=65535, description="port of each node's read-only HTTP server of its weights (sfl_files.py "
        "serve: sendfile on the head, each byte hashed as the worker receives it), bound to its fabric address only; "
        "a worker's weights pull comes from the head's"
    )
    fanout_bwlimit_kib: int = Field(
        0, ge=0, description="per-pull cap of the fan-out in KiB/s; 0 is the link's full speed"
    )
    fanout_streams: int = Field(
        4, ge=1, le=64, description="concurrent HTTP streams of a worker's weights pull, over disjoint sets of the "
        "model's files balanced by size, each file's sha256 taken as it arrives: one stream's hash is bound by one "
        "core, short of a CX7 link; 4 leaves a Spark's other cores to the head's sends (fanout_bwlimit_kib is "
        "shared between them)",
    )
    fanout_rsync_timeout_s: int = Field(
        7200, ge=1, description="seconds one fan-out transfer may take, verification included (a worker's pull of "
        "~170 GiB of weights, a kernel-cache merge); 2 h is ~24 MiB/s: raise it with `fanout_bwlimit_kib`",
    )
    fanout_rsync_io_timeout_s: int = Field(
        300, ge=1, description="rsync's own `--timeout`: seconds without any data from the peer before a transfer "
        "gives up (a stalled or vanished peer); a re-run resumes from the partial file",
    )
