"""Baseline for bench/noop.py: a pyinfra run that gathers the facts sparkfleet's own code reads to
decide what to do (preflight, guards, fingerprint, host, fabric, firewall, docker, image, fanout, weights, API
key, kernel caches, serving, watchdog), on the same hosts and under the same conditions the roles
read them, and does nothing else: no operations, no checks, no tables. The facts pyinfra's
operations read for themselves (files.put's file facts, systemd's unit state) are not here: they are
part of what the benchmark measures as sparkfleet's cost on top.

Also here: what the deploy reads of a node at prepare without a pyinfra fact, the fleet's key
(roles/router/fleet_key.py key_facts: the router group's head's key file read into memory over SSH,
every other holder's Sha1File), so that the four-host floor pays what the fleet's deploy pays. Not
here: the deploy lock (roles/lock), a change of the node's state, not a reading of it.

tests/unit/test_facts_baseline.py fails when a role reads a fact (or a file over sparkfleet.keyfiles)
this file does not gather."""
from pyinfra import host, state
from pyinfra.facts.files import File, Sha1File
from pyinfra.facts.server import Which

from roles.docker.checks import DockerInfo
from roles.fabric.facts import FabricLink, FabricPing
from sparkfleet.fabric_others import FabricConfigs
from sparkfleet.model.fabric import NETPLAN_FILE
from roles.fabric_speed.checks import record_path
from roles.fabric_speed.facts import SpeedRecord
from roles.fingerprint.facts import EngineVersions, Fingerprint
from sparkfleet.model.monitoring import PROMETHEUS_USER, TEXTFILE_DIR, monitoring_node_name
from sparkfleet.root_paths import RootOnlyChain
from sparkfleet.firewall_facts import LiveMarker, ManagementSubnet
from roles.monitoring.checks import PACKAGES, InstalledVersions, UserPresent, monitoring_node
from roles.guards.facts import ContainerMemory, ModelFiles, ProcessMemory
from roles.image.checks import base_record_path, recipe_dir
from roles.image.facts import (
    DeployedCommits, DockerImageId, ImagePin, LocalImages, RecipeCheckout, RepoDigests, ResolvedCommit,
)
from roles.kernel_cache.checks import engine_generation, group_compile_settings
from roles.kernel_cache.engine_key import engine_identity
from roles.kernel_cache.facts import CacheState, GenerationState
from roles.preflight.facts import NodeFacts
from roles.api_proxy.checks import UNIT_PATH as API_PROXY_UNIT_PATH, ApiProxyHost
from roles.router.facts import RouterHost, RouterRouting
from roles.router.node_config import UNIT_PATH as ROUTER_UNIT_PATH, key_holders, venv_dir
from roles.serving.api_key import ApiKeyState, state_command
from roles.serving.checks import unit_path
from sparkfleet.model.engine import env_file_path, image_pin_path, unit_name
from roles.serving.facts import HeadHealth, UnitState
from sparkfleet.model.tls import api_base, ca_node_name, curl_tls, hop_pem_path
from roles.tls.checks import TlsState, scope as tls_scope, state_command as tls_state_command
from roles.serving.history import RecipeHistory, history_file
from sparkfleet.model.serving import FULL_SHA, node_profile
from roles.watchdog.facts import WatchdogUnit
from roles.weights.checks import profile_models
from roles.weights.facts import ModelCopy
from sparkfleet.inventory import cluster_from_state, fleet_from_state
from sparkfleet.once import once_per_run
from sparkfleet.keyfiles import read
from sparkfleet.model.api_key import key_file
from sparkfleet.model.compile_key import settings_key
from sparkfleet.model.image import history_path
from sparkfleet.model.weights import model_dir
from sparkfleet.roce_gid import RoceGids

cluster = cluster_from_state(state)
node = cluster.node(host.name)
profile = node_profile(node)
host.get_fact(NodeFacts, data_dir=node.preflight_data_dir, netdev=node.fabric_netdev,
              twin=node.fabric_twin_netdev or "", hcas=" ".join(node.rdma_hcas))
host.get_fact(ProcessMemory)
host.get_fact(ContainerMemory, container=unit_name(node))
host.get_fact(Fingerprint, netdev=node.fabric_netdev, ref=profile.image_ref, engine=profile.engine)
for half in node.fabric_halves:
    host.get_fact(FabricLink, netdev=half.netdev)
host.get_fact(Sha1File, path=NETPLAN_FILE)
host.get_fact(FabricConfigs, netdev=node.fabric_netdev, twin=node.fabric_twin_netdev)
for peer in cluster.peers(node):
    for half in peer.fabric_halves:
        host.get_fact(FabricPing, peer_ip=half.ip, payload=node.ping_payload)
host.get_fact(SpeedRecord, path=record_path(node))
if node.fabric_speed_link_test != "off":  # roles/fabric_speed: the test's program
    host.get_fact(Which, command=node.fabric_speed_link_test)
if node.firewall_enabled:
    host.get_fact(ManagementSubnet, address=node.management_address)  # (the monitoring node's address: pinned, no fact)
    host.get_fact(Which, command="nft")
