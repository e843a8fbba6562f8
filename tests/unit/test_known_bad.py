"""Known-bad software named at preflight (sparkfleet/model/known_bad.py): a kernel the field saw break
RDMA is refused before any change, with the remedy and the evidence the node shows; the condition
that clears it (kho=off) passes; data can acknowledge an entry with a reason, validated before any
connection."""
import logging
import re
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import DeployError

from roles.preflight import checks
from roles.preflight.checks import known_bad_failures, known_bad_warnings, requirement_failures
from roles.preflight.facts import NodeFacts, parse_node_facts
from sparkfleet.config import ConfigError, build_cluster
from sparkfleet.model.known_bad import KNOWN_BAD, KNOWN_BAD_IDS, known_bad_findings, param_off
from tests.unit.helpers import capture, pair

FIXTURES = Path(__file__).parent / "fixtures"
KHO_OFF = (FIXTURES / "cmdline-ubuntu-7.0-kho-off.txt").read_text().strip()  # a real 7.0 host's, kho=off on it
NO_KHO = (FIXTURES / "cmdline-ubuntu-6.8.txt").read_text().strip()  # a real host's, no kho= at all
BAD = "7.0.0-1019-nvidia"


def node_facts(tmp_path, meminfo: str, cmdline: str) -> dict:
    """NodeFacts' own command on this machine, /proc/meminfo and /proc/cmdline read from the files given."""
    (tmp_path / "cmdline").write_text(cmdline + "\n")
    command = (NodeFacts().command(str(tmp_path), "lo")
               .replace("/proc/meminfo", str(FIXTURES / meminfo)).replace("/proc/cmdline", str(tmp_path / "cmdline")))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30).stdout
    return parse_node_facts(out.splitlines())


def spark(tmp_path, kernel=BAD, cmdline=NO_KHO, meminfo="meminfo-gb10-kho-cma.txt", **data):
    """A Spark's recorded facts with the kernel, command line and meminfo given (the last two read by
    the fact's own command) and spark-a's node with `data`."""
    recorded = parse_node_facts((FIXTURES / "nodefacts-dgx-spark.txt").read_text().splitlines())
    read = node_facts(tmp_path, meminfo, cmdline)
    facts = {**recorded, "kernel": kernel, **{k: v for k, v in read.items() if k.startswith(("cma_", "cmdline"))}}
    return build_cluster(pair(**{"spark-a": data})).head, facts


# --- the facts ----------------------------------------------------------------------------------

def test_the_fact_reads_the_command_line_and_cma_in_gib(tmp_path):
    """meminfo-gb10-kho-cma.txt: a Spark's captured first three lines and the CmaTotal/CmaFree lines a
    Spark on 7.0.0-1019-nvidia showed (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark #259), assembled."""
    facts = node_facts(tmp_path, "meminfo-gb10-kho-cma.txt", KHO_OFF)
    assert facts["cmdline"] == KHO_OFF
    assert facts["cma_total_gib"] == 0 and facts["cma_free_gib"] == pytest.approx(940604 / 1024 / 1024)
    assert facts["mem_total_gib"] == pytest.approx(121.69, abs=0.01)


def test_a_meminfo_without_cma_lines_gives_no_cma_and_no_evidence(tmp_path):
    lines = capture("meminfo_real_gb10_three_lines.txt")
    (tmp_path / "meminfo").write_text(lines)
    facts = node_facts(tmp_path, str(tmp_path / "meminfo"), NO_KHO)
    assert facts["mem_total_gib"] == pytest.approx(127601452 / 1024 / 1024)
    assert "cma_free_gib" not in facts and "cma_total_gib" not in facts
    [finding] = known_bad_findings({**facts, "kernel": BAD}, {})
    assert finding.evidence is None


# --- the verdict --------------------------------------------------------------------------------

def test_7_0_0_1019_nvidia_without_kho_off_is_refused_with_the_remedy_and_the_evidence(tmp_path):
    node, facts = spark(tmp_path)
    [msg] = requirement_failures(node, facts)
    assert msg.startswith("spark-a: kernel 7.0.0-1019-nvidia without kho=off on /proc/cmdline is known bad "
                          "(kho-7.0.0-1019-nvidia): "), msg
    assert "ibv_reg_mr fails with ENOMEM" in msg
    assert "/proc/meminfo shows CmaFree 0.90 GiB against CmaTotal 0.00 GiB" in msg
    assert "Fix: add kho=off to the kernel command line" in msg and "boot the previous kernel, 6.17.0-1032-nvidia" in msg
    assert 'preflight_known_bad_acknowledged: {"kho-7.0.0-1019-nvidia": "..."}' in msg
    assert "NVIDIA/NV-Kernels PR #590 and #591" in msg


def test_preflight_stops_before_any_change_on_it(tmp_path, monkeypatch):
    node, facts = spark(tmp_path)
    monkeypatch.setattr(checks, "preflight_rows", lambda _state: [(node, facts, requirement_failures(node, facts))])
    with pytest.raises(DeployError, match=r"preflight failed, nothing was changed:\n  spark-a: kernel 7.0.0-1019-nvidia"):
        checks._gather_and_check(None)


def test_with_kho_off_it_passes(tmp_path):
    node, facts = spark(tmp_path, cmdline=KHO_OFF)
    assert requirement_failures(node, facts) == []


