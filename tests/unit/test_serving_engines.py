"""Profiles and engines: a field an engine cannot use is refused when the profile loads, naming
the engine and the field; the shipped profiles' engine commands run on the lab stand-ins."""
import copy
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import sparkfleet.model.serving as schema
from sparkfleet.model.engine import engine_args
from sparkfleet.model.serving import load_profile, profile_names
from sparkfleet.config import build_cluster
from tests.unit.helpers import pair
from tests.unit.test_lab_standin import free_port, get

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "lab" / "standin"
QWEN = yaml.safe_load((schema.PROFILES_DIR / "qwen3.8-flash-next.yaml").read_text())
GLM = yaml.safe_load((schema.PROFILES_DIR / "glm-5.3-flash-exl3.yaml").read_text())


def load_changed(tmp_path, monkeypatch, base, change):
    data = copy.deepcopy(base)
    change(data)
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(schema, "PROFILES_DIR", tmp_path)
    return load_profile("changed")


def spec(**values):
    def change(data):
        data["speculative"].update(values)
        for key in [k for k, v in data["speculative"].items() if v is None]:
            del data["speculative"][key]
    return change


@pytest.mark.parametrize("base, change, message", [
    (QWEN, spec(num_speculative_tokens=3), "speculative.num_speculative_tokens is vLLM's"),
    (QWEN, spec(num_steps=None), "speculative.num_steps required"),
    (QWEN, spec(num_draft_tokens=5), "num_draft_tokens 5 with eagle_topk 1 must be num_steps + 1 = 4"),
    (QWEN, spec(draft_tensor_parallel_size=2), "draft_tensor_parallel_size is vLLM's"),
    (QWEN, spec(method="nextn"), "'nextn' is not an SGLang --speculative-algorithm"),
    (QWEN, lambda d: d.update(kv_cache_dtype="fp8_ds_mla"), "'fp8_ds_mla' is not an SGLang --kv-cache-dtype"),
    (GLM, spec(num_steps=3), "speculative.num_steps is SGLang's"),
    (GLM, spec(num_speculative_tokens=None), "speculative.num_speculative_tokens is required"),
    (GLM, lambda d: d.update(engine="tgi"), "engine = 'tgi': Input should be 'vllm' or 'sglang'"),
    (GLM, lambda d: d.update(pipeline_parallel_size=0), "pipeline_parallel_size = 0: Input should be greater than"),
    # SGLang's check_pipeline_parallel_compat: speculative decoding with PP is EAGLE's (NEXTN's) only.
    (QWEN, lambda d: (d.update(pipeline_parallel_size=2), spec(method="EAGLE3")(d)),
     "speculative.method 'EAGLE3' with pipeline_parallel_size 2: SGLang runs pipeline parallelism with EAGLE (NEXTN) "
     "drafting only"),
])
def test_fields_an_engine_cannot_use_are_refused(tmp_path, monkeypatch, base, change, message):
    with pytest.raises(ValueError) as err:
        load_changed(tmp_path, monkeypatch, base, change)
    assert message in str(err.value) and "profile 'changed'" in str(err.value)


def test_the_refusal_names_the_engine_and_every_problem(tmp_path, monkeypatch):
    with pytest.raises(ValueError) as err:
        load_changed(tmp_path, monkeypatch, QWEN,
                     lambda d: (spec(num_speculative_tokens=3)(d), d.update(kv_cache_dtype="fp8_ds_mla")))
    text = str(err.value)
    assert "engine sglang:" in text and "num_speculative_tokens" in text and "fp8_ds_mla" in text


@pytest.mark.parametrize("base", [QWEN, GLM], ids=["sglang", "vllm"])
def test_pipeline_parallelism_renders_on_every_rank_of_the_group(tmp_path, monkeypatch, base):
    """TP 2 x PP 2 over four nodes: the PP size, --nnodes 4 and each rank's --node-rank; vLLM's
    ranks > 0 headless. PP is rendered as explicitly at 1 (the shipped profiles)."""
    from tests.unit.helpers import group

    pair_cluster = build_cluster(pair(**{n: {"serving_profile": base["name"]} for n in ("spark-a", "spark-b")}))
    pair_words = engine_args(load_profile(base["name"]), pair_cluster, pair_cluster.node("spark-a"))
    p = load_changed(tmp_path, monkeypatch, base, lambda d: d.update(pipeline_parallel_size=2))
    c = build_cluster(group(4, **{n: {"serving_profile": "changed"} for n in ("spark-a", "spark-b", "spark-c",
                                                                                "spark-d")}))
    pp_flag = "--pipeline-parallel-size" if p.engine == "vllm" else "--pp-size"
    for node in c.nodes:
        words = engine_args(p, c, node)
        value = lambda flag: words[words.index(flag) + 1]
        assert value(pp_flag) == "2" and value("--nnodes") == "4" and value("--node-rank") == str(node.rank)
        assert ("--headless" in words) == (p.engine == "vllm" and node.rank > 0)
    assert pair_words[pair_words.index(pp_flag) + 1] == "1"


