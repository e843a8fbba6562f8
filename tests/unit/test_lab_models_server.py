"""lab/model/serve.py, the lab's model server, with the deploy's real fetcher (roles/fanout/sfl_files.py
fetch-http) against it on loopback: the plain paths serve the files as `python3 -m http.server` did,
and /uplink/<KiB/s>/ serves the same bytes no faster than its rate (a lower bound on the time, which
a server that ignored the rate breaks; nothing here bounds how slow a loaded machine may be)."""
import functools
import runpy
import threading
import time
from pathlib import Path

import pytest

from roles.fanout import sfl_files

SERVE = runpy.run_path(str(Path(__file__).resolve().parents[2] / "lab" / "model" / "serve.py"))
KIB = 1024


@pytest.fixture
def models(tmp_path):
    """A served directory holding one model of two files (96 KiB and 32 KiB) and its manifest."""
    root = tmp_path / "models"
    model = root / "org" / "m"
    model.mkdir(parents=True)
    (model / "a.safetensors").write_bytes(bytes(range(256)) * (96 * KIB // 256))
    (model / "config.json").write_bytes(b'{"x": 1}\n' * (32 * KIB // 9) + b"\n" * (32 * KIB % 9))
    (root / "org" / "m.manifest").write_text(sfl_files.manifest_text(model))
    server = SERVE["http"].server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(SERVE["Handler"], directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", model
    server.shutdown()
    server.server_close()


def fetched(url, dest):
    out = dest.with_suffix(".manifest")
    started = time.monotonic()
    assert sfl_files.main(["fetch-http", url, str(dest), "--manifest", str(out)]) == 0
    return time.monotonic() - started, out.read_text()


def test_an_uplink_path_serves_the_same_bytes_no_faster_than_its_rate(models, tmp_path):
    base, model = models
    _, plain = fetched(f"{base}/org/m", tmp_path / "plain")
    took, slow = fetched(f"{base}/uplink/64/org/m", tmp_path / "slow")
    assert slow == plain == sfl_files.manifest_text(model)  # every file, verified by the fetcher's sha256
    assert took >= 128 / 64 * 0.95, f"128 KiB at 64 KiB/s arrived in {took:.2f} s"


@pytest.mark.parametrize("path", ["/uplink/0/org/m.manifest", "/uplink/x/org/m.manifest", "/uplink/64"])
def test_a_malformed_uplink_path_is_a_missing_file_not_a_fast_one(models, path):
    import urllib.error
    import urllib.request
    base, _ = models
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(base + path, timeout=10)
    assert refused.value.code == 404