def test_acknowledged_it_passes_with_a_logged_warning(tmp_path, monkeypatch, caplog):
    reason = "NVIDIA's fixed kernel is not out; this pair runs a test load only"
    node, facts = spark(tmp_path, preflight_known_bad_acknowledged={"kho-7.0.0-1019-nvidia": reason})
    assert requirement_failures(node, facts) == []
    [warning] = known_bad_warnings(node, facts)
    assert warning.startswith("spark-a: kernel 7.0.0-1019-nvidia without kho=off on /proc/cmdline is known bad")
    assert warning.endswith(f"acknowledged in preflight_known_bad_acknowledged: {reason}")
    monkeypatch.setattr(checks, "preflight_rows", lambda _state: [(node, facts, [])])
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        assert checks._gather_and_check(None) == {"spark-a": facts}
    assert any(r.levelno == logging.WARNING and reason in r.getMessage() for r in caplog.records), caplog.text


def test_the_doctor_notes_an_acknowledged_entry_and_fails_an_unacknowledged_one(tmp_path):
    from tools.doctor import preflight_doctor_rows

    node, facts = spark(tmp_path, preflight_known_bad_acknowledged={"kho-7.0.0-1019-nvidia": "test load only"})
    [(check, name, problems, note)] = [r for r in preflight_doctor_rows(node, facts, []) if r[0] == "preflight"]
    assert (check, name, problems, note) == ("preflight", "spark-a", [], "known bad, acknowledged: kho-7.0.0-1019-nvidia "
                                             "(test load only)")
    node, facts = spark(tmp_path)
    [row] = [r for r in preflight_doctor_rows(node, facts, requirement_failures(node, facts)) if r[0] == "preflight"]
    assert len(row) == 3 and "(kho-7.0.0-1019-nvidia)" in row[2][0]


def test_the_hwe_7_0_0_31_generic_kernel_is_refused_too(tmp_path):
    node, facts = spark(tmp_path, kernel="7.0.0-31-generic")
    [msg] = known_bad_failures(node, facts)
    assert "(kho-7.0.0-31-generic)" in msg and "Fix: add kho=off" in msg and "MiaAI-Lab" in msg


@pytest.mark.parametrize("name", ["session_dgxspark03_os_df_free.txt", "smi_query_name_driver_spark3bee.txt"])
def test_the_kernels_of_real_sparks_are_not_known_bad(tmp_path, name):
    """The kernel each capture's `uname -a` shows (6.17.0-1021-nvidia, 6.17.0-1032-nvidia)."""
    [kernel] = re.findall(r"^Linux \S+ (\S+) ", capture(name), re.M)
    node, facts = spark(tmp_path, kernel=kernel)
    assert kernel.startswith("6.17.0-") and requirement_failures(node, facts) == []


def test_a_release_that_only_starts_like_a_bad_one_is_not_matched(tmp_path):
    node, facts = spark(tmp_path, kernel="7.0.0-10190-nvidia")
    assert known_bad_failures(node, facts) == []


def test_cma_within_its_area_is_no_evidence():
    """A CMA area's own free pages (the 32 MiB default, part used) are not KHO's surplus: the version alone
    refuses, without naming meminfo."""
    [finding] = known_bad_findings({"kernel": BAD, "cmdline": NO_KHO, "cma_total_gib": 0.03125, "cma_free_gib": 0.03}, {})
    assert finding.evidence is None


def test_an_unknown_command_line_judges_nothing():
    """Facts recorded before the command line was read: no fact, no verdict."""
    assert known_bad_findings({"kernel": BAD}, {}) == []


@pytest.mark.parametrize("cmdline, off", [
    (KHO_OFF, True),
    (NO_KHO, False),
    ("ro kho=0", True), ("ro kho=n", True), ("ro kho=No", True), ("ro kho=OFF", True),
    ("ro kho=on", False), ("ro kho=1", False),
    ("ro kho=off kho=on", False),  # each occurrence is read, the last wins
    ("ro kho=on kho=off", True),
    ("ro kho=off kho=maybe", True),  # kstrtobool refuses it: the earlier value stands
    ("ro nokho=off kho_scratch=16M", False),  # other parameters
    ("ro kho", False),
])
def test_the_command_line_is_read_as_the_kernel_reads_kho(cmdline, off):
    assert param_off(cmdline, "kho") is off


def test_every_entry_says_what_breaks_the_remedy_and_its_sources():
    assert len(set(KNOWN_BAD_IDS)) == len(KNOWN_BAD)
    for entry in KNOWN_BAD:
        assert entry.breaks and entry.remedy and entry.sources, entry.id
        assert all(re.search(r"\S+/\S+ (PR )?#\d+", s) for s in entry.sources), entry.sources


# --- the acknowledgement, before any connection --------------------------------------------------

def refused(value) -> str:
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**{"spark-b": {"preflight_known_bad_acknowledged": value}}))
    return str(err.value)


def test_an_unknown_id_is_refused_naming_the_known_ones():
    text = refused({"kho-7.0.0-1020-nvidia": "a newer kernel"})
    assert "spark-b: key 'preflight_known_bad_acknowledged'" in text
    assert "kho-7.0.0-1020-nvidia: not in the known-bad table; known ids: kho-7.0.0-1019-nvidia, kho-7.0.0-31-generic" in text


@pytest.mark.parametrize("reason", ["", "   "])
def test_an_empty_reason_is_refused(reason):
    text = refused({"kho-7.0.0-1019-nvidia": reason})
    assert "kho-7.0.0-1019-nvidia: no reason given" in text


def test_a_reason_that_is_not_text_is_refused():
    assert "Input should be a valid string" in refused({"kho-7.0.0-1019-nvidia": True})
