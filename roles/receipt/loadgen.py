"""The receipt's load, run on the controller as `python -m roles.receipt.loadgen` by
roles/receipt/receipt.py: one JSON object on stdin (the API key among its fields, so the key is on no
command line), one JSON object on stdout. It uses llama-benchy (eugr/llama-benchy, pinned in
pyproject.toml), the tool the DGX Spark community and spark-arena/sparkrun benchmark OpenAI-compatible
endpoints with, as a library: its client, prompt generator, runner and statistics, with the model's own
tokenizer (tokenizer.json from the head) and a corpus shipped here instead of a book downloaded from the
internet.

Before the load, one streamed request is timed to its first token: the end of the cold start (the
caller knows when the units were started).

With `unix_socket` in the job (a remote head: roles/receipt/receipt.py's Tunnel), every request goes
to that Unix socket, the tunnel's end that only this process may use; base_url then names only the
path (and Host header) of the API. Without it (the controller is the head), base_url is reached
over TCP.
"""
import asyncio
import contextlib
import functools
import http.client
import json
import os
import socket
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

CORPUS = Path(__file__).with_name("corpus.txt")
# The tunnel is local: no proxy from the environment may stand between (aiohttp's trust_env).
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket (the receipt's tunnel)."""

    def __init__(self, socket_path: str, host: str, timeout: float):
        super().__init__(host, timeout=timeout)
        self.socket_path = socket_path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def connection(base_url: str, unix_socket: str | None, timeout_s: float) -> http.client.HTTPConnection:
    url = urllib.parse.urlsplit(base_url)
    if unix_socket:
        return UnixHTTPConnection(unix_socket, url.netloc, timeout_s)
    return http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout_s)


def first_token_at(base_url: str, api_key: str, model: str, timeout_s: float, unix_socket: str | None = None) -> float:
    """time.time() when the first content token of a small streamed chat completion arrived."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "stream": True}
    with contextlib.closing(connection(base_url, unix_socket, timeout_s)) as conn:
        conn.request("POST", f"{urllib.parse.urlsplit(base_url).path}/chat/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"the first request answered HTTP {r.status}: {r.read()[:300]!r}")
        for line in r:
            if line.startswith(b"data: {"):
                choices = json.loads(line[len(b"data: "):]).get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    return time.time()
    raise RuntimeError("the stream ended without a content token")


def load(job: dict) -> dict:
    import aiohttp
    from llama_benchy.client import LLMClient
    from llama_benchy.config import BenchmarkConfig
    from llama_benchy.corpus import TokenizedCorpus
    from llama_benchy.prompts import PromptGenerator
    from llama_benchy.runner import BenchmarkRunner

    class ShippedCorpus(TokenizedCorpus):
        """llama-benchy's corpus from this directory's text (its default downloads a book)."""

        def _load_data(self):
            return self.tokenizer.encode(CORPUS.read_text(), add_special_tokens=False)

    if job.get("unix_socket"):
        # llama-benchy 0.4.0 builds its own aiohttp.TCPConnector(limit=..., force_close=False,
        # keepalive_timeout=600) in BenchmarkRunner.run_suite (llama_benchy/runner.py); aiohttp's
        # UnixConnector takes the same arguments and connects every request to the tunnel's socket.
        aiohttp.TCPConnector = functools.partial(aiohttp.UnixConnector, job["unix_socket"])
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        config = BenchmarkConfig(
            base_url=job["base_url"], api_key=job["api_key"], model=job["model"], served_model_name=job["model"],
            tokenizer=job["tokenizer"], pp_counts=[job["prompt_tokens"]], tg_counts=[job["decode_tokens"]],
            exact_tg=True, depths=[0], num_runs=job["runs"], no_cache=True, latency_mode="api", no_warmup=False,
            skip_coherence=True, adapt_prompt=True, enable_prefix_caching=False, book_url=str(CORPUS),
            concurrency_levels=job["concurrency"], save_result=str(report), result_format="json",
            exit_on_first_fail=True, no_results_on_fail=True,
        )
        corpus = ShippedCorpus(config.book_url, config.tokenizer, config.model)
        client = LLMClient(config.base_url, config.api_key, config.served_model_name, config.extra_body, config.exact_tg)
        runner = BenchmarkRunner(config, client, PromptGenerator(corpus))
        with contextlib.redirect_stdout(sys.stderr):  # llama-benchy prints progress; stdout is the result
            asyncio.run(runner.run_suite())
        if not report.exists():
            raise RuntimeError("llama-benchy wrote no report")
        return json.loads(report.read_text())


def main() -> int:
    job = json.loads(sys.stdin.read())
    if job.get("unix_socket"):
        for name in PROXY_VARIABLES:
            os.environ.pop(name, None)
    first = first_token_at(job["base_url"], job["api_key"], job["model"], job["timeout_s"], job.get("unix_socket"))
    result = {"first_token_at": first, "report": load(job)}
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
