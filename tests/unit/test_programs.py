"""tests/programs.py: a test that needs an OS program the controller lacks is skipped, saying how to
install it, except under `make unit` / `make test` (SFL_TEST_TOOLS_REQUIRED=1), where it fails."""
import pytest

from tests.programs import REQUIRED, os_program


def test_a_missing_program_skips_naming_the_target_that_installs_it(monkeypatch):
    monkeypatch.delenv(REQUIRED, raising=False)
    with pytest.raises(pytest.skip.Exception, match="sfl-no-such-program is not installed.*`make test-tools`"):
        os_program("sfl-no-such-program", "/nonexistent/sfl-no-such-program")


def test_a_missing_program_fails_under_the_targets_that_install_it(monkeypatch):
    monkeypatch.setenv(REQUIRED, "1")
    with pytest.raises(pytest.fail.Exception, match="missing under SFL_TEST_TOOLS_REQUIRED=1"):
        os_program("sfl-no-such-program")


def test_a_program_off_path_is_found_at_its_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # /usr/sbin is on no ordinary user's PATH
    assert os_program("sh", "/bin/sh") == "/bin/sh"
