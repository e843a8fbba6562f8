"""A profile file is parsed once per distinct text (sparkfleet/model/profile_file.py): the deploy asks
for a node's profile in every role, on every host, and parsing the YAML each time was a quarter of the
deploy's own CPU on the controller (docs/performance.md). Every caller still gets a profile of its
own, from the file as it is now."""
import shutil

import pytest
import yaml

from sparkfleet.model import profile_file
from sparkfleet.model.serving import PROFILES_DIR, load_profile

SHIPPED = "glm-5.3-flash-exl3"


@pytest.fixture
def site(tmp_path):
    """A site with its own copy of the shipped profile, its text made unique to this test (the parse is
    kept per text for the whole process)."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    path = profiles / "mine.yaml"
    shutil.copy(PROFILES_DIR / f"{SHIPPED}.yaml", path)
    path.write_text(path.read_text().replace(f"name: {SHIPPED}", "name: mine", 1) + f"# {tmp_path}\n")
    return tmp_path


@pytest.fixture
def parses(monkeypatch):
    """How many times a YAML text is parsed into data (yaml.safe_load, which _parsed calls)."""
    calls = []
    real = yaml.safe_load
    monkeypatch.setattr(yaml, "safe_load", lambda text: calls.append(text) or real(text))
    return calls


def test_the_same_text_is_parsed_once(site, parses):
    first = load_profile("mine", site_dir=str(site))
    again = [load_profile("mine", site_dir=str(site)) for _ in range(5)]
    assert len(parses) == 1
    assert all(p == first for p in again) and first.name == "mine"


def test_an_edited_file_is_read_again(site, parses):
    path = site / "profiles" / "mine.yaml"
    before = load_profile("mine", site_dir=str(site))
    path.write_text(path.read_text().replace(f"max_model_len: {before.max_model_len}", "max_model_len: 4096", 1))
    after = load_profile("mine", site_dir=str(site))
    assert (before.max_model_len, after.max_model_len) == (640000, 4096)
    assert len(parses) == 2


def test_a_caller_that_changes_its_data_changes_no_one_elses(site):
    """load_profile writes the node's recipe override and TP/PP into the data it read: the next caller,
    with other overrides or none, must see the file's values."""
    commit = "1" * 40
    bumped = load_profile("mine", {"commit": commit}, parallel={"tensor_parallel_size": 4}, site_dir=str(site))
    plain = load_profile("mine", site_dir=str(site))
    assert bumped.recipe.commit == commit and bumped.tensor_parallel_size == 4
    assert plain.recipe.commit != commit and plain.tensor_parallel_size == 2
    data, _ = profile_file.read(site / "profiles" / "mine.yaml")
    data["recipe"]["commit"] = "changed"
    assert profile_file.read(site / "profiles" / "mine.yaml")[0]["recipe"]["commit"] == plain.recipe.commit


def test_a_text_that_is_not_yaml_is_refused_every_time(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nengine: [\n")
    for _ in range(2):
        with pytest.raises(ValueError, match=rf"{path} line 3 column 1: not valid YAML"):
            profile_file.read(path)
