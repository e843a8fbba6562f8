"""The benchmark receipt: what a pair delivers, measured right after the deploy that (re)started it.

The load (roles/receipt/loadgen.py, llama-benchy) runs on the controller, through an SSH tunnel to the
head's API on 127.0.0.1 (the firewall and the API's bind stay as they are), over TLS end to end inside
the tunnel (the head's certificate verified against the fleet's trust bundle read from the head, for the
head's management address, as any client's), with the API key: read from
the head's root-only key file over the deploy's connection into memory (sparkfleet/keyfiles.py) and
handed to the load generator on its stdin, never on a command line, in a fact or in a log (its
output is cleared of the key before any of it is shown). The tunnel's end on the controller is a
Unix socket in a directory only the deploy's user can enter, and it serves only the load generator's
process (its pid, from the kernel: SO_PEERCRED): no other user or process of the controller reaches
the head's API through it. The receipt (JSON) is kept on the head,
<receipt_dir>/<profile>/<UTC time>.json, with the profile, recipe commit, image ID and weights
revision; one table is printed. `make status` shows the latest against the previous one.

It also keeps how long this deploy's long steps took on the pair (deploy_steps: each host's image
build, push and pull, weights fetch and fan-out, prewarm and start, from sparkfleet/progress.py's
record, then the receipt's own), and when the deploy (re)started the units (units_started_at): the
bring-up benchmark (bench/bringup.py) reads its phases from there.
"""
from __future__ import annotations

import io
import json
import os
import select
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from pyinfra import logger
from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import DeployError

from sparkfleet.keyfiles import KeyFileError, read
from sparkfleet.model.engine_proof import engine_proof_path, proven_version
from sparkfleet.model.fabric_speed import passed_figures, speed_record_path
from sparkfleet.model.monitoring import RECEIPT_TEXTFILE
from sparkfleet.model.tls import api_base as tls_api_base, ca_bundle_path
from sparkfleet.progress import spans_of
from sparkfleet.root_paths import textfile_write_command


REPO = Path(__file__).resolve().parents[2]
# When the deploy (re)started each pair's units, in the controller's clock: set by the serving role's
# "Note when the pair's units start" step, read by the receipt (cold start = first token - this).
STARTED_AT: dict[str, float] = {}


# The receipt's own entry among the deploy's steps (deploy_steps): from the key's read to just before the
# record is written.
RECEIPT_STEP = "benchmark receipt"


def deploy_steps(nodes, host: str, began_at: float, ended_at: float, spans=None) -> list[dict]:
    """This deploy's long steps on the pair's `nodes` (sparkfleet/progress.py's record, or `spans`), in
    the order they ended, then the receipt's own on `host` (the head), in the controller's clock."""
    return [*spans_of(nodes, spans),
            {"host": host, "step": RECEIPT_STEP, "start": began_at, "end": ended_at, "ok": True}]


def note_start(pair: str) -> None:
    """Operation body: the pair's units are being (re)started now."""
    STARTED_AT[pair] = time.time()


