"""Fixtures shared by the unit tests."""
import subprocess

import pytest


@pytest.fixture
def launch():
    """launch(argv, env, cwd=None) starts a process with stdout and stderr in one pipe; every process
    started is killed at teardown (the lab stand-in tests start ranks that never exit on their own)."""
    procs = []

    def start(command, env, cwd=None):
        p = subprocess.Popen(command, env=env, cwd=cwd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=5)
