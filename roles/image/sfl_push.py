#!/usr/bin/env python3
"""sparkfleet's image push on the head: a local Docker image into the head's fabric registry with its
layers as they are stored, uncompressed. Python 3 standard library only (DGX OS's python3, the lab's
Debian's). The deploy does not run it (roles/image pushes with `docker push`): a first ship is faster
this way, a later one is not, since `docker save` writes the whole image where `docker push` sends only
the layers the registry lacks (docs/performance.md, measured); bench/image_ship.py runs it.

What `docker push` costs: it gzips every layer on the head (the lab's Docker 20.10: moby
distribution/push_v2.go compressStream, which no daemon setting turns off) and every worker's dockerd
gunzips it again, so shipping an image over the fabric runs at gzip's pace on one core (34 MB/s pushed,
51 MB/s pulled in the lab, docs/performance.md), not the link's. Here the image leaves `docker save` as tar streams and goes to
the registry as they are: the manifest (Docker's schema 2) names each uncompressed layer with its
media type application/vnd.docker.image.rootfs.diff.tar (a gzip one, from a store that keeps layers
compressed, keeps its .tar.gzip type), and a worker's `docker pull <registry>/<repo>@<digest>` takes
it as any other (moby distribution/pull_v2.go decompresses by the stream's magic bytes: a plain tar
passes through), checking every blob against its digest and the layers against the image's config.

Nothing is trusted on the way: each blob's sha256 is computed while it streams and the registry
checks it again before it accepts the blob; the config's digest must be the local image's ID and an
uncompressed layer's digest its diff ID (`docker image inspect` RootFS.Layers, in order), so the
manifest describes exactly the image the head built; the registry's Docker-Content-Digest must be
the sha256 of the manifest sent. Then one line is added to RECORD (`<registry>/<repo>@<digest> <image
ID>`): what the head has pushed (`docker push` leaves a RepoDigest instead; this push leaves none).

  sfl_push.py IMAGE REGISTRY REPOSITORY TAG --record RECORD

It prints `<tag>: digest: <sha256:...> size: <manifest bytes>` as `docker push` does, then a summary.
Both `docker save` layouts are read: Docker < 25 (<id>/layer.tar, <image id>.json) and the OCI layout
of Docker >= 25 (blobs/sha256/<digest>); manifest.json, in both, names the config and the layers.
Exit codes: 0 pushed, 1 the image, the save or the registry failed (the reason on stderr).
A re-run sends every layer again (the registry stores a blob under its digest once) and makes the
same manifest, so the same digest: nothing a worker has pulled changes.
"""
import hashlib
import http.client
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import urllib.parse

CHUNK = 1 << 20
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TAR = "application/vnd.docker.image.rootfs.diff.tar"
LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
# A `docker save` member that may be a layer or the config: Docker < 25's <v1 id>/layer.tar and
# <image id>.json, the OCI layout's blobs/sha256/<digest>. Everything else (VERSION, json,
# repositories, index.json, oci-layout) is read past.
BLOB = re.compile(r"^(?:[0-9a-f]{64}/layer\.tar|[0-9a-f]{64}\.json|blobs/sha256/[0-9a-f]{64})$")


class Failed(Exception):
    pass


def media_type(head: bytes) -> str:
    if head[:2] == b"\x1f\x8b":
        return LAYER_GZIP
    if head[:4] == b"\x28\xb5\x2f\xfd":
        raise Failed("a zstd layer: Docker's schema 2 has no media type for it")
    return LAYER_TAR


class Registry:
    """The registry's v2 API over plain HTTP on the fabric address (the head's own registry, which
    listens there only: roles/image's config)."""

    def __init__(self, address: str, repository: str):
        self.address, self.repository = address, repository

    def request(self, method: str, path: str, body=None, headers=None, expect=(200,)):
        conn = http.client.HTTPConnection(self.address, timeout=600)
        try:
            try:
                conn.request(method, path, body=body, headers=headers or {})
                reply = conn.getresponse()
                text = reply.read()
            except (OSError, http.client.HTTPException) as err:
                raise Failed(f"registry {self.address}: {method} {path.split('?')[0]}: {err}") from err
            if reply.status not in expect:
                raise Failed(f"registry {self.address}: {method} {path.split('?')[0]} answered {reply.status}: "
                             f"{text[:300].decode(errors='replace')}")
            return reply
        finally:
            conn.close()

    def upload(self, chunks, size: int) -> str:
        """One blob of `size` bytes from the iterable `chunks`, hashed as it goes; its digest."""
        started = self.request("POST", f"/v2/{self.repository}/blobs/uploads/", body=b"",
                               headers={"Content-Length": "0"}, expect=(202,))
        location = urllib.parse.urlsplit(started.getheader("Location"))
        sha = hashlib.sha256()

        def body():
            for chunk in chunks:
                sha.update(chunk)
                yield chunk

        sent = self.request("PATCH", location.path + (f"?{location.query}" if location.query else ""), body=body(),
                            headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"},
                            expect=(202,))
        digest = f"sha256:{sha.hexdigest()}"
        location = urllib.parse.urlsplit(sent.getheader("Location"))
        query = urllib.parse.parse_qsl(location.query) + [("digest", digest)]
        self.request("PUT", f"{location.path}?{urllib.parse.urlencode(query)}", body=b"",
                     headers={"Content-Length": "0"}, expect=(201,))
        return digest

    def put_manifest(self, tag: str, manifest: bytes) -> str:
        reply = self.request("PUT", f"/v2/{self.repository}/manifests/{tag}", body=manifest,
                             headers={"Content-Type": MANIFEST_TYPE, "Content-Length": str(len(manifest))},
                             expect=(201,))
        return reply.getheader("Docker-Content-Digest") or ""


