"""roles/monitoring: the OS's node exporter on every node, the OS's Prometheus on the monitoring node
(roles/monitoring/checks.py renders every file; sparkfleet/model/monitoring.py holds the data).

On every node:
1. the exporter's arguments, its unit's drop-in (after the firewall), with TLS on its web configuration
   (the node's certificate: roles/tls copied it for the exporters at step 7b1), and sparkfleet's textfile;
2. (`prometheus-node-exporter` at the pinned upstream version was installed at step 4c when another or
   none was, its service held from starting: roles/monitoring/install_tasks.py;)
3. the exporter (re)started when step 4c installed it, or its arguments, drop-in or web configuration
   changed or the node's certificate is new (the plan's exporter copy), running and enabled;
4. on an RDMA node, the timer that writes its GID index now (sparkfleet-gid-metrics, sfl_gid.sh --now);
5. on a GPU node, NVIDIA's dcgm-exporter (sparkfleet-gpu-exporter), its fields GB10's, with the same web
   configuration, restarted when its unit, its fields, the web configuration or the certificate changed.
On the monitoring node, the same for `prometheus` (installed at step 4c too): its arguments, the alert rules, the secrets data names (copied from the controller, roles/monitoring/secrets.py)
and the scrape config (0640 root:prometheus; every target over https with TLS on, verified with the
trust bundle roles/tls copies for it), checked by promtool; reloaded (SIGHUP) when only the config, the
rules, a secret or that bundle changed, restarted when its arguments did. With monitoring_alertmanager_enabled, the same
again for `prometheus-alertmanager` after Prometheus (whose package makes the `prometheus` user that
reads its configuration), its configuration checked by amtool. Step 4c installed each package when
another version or none was there: its service is started here, with sparkfleet's files in place.
With monitoring_enabled false, nothing is installed; what an earlier deploy installed stays, and the
firewall closes its ports. An unchanged re-deploy changes nothing.
"""
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import python, server, systemd
from pyinfra.operations.util import any_changed

from roles.monitoring.checks import (
    ALERTMANAGER_CONFIG, ALERTMANAGER_DATA, ALERTMANAGER_DEFAULTS, ALERTMANAGER_PACKAGE, ALERTMANAGER_UNIT, PACKAGES,
    alertmanager_config_text, alertmanager_defaults_text,
    EXPORTER_DEFAULTS, EXPORTER_PACKAGE, EXPORTER_UNIT, GID_METRICS_UNIT, GPU_EXPORTER_UNIT, PROMETHEUS_CONFIG, PROMETHEUS_DATA, PROMETHEUS_DEFAULTS,
    PROMETHEUS_PACKAGE, PROMETHEUS_UNIT, RULES, TEXTFILE, TEXTFILE_DIR, InstalledVersions, exporter_defaults_text,
    gid_metrics_files, gpu_exporter_files, held_packages, monitoring_node, prometheus_config_text, prometheus_defaults_text, rules_text,
    targets, textfile_text, to_install, web_config_text,
)
from roles.monitoring.secrets import GROUP as SECRET_GROUP, MODE as SECRET_MODE, controller_secrets, stale, write_secret
from sparkfleet import unchanged
from sparkfleet.decided import fleet_decision
from sparkfleet.model.monitoring import SECRETS_DIR, secret_files
from sparkfleet.model.tls import EXPORTER_GROUP, EXPORTER_WEB_CONFIG
from sparkfleet.root_paths import RootOnlyChain, absent_dir_command, chain_complete, chain_problem, root_only_chain_command
from sparkfleet.unchanged import ManagedTargets
from sparkfleet.inventory import fleet_from_state
from sparkfleet.render import render

fleet = fleet_from_state(state)
node = fleet.node(host.name)
monitor = monitoring_node(fleet)
tls = fleet_decision(state).tls  # roles/tls's plan: a new certificate copied for the exporters, a new bundle
new_cert = tls is not None and node.name in tls.exporter_pem


