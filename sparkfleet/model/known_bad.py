"""Known-bad software: releases the field has seen break a pair of Sparks, in one table. Each entry says
what it matches, the condition under which it breaks, what breaks, the remedy and its public sources.
Preflight (roles/preflight/checks.py) refuses a node an entry matches, before anything is changed,
unless data acknowledges the entry with a reason (`preflight_known_bad_acknowledged`, validated against
KNOWN_BAD_IDS before any connection).

An entry is added only with a concrete release, a remedy and a source someone can read. Searched and
not added (no release to match, or no remedy the reports agree on): the ConnectX-7 link capped near
13 Gb/s after a boot or hot-plug (NVIDIA/dgx-spark-playbooks PR #108: DGX OS 7.5.0 and firmware
28.45.4028, which healthy Sparks run too: fabric_speed's proof catches it), NCCL 2.30.4's NVLS hang
(NVIDIA/nccl #2167, retracted by its author as intermittent), and the container toolkit 1.19.1 freeze
(NVIDIA/nvidia-container-toolkit #1910, whose cause its author did not isolate).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownBad:
    id: str
    kernel: str  # a regular expression matched against the whole of `uname -r`
    unless_off: str | None  # a boolean kernel parameter: the entry does not apply when /proc/cmdline turns it off
    evidence: str | None  # what on the node shows the breakage ("cma": /proc/meminfo), named when present
    breaks: str
    remedy: str
    sources: tuple[str, ...]


# Kexec HandOver (KHO) on by default (CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT=y) reserves scratch memory at
# boot and hands it to the allocator as MIGRATE_CMA pageblocks, which long-term pins cannot use:
# ibv_reg_mr fails with ENOMEM. Both Ubuntu 7.0 kernels the reports name are listed; they measured
# CmaFree 9.3-9.7 GiB (two reports) and 919 MiB (a third) against a CmaTotal of 0 or 32 MiB.
_KHO_BREAKS = ("Kexec HandOver is on by default and gives its scratch memory to the allocator as CMA "
               "pageblocks, which RDMA cannot pin: ibv_reg_mr fails with ENOMEM, NCCL fails to initialise or a "
               "rank drops, before any weight loads")
_KHO_OFF = ("add kho=off to the kernel command line (GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, then "
            "`sudo update-grub` and a reboot)")

KNOWN_BAD: tuple[KnownBad, ...] = (
    KnownBad(
        id="kho-7.0.0-1019-nvidia",
        kernel=r"7\.0\.0-1019-nvidia",
        unless_off="kho",
        evidence="cma",
        breaks=_KHO_BREAKS,
        remedy=f"{_KHO_OFF}, or boot the previous kernel, 6.17.0-1032-nvidia",
        sources=(
            "NVIDIA/NV-Kernels PR #590 and #591 (7.0.0-1019.19~24.04.2: kho=off alone passes; "
            "CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT=n too)",
            "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark #259 (a second pair on 7.0.0-1019-nvidia: "
            "CmaFree 919 MiB against CmaTotal 0, serving after kho=off)",
            "MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks #14 (works with 6.17.0-1032-nvidia)",
            "eugr/spark-vllm-docker #389 and #392",
            "NVIDIA/open-gpu-kernel-modules #1358 (NV_ERR_NO_MEMORY on every boot of 7.0.0-1019-nvidia)",
        ),
    ),
    KnownBad(
        id="kho-7.0.0-31-generic",
        kernel=r"7\.0\.0-31-generic",
        unless_off="kho",
        evidence="cma",
        breaks=_KHO_BREAKS,
        remedy=_KHO_OFF,
        sources=(
            "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark #259 (Ubuntu 24.04 HWE 7.0.0-31-generic, arm64: "
            "5 failed starts; root cause KHO, CmaFree 9.3 GiB against CmaTotal 32 MiB, fixed with kho=off)",
        ),
    ),
)
KNOWN_BAD_IDS: tuple[str, ...] = tuple(e.id for e in KNOWN_BAD)


def param_off(cmdline: str, name: str) -> bool:
    """Whether the kernel command line turns the boolean parameter `name` off. The kernel reads `kho`
    with kstrtobool (kernel/kexec_handover.c kho_parse_enable, an early_param: each occurrence is read,
    the last that parses wins); kstrtobool reads n, N, 0 and o[fF] as false, y, Y, 1 and o[nN] as true,
    anything else is ignored (lib/kstrtox.c)."""
    state = None
    for token in cmdline.split():
        key, sep, value = token.partition("=")
        if key != name or not sep:
            continue
        if value[:1] in ("n", "N", "0") or value[:2].lower() == "of":
            state = False
        elif value[:1] in ("y", "Y", "1") or value[:2].lower() == "on":
            state = True
    return state is False


def cma_evidence(facts: dict) -> str | None:
    """CmaFree above CmaTotal in /proc/meminfo (a CMA area never has more free than it holds: the
    surplus is KHO's scratch), or None when the node shows no such surplus or did not say."""
    free, total = facts.get("cma_free_gib"), facts.get("cma_total_gib")
    if free is None or total is None or free <= total:
        return None
    return f"/proc/meminfo shows CmaFree {free:.2f} GiB against CmaTotal {total:.2f} GiB"


EVIDENCE = {"cma": cma_evidence}


@dataclass(frozen=True)
class Finding:
    """One entry a node matches: the entry, the evidence seen (or None), and the acknowledgement's reason."""
    entry: KnownBad
    evidence: str | None
    acknowledged: str | None


def known_bad_findings(facts: dict, acknowledged: dict[str, str]) -> list[Finding]:
    """Every entry of KNOWN_BAD the node's facts match (kernel release, and the condition on
    /proc/cmdline); each with its evidence when the node shows it and the reason data acknowledged it
    with. A node whose kernel or command line is unknown matches nothing (no fact, no verdict)."""
    kernel, cmdline = facts.get("kernel"), facts.get("cmdline")
    if not kernel:
        return []
    found = []
    for entry in KNOWN_BAD:
        if not re.fullmatch(entry.kernel, kernel):
            continue
        if entry.unless_off and (cmdline is None or param_off(cmdline, entry.unless_off)):
            continue
        evidence = EVIDENCE[entry.evidence](facts) if entry.evidence else None
        found.append(Finding(entry, evidence, acknowledged.get(entry.id)))
    return found
