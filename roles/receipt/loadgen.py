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
to that Unix socket, the tunnel's end that only this process may use; base_url then names the API as
clients name it (https://<the head's management address>:<port>/v1), which TLS verifies the head's
certificate against, over the tunnel: `ca_pem` in the job is the fleet's trust bundle (read from the
head, public), and no other CA is trusted. Without a socket (the controller is the head), base_url is
reached over TCP, verified the same way. An http:// base_url (tls_enabled false in data) is plain.
"""
import asyncio
import contextlib
import functools
import http.client
import json
import os
import socket
import ssl
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


class UnixHTTPSConnection(UnixHTTPConnection):
    """http.client over TLS over a Unix socket: the head's certificate verified as the API's host names it."""

    def __init__(self, socket_path: str, host: str, timeout: float, context: ssl.SSLContext):
        super().__init__(socket_path, host, timeout)
        self.context = context

    def connect(self):
        super().connect()
        self.sock = self.context.wrap_socket(self.sock, server_hostname=urllib.parse.urlsplit(f"//{self.host}").hostname)


def tls_context(ca_pem: str | None) -> ssl.SSLContext | None:
    """The context that verifies the head's certificate: the fleet's trust bundle only, the host checked."""
    return ssl.create_default_context(cadata=ca_pem) if ca_pem else None


def connection(base_url: str, unix_socket: str | None, timeout_s: float,
               ca_pem: str | None = None) -> http.client.HTTPConnection:
    url = urllib.parse.urlsplit(base_url)
    if url.scheme == "https" and not ca_pem:
        raise RuntimeError(f"{base_url}: no trust bundle to verify its certificate with (ca_pem)")
    context = tls_context(ca_pem) if url.scheme == "https" else None
    if unix_socket:
        if context:
            return UnixHTTPSConnection(unix_socket, url.netloc, timeout_s, context)
        return UnixHTTPConnection(unix_socket, url.netloc, timeout_s)
    if context:
        return http.client.HTTPSConnection(url.hostname, url.port or 443, timeout=timeout_s, context=context)
    return http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout_s)


def first_token_at(base_url: str, api_key: str, model: str, timeout_s: float, unix_socket: str | None = None,
                   ca_pem: str | None = None) -> float:
    """time.time() when the first content token of a small streamed chat completion arrived."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "stream": True}
    with contextlib.closing(connection(base_url, unix_socket, timeout_s, ca_pem)) as conn:
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


def tunnel_connector(aiohttp):
    """aiohttp's TCPConnector (its TLS, its host check, its pool) whose every connection is a Unix socket to
    the receipt's tunnel instead of a TCP connection to the address: aiohttp 3.14's
    TCPConnector._wrap_create_connection (aiohttp/connector.py) opens the socket, then hands it to the
    event loop's create_connection with the TLS context and server_hostname, which is kept."""

    class TunnelConnector(aiohttp.TCPConnector):
        def __init__(self, path: str, **kwargs):
            super().__init__(**kwargs)
            self._tunnel_path = path

        async def _wrap_create_connection(self, *args, addr_infos, req, timeout, client_error=aiohttp.ClientConnectorError,
                                          **kwargs):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await self._loop.sock_connect(sock, self._tunnel_path)
                return await self._loop.create_connection(*args, sock=sock, **kwargs)
            except ssl.SSLCertVerificationError as exc:
                sock.close()
                raise aiohttp.ClientConnectorCertificateError(req.connection_key, exc) from exc
            except OSError as exc:
                sock.close()
                raise client_error(req.connection_key, exc) from exc

    return TunnelConnector


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

    # llama-benchy 0.4.0 builds its own aiohttp.TCPConnector(limit=..., force_close=False,
    # keepalive_timeout=600) in BenchmarkRunner.run_suite (llama_benchy/runner.py): the connector it gets
    # is this one. Over TLS, aiohttp's own TCPConnector with `ssl=` the context that trusts the fleet's
    # bundle alone (the host checked against the certificate's IP SAN); through the tunnel, connecting
    # its socket to the tunnel's end instead of the address (TunnelConnector). Plain: aiohttp's
    # UnixConnector, which takes the same arguments, connects every request to the tunnel's socket.
    context = tls_context(job.get("ca_pem")) if job["base_url"].startswith("https://") else None
    if context and job.get("unix_socket"):
        aiohttp.TCPConnector = functools.partial(tunnel_connector(aiohttp), job["unix_socket"], ssl=context)
    elif context:
        aiohttp.TCPConnector = functools.partial(aiohttp.TCPConnector, ssl=context)
    elif job.get("unix_socket"):
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
    first = first_token_at(job["base_url"], job["api_key"], job["model"], job["timeout_s"], job.get("unix_socket"),
                           job.get("ca_pem"))
    result = {"first_token_at": first, "report": load(job)}
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
