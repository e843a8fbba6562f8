"""sfl_gather.py (managed by sparkfleet): all_gather across a serving group, its bus bandwidth.

Runs inside the serving image, one process per rank, with the rank's environment (NCCL_IB_HCA,
NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME: the engine's own). The image ships torch, not nccl-tests;
torch.distributed drives the same ncclAllGather the engine does (backend nccl), or gloo without a
GPU. The figures follow nccl-tests' definitions (doc/PERFORMANCE.md): size is the gathered output,
algbw = size / time, busbw = algbw * (n - 1) / n; the warm-up and iteration counts are its
defaults (-w 5, -n 20). Rank 0 prints one line: `sfl_gather {json}`.
"""
import argparse
import datetime
import json
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("--rank", "--world", "--port", "--mib"):
        p.add_argument(name, type=int, required=True)
    p.add_argument("--addr", required=True)
    p.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    dist.init_process_group(a.backend, init_method=f"tcp://{a.addr}:{a.port}", rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=120))
    device = torch.device("cuda", 0) if a.backend == "nccl" else torch.device("cpu")
    total = a.mib * 2**20
    per_rank = total // 4 // a.world  # float32 elements each rank contributes
    mine = torch.full((per_rank,), float(a.rank + 1), dtype=torch.float32, device=device)
    out = torch.empty(per_rank * a.world, dtype=torch.float32, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()

    for _ in range(a.warmup):
        dist.all_gather_into_tensor(out, mine)
    sync()
    start = time.perf_counter()
    for _ in range(a.iters):
        dist.all_gather_into_tensor(out, mine)
    sync()
    seconds = (time.perf_counter() - start) / a.iters
    # nccl-tests' check: every rank's block holds what that rank sent.
    want = torch.arange(1, a.world + 1, dtype=torch.float32, device=device).repeat_interleave(per_rank)
    wrong = int((out != want).sum().item())
    size = per_rank * 4 * a.world
    algbw = size / seconds / 1e9
    if a.rank == 0:
        print("sfl_gather " + json.dumps({
            "backend": a.backend, "world": a.world, "bytes": size, "iters": a.iters, "seconds_per_iter": seconds,
            "algbw_gbytes": algbw, "busbw_gbytes": algbw * (a.world - 1) / a.world, "wrong": wrong,
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if a.backend == "nccl" else None,
        }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
