"""Facts of roles/weights: a model's manifest and the files actually under its directory."""
import shlex

from pyinfra.api import FactBase


class ModelCopy(FactBase):
    """{"manifest": text or None, "files": {relative path: size}} of <dir>/<model> on a node.

    Sizes only: hashing ~164 GiB at every deploy would take minutes; sha256 is checked after every
    transfer, and the manifest written only when it matched."""

    @staticmethod
    def default():  # no output at all: neither a manifest nor a directory
        return {"manifest": None, "files": {}}

    def command(self, root: str, model: str) -> str:
        d = shlex.quote(f"{root}/{model}")
        m = shlex.quote(f"{root}/{model}.manifest")
        return (
            f"if [ -f {m} ]; then sed 's/^/M\\t/' {m}; fi; "
            f"if [ -d {d} ]; then find {d} \\( -name .sparkfleet-partial -o -name .cache \\) -prune -o "
            f"-type f -printf 'F\\t%s\\t%P\\n'; fi"
        )

    def process(self, output):
        manifest, files = [], {}
        for line in output:
            kind, _, rest = line.partition("\t")
            if kind == "M":
                manifest.append(rest)
            elif kind == "F":
                size, _, rel = rest.partition("\t")
                files[rel] = int(size)
        return {"manifest": "\n".join(manifest) + "\n" if manifest else None, "files": files}
