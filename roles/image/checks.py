"""Where the recipe lives on the head, which image a profile builds, and whether every node has it."""
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError

from roles.docker.checks import registry_address
from roles.image.facts import DockerImageId
from sparkfleet.once import active_hosts, once_per_run


def recipe_dir(node, profile) -> str:
    return f"{node.preflight_data_dir}/recipes/{profile.name}"


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
