"""The field report's failure modes as checks that stop a deploy in seconds, with the numbers.

Each function is pure (facts and settings in, problems out) so every guard has unit tests that
pass and fail; roles/guards/tasks.py runs them at prepare time, before any operation.
"""
import re

GIB = 1024**3

# Licenses that forbid commercial use (SPDX ids, case-insensitive prefix match).
NON_COMMERCIAL = ("CC-BY-NC",)
# What each licence forbids, in words a refusal can name (creativecommons.org/licenses: NC, ND, SA).
LICENSE_TERMS = {
    "CC-BY-NC-ND-4.0": "non-commercial use only, no derivatives",
    "CC-BY-NC-SA-4.0": "non-commercial use only, derivatives under the same licence",
    "CC-BY-NC-4.0": "non-commercial use only",
}


def memory_admission(name: str, utilization: float, mem_total_gib: float, free_gib: float, headroom_gib: float = 0.0,
                     *, profile: str) -> str | None:
    """vLLM refuses to start when utilization x total exceeds free memory (page cache counts as
    used on unified memory). None when it fits; else the refusal, with the numbers and what to change:
    utilization is the profile's `gpu_memory_utilization` (`profile`: its name), a field of the
    profile's file that no data key overrides."""
    needed = utilization * mem_total_gib
    if needed + headroom_gib <= free_gib:
        return None
    extra = f" + {headroom_gib:.2f} GiB headroom" if headroom_gib else ""
    return (
        f"memory: {utilization:.2f} x {mem_total_gib:.2f} GiB = {needed:.2f} GiB needed{extra}, "
        f"{free_gib:.2f} GiB free on {name}; lower gpu_memory_utilization in "
        f"roles/serving/profiles/{profile}.yaml (a profile's field: no data key overrides it; your "
        f"site's profiles/{profile}.yaml with `base: {profile}` and the field changes only it), or free memory (see "
        f"the largest consumers above)"
    )


_UNITS = {"b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}


def parse_size(text: str) -> float:
    """Bytes of a docker-style size: '19.5MiB', '1.2GB', '0B'."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]+)\s*", text)
    if not m or m[2].lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r}")
    return float(m[1]) * _UNITS[m[2].lower()]


# A container's cgroup: /docker/<id> (cgroupfs) or docker-<id>.scope (systemd driver).
_CONTAINER_CGROUP = re.compile(r"docker[-/][0-9a-f]{12,}")


def top_consumers(lines: list[str], count: int = 3) -> list[tuple[str, float]]:
    """`rss_kib cgroup comm` lines (ps) -> the largest processes outside containers, in GiB, summed by name."""
    by_name: dict[str, float] = {}
    for line in lines:
        parts = line.split(None, 2)
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        rss_kib, cgroup, comm = parts
        if _CONTAINER_CGROUP.search(cgroup):
            continue  # the engine and other containers are not "outside the engine"
        by_name[comm] = by_name.get(comm, 0.0) + int(rss_kib) / 1024**2
    return sorted(by_name.items(), key=lambda kv: -kv[1])[:count]


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` in an argv, written `--flag value` or `--flag=value`."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def refused_settings(rank_name: str, args: list[str], env: dict[str, str], is_head: bool, engine: str, allow_ray: bool) -> list[str]:
    """Settings that broke the field bring-up, found in what a rank will actually run."""
    problems = []
    if flag_value(args, "--load-format") == "dummy":
        problems.append(f"{rank_name}: --load-format dummy can hard-freeze both machines (recipe safety note)")
    if "--no-ple-offload-embedding" in args:
        problems.append(f"{rank_name}: --no-ple-offload-embedding can hard-freeze both machines (recipe safety note)")
    if flag_value(args, "--distributed-executor-backend") == "ray" and not allow_ray:
        problems.append(
            f"{rank_name}: --distributed-executor-backend ray: Ray's memory monitor killed the head at "
            f"115.62/121.69 GB of unified memory; use mp, or set allow_ray_backend: true on purpose"
        )
    if engine == "vllm" and not is_head and "--headless" not in args:
        problems.append(
            f"{rank_name}: a vLLM worker without --headless crashes ('collective_rpc should not be called on follower node')"
        )
    if "NCCL_IB_GID_INDEX" in env and not env["NCCL_IB_GID_INDEX"].strip():
        problems.append(f"{rank_name}: NCCL_IB_GID_INDEX is empty, which NCCL reads as 0 (the fe80 link-local GID)")
    return problems


def license_gate(profile, purpose: str, acknowledged: str | None) -> str | None:
    """A non-commercial drafter in production is refused; research needs the license acknowledged."""
    spec = profile.speculative
    license_id = (spec.draft_license or "") if spec else ""
    if not license_id.upper().startswith(NON_COMMERCIAL):
        return None
    if purpose == "production":
        return (
            f"license: profile {profile.name} uses drafter {spec.draft_model} under {license_id} (non-commercial); "
            f"deployment_purpose is production. Use the licensed MTP fallback (speculative method mtp, "
            f"e.g. profile {profile.name}-mtp), or set deployment_purpose: research with "
            f"drafter_license_acknowledged: {license_id}"
        )
    if (acknowledged or "").strip().upper() != license_id.upper():
        terms = LICENSE_TERMS.get(license_id.upper(), "non-commercial")
        return (
            f"license: profile {profile.name} uses drafter {spec.draft_model} under {license_id} ({terms}); "
            f"sparkfleet accepts no licence on your behalf (found {acknowledged!r}). Allowed: "
            f"drafter_license_acknowledged: {license_id} in your site's data (you accept its terms, deployment_purpose "
            f"research), or deployment_purpose: production with a drafter under no such licence (e.g. profile "
            f"{profile.name}-mtp)"
        )
    return None
