"""Streamed chat completions from both lab stand-ins, as a benchmark client (llama-benchy, the
receipt's tool) reads them: server-sent events, one token per chunk, a usage chunk, [DONE]; the
reply's length follows max_tokens, min_tokens and ignore_eos like the real engines' sampling
parameters, and each token after the first is one more step over every rank."""
import json
import urllib.request

import pytest

from tests.unit import test_lab_standin as vllm_tests
from tests.unit import test_lab_standin_sglang as sglang_tests
from tests.unit.test_lab_standin import get, wait_for


def stream(port, body, timeout=15):
    """(content type, [parsed events], saw [DONE]) of a streamed chat completion."""
    body = {"model": "lab", "messages": [{"role": "user", "content": "one two three"}], "stream": True, **body}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        kind, lines = r.headers["Content-Type"], r.read().decode().split("\n\n")
    events = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: {")]
    return kind, events, "data: [DONE]" in lines


@pytest.fixture(params=["vllm", "sglang"])
def pair(request, launch):
    """A serving two-rank pair of one stand-in; its HTTP port."""
    if request.param == "vllm":
        ports = {"http": vllm_tests.free_port(), "master": vllm_tests.free_port()}
        run = lambda *args, **extra: launch([vllm_tests.sys.executable, str(vllm_tests.VLLM), *args],  # noqa: E731
                                            vllm_tests.env(**extra))
        vllm_tests.start_pair(run, ports)
    else:
        ports = {"http": vllm_tests.free_port(), "dist": vllm_tests.free_port()}
        run = lambda *args, **extra: launch(sglang_tests.command(*args), sglang_tests.env(**extra))  # noqa: E731
        sglang_tests.start_pair(run, ports)
    wait_for(lambda: get(ports["http"], "/v1/models")[0] == 200, what="/v1/models 200")
    return ports["http"]


def text_of(events):
    return "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])


def test_a_stream_is_one_chunk_per_token_then_usage_then_done(pair):
    kind, events, done = stream(pair, {"max_tokens": 64, "stream_options": {"include_usage": True}})
    assert kind == "text/event-stream" and done
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert text_of(events) == "sparkfleet lab stand-in reply" and len(tokens) == 4  # its end of sequence
    assert tokens[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"] == [] and events[-1]["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_ignore_eos_runs_to_max_tokens_and_min_tokens_past_the_end(pair):
    _, events, _ = stream(pair, {"max_tokens": 10, "min_tokens": 10, "ignore_eos": True})
    assert len(text_of(events).split()) == 10 and not any("usage" in e for e in events)  # no include_usage
    assert [e for e in events if e["choices"]][-1]["choices"][0]["finish_reason"] == "length"
    _, events, _ = stream(pair, {"max_tokens": 50, "min_tokens": 6})
    assert text_of(events).split() == "sparkfleet lab stand-in reply sparkfleet lab".split()


def test_a_stream_with_tools_is_refused(pair):
    body = {"model": "lab", "messages": [{"role": "user", "content": "x"}], "stream": True,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}
    status, answer = vllm_tests.post(pair, "/v1/chat/completions", body)
    assert status == 400 and "'stream' with 'tools'" in answer["error"]["message"]
