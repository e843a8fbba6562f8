"""roles/router: the fleet's one endpoint, smg, on router_node, in front of every serving group that
serves the router group's model (roles/router/node_config.py); the key is the fleet's
(roles/router/fleet_key.py, decided at step 1b; key_tasks.py writes it). Runs after roles/serving: the heads serve by then.

On the router node:
1. python3-venv from the distribution when python3 cannot make a virtualenv with pip;
2. when its virtualenv lacks the pinned smg: the controller's cached wheel for the node's
   architecture (roles/router/wheels.py, fetched once, sha256-pinned) shipped over SSH, its sha256
   checked again on the node, a virtualenv made and the wheel installed into it, offline (--no-index
   --no-deps);
3. the control-plane key, /etc/sparkfleet/router-control-key, generated on the node when nothing is
   at that path (root-only from its first byte; a file there that cannot be read, is not root-only
   or is not one key line stops the deploy at prepare, naming it);
4. sfl_router.py, /etc/sparkfleet/router.json (root-only: it names the key files, not the keys) and
   sparkfleet-router.service; the router restarted only when one of them, its installation or a key
   changed, started when it is not running, enabled at boot; then its routing printed.
On any other node, a router unit left from an earlier router_node is stopped and removed, with its
config and control-plane key.
An unchanged re-deploy changes nothing.
"""
from io import StringIO
from pathlib import Path

from pyinfra import host, logger, state
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import apt, python, server, systemd
from pyinfra.operations.util import any_changed

from roles.router.control import report_routing
from roles.router.facts import RouterHost
from roles.router.node_config import (
    CONTROL_KEY_FILE, ROUTER_CONFIG, ROUTER_UNIT, SFL_ROUTER, UNIT_PATH, WHEEL_DIR, backends, config_text, unit_text,
    venv_dir,
)
from roles.router.wheels import fetch, wheel
from sparkfleet.model.api_key import KEY_TEXT
from sparkfleet import unchanged
from sparkfleet.keyfiles import generate_command, problem
from sparkfleet.decided import fleet_decision
from sparkfleet.inventory import fleet_from_state

fleet = fleet_from_state(state)
node = fleet.node(host.name)
version = node.router_version
venv = venv_dir(version)
found = host.get_fact(RouterHost, venv=venv, unit_path=UNIT_PATH)

if node.router_node == node.name:
    try:
        wheel_name, wheel_sha256 = wheel(version, found["arch"])
    except ValueError as e:
        raise DeployError(f"{node.name}: router_version {version}: {e}. Nothing was changed.")
    install = found["installed"] != version
    if install:
        try:
            local_wheel = fetch(version, found["arch"])
        except Exception as e:  # the controller reaches PyPI once; the nodes never do
            raise DeployError(f"{node.name}: the controller could not get {wheel_name}: {e}")
        logger.info(f"--> sparkfleet router: installing smg {version} ({found['arch']}) on {node.name} from the "
                    f"controller's {local_wheel}")
    if not found["venv"]:
        apt.packages(name="Install python3-venv (the router's virtualenv)", packages=["python3-venv"], update=True,
                     cache_time=3600)
    why = problem(node.name, "the router's control-plane key file", CONTROL_KEY_FILE, found["control_key"], KEY_TEXT)
    if why:
        raise DeployError(why)
    new_control_key = found["control_key"] == "missing"
    control_key = server.shell(
        name=f"Generate the router's control-plane key ({CONTROL_KEY_FILE}, root-only; no client has it)",
        commands=[generate_command(CONTROL_KEY_FILE)],
        _if=lambda: new_control_key,
    )
    installed = None
    if install:
        unchanged.directory(name=f"Create {WHEEL_DIR}", path=WHEEL_DIR, user="root", group="root", mode="0755")
        unchanged.put(name=f"Ship {wheel_name}", src=str(local_wheel), dest=f"{WHEEL_DIR}/{wheel_name}", user="root",
                      group="root", mode="0644")
        installed = server.shell(
            name=f"Install smg {version} into {venv} (offline, sha256 checked)",
            commands=[
                f"cd {WHEEL_DIR} && echo '{wheel_sha256}  {wheel_name}' | sha256sum -c --quiet",
                f"rm -rf {venv} && python3 -m venv {venv}",
                f"{venv}/bin/pip install --quiet --no-index --no-deps --disable-pip-version-check "
                f"{WHEEL_DIR}/{wheel_name}",
                f"rm -f {WHEEL_DIR}/{wheel_name}",
            ],
        )
    program = unchanged.put(name="Install sfl_router.py (the router's launcher and admin client)",
                            src=str(Path(__file__).with_name("sfl_router.py")), dest=SFL_ROUTER, mode="0755")
    config = unchanged.put(name=f"Write {ROUTER_CONFIG}", src=StringIO(config_text(fleet, node)), dest=ROUTER_CONFIG,
                           user="root", group="root", mode="0600")
    unit = unchanged.put(name=f"Write the {ROUTER_UNIT} unit", src=StringIO(unit_text(fleet, node)), dest=UNIT_PATH,
                         user="root", group="root", mode="0644")
    systemd.daemon_reload(name=f"Reload systemd ({ROUTER_UNIT} unit changed)", _if=unit.did_change)
    server.shell(name=f"Check {ROUTER_CONFIG} with the program",
                 commands=[f"python3 {SFL_ROUTER} check {ROUTER_CONFIG}"], _if=any_changed(program, config))
    key_changed = fleet_decision(state).key_written_on(node.name)  # the plan's key verdict (step 1b)
    tls = fleet_decision(state).tls  # smg reads the heads' CA (ca_file) at start only
    new_ca = tls is not None and node.name in tls.bundle
    restart = server.shell(
        name=f"Restart {ROUTER_UNIT} (its program, config, unit, installation, a key or the heads' CA changed)",
        commands=[f"systemctl restart {ROUTER_UNIT}.service"],
        _if=lambda: (key_changed or new_ca or (installed is not None and installed.did_change())
                     or any_changed(program, config, unit, control_key)()),
    )
    started = unchanged.service(name=f"Run {ROUTER_UNIT}, at boot too", service=f"{ROUTER_UNIT}.service",
                                running=True, enabled=True)
    python.call(
        name=f"The router's routing ({len(backends(fleet, node))} group(s))",
        function=report_routing,
        port=node.router_port,
        _if=any_changed(restart, started),
    )
elif found["unit"]:
    server.shell(
        name=f"Remove {ROUTER_UNIT} (router_node is {node.router_node or 'none'})",
        commands=[f"systemctl disable --now {ROUTER_UNIT}.service",
                  f"rm -f {UNIT_PATH} {ROUTER_CONFIG} {CONTROL_KEY_FILE}",
                  "systemctl daemon-reload"],
    )
