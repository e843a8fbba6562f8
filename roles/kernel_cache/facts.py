"""Facts of roles/kernel_cache: a node's cache generations, and the one for an image."""
import re
import shlex

from pyinfra.api import FactBase

from sparkfleet.model.fanout import SFL_FILES


class CacheState(FactBase):
    """{"image": image ID or None, "current": link target or None, "generations": {name: mtime},
    "manifest": text or None, "files": {path: size}, "foreign": [(kind, path)]} of the cache root on a
    node, the manifest, files and foreign entries being those of the generation of `ref`'s image.
    Foreign: what sfl_files.py scrub would drop there (device nodes, fifos, sockets, symlinks leaving
    the generation, setuid/setgid entries); none is ever merged (roles/kernel_cache/checks.py)."""

    @staticmethod
    def default():
        return {"image": None, "current": None, "generations": {}, "manifest": None, "files": {}, "foreign": []}

    def command(self, root: str, ref: str) -> str:
        r, q = shlex.quote(root), shlex.quote(ref)
        return (
            f"id=$(docker image inspect --format '{{{{.Id}}}}' {q} 2>/dev/null || true); printf 'I\\t%s\\n' \"$id\"; "
            f"printf 'C\\t%s\\n' \"$(readlink {r}/current 2>/dev/null)\"; "
            f"[ -d {r} ] && find {r} -mindepth 1 -maxdepth 1 -type d -printf 'G\\t%f\\t%T@\\n'; "
            f"[ -d {r} ] && find {r} -mindepth 1 -maxdepth 1 -type f -name '*.manifest' -printf 'N\\t%f\\n'; "
            f"g=$(echo \"$id\" | sed 's/^sha256://' | cut -c1-12); "
            f"if [ -n \"$g\" ]; then [ -f {r}/$g.manifest ] && sed 's/^/M\\t/' {r}/$g.manifest; "
            f"[ -d {r}/$g ] && find {r}/$g -type f -printf 'F\\t%s\\t%P\\n'; "
            # Before roles/fanout installs it (a first deploy) there is no scrub: nothing is reported,
            # and the merge scrubs every rank anyway.
            f"[ -d {r}/$g ] && python3 {SFL_FILES} scrub --dry-run {r}/$g 2>/dev/null | sed 's/^/X\\t/'; fi; true"
        )

    def process(self, output):
        out = CacheState.default()
        manifest, dirs, sealed = [], {}, set()
        for line in output:
            kind, _, rest = line.partition("\t")
            if kind == "I":
                out["image"] = rest.strip() or None
            elif kind == "C":
                out["current"] = rest.strip() or None
            elif kind == "G":
                name, _, mtime = rest.partition("\t")
                dirs[name] = float(mtime)
            elif kind == "N":
                sealed.add(rest.strip().removesuffix(".manifest"))
            elif kind == "M":
                manifest.append(rest)
            elif kind == "F":
                size, _, rel = rest.partition("\t")
                out["files"][rel] = int(size)
            elif kind == "X":
                what, _, rel = rest.rstrip("\n").partition("\t")
                out["foreign"].append((what, rel))
        out["manifest"] = "\n".join(manifest) + "\n" if manifest else None
        # Only what sparkfleet created counts as a generation (retention removes nothing else): a
        # directory named by 12 hex digits of an image ID with its <name>.manifest beside it.
        out["generations"] = {n: t for n, t in dirs.items() if is_generation(n) and n in sealed}
        return out


GENERATION = re.compile(r"^[0-9a-f]{12}$")


def is_generation(name: str) -> bool:
    return bool(GENERATION.match(name))
