"""roles/watchdog as the deploy wires it: the data keys and their refusals, the files it writes."""
import pytest

from roles.watchdog.schema import WatchdogData, give_up_span_s
from sparkfleet.config import DATA_FIELDS, ConfigError, build_cluster
from tests.unit.helpers import pair


def both(**data):
    return build_cluster(pair(**{n: data for n in ("spark-a", "spark-b")}))


def refusal(**by_host) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**by_host))
    return err.value


def refused(**data) -> ConfigError:
    return refusal(**{n: data for n in ("spark-a", "spark-b")})


# ------------------------------------------------------------------------------------------ the data

def test_every_watchdog_key_is_a_data_key_with_the_programs_defaults():
    assert {k for k in DATA_FIELDS if k.startswith("watchdog_")} == set(WatchdogData.model_fields)
    node = both().head
    for key, field in WatchdogData.model_fields.items():
        assert getattr(node, key) == field.default, key


def test_the_defaults_and_the_labs_values_pass_the_cross_checks():
    both()
    both(serving_health_timeout_s=120)  # lab/group_data/all.py


def test_a_grace_shorter_than_a_cold_start_is_refused_naming_host_key_and_bound():
    err = refused(watchdog_startup_grace_s=600)
    assert [(p.hosts, p.key) for p in err.problems] == [(("spark-a",), "watchdog_startup_grace_s"),
                                                        (("spark-b",), "watchdog_startup_grace_s")]
    text = str(err)
    assert "key 'watchdog_startup_grace_s' = 600: must be at least serving_health_timeout_s (1200)" in text
    assert "set watchdog_startup_grace_s to 1200 or more" in text
    both(watchdog_startup_grace_s=600, serving_health_timeout_s=600)


def test_a_window_that_cannot_hold_max_restarts_cold_starts_is_refused_with_the_arithmetic():
    node = both().head
    span = give_up_span_s(node)
    # 3 cold starts of 1200 s; before restart 2 and 3: max(3 x (30 + 30), 60 x 2) and max(180, 240); then 180.
    assert span == 3 * 1200 + 180 + 240 + 180 == 4200
    err = refused(watchdog_window_s=span)
    [problem] = [p for p in err.problems if p.hosts == ("spark-a",)]
    assert problem.key == "watchdog_window_s"
    assert f"key 'watchdog_window_s' = {span}: must be more than {span} s" in problem
    assert f"set watchdog_window_s above {span}" in problem.fix
    both(watchdog_window_s=span + 1)
    # More restarts, or longer backoffs, need a longer window.
    assert "watchdog_window_s" in str(refused(watchdog_max_restarts=6))
    assert "watchdog_window_s" in str(refused(watchdog_backoff_s=1800))


def test_a_disabled_watchdog_is_not_held_to_its_timing():
    both(watchdog_enabled=False, watchdog_startup_grace_s=0, watchdog_window_s=60)


def test_watchdog_settings_must_be_the_same_on_every_node():
    err = refusal(**{"spark-b": {"watchdog_enabled": False}})
    [problem] = err.problems
    assert problem.key == "watchdog_enabled" and problem.hosts == ("spark-a", "spark-b")
    assert "key 'watchdog_enabled' differs between nodes (spark-a=True, spark-b=False)" in problem
    assert "watchdog_follow_interval_s" in str(refusal(**{"spark-b": {"watchdog_follow_interval_s": 7}}))
    # Each node keeps its own state directory: the peers read it through the rsync module.
    c = build_cluster(pair(**{"spark-b": {"watchdog_state_dir": "/srv/sparkfleet/watchdog"}}))
    assert c.node("spark-b").watchdog_state_dir == "/srv/sparkfleet/watchdog"


@pytest.mark.parametrize("path, why", [
    ("/var/lib", "system directory"),
    ("/var/lib/sparkfleet/models/watchdog", "each need a directory of their own"),
    ("/var/lib/sparkfleet/watch dog", "letters, digits"),
    ("relative/dir", "String should match pattern"),
])
def test_the_state_directory_is_a_directory_of_its_own(path, why):
    err = refused(watchdog_state_dir=path)
    assert why in str(err) and "watchdog_state_dir" in str(err)


def test_booleans_and_numbers_are_not_converted():
    assert "true or false" in str(refused(watchdog_enabled="yes"))
    assert "30 without quotes" in str(refused(watchdog_interval_s="30"))
    assert "greater than or equal to 5" in str(refused(watchdog_interval_s=1))
