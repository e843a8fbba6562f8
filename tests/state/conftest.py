"""Expected state comes from the inventory the deploy used, never from literals in the tests."""
import pytest

from sparkfleet.inventory import load_cluster


@pytest.fixture(scope="session")
def cluster(request):
    return load_cluster(request.config.getoption("inventory"))


@pytest.fixture
def node(host, cluster):
    name = host.backend.get_hostname()
    found = cluster.find(name)
    if found is None:
        pytest.fail(f"testinfra host {name!r} is not a node of the inventory (names or ssh_hostname)")
    return found
