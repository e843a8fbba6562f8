"""Expected state comes from the inventory the deploy used, never from literals in the tests."""
import pytest

from sparkfleet.inventory import load_cluster


@pytest.fixture(scope="session")
def cluster(request):
    from pyinfra_cli.util import parse_cli_arg

    overrides = {}
    for item in request.config.getoption("data"):
        key, _, value = item.partition("=")
        overrides[key] = parse_cli_arg(value)
    return load_cluster(request.config.getoption("inventory"), overrides=overrides)


@pytest.fixture
def node(host, cluster):
    name = host.backend.get_hostname()
    found = cluster.find(name)
    if found is None:
        pytest.fail(f"testinfra host {name!r} is not a node of the inventory (names or ssh_hostname)")
    return found


@pytest.fixture(scope="session")
def node_hosts(request, cluster):
    """A testinfra host for every node named in --hosts, by node name (for checks across nodes)."""
    import testinfra

    opt = request.config.option
    out = {}
    for spec in opt.hosts.split(","):
        name = spec.split("://", 1)[-1].split("@", 1)[-1].split(":", 1)[0]
        node = cluster.find(name)
        if node is not None:
            out[node.name] = testinfra.get_host(spec, ssh_config=opt.ssh_config, ssh_identity_file=opt.ssh_identity_file)
    return out


@pytest.fixture(scope="session")
def profile(cluster):
    from sparkfleet.model.serving import node_profile

    return node_profile(cluster.head)