class Tunnel:
    """A Unix socket on the controller (`path`), forwarded to 127.0.0.1:<remote_port> on the host through
    the deploy's own SSH connection (paramiko's direct-tcpip channels, one per accepted connection).

    It lies in a fresh directory of mode 0700 (tempfile.mkdtemp): no other user of the controller can
    connect to it (a TCP port on 127.0.0.1 would take any local user). And it serves only the process
    `allow()` names, the load generator: the kernel's SO_PEERCRED gives each connection's pid and uid,
    and any other is closed before a byte is forwarded."""

    def __init__(self, transport, remote_port: int):
        self.transport, self.remote_port = transport, remote_port
        self.directory = tempfile.mkdtemp(prefix="sfl-receipt-")
        self.path = os.path.join(self.directory, "api.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(64)
        self.allowed_pid: int | None = None
        self.refused = 0  # connections closed unserved (another process or user)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def allow(self, pid: int) -> None:
        self.allowed_pid = pid

    @staticmethod
    def peer(conn) -> tuple[int, int]:
        """(pid, uid) of the process at the other end of a Unix socket connection."""
        pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
        return pid, uid

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            pid, uid = self.peer(conn)
            if self.allowed_pid is None or pid != self.allowed_pid or uid != os.getuid():
                self.refused += 1
                conn.close()
                continue
            threading.Thread(target=self._pipe, args=(conn,), daemon=True).start()

    def _pipe(self, conn):
        try:
            chan = self.transport.open_channel("direct-tcpip", ("127.0.0.1", self.remote_port), ("127.0.0.1", 0))
        except Exception:
            conn.close()
            return
        try:
            while True:
                ready, _, _ = select.select([conn, chan], [], [], 1.0)
                if conn in ready:
                    data = conn.recv(65536)
                    if not data:
                        break
                    chan.sendall(data)
                if chan in ready:
                    data = chan.recv(65536)
                    if not data:
                        break
                    conn.sendall(data)
        except OSError:
            pass
        finally:
            chan.close()
            conn.close()

    def close(self):
        self.closed = True
        self.server.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def api_base(host, node, port: int):
    """(base URL, Unix socket path or None, tunnel or None) for the head's API: the URL as clients name it
    (https://<management address>:<port>/v1: its certificate is checked against that address), reached
    through the tunnel to the head's 127.0.0.1:<port> (TLS runs end to end inside it)."""
    base = f"{tls_api_base(node, port)}/v1"
    client = getattr(host.connector, "client", None)
    if client is None:  # @local: the controller is the head
        return base, None, None
    tunnel = Tunnel(client.get_transport(), port)
    return base, tunnel.path, tunnel


def read_remote(host, path: str) -> bytes | None:
    buf = io.BytesIO()
    try:
        if not host.get_file(path, buf):
            return None
    except Exception:
        return None
    return buf.getvalue()


def scrub(text: str, key: str) -> str:
    """`text` (the load generator's output) with the key replaced, before any of it is shown: as it
    is, and as Python's repr and JSON would quote it."""
    if not key:
        return text
    for form in sorted({key, repr(key)[1:-1], repr(key.encode())[2:-1], json.dumps(key)[1:-1]}, key=len, reverse=True):
        text = text.replace(form, "<the API key>")
    return text


def run_load(job: dict, tunnel, timeout_s: float) -> subprocess.CompletedProcess:
    """The load generator with `job` on its stdin; the tunnel (if any) admits its process only."""
    proc = subprocess.Popen([sys.executable, "-m", "roles.receipt.loadgen"], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if tunnel is not None:
        tunnel.allow(proc.pid)  # before the job (it connects only once it has read it)
    try:
        out, err = proc.communicate(json.dumps(job), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, scrub(out, job["api_key"]), scrub(err, job["api_key"]))


def metric(run: dict, key: str) -> float | None:
    value = run.get(key)
    return round(value["mean"], 2) if isinstance(value, dict) and value.get("mean") is not None else None


def figures(report: dict) -> list[dict]:
    """Per concurrency: time to first token (ms, llama-benchy's e2e_ttft), decode tokens/s per request
    and in aggregate (its tg_req_throughput and tg_throughput), from llama-benchy's JSON report."""
    out = []
    for run in report.get("benchmarks") or []:
        if run.get("is_context_prefill_phase"):
            continue
        per_request = metric(run, "tg_req_throughput") or metric(run, "tg_throughput")
        out.append({"concurrency": run["concurrency"], "prompt_tokens": run["prompt_size"],
                    "decode_tokens": run["response_size"], "ttft_ms": metric(run, "e2e_ttft"),
                    "decode_tps_per_request": per_request, "decode_tps_aggregate": metric(run, "tg_throughput")})
    return sorted(out, key=lambda f: f["concurrency"])


def table(receipt: dict) -> str:
    rows = [f"  {'concurrency':>11}  {'TTFT ms':>9}  {'decode t/s per request':>22}  {'decode t/s aggregate':>20}"]
    for f in receipt["figures"]:
        rows.append(f"  {f['concurrency']:>11}  {f['ttft_ms'] or '?':>9}  {f['decode_tps_per_request'] or '?':>22}  "
                    f"{f['decode_tps_aggregate'] or '?':>20}")
    cold = receipt.get("cold_start_s")
    head = (f"receipt {receipt['taken_at']}: profile {receipt['profile']}, "
            f"{receipt['engine']} {receipt.get('engine_version') or '?'}, recipe {receipt['recipe_commit'][:12]}, "
            f"image {receipt['image_id'][:19]}, weights {receipt['weights_revision']}; "
            f"cold start {cold if cold is not None else '?'} s (units started -> first token); "
            f"{receipt['load']['prompt_tokens']} prompt + {receipt['load']['decode_tokens']} decode tokens per "
            f"request, {receipt['load']['runs']} run(s) per concurrency, {receipt['tool']}, "
            f"{receipt['load'].get('took_s', '?')} s")
    return head + "\n" + "\n".join(rows)


def drops(latest: dict, previous: dict, threshold_pct: float) -> list[str]:
    """Each figure of `latest` worse than `previous`'s by more than threshold_pct percent, as a line."""
    out = []
    before = {f["concurrency"]: f for f in previous.get("figures") or []}
    for f in latest.get("figures") or []:
        p = before.get(f["concurrency"])
        if not p:
            continue
        for key, what, higher_is_better in (("decode_tps_per_request", "decode t/s per request", True),
                                            ("decode_tps_aggregate", "decode t/s aggregate", True),
                                            ("ttft_ms", "TTFT ms", False)):
            new, old = f.get(key), p.get(key)
            if not new or not old:
                continue
            change = (new - old) / old * 100
            worse = -change if higher_is_better else change
            if worse > threshold_pct:
                out.append(f"DROP at concurrency {f['concurrency']}: {what} {old} -> {new} "
                           f"({change:+.1f} %, threshold {threshold_pct:g} %)")
    return out


def receipt_metrics_text(receipt: dict) -> str:
    """The receipt's figures for the node exporter's textfile collector (sparkfleet-receipt.prom on the
    head): what roles/monitoring's SparkfleetTtftRegression holds the live p95 against."""
    lines = ["# HELP sparkfleet_receipt_ttft_seconds Time to first token of the last benchmark receipt (mean, "
             "llama-benchy's e2e_ttft), per concurrency.",
             "# TYPE sparkfleet_receipt_ttft_seconds gauge"]
    lines += [f'sparkfleet_receipt_ttft_seconds{{concurrency="{f["concurrency"]}"}} {f["ttft_ms"] / 1000:.6f}'
              for f in receipt.get("figures") or [] if f.get("ttft_ms")]
    lines += ["# HELP sparkfleet_receipt_decode_tokens_per_second Decode tokens/s per request of the last receipt.",
              "# TYPE sparkfleet_receipt_decode_tokens_per_second gauge"]
    lines += [f'sparkfleet_receipt_decode_tokens_per_second{{concurrency="{f["concurrency"]}"}} '
              f'{f["decode_tps_per_request"]}' for f in receipt.get("figures") or [] if f.get("decode_tps_per_request")]
    lines += ["# HELP sparkfleet_receipt_timestamp_seconds When the last receipt was taken.",
              "# TYPE sparkfleet_receipt_timestamp_seconds gauge",
              f"sparkfleet_receipt_timestamp_seconds {_epoch(receipt.get('taken_at'))}"]
    return "\n".join(lines) + "\n"


def _epoch(taken_at: str | None) -> int:
    try:
        return int(datetime.strptime(taken_at or "", "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp())
    except ValueError:
        return 0


def write_receipt_metrics(host, receipt: dict) -> None:
    """The receipt's figures into the textfile collector's directory (monitoring on): written beside
    (mktemp) and moved in, so the exporter never reads half a file, in a directory every directory of
    which is root's alone (sparkfleet/root_paths.py: a planted symlink fails the step, naming it)."""
    ok, out = host.run_shell_command(StringCommand(textfile_write_command(RECEIPT_TEXTFILE, receipt_metrics_text(receipt))))
    if not ok:
        raise DeployError(f"{host.name}: receipt: could not write {RECEIPT_TEXTFILE}: {out.stderr}")


def receipt_path(node, profile) -> str:
    return f"{node.receipt_dir}/{profile.name}"


def take_receipt(pair: str, node, profile, key_path: str, model_dir: str, nodes: tuple[str, ...] = ()) -> None:
    """Operation body (head): the load through the API, then the receipt written on the head; `nodes`:
    the pair's, whose long steps of this deploy it keeps (deploy_steps)."""
    from pyinfra import host

    began_at = time.time()

    try:
        key = read(host, key_path)
    except KeyFileError as e:
        raise DeployError(f"receipt: {e}")
    if not key:
        raise DeployError(f"{host.name}: receipt: the API key file {key_path} does not exist")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = read_remote(host, f"{model_dir}/tokenizer.json")
        if tokenizer:
            Path(tmp, "tokenizer.json").write_bytes(tokenizer)
        ca_pem = None
        if node.tls_enabled:  # the fleet's trust bundle (public), what the load generator verifies the head with:
            try:  # read as root (its directory is root's alone), with the host's sudo settings
                ca_pem = read(host, ca_bundle_path(node))
            except KeyFileError as e:
                raise DeployError(f"receipt: {e}")
            if not ca_pem:
                raise DeployError(f"{host.name}: receipt: no trust bundle at {ca_bundle_path(node)} to verify the API's "
                                  f"certificate with (roles/tls writes it)")
        base, unix_socket, tunnel = api_base(host, node, profile.port)
        job = {"base_url": base, "unix_socket": unix_socket, "api_key": key.decode().strip(),
               "ca_pem": ca_pem.decode() if ca_pem else None,
               "model": profile.api_model_name,
               "tokenizer": tmp if tokenizer else profile.model, "prompt_tokens": node.receipt_prompt_tokens,
               "decode_tokens": node.receipt_decode_tokens, "concurrency": list(node.receipt_concurrency),
               "runs": node.receipt_runs, "timeout_s": node.receipt_timeout_s}
        began = time.monotonic()
        try:
            done = run_load(job, tunnel, node.receipt_timeout_s)
        except subprocess.TimeoutExpired:
            raise DeployError(f"{host.name}: receipt: the load did not finish within receipt_timeout_s = "
                              f"{node.receipt_timeout_s} s")
        finally:
            if tunnel:
                tunnel.close()
    if done.returncode != 0:
        raise DeployError(f"{host.name}: receipt: the load failed (exit {done.returncode}); the pair was restarted and "
                          f"its /health passed; receipt_enabled = false skips the receipt:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout)
    load_s = round(time.monotonic() - began, 1)
    started = STARTED_AT.get(pair)
    _, out = host.run_shell_command(StringCommand(
        # one line each, empty when absent: the image's ID, the manifest's sha256, the speed record
        f"printf '%s\\n' \"$(docker image inspect --format '{{{{.Id}}}}' {shlex.quote(profile.image_ref)} 2>/dev/null)\" "
        f"\"$(sha256sum < {shlex.quote(model_dir)}.manifest 2>/dev/null | cut -c1-64)\" "
        f"\"$(tr -d '\\n' < {shlex.quote(speed_record_path(node))} 2>/dev/null)\" "
        # the engine proof's record (roles/engine_proof, step 7a): the version the image's engine reported
        f"\"$(tr -d '\\n' < {shlex.quote(engine_proof_path(node))} 2>/dev/null)\""))
    lines = out.stdout.splitlines()
    image_id = lines[0] if lines and lines[0] else "?"
    manifest = lines[1] if len(lines) > 1 and lines[1] else "?"
    now = datetime.now(timezone.utc)
    receipt = {
        "receipt": "sparkfleet benchmark receipt v1", "taken_at": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "pair": pair,
        "profile": profile.name, "engine": profile.engine, "model": profile.model,
        "engine_version": proven_version(lines[3] if len(lines) > 3 else None, profile.image_ref),
        "recipe_commit": profile.recipe.commit, "image": profile.image_ref, "image_id": image_id,
        "weights_revision": profile.model_revision, "weights_manifest_sha256": manifest,
        "cold_start_s": round(result["first_token_at"] - started, 1) if started else None,
        "tool": f"llama-benchy {result['report'].get('version', '?')}",
        "load": {"prompt_tokens": node.receipt_prompt_tokens, "decode_tokens": node.receipt_decode_tokens,
                 "concurrency": list(node.receipt_concurrency), "runs": node.receipt_runs, "took_s": load_s},
        "figures": figures(result["report"]), "report": result["report"],
        # the group's last passed fabric speed proof (roles/fabric_speed), as its record on the head holds it
        "fabric_speed": passed_figures(lines[2] if len(lines) > 2 else None),
        # this deploy's timings, in the controller's clock (seconds since the epoch): bench/bringup.py
        "units_started_at": started,
        "deploy_steps": deploy_steps(nodes or (host.name,), host.name, began_at, time.time()),
    }
    directory = receipt_path(node, profile)
    name = f"{directory}/{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    host.run_shell_command(StringCommand(f"mkdir -p -m 0755 {shlex.quote(directory)}"))
    if not host.put_file(io.BytesIO((json.dumps(receipt, indent=1) + "\n").encode()), name):
        raise DeployError(f"{host.name}: receipt: could not write {name}")
    host.run_shell_command(StringCommand(
        f"chmod 0644 {shlex.quote(name)}; cd {shlex.quote(directory)} && "
        f"ls -1 *.json | sort | head -n -{node.receipt_keep} | xargs -r rm -f"))
    if node.monitoring_enabled:
        write_receipt_metrics(host, receipt)
    logger.info(f"    [{host.name}] {table(receipt)}\n    [{host.name}] kept in {name}")


class Receipts(FactBase):
    """The last two receipts of a profile on the head, newest first: [{...}, ...] (parsed JSON)."""

    def command(self, directory: str) -> str:
        d = shlex.quote(directory)
        return f"for f in $(ls -1 {d}/*.json 2>/dev/null | sort -r | head -2); do cat $f; echo; echo '#--'; done; true"

    def process(self, output):
        out, buf = [], []
        for line in output:
            if line == "#--":
                try:
                    out.append(json.loads("\n".join(buf)))
                except ValueError:
                    pass
                buf = []
            else:
                buf.append(line)
        return out


def status_lines(receipts: list[dict], threshold_pct: float) -> list[str]:
    """`make status`'s receipt section: the latest receipt's table, the previous one's, the drops."""
    if not receipts:
        return ["no receipt yet (one is taken after every deploy that restarts the pair)"]
    latest, *rest = receipts
    lines = table(latest).splitlines()
    if rest:
        lines += ["previous " + line if i == 0 else line for i, line in enumerate(table(rest[0]).splitlines())]
        lines += drops(latest, rest[0], threshold_pct) or [f"no figure dropped by more than {threshold_pct:g} %"]
    else:
        lines.append("no previous receipt to compare with")
    return lines