host.get_fact(LiveMarker)
host.get_fact(Which, command="dockerd")
host.get_fact(Sha1File, path="/etc/docker/daemon.json")
host.get_fact(DockerInfo)
host.get_fact(DockerImageId, ref=profile.image_ref)
host.get_fact(RepoDigests, ref=profile.image_ref)  # roles/image: every node's registry digests of the image
if not node.is_head:  # and each worker's pinned digest
    host.get_fact(ImagePin, path=image_pin_path(node))
if node.serving_prune_other_profiles:
    host.get_fact(LocalImages)
host.get_fact(Sha1File, path=env_file_path(node, node.serving_dir))
host.get_fact(Sha1File, path=unit_path(node))
host.get_fact(UnitState, unit=unit_name(node))
host.get_fact(File, path=f"/etc/systemd/system/{'sparkfleet-worker' if node.is_head else 'sparkfleet-head'}.service")
for half in node.fabric_halves:
    if half.hca:
        host.get_fact(RoceGids, hca=half.hca)
host.get_fact(Which, command="rsync")
for model, _revision in profile_models(profile):
    host.get_fact(ModelCopy, root=node.weights_dir, model=model)
# tools/plan.py: the head's EngineVersions once per group (the plan's engine line, and the image's layers the
# kernel caches are keyed by); then each node's cache state of the generation of the engine in the image (of
# the image, where the engine cannot be read), as roles/kernel_cache/checks.py cache_facts reads it.
_head = state.inventory.get_host(cluster.head.name)
_versions = once_per_run(state, "engine-versions", lambda: _head.get_fact(
    EngineVersions, netdev=cluster.head.fabric_netdev, unit=unit_name(cluster.head), ref=profile.image_ref,
    engine=profile.engine) or {})
_settings = group_compile_settings(cluster)
_gen = engine_generation(engine_identity(_versions.get("layers"), profile.engine), _settings)
if _gen is not None:
    host.get_fact(GenerationState, root=node.kernel_cache_dir, ref=profile.image_ref, gen=_gen)
else:
    host.get_fact(CacheState, root=node.kernel_cache_dir, ref=profile.image_ref, key=settings_key(_settings))
host.get_fact(WatchdogUnit)
host.get_fact(RouterHost, venv=venv_dir(node.router_version), unit_path=ROUTER_UNIT_PATH, hop_pem=hop_pem_path(node))
if node.router_node == node.name:  # roles/rolling: the router's routing, read on the router node before the turns
    host.get_fact(RouterRouting)
    if not node.is_head:  # roles/router: the gate's pattern file derived from the fleet key there
        host.get_fact(ApiKeyState, command=state_command(node))
fleet = fleet_from_state(state)
if node.tls_enabled and node.name in {n.name for n in tls_scope(fleet)}:  # roles/tls: the CA, certificates, bundles
    host.get_fact(TlsState, script=tls_state_command(node, ca=node.name == ca_node_name(fleet.nodes),
                                                      scrape_ca=node.name == monitoring_node_name(list(fleet.nodes))))
holders = key_holders(fleet)  # roles/router/fleet_key.py key_facts: the fleet's key, with a router
if holders is not None:
    source, targets = holders
    if node.name == source.name:
        read(host, key_file(node))  # the source's key file, into memory (never printed)
    elif node.name in {n.name for n in targets}:
        host.get_fact(Sha1File, path=key_file(node))
host.get_fact(ApiProxyHost, unit_path=API_PROXY_UNIT_PATH)
if node.is_head:
    host.get_fact(ModelFiles, path=model_dir(node, profile.model))
    if profile.speculative and profile.speculative.draft_model:
        host.get_fact(ModelFiles, path=model_dir(node, profile.speculative.draft_model))
    if node.weights_source == "hub":
        host.get_fact(File, path=node.weights_hf_token_file)
    short = None if FULL_SHA.match(profile.recipe.commit) or set(profile.recipe.commit) == {"0"} else profile.recipe.commit
    if short:
        host.get_fact(ResolvedCommit, path=recipe_dir(node, profile), short=short, repository=profile.recipe.repository)
    host.get_fact(Which, command="git")
    host.get_fact(Which, command="docker-registry")
    host.get_fact(RecipeCheckout, path=recipe_dir(node, profile))
    host.get_fact(DeployedCommits, path=history_path(node, profile))
    host.get_fact(File, path=base_record_path(node, profile))
    host.get_fact(RecipeHistory, path=history_file(node, profile), deployed=history_path(node, profile))
    host.get_fact(ApiKeyState, command=state_command(node))
    host.get_fact(HeadHealth, api=api_base(node, profile.port), tls=curl_tls(node),
                  plain_port=profile.port if node.tls_enabled else None)
if node.monitoring_enabled:
    host.get_fact(InstalledVersions, packages=PACKAGES)
    host.get_fact(RootOnlyChain, path=TEXTFILE_DIR)  # roles/monitoring: the textfile directory's chain
    monitor = monitoring_node(fleet_from_state(state))
    if node.firewall_enabled and monitor is not None and monitor.name == node.name:
        host.get_fact(UserPresent, user=PROMETHEUS_USER)  # roles/monitoring/user_tasks.py, before the firewall
