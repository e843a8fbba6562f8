"""roles/host: the logind drop-in renders the data's RemoveIPC, and the sysctl drop-in the kernel's memory
reserve data sets (none by default), each with the managed-by header; the reserve applied on change only."""
import configparser
import math
from pathlib import Path

import pytest

from sparkfleet.model.host import LOGIND_DROP_IN, MEMORY_SYSCTL_DROP_IN, memory_sysctls
from sparkfleet.config import ConfigError, build_cluster
from sparkfleet.render import render
from tests.unit.helpers import capture, pair


def logind_conf(**data) -> configparser.ConfigParser:
    node = build_cluster(pair(**{n: data for n in ("spark-a", "spark-b")})).node("spark-b")
    text = render("host", LOGIND_DROP_IN, node=node)
    assert text.startswith("# Managed by sparkfleet (roles/host)")
    parsed = configparser.ConfigParser()
    parsed.read_string(text)
    return parsed


def test_remove_ipc_is_off_by_default_and_follows_data():
    assert logind_conf()["Login"]["RemoveIPC"] == "no"
    assert logind_conf(host_logind_remove_ipc=True)["Login"]["RemoveIPC"] == "yes"


def test_remove_ipc_takes_a_boolean_only():
    with pytest.raises(ConfigError, match="host_logind_remove_ipc"):
        build_cluster(pair(**{n: {"host_logind_remove_ipc": "no"} for n in ("spark-a", "spark-b")}))


# --- the kernel's memory reserve (host_vm_min_free_kbytes, host_vm_watermark_scale_factor) --------

FIELD_PAIR = {"host_vm_min_free_kbytes": 1048576, "host_vm_watermark_scale_factor": 200}
WRITE = f"Write {MEMORY_SYSCTL_DROP_IN} (vm.min_free_kbytes, vm.watermark_scale_factor)"
APPLY = f"Apply {MEMORY_SYSCTL_DROP_IN} (it changed)"


def reserve_node(**data):
    return build_cluster(pair(**{n: data for n in ("spark-a", "spark-b")})).node("spark-b")


def test_the_reserve_is_not_pinned_by_default_and_the_drop_in_holds_what_data_sets():
    assert memory_sysctls(reserve_node()) == {}
    node = reserve_node(**FIELD_PAIR)
    text = render("host", MEMORY_SYSCTL_DROP_IN, node=node, sysctls=memory_sysctls(node))
    assert text.startswith("# Managed by sparkfleet (roles/host)")
    settings = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert settings == ["vm.min_free_kbytes = 1048576", "vm.watermark_scale_factor = 200"]  # sysctl.d(5) lines
    one = reserve_node(host_vm_watermark_scale_factor=150)
    assert memory_sysctls(one) == {"vm.watermark_scale_factor": 150}


@pytest.mark.parametrize("key, value", [("host_vm_min_free_kbytes", 512), ("host_vm_watermark_scale_factor", 0),
                                        ("host_vm_watermark_scale_factor", 3000), ("host_vm_min_free_kbytes", "1G")])
def test_a_reserve_the_kernel_would_refuse_or_break_on_is_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        reserve_node(**{key: value})


def test_the_drop_in_is_applied_when_it_changes_and_nothing_runs_when_it_does_not(monkeypatch):
    """roles/host/tasks.py as pyinfra runs it (tests/unit/test_watchdog_deploy.py's recorder): written and
    applied on each node when it changed; an unchanged re-deploy runs nothing; data unset declares nothing."""
    from tests.unit.test_watchdog_deploy import Deploy, plan

    c = build_cluster(pair(**{n: FIELD_PAIR for n in ("spark-a", "spark-b")}))
    done = Deploy(monkeypatch, c, plan(c), changed={WRITE}).run(includes=("roles/host/tasks.py",))
    assert done == [(WRITE, "spark-a"), (WRITE, "spark-b"), (APPLY, "spark-a"), (APPLY, "spark-b")]
    assert Deploy(monkeypatch, c, plan(c)).run(includes=("roles/host/tasks.py",)) == []
    off = build_cluster(pair())
    deploy = Deploy(monkeypatch, off, plan(off))
    deploy.run(includes=("roles/host/tasks.py",))
    assert not [o for *_k, o in deploy.ops if "sysctl" in o.name]


def high_watermark_gib(mem_kib: int, min_free_kbytes: int | None, scale_factor: int) -> float:
    """The sum of the zones' high watermarks (mm/page_alloc.c __setup_per_zone_wmarks: min + 2 x max(min / 4,
    managed x watermark_scale_factor / 10000)); min_free_kbytes None: the kernel's default (page_alloc.c
    calculate_min_free_kbytes: clamp(int_sqrt(lowmem kB x 16), 128, 262144)). MemTotal stands for managed."""
    minimum = min_free_kbytes if min_free_kbytes is not None else min(max(math.isqrt(mem_kib * 16), 128), 262144)
    return (minimum + 2 * max(minimum / 4, mem_kib * scale_factor / 10000)) / 2**20


def test_the_figures_the_docs_give_for_the_field_s_pair_on_a_spark():
    """docs/operations.md and the keys' description: the kernel's default on a Spark is about 44 MiB, its
    high watermark about 0.3 GiB, and about 5.9 GiB at 1048576 and 200 (a Spark's MemTotal, captured)."""
    mem_kib = int(capture("meminfo_real_gb10_three_lines.txt").split()[1])
    assert round(math.isqrt(mem_kib * 16) / 1024) == 44
    assert round(high_watermark_gib(mem_kib, None, 10), 1) == 0.3
    assert round(high_watermark_gib(mem_kib, 1048576, 200), 1) == 5.9
    docs = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert "about 5.9 GiB" in docs and "about 0.3 GiB" in docs and "about 44 MiB" in docs
