"""Where the recipe lives on the head, which image a profile builds, and whether every node has it."""
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError

from roles.docker.checks import registry_address
from roles.image.facts import DockerImageId
from sparkfleet.once import active_hosts, once_per_run


def recipe_dir(node, profile) -> str:
    return f"{node.preflight_data_dir}/recipes/{profile.name}"


def history_path(node, profile) -> str:
    """The recipe commits this pair has served (written by roles/serving once /health is 200)."""
    return f"{node.preflight_data_dir}/recipes/{profile.name}.deployed"


def check_recipe_drift(src: str, old: str, new: str, launch_files, pinned: dict, acknowledged) -> None:
    """Operation body (head, after the checkout fetched `new`): report every launch default that
    changed between the served commit and the new one; stop on one sparkfleet does not pin."""
    from pyinfra import host, logger

    from roles.guards.drift import drift_report, launch_defaults

    def defaults(commit):
        out = {}
        for name in launch_files:
            ok, text = host.run_shell_command(StringCommand(f"git -C {src} show {commit}:{name} 2>/dev/null || true"))
            out.update(launch_defaults(text.stdout if ok else ""))
        return out

    lines, stops = drift_report(defaults(old), defaults(new), pinned, set(acknowledged))
    header = f"recipe {old[:12]} -> {new[:12]}, launch defaults ({', '.join(launch_files)}):"
    logger.info(f"    [{host.name}] {header} " + ("; ".join(lines) if lines else "unchanged"))
    if stops:
        raise DeployError(
            f"{header} {', '.join(stops)} changed upstream and sparkfleet does not pin "
            f"{'it' if len(stops) == 1 else 'them'}: pin in data (serving_env_pins: {{{stops[0]}: ...}}) or "
            f"acknowledge (recipe_drift_acknowledged: [{', '.join(stops)}]). Nothing was built or restarted.\n  "
            + "\n  ".join(lines)
        )


def other_profile_images(local: list[str], profile, registry: str) -> list[str]:
    """Local images (plain and registry-tagged) of every shipped profile but the served one."""
    from roles.serving.schema import load_profile, profile_names

    repos = {load_profile(n).image for n in profile_names()} - {profile.image}
    repos |= {f"{registry}/{r}" for r in repos}
    return [ref for ref in local if ref.rsplit(":", 1)[0] in repos]


def registry_ref(cluster, profile) -> str:
    return f"{registry_address(cluster)}/{profile.image_ref}"


def image_ids(state, profile) -> dict[str, str | None]:
    """Image ID of the profile's image on every node, at prepare time (before any operation)."""
    return once_per_run(
        state,
        f"image-ids:{profile.image_ref}",
        lambda: {h.name: h.get_fact(DockerImageId, ref=profile.image_ref) for h in active_hosts(state)},
    )


def ids_differ_message(ids: dict[str, str | None], ref: str) -> str:
    rows = ", ".join(f"{name}={(image_id or 'missing')[:19]}" for name, image_id in sorted(ids.items()))
    return f"image {ref} differs between nodes: {rows}; every rank must run the same image"


def verify_same_image(ref: str) -> None:
    """Operation body (runs on the head after the pulls): the same image ID on every node, read afresh."""
    from pyinfra import state

    ids = {}
    for node_host in active_hosts(state):
        ok, out = node_host.run_shell_command(StringCommand(DockerImageId().command(ref)))
        ids[node_host.name] = DockerImageId().process(out.stdout_lines) if ok else None
    if len(set(ids.values())) != 1 or None in ids.values():
        raise DeployError(ids_differ_message(ids, ref))
