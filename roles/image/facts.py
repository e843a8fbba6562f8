"""Facts of roles/image: the recipe checkout on the head, and an image's ID on any node."""
import shlex

from pyinfra.api import FactBase

from sparkfleet.keyvalue import key_values


class RecipeCheckout(FactBase):
    """{"head": full sha, "origin": url} of the git checkout at `path`, or None when absent."""

    def command(self, path: str) -> str:
        p = shlex.quote(path)
        return (
            f"if [ -d {p}/.git ]; then echo head=$(git -C {p} rev-parse HEAD 2>/dev/null);"
            f" echo origin=$(git -C {p} remote get-url origin 2>/dev/null); fi"
        )

    def process(self, output):
        return key_values(output) or None


class DockerImageId(FactBase):
    """The local image ID of `ref` (sha256:...), or None when the node does not have it."""

    def command(self, ref: str) -> str:
        return f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(ref)} 2>/dev/null || true"

    def process(self, output):
        lines = [line.strip() for line in output if line.strip().startswith("sha256:")]
        return lines[0] if lines else None


class DeployedCommits(FactBase):
    """Recipe commits a pair has served, oldest first, the current one last ([] when none)."""

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        return [line.strip() for line in output if line.strip()]


class LocalImages(FactBase):
    """Every local image as repository:tag."""

    def command(self) -> str:
        return "docker images --format '{{.Repository}}:{{.Tag}}' 2>/dev/null || true"

    def process(self, output):
        return sorted({line.strip() for line in output if line.strip() and not line.endswith(":<none>")})
