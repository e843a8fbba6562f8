"""The receipt's load, run on the controller as `python -m roles.receipt.loadgen` by
roles/receipt/receipt.py: one JSON object on stdin (the API key among its fields, so the key is on no
command line), one JSON object on stdout. It uses llama-benchy (eugr/llama-benchy, pinned in
pyproject.toml), the tool the DGX Spark community and spark-arena/sparkrun benchmark OpenAI-compatible
endpoints with, as a library: its client, prompt generator, runner and statistics, with the model's own
tokenizer (tokenizer.json from the head) and a corpus shipped here instead of a book downloaded from the
internet.

Before the load, one streamed request is timed to its first token: the end of the cold start (the
caller knows when the units were started).
"""
import asyncio
import contextlib
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CORPUS = Path(__file__).with_name("corpus.txt")


def first_token_at(base_url: str, api_key: str, model: str, timeout_s: float) -> float:
    """time.time() when the first content token of a small streamed chat completion arrived."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "stream": True}
    request = urllib.request.Request(f"{base_url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(request, timeout=timeout_s) as r:
        for line in r:
            if line.startswith(b"data: {"):
                choices = json.loads(line[len(b"data: "):]).get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    return time.time()
    raise RuntimeError("the stream ended without a content token")


def load(job: dict) -> dict:
    from llama_benchy.client import LLMClient
    from llama_benchy.config import BenchmarkConfig
    from llama_benchy.corpus import TokenizedCorpus
    from llama_benchy.prompts import PromptGenerator
    from llama_benchy.runner import BenchmarkRunner

    class ShippedCorpus(TokenizedCorpus):
        """llama-benchy's corpus from this directory's text (its default downloads a book)."""

        def _load_data(self):
            return self.tokenizer.encode(CORPUS.read_text(), add_special_tokens=False)

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
    first = first_token_at(job["base_url"], job["api_key"], job["model"], job["timeout_s"])
    result = {"first_token_at": first, "report": load(job)}
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
