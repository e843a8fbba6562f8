"""roles/image/sfl_push.py against the real registry the head runs (the OS's docker-registry 2.8.2,
tests/unit/promtool.sh), fed by a stand-in `docker` CLI that answers `image inspect` and `save` from an
image this test writes in both of `docker save`'s layouts: Docker < 25's (the lab's Docker 20.10, whose
real `docker save` and `docker pull` bench/image_ship.py runs it with: the deploy does not) and the OCI
layout of Docker >= 25 (DGX OS's docker-ce), which no lab host runs. The layouts are written as moby's
image/tarexport/save.go writes them (v1 directories with a symlink for a repeated layer; blobs/sha256
with index.json); the registry is the real one, and what it stores is read back from it."""
import gzip
import hashlib
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PUSH = REPO / "roles/image/sfl_push.py"
IMAGE = "sparkfleet-lab/m:c0ffee"
REPOSITORY, TAG = "sparkfleet-lab/m", "c0ffee"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def add(tar: tarfile.TarFile, name: str, data: bytes = b"", link: str | None = None) -> None:
    info = tarfile.TarInfo(name)
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
    else:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if link is None else None)


def image(layers: list[bytes], oci: bool = False):
    """(`docker save`'s bytes, `docker image inspect`'s JSON): one image of these layers."""
    diff_ids = [sha(blob) if blob[:2] != b"\x1f\x8b" else sha(gzip.decompress(blob)) for blob in layers]
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["true"]},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    image_id = sha(config)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        if oci:
            paths = [f"blobs/sha256/{sha(b)[7:]}" for b in layers]
            seen = set()
            for path, blob in zip(paths, layers):
                if path not in seen:
                    add(tar, path, blob)
                    seen.add(path)
            add(tar, f"blobs/sha256/{image_id[7:]}", config)
            oci_manifest = json.dumps({"schemaVersion": 2, "layers": []}).encode()  # a blob the push need not send
            add(tar, f"blobs/sha256/{sha(oci_manifest)[7:]}", oci_manifest)
            add(tar, "index.json", b"{}")
            add(tar, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
            config_path = f"blobs/sha256/{image_id[7:]}"
        else:
            paths, first = [], {}
            for n, blob in enumerate(layers):
                v1 = hashlib.sha256(f"v1-{n}".encode()).hexdigest()
                add(tar, f"{v1}/VERSION", b"1.0")
                add(tar, f"{v1}/json", b"{}")
                if sha(blob) in first:  # a layer repeated: save.go links it to the first copy
                    add(tar, f"{v1}/layer.tar", link=f"../{first[sha(blob)]}/layer.tar")
                else:
                    add(tar, f"{v1}/layer.tar", blob)
                    first[sha(blob)] = v1
                paths.append(f"{v1}/layer.tar")
            config_path = f"{image_id[7:]}.json"
            add(tar, config_path, config)
        add(tar, "manifest.json", json.dumps([{"Config": config_path, "RepoTags": [IMAGE], "Layers": paths}]).encode())
        add(tar, "repositories", b"{}")
    inspect = [{"Id": image_id, "RepoTags": [IMAGE], "RootFS": {"Type": "layers", "Layers": diff_ids}}]
    return out.getvalue(), inspect


@pytest.fixture
def docker(tmp_path, monkeypatch):
    """A stand-in `docker` on PATH: `image inspect` and `save` of the one image `put` gave it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    saved, inspected = tmp_path / "saved.tar", tmp_path / "inspect.json"
    (bin_dir / "docker").write_text(f"""#!{sys.executable}
import sys
args = sys.argv[1:]
if args[:2] == ["image", "inspect"] and args[2] == {IMAGE!r}:
    sys.stdout.write(open({str(inspected)!r}).read())
elif args == ["save", {IMAGE!r}]:
    sys.stdout.buffer.write(open({str(saved)!r}, "rb").read())
else:
    sys.exit("Error: No such image: " + args[-1])
""")
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    def put(tar: bytes, inspect: list):
        saved.write_bytes(tar)
        inspected.write_text(json.dumps(inspect))

    return put


@pytest.fixture
def registry(tmp_path, registry_program):
    """The OS's registry on a free loopback port, storing under tmp_path; its address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path}/store\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen([registry_program, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:  # until it answers /v2/ (its start, not a time)
            try:
                if get(address, "/v2/")[0] == 200:
                    break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "the registry did not start"
                time.sleep(0.05)
        yield address
    finally:
        proc.terminate()
        proc.wait(10)


def get(address: str, path: str, accept: str = "") -> tuple[int, bytes, dict]:
    conn = http.client.HTTPConnection(address, timeout=10)
    try:
        conn.request("GET", path, headers={"Accept": accept} if accept else {})
        reply = conn.getresponse()
        return reply.status, reply.read(), {k.lower(): v for k, v in reply.getheaders()}
    finally:
        conn.close()


def push(address: str, record: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PUSH), IMAGE, address, REPOSITORY, TAG, "--record", str(record)],
                          capture_output=True, text=True, timeout=60)


