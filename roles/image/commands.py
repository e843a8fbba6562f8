"""The network-bound commands of roles/image, each bounded by its key of sparkfleet/model/image.py
(sparkfleet/bounded.py), and the names of their operations (the step a timeout names).

Each resumes on a re-run: a fetch keeps the objects that arrived (a lock a KILLed git left behind is
removed first), docker build reuses its layer cache, push and pull skip the layers already there.

Each failure, at its limit or before, prints one line naming the log to read, the data key that
governs the step and the next step (sparkfleet/run_failure.py Advice). The fetch and the build write
their output to a root-only log file on the head (log_path), which the line names.
"""
import shlex

from sparkfleet.bounded import bounded
from sparkfleet.run_failure import Advice, journal, on_node

q = shlex.quote


def checkout_step(recipe) -> str:
    return f"Check out the recipe at {recipe.commit}"


def build_step(profile) -> str:
    return f"Build {profile.image_ref} on the head"


def push_step(profile) -> str:
    return f"Push {profile.image_ref} to the fabric registry"


def pull_step(profile) -> str:
    return f"Pull {profile.image_ref} from the head"


def log_path(node, what: str) -> str:
    """The head's log of one step's last run (overwritten by the next): <preflight_data_dir>/logs/<what>.log."""
    return f"{node.preflight_data_dir}/logs/{what}.log"


def fetch_log(node) -> str:
    return log_path(node, "recipe-fetch")


def build_log(node, profile) -> str:
    return log_path(node, f"build-{profile.name}")


def git_fetch_command(node, recipe, src: str) -> str:
    """The head's fetch of the recipe repository into its checkout `src`. A fetch stopped by TERM
    removes its own lock files; one that needed the KILL may leave one, which no other git process
    holds (sparkfleet owns the checkout), so stale locks go first."""
    d = q(src)
    return bounded(
        f"cd {d} && find .git -name '*.lock' -type f -delete && git fetch --quiet --tags origin",
        step=checkout_step(recipe), host=node.name, limit_s=node.image_git_fetch_timeout_s,
        key="image_git_fetch_timeout_s", resume="a re-run fetches again, keeping the objects that arrived",
        log_file=fetch_log(node),
        advice=Advice(
            log=on_node(node.management_address, f"cat {fetch_log(node)}"), key="serving_recipe_repository",
            next_step=f"check that {node.name} reaches {recipe.repository} (serving_recipe_repository: the recipe's "
                      f"origin) and that it holds commit {recipe.commit} (serving_recipe_commit); then re-deploy"),
    )


def build_command(node, profile, src: str) -> str:
    recipe = profile.recipe
    build_args = " ".join(f"--build-arg {q(f'{k}={v}')}" for k, v in sorted(recipe.build_args.items()))
    return bounded(
        f"cd {q(src)} && docker build --quiet -f {q(recipe.dockerfile)} {build_args}"
        f" -t {q(profile.image_ref)} {q(recipe.context)}",
        step=build_step(profile), host=node.name, limit_s=node.image_build_timeout_s, key="image_build_timeout_s",
        resume="a re-run builds again from docker's layer cache", log_file=build_log(node, profile),
        advice=Advice(
            log=on_node(node.management_address, f"tail -n 200 {build_log(node, profile)}"), key="serving_recipe_commit",
            next_step=f"find the Dockerfile step that failed in the build log; fix the recipe at {recipe.commit[:12]}, "
                      f"or set serving_recipe_commit to a commit that builds; a re-run builds again from docker's "
                      f"layer cache"),
    )


def push_command(node, profile, ref: str) -> str:
    return bounded(
        f"docker push {q(ref)}", step=push_step(profile), host=node.name, limit_s=node.image_push_timeout_s,
        key="image_push_timeout_s", resume="a re-run pushes only the layers the registry lacks",
        advice=Advice(
            log=journal(node.management_address, "docker-registry"), key="docker_registry_port",
            next_step=f"check that the head's registry runs and listens on {registry_of(ref)} "
                      f"({on_node(node.management_address, 'systemctl status docker-registry')}); "
                      f"a re-run pushes only the layers the registry lacks"),
    )


def pull_command(node, profile, ref: str) -> str:
    return bounded(
        f"docker pull {q(ref)}", step=pull_step(profile), host=node.name, limit_s=node.image_pull_timeout_s,
        key="image_pull_timeout_s", resume="a re-run pulls only the layers this node lacks",
        advice=Advice(
            log=journal(node.management_address, "docker"), key="docker_registry_port",
            next_step=f"check that {node.name} reaches the head's registry over the fabric "
                      f"({on_node(node.management_address, f'curl -sS http://{registry_of(ref)}/v2/')} answers {{}}); "
                      f"a re-run pulls only the layers this node lacks"),
    )


def registry_of(ref: str) -> str:
    """The registry's host:port of an image reference (`10.77.77.1:5000/repo@sha256:...`)."""
    return ref.split("/", 1)[0]
