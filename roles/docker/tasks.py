"""roles/docker: the engine, the NVIDIA runtime on GPU nodes, log rotation; restarted only on change."""
from io import StringIO

from pyinfra import host, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.files import Sha1File
from pyinfra.facts.server import Which
from pyinfra.operations import apt, python, systemd

from roles.docker.checks import DockerInfo, daemon_config, docker_info_problems
from sparkfleet import unchanged
from sparkfleet.inventory import cluster_from_state
from sparkfleet.once import at_once
from sparkfleet.render import render, sha1_text

DAEMON_JSON = "/etc/docker/daemon.json"

cluster = cluster_from_state(state)
node = cluster.node(host.name)
daemon_text = render("docker", DAEMON_JSON, daemon=daemon_config(node, cluster))

# What this step reads of the node, at once: pyinfra keeps no fact between reads, and one read after
# the other each costs a round trip (bench/noop.py). docker info answers nothing without an engine.
dockerd, daemon_sha1, live_info = at_once(
    lambda: host.get_fact(Which, command="dockerd"),
    lambda: host.get_fact(Sha1File, path=DAEMON_JSON),
    lambda: host.get_fact(DockerInfo),
)

# 1. An engine, when the node has none (DGX OS ships Docker; a plain server may not).
if not dockerd:
    apt.packages(name="Install the Docker engine", packages=[node.docker_package], update=True, cache_time=3600)

# 2. The NVIDIA container runtime, on nodes with a GPU.
if node.gpu_expected:
    apt.packages(name="Install the NVIDIA container toolkit", packages=["nvidia-container-toolkit"])

# 3. daemon.json: log rotation, live-restore, the fabric registry, the NVIDIA runtime as default.
daemon_json = unchanged.put(
    name="Write /etc/docker/daemon.json",
    src=StringIO(daemon_text),
    dest=DAEMON_JSON,
    user="root",
    group="root",
    mode="0644",
)
unchanged.service(name="Enable and start Docker", service="docker", running=True, enabled=True)
systemd.service(name="Restart Docker (daemon.json changed)", service="docker", restarted=True, _if=daemon_json.did_change)


# 4. What the daemon reports: now when nothing changes, after the restart otherwise.
def check_docker_info():
    from pyinfra import host as running_host  # facts are cached from prepare: ask the daemon afresh

    ok, output = running_host.run_shell_command(StringCommand(DockerInfo().command()))
    info = DockerInfo().process(output.stdout_lines) if ok else None
    problems = docker_info_problems(node, cluster, info)
    if problems:
        raise DeployError("\n".join(problems))


if daemon_sha1 == sha1_text(daemon_text) and live_info:
    problems = docker_info_problems(node, cluster, live_info)
    if problems:
        raise DeployError("\n".join(problems))
else:
    python.call(name="Check docker info", function=check_docker_info)
