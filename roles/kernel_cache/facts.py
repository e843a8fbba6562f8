"""Facts of roles/kernel_cache: a node's cache generations, and the one for an image."""
import re
import shlex

from pyinfra.api import FactBase

from roles.fanout.sfl_files import parse_manifest
from sparkfleet.model.fanout import SFL_FILES


class CacheState(FactBase):
    """{"image": image ID or None, "current": link target or None, "generations": {name: mtime},
    "manifest": text or None, "files": {path: size}, "foreign": [(kind, path)], "current_header":
    {key: value}, "engine": None} of the cache root on a node, the manifest, files and foreign entries
    being those of the generation of `ref`'s image and compile key `key` (roles/kernel_cache/checks.py
    generation; "" names an older sparkfleet's generation, by the image alone), the header that of the
    manifest of the generation 'current' links to when that is another one (what it was warmed with).
    "engine": the head's EngineIdentity, set by roles/kernel_cache/checks.py cache_facts (no node prints it).
    Foreign: what sfl_files.py scrub would drop there (device nodes, fifos, sockets, symlinks leaving
    the generation, setuid/setgid entries); none is ever merged (roles/kernel_cache/checks.py)."""

    @staticmethod
    def default():
        return {"image": None, "current": None, "generations": {}, "manifest": None, "files": {}, "foreign": [],
                "current_header": {}, "engine": None}

    def command(self, root: str, ref: str, key: str = "") -> str:
        if not KEY.fullmatch(key):
            raise ValueError(f"kernel cache: compile key {key!r} is not 8 hex digits")
        suffix = f"-{key}" if key else ""
        # The generation named by the image ID (its first 12 hex digits) and the compile key.
        return state_command(root, ref, f"g=$(echo \"$id\" | sed 's/^sha256://' | cut -c1-12); [ -n \"$g\" ] && g=\"$g{suffix}\"")

    def process(self, output):
        out = CacheState.default()
        manifest, dirs, sealed, header = [], {}, set(), []
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
            elif kind == "P":
                header.append(rest)
            elif kind == "M":
                manifest.append(rest)
            elif kind == "F":
                size, _, rel = rest.partition("\t")
                out["files"][rel] = int(size)
            elif kind == "X":
                what, _, rel = rest.rstrip("\n").partition("\t")
                out["foreign"].append((what, rel))
        out["manifest"] = "\n".join(manifest) + "\n" if manifest else None
        out["current_header"] = parse_manifest("\n".join(header))[0] if header else {}
        # Only what sparkfleet created counts as a generation (retention removes nothing else): a
        # directory named by 12 hex digits of an image ID (and, since issue 40, '-' and 8 hex digits
        # of its compile key), or since issue 44 'e-', 12 hex digits of the engine's identity and
        # the key, with its <name>.manifest beside it.
        out["generations"] = {n: t for n, t in dirs.items() if is_generation(n) and n in sealed}
        return out


class GenerationState(CacheState):
    """CacheState of the generation named `gen` (an engine-keyed one: roles/kernel_cache/engine_key.py),
    whatever the image's ID: the image ID is still read (`image`), the generation is not derived from it."""

    def command(self, root: str, ref: str, gen: str) -> str:
        if not ENGINE_GENERATION.fullmatch(gen):
            raise ValueError(f"kernel cache: {gen!r} is not an engine-keyed generation name (e-<12 hex>-<8 hex>)")
        return state_command(root, ref, f"g={gen}")


def state_command(root: str, ref: str, name_generation: str) -> str:
    """The shell of CacheState and GenerationState: the image's ID, the cache root's generations, the
    served one's header when it is another, and the files, manifest and foreign entries of the
    generation `name_generation` (shell that sets g from $id, or to a name) names."""
    r, q = shlex.quote(root), shlex.quote(ref)
    return (
        f"id=$(docker image inspect --format '{{{{.Id}}}}' {q} 2>/dev/null || true); printf 'I\\t%s\\n' \"$id\"; "
        f"printf 'C\\t%s\\n' \"$(readlink {r}/current 2>/dev/null)\"; "
        f"[ -d {r} ] && find {r} -mindepth 1 -maxdepth 1 -type d -printf 'G\\t%f\\t%T@\\n'; "
        f"[ -d {r} ] && find {r} -mindepth 1 -maxdepth 1 -type f -name '*.manifest' -printf 'N\\t%f\\n'; "
        f"{name_generation}; "
        # The header of the served generation's manifest, when that is another generation
        # (a name of sparkfleet's grammar only): the compile settings and engine it was warmed with.
        f"c=$(readlink {r}/current 2>/dev/null); case \"$c\" in ''|*[!0-9a-f-]*) ;; *) "
        f"[ -n \"$g\" ] && [ \"$c\" != \"$g\" ] && [ -f {r}/\"$c\".manifest ] && "
        f"sed -n '/^#/!q;s/^/P\\t/p' {r}/\"$c\".manifest;; esac; "
        f"if [ -n \"$g\" ]; then [ -f {r}/$g.manifest ] && sed 's/^/M\\t/' {r}/$g.manifest; "
        f"[ -d {r}/$g ] && find {r}/$g -type f -printf 'F\\t%s\\t%P\\n'; "
        # Before roles/fanout installs it (a first deploy) there is no scrub: nothing is reported,
        # and the merge scrubs every rank anyway.
        f"[ -d {r}/$g ] && python3 {SFL_FILES} scrub --dry-run {r}/$g 2>/dev/null | sed 's/^/X\\t/'; fi; true"
    )


# e-<12 hex of the engine's identity>-<8 hex of the compile key> (roles/kernel_cache/engine_key.py);
# <12 hex of the image ID>-<8 hex of the compile key> where the engine in the image could not be read
# (and before issue 44); the 12 hex alone: an older sparkfleet's generation, still expired by retention
# and linked back to by a failed prewarm's restore.
ENGINE_GENERATION = re.compile(r"e-[0-9a-f]{12}-[0-9a-f]{8}")
IMAGE_GENERATION = re.compile(r"[0-9a-f]{12}-[0-9a-f]{8}")
GENERATION = re.compile(rf"{ENGINE_GENERATION.pattern}|{IMAGE_GENERATION.pattern}|[0-9a-f]{{12}}")
KEY = re.compile(r"([0-9a-f]{8})?")


def is_generation(name: str) -> bool:
    return bool(GENERATION.fullmatch(name))
