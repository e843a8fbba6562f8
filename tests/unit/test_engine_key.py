"""roles/kernel_cache/engine_key.py: what the engine in an image folds into its compile-cache keys, read
from the image's layers (issue 44 item 3).

The command runs here for real (sh, with a stand-in `docker` whose image's overlay2 layers are
directories of this test), and its lines go through the parser and the identity: an image changed
only above the engine's code keeps its identity (the kernel-cache generation is reused), each input
the engine folds into its keys, changed alone, moves it and is named, and what cannot be read is said.
"""
import fnmatch
import json
import os
import subprocess
from pathlib import Path

import pytest

from roles.fingerprint.facts import EngineVersions
from roles.fingerprint.sfl_fingerprint import SITE_DIRS
from roles.kernel_cache.engine_key import (
    CODE_ROOTS, EngineIdentity, engine_identity, identity_changes, layers_command, parse_layers, recorded,
)

SITE = "opt/vllm/lib/python3.11/site-packages"  # the lab recipe's venv (lab/recipe/vllm-cpu/Dockerfile)


class Image:
    """An image as Docker's overlay2 store holds it: one directory per layer (bottom first), its diff
    IDs, its environment and entrypoint; `docker image inspect` answered by a stand-in."""

    def __init__(self, root: Path, image_id: str = "sha256:" + "1" * 64, driver: str = "overlay2"):
        self.root, self.image_id, self.driver = root, image_id, driver
        self.layers: list[tuple[Path, str]] = []  # (directory, diff ID), bottom first
        self.env = ["PATH=/opt/vllm/bin:/usr/bin", "HF_TOKEN=hunter2-secret"]
        self.entrypoint = "null"
        self.extra_dirs = 0  # a layer directory Docker names that the diff IDs do not count

    def layer(self, name: str, diff: str, files: dict[str, str]) -> Path:
        d = self.root / name
        for rel, text in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            if rel.endswith("/"):
                (d / rel).mkdir(exist_ok=True)
            else:
                (d / rel).write_text(text)
        d.mkdir(parents=True, exist_ok=True)
        self.layers.append((d, diff))
        return d

    def env_for_docker(self) -> dict:
        dirs = [str(d) for d, _ in reversed(self.layers)] + [str(self.root / f"gone{i}") for i in range(self.extra_dirs)]
        upper, lower = dirs[0], ":".join(dirs[1:])
        lines = [f"id={self.image_id}", f"driver={self.driver}", f"layers={upper}:{lower}"]
        lines += [f"diff={diff}" for _, diff in self.layers]
        lines += [f"entrypoint={self.entrypoint}"] + [f'env="{e}"' for e in self.env]
        bin_dir = self.root / "bin"
        bin_dir.mkdir(exist_ok=True)
        (self.root / "inspect.txt").write_text("\n".join(lines) + "\n")
        (bin_dir / "docker").write_text(
            "#!/bin/sh\n"
            f'if [ "$1 $2" = "image inspect" ]; then cat {self.root / "inspect.txt"}; exit 0; fi\nexit 1\n')
        (bin_dir / "docker").chmod(0o755)
        return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def read(self, engine: str = "vllm") -> tuple[str, EngineIdentity]:
        out = subprocess.run(["sh", "-c", layers_command("sparkfleet-lab/vllm-cpu:v4", engine)],
                             env=self.env_for_docker(), capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout, engine_identity(parse_layers(out.stdout.splitlines()), engine)


def lab_image(root: Path, version: str = "0.32.0+cpu", **kwargs) -> Image:
    """The lab recipe's real-engine image, as its Dockerfile builds it: the Debian base (libraries,
    compilers), the shared wheels (torch, ...), the lane's wheels with the `vllm` dist-info."""
    image = Image(root, **kwargs)
    image.layer("base", "sha256:base", {"usr/lib/x86_64-linux-gnu/libc.so.6": "", "usr/bin/g++": "",
                                        "etc/os-release": ""})
    image.layer("shared", "sha256:shared", {f"{SITE}/torch/__init__.py": "torch", "opt/vllm/bin/python3": ""})
    image.layer("lane", "sha256:lane", {f"{SITE}/vllm/__init__.py": "vllm", f"{SITE}/vllm-{version}.dist-info/METADATA": ""})
    return image


def test_the_lab_images_engine_is_its_dist_info_and_every_layer_up_to_the_last_holding_code(tmp_path):
    out, identity = lab_image(tmp_path).read()
    assert identity.problem is None and identity.engine == "vllm 0.32.0+cpu"
    assert (identity.counted, identity.total) == (3, 3) and identity.key and len(identity.key) == 12
    assert dict(identity.env).keys() == {"PATH"}  # a credential is no part of it
    assert "hunter2" not in out and "HF_TOKEN" not in out  # an ENV value is never printed: its digest only
    assert "layer 3 code usr/lib" in out and "layer 1 has vllm-0.32.0+cpu.dist-info" in out


def test_a_layer_above_the_engines_code_changes_the_image_not_the_engine(tmp_path):
    """The recipe bump that changes nothing the engine compiles: a README (or a launcher in
    /usr/local/bin) copied into the image after the engine's layers: another image ID, the same key."""
    _, before = lab_image(tmp_path / "a").read()
    image = lab_image(tmp_path / "b", image_id="sha256:" + "2" * 64)
    image.layer("readme", "sha256:readme", {"opt/recipe/README.md": "v6", "usr/local/bin/start.sh": "#!/bin/sh"})
    _, after = image.read()
    assert after.image_id != before.image_id and (after.counted, after.total) == (3, 4)
    assert after.key == before.key and identity_changes(before.record(), after) == []


@pytest.mark.parametrize("change, named", [
    ("engine", "the engine changed: vllm 0.31.0+cpu -> vllm 0.32.0+cpu"),
    ("torch rebuilt", "the engine's files changed: the image's layers up to the last holding code (3 of 3)"),
    ("vllm patched above", "the engine's files changed: the image's layers up to the last holding code (4 of 4)"),
    ("compiler added above", "the engine's files changed: the image's layers up to the last holding code (4 of 4)"),
    ("env", "the image's environment changed: VLLM_USE_AOT_COMPILE"),
    ("entrypoint", "the image's entrypoint changed"),
    ("pythonpath dir", "the engine's files changed"),
    (".pth dir", "the engine's files changed"),
])
def test_each_input_the_engine_keys_by_changed_alone_is_another_key_naming_it(tmp_path, change, named):
    old = lab_image(tmp_path / "old", version="0.31.0+cpu" if change == "engine" else "0.32.0+cpu")
    if change in ("pythonpath dir", ".pth dir"):  # the code path exists in both; the new image adds to it above
        old.env.append("PYTHONPATH=/opt/patches")
        old.layer("patches", "sha256:patches", {"opt/patches/": ""})
    _, before = old.read()
    new = lab_image(tmp_path / "new")
    if change == "torch rebuilt":  # the same instructions without docker's layer cache: other content
        new.layers[1] = (new.layers[1][0], "sha256:shared-rebuilt")
    elif change == "vllm patched above":
        new.layer("patch", "sha256:patch", {f"{SITE}/vllm/model_executor/layers/linear.py": "patched"})
    elif change == "compiler added above":
        new.layer("apt", "sha256:apt", {"usr/bin/g++-13": "", "usr/share/doc/g++-13/copyright": ""})
    elif change == "env":
        new.env.append("VLLM_USE_AOT_COMPILE=0")
    elif change == "entrypoint":
        new.entrypoint = '["/opt/recipe/start.sh"]'
    elif change == "pythonpath dir":
        new.env.append("PYTHONPATH=/opt/patches")
        new.layer("patches", "sha256:patches", {"opt/patches/": ""})
        new.layer("patch", "sha256:patch", {"opt/patches/vllm_fix.py": "x"})
    elif change == ".pth dir":
        new.env.append("PYTHONPATH=/opt/patches")
        new.layer("patches", "sha256:patches", {"opt/patches/": ""})
        new.layers[2][0].joinpath(SITE, "patches.pth").write_text("/workspace/mods\nimport os\n")
        new.layer("mods", "sha256:mods", {"workspace/mods/fix.py": "x"})
    if change == ".pth dir":
        old.layers[2][0].joinpath(SITE, "patches.pth").write_text("/workspace/mods\nimport os\n")
        _, before = old.read()
    _, after = new.read()
    assert after.problem is None and before.problem is None
    assert after.key != before.key
    changes = identity_changes(before.record(), after)
    assert any(c.startswith(named) for c in changes), changes


def test_a_credential_in_the_images_environment_is_no_part_of_the_key_and_not_printed(tmp_path):
    """A token changed in the image's ENV moves nothing the engine compiles (vllm/envs.py compile_factors
    ignores its own credentials; HF_TOKEN is none of its variables): the same key, and neither its value
    nor a digest of it leaves the node. A setting whose name only contains TOKENS is one (hashed by vLLM)."""
    image = lab_image(tmp_path / "a")
    image.env += ["AWS_SECRET_ACCESS_KEY=abc", "WANDB_API_KEY=def", "DB_PASSWORD=ghi"]
    out, before = image.read()
    image.env = [e.replace("hunter2", "swordfish") for e in image.env]
    out2, after = image.read()
    assert before.key == after.key and dict(after.env).keys() == {"PATH"}
    assert not [w for w in ("hunter2", "swordfish", "HF_TOKEN", "SECRET", "API_KEY", "PASSWORD") if w in out + out2]
    image.env.append("VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE=512")
    _, moved = image.read()
    assert moved.key != after.key and identity_changes(after.record(), moved) == [
        "the image's environment changed: VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE"]


def test_identity_changes_name_each_moved_variable_never_a_value():
    old = EngineIdentity("sha256:a", engine="vllm 0.32.0", layers="l", counted=3, total=3,
                         env=(("A", "1"), ("B", "2")), entrypoint="e")
    new = EngineIdentity("sha256:b", engine="vllm 0.32.0", layers="l", counted=3, total=5,
                         env=(("A", "9"), ("C", "3")), entrypoint="e")
    assert identity_changes(old.record(), new) == ["the image's environment changed: A, B, C"]
    assert identity_changes(old.record(), old) == []
    assert old.key != new.key and old.key == EngineIdentity("sha256:other", **{
        k: getattr(old, k) for k in ("engine", "layers", "counted", "env", "entrypoint")}, total=9).key


def test_what_cannot_be_read_keys_nothing_and_says_why(tmp_path):
    assert engine_identity(None, "vllm").problem == "the image is not on the head"
    cases = {
        "vfs": "Docker's storage driver is vfs, not overlay2: the image's layers cannot be read",
        "count": "4 layer directories for 3 layers",
        "missing": "layer directory 1 (from the top) is missing",
        "no engine": "no vllm distribution (dist-info) in the image's Python site directories",
        "editable": "vllm-0.32.0.dist-info is an editable install: its sources are outside the site directories",
        "deleted": "no vllm distribution (dist-info) in the image's Python site directories",
    }
    for case, problem in cases.items():
        image = lab_image(tmp_path / case.replace(" ", "-"), driver="vfs" if case == "vfs" else "overlay2")
        if case == "count":
            image.extra_dirs = 1
        elif case == "missing":
            image.layers[-1] = (tmp_path / "nowhere", image.layers[-1][1])
        elif case == "no engine":
            image = Image(tmp_path / "standin")  # the lab's stand-in: /usr/local/bin/vllm, no dist-info
            image.layer("base", "sha256:base", {"usr/lib/python3/dist-packages/six.py": ""})
            image.layer("standin", "sha256:standin", {"usr/local/bin/vllm": "#!/usr/bin/python3"})
        elif case == "editable":
            image.layer("dev", "sha256:dev", {f"{SITE}/vllm-0.32.0.dist-info/direct_url.json":
                                              '{"url": "file:///workspace/vllm", "dir_info": {"editable": true}}'})
        elif case == "deleted":  # a later layer removed the engine (overlay2's whiteout is a character device)
            image.layer("rm", "sha256:rm", {f"{SITE}/": ""})
        out, identity = image.read()
        if case == "deleted":
            # the whiteout itself needs mknod (root); its line, as the command prints it, goes to the parser
            lines = out.splitlines()
            lines.insert(-1, "layer 1 whiteout vllm-0.32.0+cpu.dist-info")
            identity = engine_identity(parse_layers(lines), "vllm")
        assert identity.problem == problem, (case, out)
        assert identity.key is None


def test_no_image_prints_nothing_and_parses_to_none(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "docker").chmod(0o755)
    out = subprocess.run(["sh", "-c", layers_command("x:y", "vllm")], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert out.returncode == 0 and out.stdout == ""
    assert parse_layers([]) is None


def test_the_head_reads_the_layers_with_its_engine_versions_in_one_round_trip(tmp_path):
    """EngineVersions (tools/plan.py reads it once per group): the engine line's versions and the
    image's layers; a record taken before it read them (a capture bundle) gives no layers."""
    image = lab_image(tmp_path)
    out = subprocess.run(["sh", "-c", EngineVersions().command(netdev="lo", unit="sparkfleet-head",
                                                             ref="sparkfleet-lab/vllm-cpu:v4", engine="vllm")],
                         env=image.env_for_docker(), capture_output=True, text=True, timeout=30)
    versions = EngineVersions().process(out.stdout.splitlines())
    assert engine_identity(versions["layers"], "vllm") == image.read()[1]
    assert EngineVersions().process(out.stdout.split("== layers")[0].splitlines())["layers"] is None


def test_recorded_reads_a_manifests_engine_record_or_nothing():
    identity = EngineIdentity("sha256:a", engine="vllm 0.32.0", layers="l", counted=2, total=2)
    assert recorded(json.dumps(identity.record())) == identity.record()
    assert recorded(None) is None and recorded("{oops") is None and recorded("[1]") is None


def test_code_roots_hold_every_site_directory_the_fingerprint_reads():
    """Every Python site directory the engine's dist-info is looked for in is under a code root, so the
    layer that installs the engine is always counted."""
    for site in SITE_DIRS:
        assert any(fnmatch.fnmatch(site.split("/python3")[0], root) for root in CODE_ROOTS), site