def member_chunks(stream, size: int, first: bytes):
    yield first
    left = size - len(first)
    while left > 0:
        chunk = stream.read(min(CHUNK, left))
        if not chunk:
            raise Failed("docker save's stream ended inside a file")
        left -= len(chunk)
        yield chunk


def inspect(image: str) -> dict:
    out = subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True)
    if out.returncode != 0:
        raise Failed(f"docker image inspect {image}: {out.stderr.strip()}")
    return json.loads(out.stdout)[0]


def push(image: str, registry: Registry, tag: str) -> tuple[str, bytes, int, dict]:
    """Save `image`, send its blobs, put its manifest under `tag`: (digest, manifest, bytes sent, inspect)."""
    local = inspect(image)
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    blobs, links, index, sent = {}, {}, None, 0
    try:
        with tarfile.open(fileobj=save.stdout, mode="r|") as tar:
            for member in tar:
                if member.issym() and BLOB.match(member.name):
                    links[member.name] = os.path.normpath(os.path.join(os.path.dirname(member.name), member.linkname))
                elif member.isfile() and member.name == "manifest.json":
                    index = json.loads(tar.extractfile(member).read())
                elif member.isfile() and BLOB.match(member.name):
                    stream = tar.extractfile(member)
                    first = stream.read(min(CHUNK, member.size))
                    kind = media_type(first)
                    digest = registry.upload(member_chunks(stream, member.size, first), member.size)
                    blobs[member.name] = {"mediaType": kind, "size": member.size, "digest": digest}
                    sent += member.size
    except tarfile.TarError as err:
        raise Failed(f"docker save {image}: not a tar stream ({err})") from err
    finally:
        save.stdout.close()
        err = save.stderr.read().decode(errors="replace").strip()
        code = save.wait()
    if code != 0:
        raise Failed(f"docker save {image} exited {code}: {err}")
    if not index:
        raise Failed(f"docker save {image}: no manifest.json in its output")

    def blob(path: str) -> dict:
        found = blobs.get(links.get(path, path))
        if found is None:
            raise Failed(f"docker save {image}: manifest.json names {path}, which its output did not carry")
        return dict(found)

    config = blob(index[0]["Config"]) | {"mediaType": CONFIG_TYPE}
    layers = [blob(path) for path in index[0]["Layers"]]
    if config["digest"] != local["Id"]:
        raise Failed(f"docker save {image}: its config is {config['digest']}, the image's ID is {local['Id']}")
    diff_ids = local.get("RootFS", {}).get("Layers") or []
    if len(diff_ids) != len(layers):
        raise Failed(f"docker save {image}: {len(layers)} layers, the image has {len(diff_ids)}")
    for n, (layer, diff_id) in enumerate(zip(layers, diff_ids)):
        if layer["mediaType"] == LAYER_TAR and layer["digest"] != diff_id:
            raise Failed(f"docker save {image}: layer {n} is {layer['digest']}, the image's layer {n} is {diff_id}")
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": config, "layers": layers},
                          indent=3).encode()
    digest = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
    answered = registry.put_manifest(tag, manifest)
    if answered != digest:
        raise Failed(f"registry {registry.address}: stored the manifest as {answered or 'nothing'}, not {digest}")
    return digest, manifest, sent, local


def record(path: str, line: str) -> None:
    """Add `line` to the record file (root-only, written whole and renamed: never half a line)."""
    try:
        with open(path) as f:
            lines = [ln.rstrip("\n") for ln in f if ln.strip()]
    except FileNotFoundError:
        lines = []
    if line in lines:
        return
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{ln}\n" for ln in [*lines, line]))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    args = argv[1:]
    if len(args) != 6 or args[4] != "--record":
        print("usage: sfl_push.py IMAGE REGISTRY REPOSITORY TAG --record RECORD", file=sys.stderr)
        return 2
    image, address, repository, tag, _, record_path = args
    began = time.monotonic()
    try:
        digest, manifest, sent, local = push(image, Registry(address, repository), tag)
        record(record_path, f"{address}/{repository}@{digest} {local['Id']}")
    except (Failed, OSError, http.client.HTTPException) as err:
        print(f"sfl_push.py: {err}", file=sys.stderr)
        return 1
    took = time.monotonic() - began
    print(f"{tag}: digest: {digest} size: {len(manifest)}")
    print(f"pushed {address}/{repository}:{tag} uncompressed: {sent} bytes in {took:.1f} s "
          f"({sent / max(took, 1e-6) / 1e6:.0f} MB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
