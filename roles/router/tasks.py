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
   sparkfleet-router.service: smg on 127.0.0.1:router_smg_port; the router restarted only when one of
   them, its installation, a key, the heads' CA or the router hop's client certificate (roles/tls,
   step 7b1; smg reads it at start) changed, started when it is not running, enabled at boot; with TLS
   off, a router hop's certificate left there from a run with TLS on is removed (nothing presents it);
5. the router's gate (roles/router/gate.py): on a router node that is no head, the fleet key's derived
   root-only files (roles/serving/api_key.py: the gate's pattern file) rewritten when they differ from
   its key file; HAProxy's config and sparkfleet-router-proxy.service on router_port, after smg has left
   that port (a router deployed before the gate listened there itself); reloaded (in-flight requests
   finish) when its config, the key or the node's certificate changed; then the router's routing printed.
On any other node, a router unit and gate left from an earlier router_node are stopped and removed, with
their config and the control-plane key, and the router hop's client certificate and key (roles/tls issued
them there; the heads admit it from the router node's address only, but no node other than the router
node keeps the hop's credential).
An unchanged re-deploy changes nothing.
"""
from io import StringIO
from pathlib import Path

from pyinfra import host, logger, state
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import apt, python, server, systemd
from pyinfra.operations.util import any_changed

from roles.api_proxy.gate_ops import gate_operations
from roles.router.control import report_routing
from roles.router.facts import RouterHost
from roles.router.gate import GATE_UNIT, GATE_UNIT_PATH, gate_config_path, gate_config_text, gate_unit_text
from roles.serving.api_key import ApiKeyState, decide_key
from roles.serving.api_key import state_command as key_state_command
from roles.serving.api_key import write_command as key_write_command
from roles.router.node_config import (
    CONTROL_KEY_FILE, ROUTER_CONFIG, ROUTER_UNIT, SFL_ROUTER, UNIT_PATH, WHEEL_DIR, backends, config_text, unit_text,
    venv_dir,
)
from roles.router.wheels import fetch, wheel
from sparkfleet.model.tls import hop_pem_path
from sparkfleet.model.api_key import KEY_TEXT
from sparkfleet import unchanged
from sparkfleet.keyfiles import generate_command, problem
from sparkfleet.decided import decisions, fleet_decision
from sparkfleet.inventory import fleet_from_state

fleet = fleet_from_state(state)
node = fleet.node(host.name)
version = node.router_version
venv = venv_dir(version)
found = host.get_fact(RouterHost, venv=venv, unit_path=UNIT_PATH, hop_pem=hop_pem_path(node))
hop_files = " ".join(f"{hop_pem_path(node)}{end}" for end in ("", ".new", ".crt.new", ".key.new"))

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
    tls = fleet_decision(state).tls  # smg reads the heads' CA (ca_file) and its client certificate at start only
    new_ca = tls is not None and node.name in tls.bundle
    new_cert = tls is not None and tls.reloads(node.name)  # roles/tls issued the node's certificate (the gate's)
    new_hop = tls is not None and node.name in tls.hop  # roles/tls issued the router hop's (smg's), step 7b1
    if not node.tls_enabled and found["hop_pem"]:
        server.shell(name=f"Remove the router hop's client certificate ({hop_pem_path(node)}): TLS is off, smg "
                          f"presents the key", commands=[f"rm -f {hop_files}"])
    restart = server.shell(
        name=f"Restart {ROUTER_UNIT} (its program, config, unit, installation, a key, the heads' CA or its client "
             f"certificate changed)",
        commands=[f"systemctl restart {ROUTER_UNIT}.service"],
        _if=lambda: (key_changed or new_ca or new_hop or (installed is not None and installed.did_change())
                     or any_changed(program, config, unit, control_key)()),
    )
    started = unchanged.service(name=f"Run {ROUTER_UNIT}, at boot too", service=f"{ROUTER_UNIT}.service",
                                running=True, enabled=True)

    # The gate, once smg listens on loopback (an earlier router listened on router_port itself).
    if node.is_head:  # roles/serving/api_key_tasks.py wrote the head's derived files at step 7b
        key_files_changed = decisions(state).key != "ok"
    else:  # the gate's pattern file from the fleet key the plan wrote here (roles/router/key_tasks.py, step 7b)
        key_files = decide_key(node, host.get_fact(ApiKeyState, command=key_state_command(node)), key_changed)
        key_files_changed = key_files != "ok"
        server.shell(name="Write the fleet key's root-only derived files on the router node (the gate's pattern file)",
                     commands=[key_write_command(node)], _if=lambda: key_files_changed)
    gate_operations(GATE_UNIT, GATE_UNIT_PATH, gate_unit_text(node), gate_config_path(node), gate_config_text(node),
                    reload_also=lambda: key_files_changed or new_cert,
                    reload_why="its config, the API key or the node's certificate changed")
    python.call(
        name=f"The router's routing ({len(backends(fleet, node))} group(s))",
        function=report_routing,
        port=node.router_port,
        _if=any_changed(restart, started),
    )
else:
    if found["unit"] or found["gate_unit"]:
        server.shell(
            name=f"Remove {ROUTER_UNIT} and {GATE_UNIT} (router_node is {node.router_node or 'none'})",
            commands=[f"systemctl disable --now {GATE_UNIT}.service {ROUTER_UNIT}.service 2>/dev/null || true",
                      f"rm -f {UNIT_PATH} {GATE_UNIT_PATH} {ROUTER_CONFIG} {gate_config_path(node)} {CONTROL_KEY_FILE}",
                      "systemctl daemon-reload"],
        )
    if found["hop_pem"]:  # after smg stopped (above): nothing presents it again
        server.shell(name=f"Remove the router hop's client certificate and key ({hop_pem_path(node)}; router_node is "
                          f"{node.router_node or 'none'})", commands=[f"rm -f {hop_files}"])
