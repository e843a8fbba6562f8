"""The OS's programs some controller-side tests run for real (haproxy, rsync): not the project's to
install with `make install` (no root, no apt), but `make test-tools`' (as root), which `make unit` and
`make test` run first and mark with SFL_TEST_TOOLS_REQUIRED=1. A test that needs a missing program
is skipped, naming it and how to install it; under those targets it fails instead: they promise it ran."""
import os
import shutil
from pathlib import Path

import pytest

REQUIRED = "SFL_TEST_TOOLS_REQUIRED"


def os_program(name: str, path: str | None = None) -> str:
    """The path of `name` (on PATH, or at `path`: /usr/sbin is on no ordinary user's PATH); skip the
    test without it, or fail under `make unit` / `make test`."""
    found = shutil.which(name) or (path if path and Path(path).exists() else None)
    if found:
        return found
    why = (f"{name} is not installed on this machine: `make test-tools` installs it (apt, as root); "
           f"`make unit` and `make test` run that first")
    if os.environ.get(REQUIRED) == "1":
        pytest.fail(f"{why}, yet it is missing under {REQUIRED}=1")
    pytest.skip(why)