def test_topk_above_one_leaves_the_draft_tokens_free(tmp_path, monkeypatch):
    p = load_changed(tmp_path, monkeypatch, QWEN, spec(eagle_topk=4, num_draft_tokens=8))
    assert (p.speculative.num_steps, p.speculative.eagle_topk, p.speculative.num_draft_tokens) == (3, 4, 8)


def test_sglang_vision_off_and_a_drafter_render_their_flags(tmp_path, monkeypatch):
    c = build_cluster(pair())  # before the profiles directory is swapped
    p = load_changed(tmp_path, monkeypatch, QWEN, lambda d: (
        d.update(vision=False, tool_call_parser="qwen25", reasoning_parser="qwen3", trust_remote_code=True,
                 model_revision="a" * 40),  # remote code only at a pinned revision
        spec(method="EAGLE3", draft_model="org/drafter", draft_model_revision="b" * 40)(d)))
    words = engine_args(p, c, c.node("spark-b"))
    assert "--language-model-only" in words and "--enable-multimodal" not in words
    # The drafter is loaded from the local copy roles/weights verified, like the model.
    assert words[words.index("--speculative-draft-model-path") + 1] == "/models/org/drafter"
    assert words[words.index("--tool-call-parser") + 1] == "qwen25" and "--enable-auto-tool-choice" not in words
    assert words[words.index("--reasoning-parser") + 1] == "qwen3" and "--trust-remote-code" in words


# --- The rendered commands run on the lab stand-ins (what the lab image executes) ---------------

def local(args, engine, http, rendezvous):
    """A rank's rendered engine command, moved to 127.0.0.1 and free ports; argv for this Python."""
    args = list(args)
    swap = {"--host": "127.0.0.1", "--port": str(http), "--master-addr": "127.0.0.1",
            "--master-port": str(rendezvous), "--dist-init-addr": f"127.0.0.1:{rendezvous}"}
    for i, word in enumerate(args[:-1]):
        if word in swap:
            args[i + 1] = swap[word]
    if engine == "vllm":
        assert args[0] == "vllm"
        return [sys.executable, str(STANDIN / "vllm"), *args[1:]]
    assert args[:3] == ["python3", "-m", "sglang.launch_server"]
    return [sys.executable, *args[1:]]


@pytest.mark.parametrize("profile", profile_names())
def test_every_profile_command_brings_up_a_pair_on_the_stand_in(profile, tmp_path):
    p = load_profile(profile)
    c = build_cluster(pair(**{n: {"serving_profile": profile} for n in ("spark-a", "spark-b")}))
    http, rendezvous = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "SFL_STANDIN_", "GLOO_"))}
    env.update({"VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "SFL_STANDIN_JOIN_TIMEOUT_S": "10",
                "PYTHONPATH": str(STANDIN), "PYTHONDONTWRITEBYTECODE": "1"})
    procs = []
    try:
        for name in ("spark-b", "spark-a"):  # worker first, as the deploy starts them
            argv = local(engine_args(p, c, c.node(name)), p.engine, http, rendezvous)
            procs.append(subprocess.Popen(argv, env=env, text=True, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 10
        while get(http, "/health")[0] != 200:
            assert all(q.poll() is None for q in procs), [q.communicate(timeout=5)[0] for q in procs]
            assert time.monotonic() < deadline, "no /health 200 within 10 s"
            time.sleep(0.05)
        # The engine holds no key (the API proxy in front of it checks it: test_api_proxy.py), so its
        # own port serves without one, and a header it is sent changes nothing.
        assert get(http, "/v1/models", key="anything-at-all-0123")[0] == 200
        status, models = get(http, "/v1/models")
        assert status == 200 and models["data"][0]["id"] == p.api_model_name
        assert models["data"][0]["max_model_len"] == p.max_model_len
    finally:
        for q in procs:
            if q.poll() is None:
                q.kill()
            q.communicate(timeout=5)