LAYERS = [layer({"etc/os-release": b"ID=debian\n"}), layer({"opt/vllm/big": os.urandom(3 << 20)}),
          layer({"etc/os-release": b"ID=debian\n"})]  # the first again: save.go writes a symlink for it


@pytest.mark.parametrize("oci", [False, True], ids=["docker-20.10-layout", "docker-25-oci-layout"])
def test_the_image_lands_uncompressed_under_a_manifest_that_names_its_id_and_layers(oci, docker, registry, tmp_path):
    tar, inspect = image(LAYERS, oci=oci)
    docker(tar, inspect)
    record = tmp_path / "image" / "pushed"
    done = push(registry, record)
    assert done.returncode == 0, done.stderr
    digest = done.stdout.split("digest: ")[1].split()[0]
    assert done.stdout.startswith(f"{TAG}: digest: {digest} size: ")  # what roles/image reads (pushed_digest)
    # The registry's manifest, by the tag and by the digest: the config is the image's ID, the layers its
    # diff IDs in order, each stored as the plain tar the image holds.
    status, body, headers = get(registry, f"/v2/{REPOSITORY}/manifests/{TAG}",
                                "application/vnd.docker.distribution.manifest.v2+json")
    assert status == 200 and headers["docker-content-digest"] == digest == sha(body)
    manifest = json.loads(body)
    assert manifest["config"] == {"mediaType": "application/vnd.docker.container.image.v1+json",
                                  "size": len(get(registry, f"/v2/{REPOSITORY}/blobs/{inspect[0]['Id']}")[1]),
                                  "digest": inspect[0]["Id"]}
    assert [entry["digest"] for entry in manifest["layers"]] == inspect[0]["RootFS"]["Layers"]
    assert {entry["mediaType"] for entry in manifest["layers"]} == {"application/vnd.docker.image.rootfs.diff.tar"}
    for entry, blob in zip(manifest["layers"], LAYERS):
        assert entry["size"] == len(blob) and get(registry, f"/v2/{REPOSITORY}/blobs/{entry['digest']}")[1] == blob
    # The head's record: one line, root-only; a second push of the same image is the same manifest.
    line = f"{registry}/{REPOSITORY}@{digest} {inspect[0]['Id']}\n"
    assert record.read_text() == line and record.stat().st_mode & 0o777 == 0o600
    again = push(registry, record)
    assert again.returncode == 0 and f"digest: {digest} " in again.stdout, again.stderr
    assert record.read_text() == line


def test_a_gzip_layer_keeps_its_media_type(docker, registry, tmp_path):
    """A store that keeps layers compressed (Docker's containerd image store) saves them so: sent as
    they are, named .tar.gzip; the worker's pull checks their diff IDs."""
    blobs = [LAYERS[0], gzip.compress(LAYERS[1], mtime=0)]
    docker(*image(blobs, oci=True))
    done = push(registry, tmp_path / "pushed")
    assert done.returncode == 0, done.stderr
    manifest = json.loads(get(registry, f"/v2/{REPOSITORY}/manifests/{TAG}",
                              "application/vnd.docker.distribution.manifest.v2+json")[1])
    assert [(e["mediaType"], e["digest"]) for e in manifest["layers"]] == [
        ("application/vnd.docker.image.rootfs.diff.tar", sha(blobs[0])),
        ("application/vnd.docker.image.rootfs.diff.tar.gzip", sha(blobs[1]))]


def test_a_save_that_is_not_the_image_inspect_names_is_refused_and_nothing_is_recorded(docker, registry, tmp_path):
    tar, inspect = image(LAYERS)
    other = dict(inspect[0], Id=sha(b"another config"))
    docker(tar, [other])
    record = tmp_path / "pushed"
    done = push(registry, record)
    assert done.returncode == 1
    assert f"its config is {inspect[0]['Id']}, the image's ID is {other['Id']}" in done.stderr
    assert get(registry, f"/v2/{REPOSITORY}/manifests/{TAG}")[0] == 404 and not record.exists()
    # A layer that is not the image's diff ID at its place: refused too.
    swapped = dict(inspect[0], RootFS={"Type": "layers", "Layers": list(reversed(inspect[0]["RootFS"]["Layers"][:2]))
                                       + inspect[0]["RootFS"]["Layers"][2:]})
    docker(tar, [swapped])
    done = push(registry, record)
    assert done.returncode == 1 and "layer 0 is " in done.stderr and not record.exists()


def test_no_registry_and_no_image_each_fail_naming_it(docker, tmp_path):
    docker(*image(LAYERS))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    done = push(closed, tmp_path / "pushed")
    assert done.returncode == 1
    assert f"sfl_push.py: registry {closed}: POST /v2/{REPOSITORY}/blobs/uploads/: [Errno 111] Connection refused" in done.stderr
    missing = subprocess.run([sys.executable, str(PUSH), "sparkfleet-lab/none:1", closed, REPOSITORY, TAG,
                              "--record", str(tmp_path / "pushed")], capture_output=True, text=True)
    assert missing.returncode == 1 and "docker image inspect sparkfleet-lab/none:1: Error: No such image" in missing.stderr
    assert not (tmp_path / "pushed").exists()
