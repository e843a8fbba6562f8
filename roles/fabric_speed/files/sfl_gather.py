"""sfl_gather.py (managed by sparkfleet): all_gather across a serving group, its bus bandwidth.

Runs inside the serving image, one process per rank, with the rank's environment (NCCL_IB_HCA,
NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME: the engine's own). The image ships torch, not nccl-tests;
torch.distributed drives the same ncclAllGather the engine does (backend nccl), or gloo without a
GPU. The figures follow nccl-tests' definitions (doc/PERFORMANCE.md): size is the gathered output,
algbw = size / time, busbw = algbw * (n - 1) / n; like all_gather_perf it runs out of place, then in
place (each rank's input the output's own block, as FSDP2 gathers: torch/distributed/fsdp/
_fully_shard/_fsdp_collectives.py), and the figure held to a bar is their mean, all_gather_perf's
'Avg bus bandwidth' of one size, the figure NVIDIA's bar is read from. The warm-up and iteration
counts are nccl-tests' defaults (-w 5, -n 20). Rank 0 prints one line: `sfl_gather {json}`.
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
    size = per_rank * 4 * a.world
    out = torch.empty(per_rank * a.world, dtype=torch.float32, device=device)
    own_block = out.narrow(0, a.rank * per_rank, per_rank)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()

    def run(send: torch.Tensor) -> dict:
        """One way of gathering, timed as nccl-tests times it, then checked as it checks: every rank's
        block holds what that rank sent (one block compared at a time: no second output-sized buffer)."""
        out.zero_()
        send.fill_(float(a.rank + 1))
        for _ in range(a.warmup):
            dist.all_gather_into_tensor(out, send)
        sync()
        start = time.perf_counter()
        for _ in range(a.iters):
            dist.all_gather_into_tensor(out, send)
        sync()
        seconds = (time.perf_counter() - start) / a.iters
        wrong = sum(int((out.narrow(0, r * per_rank, per_rank) != float(r + 1)).sum().item()) for r in range(a.world))
        algbw = size / seconds / 1e9
        return {"seconds_per_iter": seconds, "algbw_gbytes": algbw, "busbw_gbytes": algbw * (a.world - 1) / a.world,
                "wrong": wrong}

    out_of_place = run(torch.empty(per_rank, dtype=torch.float32, device=device))
    in_place = run(own_block)
    if a.rank == 0:
        print("sfl_gather " + json.dumps({
            "backend": a.backend, "world": a.world, "bytes": size, "iters": a.iters,
            "algbw_gbytes": (out_of_place["algbw_gbytes"] + in_place["algbw_gbytes"]) / 2,
            "busbw_gbytes": (out_of_place["busbw_gbytes"] + in_place["busbw_gbytes"]) / 2,
            "busbw_out_of_place_gbytes": out_of_place["busbw_gbytes"], "busbw_in_place_gbytes": in_place["busbw_gbytes"],
            "seconds_per_iter": [out_of_place["seconds_per_iter"], in_place["seconds_per_iter"]],
            "wrong": out_of_place["wrong"] + in_place["wrong"],
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if a.backend == "nccl" else None,
        }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
