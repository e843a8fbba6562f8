"""The network-bound commands of roles/image, each bounded by its key of sparkfleet/model/image.py
(sparkfleet/bounded.py), and the names of their operations (the step a timeout names).

Each resumes on a re-run: a fetch keeps the objects that arrived (a lock a KILLed git left behind is
removed first), docker build reuses its layer cache, push and pull skip the layers already there.
"""
import shlex

from sparkfleet.bounded import bounded

q = shlex.quote


def checkout_step(recipe) -> str:
    return f"Check out the recipe at {recipe.commit}"


def build_step(profile) -> str:
    return f"Build {profile.image_ref} on the head"


def push_step(profile) -> str:
    return f"Push {profile.image_ref} to the fabric registry"


def pull_step(profile) -> str:
    return f"Pull {profile.image_ref} from the head"


def git_fetch_command(node, recipe, src: str) -> str:
    """The head's fetch of the recipe repository into its checkout `src`. A fetch stopped by TERM
    removes its own lock files; one that needed the KILL may leave one, which no other git process
    holds (sparkfleet owns the checkout), so stale locks go first."""
    d = q(src)
    return bounded(
        f"cd {d} && find .git -name '*.lock' -type f -delete && git fetch --quiet --tags origin",
        step=checkout_step(recipe), host=node.name, limit_s=node.image_git_fetch_timeout_s,
        key="image_git_fetch_timeout_s", resume="a re-run fetches again, keeping the objects that arrived",
    )


def build_command(node, profile, src: str) -> str:
    recipe = profile.recipe
    build_args = " ".join(f"--build-arg {q(f'{k}={v}')}" for k, v in sorted(recipe.build_args.items()))
    return bounded(
        f"cd {q(src)} && docker build --quiet -f {q(recipe.dockerfile)} {build_args}"
        f" -t {q(profile.image_ref)} {q(recipe.context)}",
        step=build_step(profile), host=node.name, limit_s=node.image_build_timeout_s, key="image_build_timeout_s",
        resume="a re-run builds again from docker's layer cache",
    )


def push_command(node, profile, ref: str) -> str:
    return bounded(
        f"docker push {q(ref)}", step=push_step(profile), host=node.name, limit_s=node.image_push_timeout_s,
        key="image_push_timeout_s", resume="a re-run pushes only the layers the registry lacks",
    )


def pull_command(node, profile, ref: str) -> str:
    return bounded(
        f"docker pull {q(ref)}", step=pull_step(profile), host=node.name, limit_s=node.image_pull_timeout_s,
        key="image_pull_timeout_s", resume="a re-run pulls only the layers this node lacks",
    )
