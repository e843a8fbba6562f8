"""Data of roles/host: host settings the serving pair needs, each justified by a reported failure."""
from pydantic import BaseModel, Field

# logind reads drop-ins from here (logind.conf(5)); 90-: after the distribution's own.
LOGIND_DROP_IN = "/etc/systemd/logind.conf.d/90-sparkfleet.conf"
# systemd-sysctl applies /etc/sysctl.d/*.conf at boot in the lexical order of their names (sysctl.d(5));
# 90-: after the distribution's own.
MEMORY_SYSCTL_DROP_IN = "/etc/sysctl.d/90-sparkfleet-memory.conf"

# The field's figures for the kernel's free-memory reserve, and why they are not pinned (docs/operations.md,
# "The kernel's memory reserve", has the measurements and the watermark arithmetic behind "about 5.9 GiB").
_RESERVE_WHY = ("Not pinned by default: the field recommends 1048576 and 200 (tonyd2wild/DeepSeek-V4.1-Flash-"
                "vLLM-DGX-Spark docs/RECIPE.md step 7) against the unified-memory freeze, but no field measurement "
                "shows the freeze prevented, and the measured costs are 20-22 % throughput at 5-6 streams (tsw2k/"
                "Deepseek-4.1-Flash-Quad-DGX-Sparks docs/LEVERS.md L7) and MemAvailable lowered by the kernel's "
                "higher watermarks (about 5.9 GiB at that pair instead of 0.3, computed; a 4 GiB floor failed vLLM's "
                "start check: tonyd2wild/GLM-5.3-Flash-NVFP4-DFlash2-2x-DGX-Spark docs/GB10-UNIFIED-MEMORY-FIELD-"
                "REPORT.md), which the guards' memory admission and vLLM's check count; set, lower "
                "gpu_memory_utilization by as much in the profile's file (roles/serving/profiles/<serving_profile>.yaml: "
                "no data key overrides it; docs/operations.md)")


class HostData(BaseModel):
    host_logind_remove_ipc: bool = Field(
        False, description="logind's `RemoveIPC` on every node (`/etc/systemd/logind.conf.d/90-sparkfleet.conf`; "
        "logind.conf(5) defaults to yes): `yes` deletes a user's System V and POSIX IPC (shared memory, semaphores) "
        "when its last session ends, which killed engine workers running as a login user in the field "
        "(eugr/spark-vllm-docker#352, spark-arena/sparkrun#285, vllm-project/vllm#54259); `no` keeps them across SSH "
        "logouts",
    )
    host_vm_min_free_kbytes: int | None = Field(
        None, ge=1024, description="`vm.min_free_kbytes` on the node (`/etc/sysctl.d/90-sparkfleet-memory.conf`, "
        "applied with `sysctl -p` when it changes): the free memory the kernel keeps for allocations that "
        "cannot wait (atomic ones, a NIC's receive path among them) before others must reclaim; at least 1024 (the kernel's "
        "vm.rst: below it the system is subtly broken); none: the kernel's own (about 44 MiB on a Spark). "
        + _RESERVE_WHY,
    )
    host_vm_watermark_scale_factor: int | None = Field(
        None, ge=1, le=1000, description="`vm.watermark_scale_factor` on the node (the same drop-in): how far "
        "above the minimum kswapd starts reclaiming in the background and how much it frees, in 1/10000 of "
        "memory (vm.rst: 1 to 1000; the kernel's default 10); none: the kernel's own. " + _RESERVE_WHY,
    )


def memory_sysctls(node) -> dict[str, int]:
    """The vm.* settings data sets on `node`, by sysctl name; empty: no drop-in is written."""
    pairs = (("vm.min_free_kbytes", node.host_vm_min_free_kbytes),
             ("vm.watermark_scale_factor", node.host_vm_watermark_scale_factor))
    return {name: value for name, value in pairs if value is not None}
