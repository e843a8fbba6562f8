"""roles/weights and roles/fanout's sfl_files.py: manifests, resumable HTTP fetch, the plan's verdicts."""
import functools
import http.server
import os
import threading
from pathlib import Path

import pytest

from roles.fanout import sfl_files
from sparkfleet.model.serving import load_profile
from roles.weights.checks import (
    copy_problem, fetch_command, manifest_header, profile_models, pull_command, token_file_problem,
)
from sparkfleet.config import ConfigError, build_cluster
from tests.unit.helpers import pair


def write_model(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


FILES = {"config.json": b'{"a": 1}\n', "model-00001-of-00002.safetensors": os.urandom(300_000),
         "sub/model-00002-of-00002.safetensors": os.urandom(200_000)}


def test_manifest_lists_every_file_sorted_with_size_and_sha256_and_skips_bookkeeping(tmp_path):
    write_model(tmp_path, {**FILES, ".cache/huggingface/x.lock": b"x", ".sparkfleet-partial/y": b"y"})
    header, entries = sfl_files.parse_manifest(sfl_files.manifest_text(tmp_path, ["model: m"]))
    assert header == {"model": "m"}
    assert list(entries) == sorted(FILES)
    assert entries["sub/model-00002-of-00002.safetensors"][0] == 200_000
    assert sfl_files.differences(tmp_path, entries) == []


def test_differences_name_missing_resized_and_corrupted_files(tmp_path):
    write_model(tmp_path, FILES)
    _, entries = sfl_files.parse_manifest(sfl_files.manifest_text(tmp_path))
    (tmp_path / "config.json").unlink()
    (tmp_path / "sub/model-00002-of-00002.safetensors").write_bytes(b"short")
    data = bytearray((tmp_path / "model-00001-of-00002.safetensors").read_bytes())
    data[0] ^= 0xFF
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(bytes(data))
    assert sfl_files.differences(tmp_path, entries) == [
        "missing config.json",
        "sha256 model-00001-of-00002.safetensors differs from the manifest",
        "size sub/model-00002-of-00002.safetensors: 5 bytes, manifest says 200000",
    ]


class RangeLog(http.server.SimpleHTTPRequestHandler):
    """Serves a directory with HTTP ranges (which SimpleHTTPRequestHandler lacks); logs bytes sent."""

    sent: list = []

    def do_GET(self):
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            return self.send_error(404)
        data = Path(path).read_bytes()
        start = 0
        if rng := self.headers.get("Range"):
            start = int(rng.removeprefix("bytes=").split("-")[0])
        body = data[start:]
        RangeLog.sent.append((self.path, len(body)))  # before the reply: the client may check at once
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


@pytest.fixture
def http_source(tmp_path):
    src = tmp_path / "src"
    write_model(src / "org" / "m", FILES)
    (src / "org" / "m.manifest").write_text(sfl_files.manifest_text(src / "org" / "m"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(RangeLog, directory=str(src)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    RangeLog.sent = []
    yield f"http://127.0.0.1:{server.server_address[1]}/org/m", src / "org" / "m"
    server.shutdown()


def fetch(url, dest, out, *extra):
    return sfl_files.main(["fetch-http", url, str(dest), "--manifest", str(out), "--header", "model: org/m", *extra])


def test_http_fetch_verifies_writes_the_manifest_and_a_second_fetch_sends_nothing(http_source, tmp_path):
    url, src = http_source
    dest, out = tmp_path / "dest", tmp_path / "dest.manifest"
    assert fetch(url, dest, out) == 0
    header, entries = sfl_files.parse_manifest(out.read_text())
    assert header == {"model": "org/m"} and sfl_files.differences(dest, entries) == []
    assert not (dest / sfl_files.PARTIAL).exists()
    sent = len(RangeLog.sent)
    assert fetch(url, dest, out) == 0
    assert [p for p, _ in RangeLog.sent[sent:]] == ["/org/m.manifest"]  # only the index again


def test_an_interrupted_http_fetch_resumes_from_its_partial_file(http_source, tmp_path):
    url, src = http_source
    dest = tmp_path / "dest"
    big = "model-00001-of-00002.safetensors"
    part = dest / sfl_files.PARTIAL / big
    part.parent.mkdir(parents=True)
    part.write_bytes((src / big).read_bytes()[:100_000])  # what arrived before the cut
    assert fetch(url, dest, tmp_path / "m.manifest") == 0
    assert (f"/org/m/{big}", 200_000) in RangeLog.sent  # the rest only
    assert (dest / big).read_bytes() == (src / big).read_bytes()


def test_a_shortfall_of_disk_stops_before_any_byte_is_fetched(http_source, tmp_path, capsys):
    url, _ = http_source
    with pytest.raises(SystemExit) as stop:
        fetch(url, tmp_path / "dest", tmp_path / "m.manifest", "--margin-gib", "1000000")
    assert stop.value.code == 3
    out = capsys.readouterr().err
    assert "not enough disk" in out and "+ 1000000.00 GiB margin" in out and "nothing was transferred" in out
    assert [p for p, _ in RangeLog.sent] == ["/org/m.manifest"] and not (tmp_path / "dest").exists()


def test_a_corrupted_download_is_refused_and_its_partial_removed(http_source, tmp_path):
    url, src = http_source
    (src / "config.json").write_bytes(b'{"a": 2}\n')  # same size, different bytes than the manifest says
    with pytest.raises(SystemExit) as stop:
        fetch(url, tmp_path / "dest", tmp_path / "m.manifest")
    assert stop.value.code == 1 and not (tmp_path / "m.manifest").exists()


def copy(manifest, files):
    return {"manifest": manifest, "files": files}


def test_copy_problem_verdicts():
    header = manifest_header("org/m", "abc", "hub")
    text = "\n".join(f"# {h}" for h in header) + "\nsha\t10\tconfig.json\nsha\t20\tw.safetensors\n"
    files = {"config.json": 10, "w.safetensors": 20}
    assert copy_problem(copy(None, {}), header) == "no manifest"
    assert copy_problem(copy(text, files), header) is None
    assert copy_problem(copy(text, {**files, "extra": 1}), header) is None
    assert copy_problem(copy(text, {"config.json": 10}), header) == "1 file(s) missing or resized (w.safetensors)"
    assert copy_problem(copy(text, files), manifest_header("org/m", "def", "hub")) == "revision 'abc' -> 'def'"
    assert copy_problem(copy(text, files), reference=text) is None
    assert copy_problem(copy(text, files), reference=text + "x") == "manifest differs from the head's"


def cluster(**data):
    return build_cluster(pair(**{"spark-a": data, "spark-b": data}))


def test_profile_models_are_the_model_then_the_drafter():
    assert profile_models(load_profile("glm-5.3-flash-exl3")) == [
        ("brandonmusic/GLM-5.3-Flash-tr3-4bpw", "5ab363a8dcf6405955fd5f99671e01a1c9fb124b"),
        ("incoai/GLM-5.3-Flash-DFlash2", "dc77ff1c99eeb2df044ee3d4f0094eb033fee410")]
    assert [m for m, _ in profile_models(load_profile("glm-5.3-flash-exl3-mtp"))] == ["brandonmusic/GLM-5.3-Flash-tr3-4bpw"]


def test_the_hub_fetch_reads_the_token_from_a_mounted_file_never_the_command_line():
    c = cluster()
    cmd = fetch_command(c.head, load_profile("glm-5.3-flash-exl3"), "org/m", "abc123")
    assert "-e HF_TOKEN_PATH=/run/secrets/hf-token" in cmd and "/etc/sparkfleet/hf-token:/run/secrets/hf-token:ro" in cmd
    assert "HF_TOKEN=" not in cmd and "--token" not in cmd
    assert "fetch-hub org/m abc123 /weights" in cmd and "seal /var/lib/sparkfleet/models/org/m" in cmd


def test_directory_and_url_sources_and_the_pull_over_the_fabric():
    c = cluster(weights_source="https://mirror.example/models/")
    assert "fetch-http https://mirror.example/models/org/m /var/lib/sparkfleet/models/org/m" in \
        fetch_command(c.head, load_profile("glm-5.3-flash-exl3"), "org/m", "r")
    c = cluster(weights_source="/srv/models", fanout_bwlimit_kib=1000, fanout_streams=3)
    assert "fetch-dir /srv/models/org/m" in fetch_command(c.head, load_profile("glm-5.3-flash-exl3"), "org/m", "r")
    worker = c.node("spark-b")
    assert (  # bounded by fanout_rsync_timeout_s (tests/unit/test_timeouts.py)
        "python3 /usr/local/libexec/sparkfleet/sfl_files.py pull http://10.77.77.1:8874/org/m "
        "/var/lib/sparkfleet/models/org/m --manifest /var/lib/sparkfleet/models/org/m.manifest --streams 3 "
        "--bwlimit 1000"
    ) in pull_command(c, worker, "org/m")


@pytest.mark.parametrize("source", ["s3://bucket/models", "models/relative", "ftp://x", ""])
def test_an_unknown_weights_source_is_refused_naming_host_key_and_forms(source):
    with pytest.raises(ConfigError) as err:
        cluster(weights_source=source)
    text = str(err.value)
    assert "spark-a: key 'weights_source'" in text and "'hub' (the Hugging Face hub)" in text and "http(s)://" in text


def test_the_hub_token_file_must_be_root_only():
    assert token_file_problem("spark-a", "/etc/sparkfleet/hf-token", None) is None  # anonymous
    assert token_file_problem("spark-a", "/t", {"user": "root", "mode": 600}) is None
    assert token_file_problem("spark-a", "/t", {"user": "root", "mode": 400}) is None
    assert token_file_problem("spark-a", "/t", {"user": "root", "mode": 644}) == (
        "spark-a: weights_hf_token_file /t is owned by root with mode 0644; it must be root-only "
        "(chown root /t && chmod 0600 /t). Nothing was fetched.")
    assert "owned by ubuntu" in token_file_problem("spark-a", "/t", {"user": "ubuntu", "mode": 600})


# --- Manifests are confined to their directory --------------------------------------------------

SHA = "0" * 64


@pytest.mark.parametrize("path, why", [
    ("../etc/passwd", "'..' in the path"),
    ("a/../../b", "'..' in the path"),
    ("/etc/cron.d/x", "absolute path"),
    ("a//b", "path not normalised"),
    ("./a", "path not normalised"),
    ("a/./b", "path not normalised"),
    ("a\\b", "path not normalised"),
    ("a\rb", "control character"),
    (".sparkfleet-partial/x", "bookkeeping"),
    ("", "want '<sha256>"),
])
def test_a_manifest_line_that_leaves_the_directory_is_refused_naming_the_line(path, why):
    text = f"# model: m\n{SHA}\t1\tok.bin\n{SHA}\t1\t{path}\n" if path else f"# model: m\n{SHA}\t1\n"
    with pytest.raises(sfl_files.ManifestError) as err:
        sfl_files.parse_manifest(text)
    assert f"manifest line {3 if path else 2}:" in str(err.value) and why in str(err.value)


def test_a_manifest_listing_a_path_twice_or_a_bad_size_is_refused():
    with pytest.raises(sfl_files.ManifestError, match="listed twice"):
        sfl_files.parse_manifest(f"{SHA}\t1\ta\n{SHA}\t2\ta\n")
    with pytest.raises(sfl_files.ManifestError, match="not a size"):
        sfl_files.parse_manifest(f"{SHA}\t-1\ta\n")


def serve_manifest(tmp_path, text):
    src = tmp_path / "src"
    src.mkdir()
    (tmp_path / "src.manifest").write_text(text)
    return f"file://{src}"


def test_fetch_refuses_a_bad_manifest_before_a_byte_is_written(tmp_path, capsys):
    url = serve_manifest(tmp_path, f"# model: m\n{SHA}\t1\tok.bin\n{SHA}\t1\t../../etc/x\n")
    dest, out = tmp_path / "models" / "m", tmp_path / "models" / "m.manifest"
    with pytest.raises(SystemExit) as e:
        sfl_files.main(["fetch-http", url, str(dest), "--manifest", str(out)])
    assert e.value.code == 1
    assert "manifest line 3: '..' in the path: '../../etc/x'; refused, nothing was written" in capsys.readouterr().err
    assert not (tmp_path / "models").exists()


def test_fetch_refuses_a_path_through_a_symlink_out_of_the_directory(tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "models" / "m"
    dest.mkdir(parents=True)
    (dest / "sub").symlink_to(outside)
    url = serve_manifest(tmp_path, f"# model: m\n{SHA}\t1\tsub/x.bin\n")
    with pytest.raises(SystemExit):
        sfl_files.main(["fetch-http", url, str(dest), "--manifest", str(tmp_path / "m.manifest")])
    err = capsys.readouterr().err
    assert "'sub/x.bin': resolves to" in err and "(a symlink on the way); refused, nothing was written" in err
    assert list(outside.iterdir()) == [] and not (tmp_path / "m.manifest").exists()
