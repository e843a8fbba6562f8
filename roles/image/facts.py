"""Facts of roles/image: the recipe checkout on the head, and an image's ID on any node."""
import re
import shlex

from pyinfra.api import FactBase

from sparkfleet.keyvalue import key_values
from sparkfleet.model.engine import IMAGE_VAR


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


class RepoDigests(FactBase):
    """The registry digests (`<registry>/<repo>@sha256:...`) Docker has recorded for the local image
    `ref` (a push or a pull records one per registry it went through); [] when none or no image."""

    def command(self, ref: str) -> str:
        return f"docker image inspect --format '{{{{json .RepoDigests}}}}' {shlex.quote(ref)} 2>/dev/null || true"

    def process(self, output):
        import json

        for line in output:
            if line.strip().startswith("["):
                return sorted(d for d in json.loads(line) if isinstance(d, str))
        return []


class ImagePin(FactBase):
    """The image reference a worker's unit runs (sparkfleet/model/engine.py's pin file), or None."""

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        return pin_of("\n".join(output))


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


class ResolvedCommit(FactBase):
    """The full SHA an abbreviated recipe commit names, or None: from the head's recipe checkout when
    it has the commit, else from the commits the repository advertises (a branch or tag tip, `git
    ls-remote`, bounded to 20 s). Read at prepare, before anything is fetched."""

    def command(self, path: str, short: str, repository: str) -> str:
        p, s, r = shlex.quote(path), shlex.quote(short), shlex.quote(repository)
        return (
            "command -v git >/dev/null || exit 0; "
            f"git -C {p} rev-parse --verify --quiet {shlex.quote(short + '^{commit}')} 2>/dev/null"
            f" || timeout 20 git ls-remote {r} 2>/dev/null | awk -v s={s} 'index($1, s) == 1 {{print $1; exit}}'"
            " || true"
        )

    def process(self, output):
        shas = [line.strip() for line in output if len(line.strip()) == 40]
        return shas[0] if shas else None


# A manifest digest as Docker prints it.
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def pin_of(text: str) -> str | None:
    """The digest reference a pin file names, or None (no file, or not a reference by digest)."""

    for line in text.splitlines():
        key, sep, ref = line.strip().partition("=")
        if sep and key == IMAGE_VAR and "@" in ref and DIGEST.match(ref.rpartition("@")[2]):
            return ref
    return None