def _dropin(unit: str) -> str:
    return f"/etc/systemd/system/{unit}.service.d/50-sparkfleet.conf"


def _ordered_after_the_firewall(unit: str):
    """The OS's unit's drop-in (after the firewall), systemd reloaded when it changed."""
    dropin = unchanged.put(name=f"Write {_dropin(unit)} (after the firewall)",
                           src=StringIO(render("monitoring", _dropin(unit), firewall_enabled=node.firewall_enabled)),
                           dest=_dropin(unit), user="root", group="root", mode="0644", create_remote_dir=True)
    systemd.daemon_reload(name=f"Reload systemd ({unit}'s drop-in changed)", _if=dropin.did_change)
    return dropin


if monitor is not None:
    # The packages step 4c installed in this run (roles/monitoring/install_tasks.py): their services were held
    # from starting, so each is started here once its files are written (an upgrade's, restarted).
    fresh = to_install(held_packages(node, monitor), host.get_fact(InstalledVersions, packages=PACKAGES))
    if node.name == monitor.name:
        jobs = targets(fleet)
        logger.info(f"--> sparkfleet monitoring: Prometheus on {node.name} (127.0.0.1:{node.monitoring_prometheus_port}) "
                    f"scrapes {len(jobs['node'])} node exporters and {len(jobs['engine'])} engines")

    # 1. Every node: the exporter, its arguments and sparkfleet's facts.
    # The textfile directory: every directory of it root's alone, made component by component when absent
    # (sparkfleet/root_paths.py), so no other user can swap a path under root's writes there. Read at
    # prepare: one planted symlink or another user's directory on the way stops the deploy here, naming it.
    chain = host.get_fact(RootOnlyChain, path=TEXTFILE_DIR)
    problem = chain_problem(chain, TEXTFILE_DIR)
    if problem:
        raise DeployError(f"{host.name}: monitoring: the textfile directory {TEXTFILE_DIR}: {problem}")
    server.shell(name=f"Create {TEXTFILE_DIR} (every directory of it root's alone)",
                 commands=[root_only_chain_command(TEXTFILE_DIR)], _if=lambda: not chain_complete(chain))
    facts = unchanged.put(name=f"Write {TEXTFILE} (sparkfleet's facts, for the textfile collector)",
                          src=StringIO(textfile_text(fleet, node)), dest=TEXTFILE, user="root", group="root",
                          mode="0644")
    args = unchanged.put(name=f"Write {EXPORTER_DEFAULTS}", src=StringIO(exporter_defaults_text(node)),
                         dest=EXPORTER_DEFAULTS, user="root", group="root", mode="0644")
    dropin = _ordered_after_the_firewall(EXPORTER_UNIT)
    # TLS: the exporters' web configuration beside the copy of the node's certificate roles/tls made there
    # (its directory root:prometheus 0750; that group exists from step 3a or 4c, roles/monitoring/user_tasks.py or install_tasks.py).
    web_text = web_config_text(node)
    web = unchanged.put(name=f"Write {EXPORTER_WEB_CONFIG} (the exporters' TLS)", src=StringIO(web_text),
                        dest=EXPORTER_WEB_CONFIG, user="root", group=EXPORTER_GROUP, mode="0640") if web_text else None
    web_changed = lambda: web is not None and web.did_change()  # noqa: E731
    if EXPORTER_PACKAGE in fresh:
        server.shell(name=f"Start {EXPORTER_UNIT} (installed at step 4c)", commands=[f"systemctl restart {EXPORTER_UNIT}.service"])
    server.shell(name=f"Restart {EXPORTER_UNIT} (its arguments, its TLS or its certificate changed)",
                 commands=[f"systemctl restart {EXPORTER_UNIT}.service"],
                 _if=lambda: (args.did_change() or dropin.did_change() or web_changed() or new_cert)
                 and EXPORTER_PACKAGE not in fresh)
    unchanged.service(name=f"Run {EXPORTER_UNIT}, at boot too", service=f"{EXPORTER_UNIT}.service", running=True,
                      enabled=True)
    # An RDMA node: its GID index, now, every scrape interval (SparkfleetGidMoved).
    gid_files = gid_metrics_files(node)
    if gid_files:
        gid_units = [unchanged.put(name=f"Write {path}", src=StringIO(text), dest=path, user="root", group="root",
                                   mode="0644") for path, text in gid_files.items()]
        systemd.daemon_reload(name=f"Reload systemd ({GID_METRICS_UNIT} changed)", _if=any_changed(*gid_units))
        unchanged.service(name=f"Run {GID_METRICS_UNIT}.timer, at boot too", service=f"{GID_METRICS_UNIT}.timer",
                          running=True, enabled=True)
    # A GPU node: GPU utilization, SM clock, temperature and power (SparkfleetGpuThrottled).
    gpu_files = gpu_exporter_files(node)
    if gpu_files:
        gpu = [unchanged.put(name=f"Write {path}", src=StringIO(text), dest=path, user="root", group="root",
                             mode="0644", create_remote_dir=True) for path, text in gpu_files.items()]
        systemd.daemon_reload(name=f"Reload systemd ({GPU_EXPORTER_UNIT} changed)", _if=any_changed(*gpu))
        server.shell(name=f"Restart {GPU_EXPORTER_UNIT} (its unit, its fields, its TLS or its certificate changed)",
                     commands=[f"systemctl restart {GPU_EXPORTER_UNIT}.service"],
                     _if=lambda: any_changed(*gpu)() or web_changed() or new_cert)
        unchanged.service(name=f"Run {GPU_EXPORTER_UNIT}, at boot too", service=f"{GPU_EXPORTER_UNIT}.service",
                          running=True, enabled=True)

    # 2. The monitoring node: Prometheus, its targets from the fleet and sparkfleet's rules.
    if node.name == monitor.name:
        # Every secret data names, read on the controller now (prepare): a file that cannot be used stops here.
        secrets = controller_secrets(state, node)
        prom_args = unchanged.put(name=f"Write {PROMETHEUS_DEFAULTS}", src=StringIO(prometheus_defaults_text(node)),
                                  dest=PROMETHEUS_DEFAULTS, user="root", group="root", mode="0644")
        unchanged.directory(name="Create /etc/prometheus", path="/etc/prometheus", user="root", group="root",
                            mode="0755")
        rules = unchanged.put(name=f"Write {RULES} (sparkfleet's alerts)", src=StringIO(rules_text(fleet)), dest=RULES,
                              user="root", group="root", mode="0644")
        prom_dropin = _ordered_after_the_firewall(PROMETHEUS_UNIT)
        # The prometheus user and group exist since step 3a or 4c (its user, or the packages' postinst): the scrape
        # config and the secrets are root's and that group's alone.
        new_prom = PROMETHEUS_PACKAGE in fresh
        unchanged.directory(name=f"Create {SECRETS_DIR} (root:{SECRET_GROUP})", path=SECRETS_DIR, user="root",
                            group=SECRET_GROUP, mode="0750")
        found = host.get_fact(ManagedTargets, files=tuple(sorted(secrets))) if secrets else {}
        written = [python.call(name=f"Write {path} (root:{SECRET_GROUP} {SECRET_MODE}, from the controller's "
                                    f"{secret_files(node)[path][1]})", function=write_secret, path=path)
                   for path in stale(secrets, (found or {}).get("files", {}))]
        config = unchanged.put(name=f"Write {PROMETHEUS_CONFIG} (targets from the inventory)",
                               src=StringIO(prometheus_config_text(fleet)), dest=PROMETHEUS_CONFIG, user="root",
                               group="prometheus", mode="0640")
        # promtool checks the config and the rules it names: a file Prometheus would refuse stops here.
        server.shell(name=f"Check {PROMETHEUS_CONFIG} and {RULES} with promtool",
                     commands=[f"promtool check config {PROMETHEUS_CONFIG}"],
                     _if=lambda: new_prom or any_changed(config, rules)())
        if new_prom:
            server.shell(name=f"Start {PROMETHEUS_UNIT} (installed at step 4c)",
                         commands=[absent_dir_command(PROMETHEUS_DATA, "prometheus", "prometheus"),
                                   f"systemctl restart {PROMETHEUS_UNIT}.service"])
        restart = any_changed(prom_args, prom_dropin)
        restarts = lambda: restart() and not new_prom  # noqa: E731 (the start above read the args)
        server.shell(name=f"Restart {PROMETHEUS_UNIT} (its arguments changed)",
                     commands=[absent_dir_command(PROMETHEUS_DATA, "prometheus", "prometheus"),
                               f"systemctl restart {PROMETHEUS_UNIT}.service"],
                     _if=restarts)
        new_bundle = tls is not None and node.name in tls.bundle  # roles/tls wrote Prometheus' copy too
        server.shell(name=f"Reload {PROMETHEUS_UNIT} (its targets, rules, secrets or trust bundle changed)",
                     commands=[f"systemctl reload {PROMETHEUS_UNIT}.service"],
                     _if=lambda: (any_changed(config, rules, *written)() or new_bundle) and not restarts()
                     and not new_prom)
        unchanged.service(name=f"Run {PROMETHEUS_UNIT}, at boot too", service=f"{PROMETHEUS_UNIT}.service",
                          running=True, enabled=True)

    # 3. The monitoring node, when data asks for it: Alertmanager, Prometheus' alerts to data's receivers.
    if node.name == monitor.name and node.monitoring_alertmanager_enabled:
        am_args = unchanged.put(name=f"Write {ALERTMANAGER_DEFAULTS}", src=StringIO(alertmanager_defaults_text(node)),
                                dest=ALERTMANAGER_DEFAULTS, user="root", group="root", mode="0644")
        # root and the service's group only: the receivers name the team's endpoints (their secrets are in the
        # copies step 2 wrote, never in data: sparkfleet/model/monitoring.py ALERTMANAGER_SECRETS)
        am_config = unchanged.put(name=f"Write {ALERTMANAGER_CONFIG} (the receivers)",
                                  src=StringIO(alertmanager_config_text(node)), dest=ALERTMANAGER_CONFIG, user="root",
                                  group="prometheus", mode="0640")
        new_am = ALERTMANAGER_PACKAGE in fresh
        server.shell(name=f"Check {ALERTMANAGER_CONFIG} with amtool", commands=[f"amtool check-config {ALERTMANAGER_CONFIG}"],
                     _if=lambda: new_am or am_config.did_change())
        if new_am:
            server.shell(name=f"Start {ALERTMANAGER_UNIT} (installed at step 4c)",
                         commands=[absent_dir_command(ALERTMANAGER_DATA, "prometheus", "prometheus"),
                                   f"systemctl restart {ALERTMANAGER_UNIT}.service"])
        server.shell(name=f"Restart {ALERTMANAGER_UNIT} (its arguments changed)",
                     commands=[absent_dir_command(ALERTMANAGER_DATA, "prometheus", "prometheus"),
                               f"systemctl restart {ALERTMANAGER_UNIT}.service"],
                     _if=lambda: am_args.did_change() and not new_am)
        server.shell(name=f"Reload {ALERTMANAGER_UNIT} (its receivers changed)",
                     commands=[f"systemctl reload {ALERTMANAGER_UNIT}.service"],
                     _if=lambda: (am_config.did_change() or any_changed(*written)()) and not am_args.did_change()
                     and not new_am)
        unchanged.service(name=f"Run {ALERTMANAGER_UNIT}, at boot too", service=f"{ALERTMANAGER_UNIT}.service",
                          running=True, enabled=True)
