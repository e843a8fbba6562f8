#!/usr/bin/env python3
"""Build the lab's model directory: a small, deterministic stand-in for every model and drafter the
shipped profiles name (roles/serving/profiles/*.yaml), each with the manifest sparkfleet's URL
source reads, so the weights path (fetch on the head, fan-out to the worker, manifests) runs
without the internet. Not a model: a tiny config.json, a word-level tokenizer.json and seeded random
"safetensors" bytes; for the real vLLM's profile (lab-vllm-cpu), a real tiny Llama (tiny_llama.py).

  make-models.py DEST     writes DEST/<model id>/... and DEST/<model id>.manifest; idempotent

SFL_LAB_MODEL_MIB (default 24) sizes each model (two shards); drafters get a quarter of it.
"""
import hashlib
import json
import os
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_llama  # noqa: E402  (beside this file)

PROFILES = Path(__file__).resolve().parents[2] / "roles" / "serving" / "profiles"
CORPUS = Path(__file__).resolve().parents[2] / "roles" / "receipt" / "corpus.txt"
MIB = 1024 * 1024


def model_ids():
    """(model id, is a drafter) for every profile, from the YAML's `model:` and `draft_model:` lines."""
    found = {}
    for path in sorted(PROFILES.glob("*.yaml")):
        for line in path.read_text().splitlines():
            m = re.match(r"^\s*(model|draft_model):\s*([^\s#]+)", line)
            if m:
                found.setdefault(m.group(2), m.group(1) == "draft_model")
    return sorted(found.items())


def tokenizer_json():
    """A word-level tokenizer (the `tokenizers` library's JSON) over the words of the receipt's corpus
    (roles/receipt/corpus.txt) and the stand-ins' reply: a real one, so the receipt's load generator
    counts the prompt's tokens as the stand-in counts its words."""
    text = (CORPUS.read_text() + " sparkfleet lab stand-in reply").replace("-", " - ")
    words = sorted(set(re.findall(r"\w+|[^\w\s]+", text)))
    vocab = {"[UNK]": 0, **{w: i for i, w in enumerate(words, 1)}}
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}
    return (json.dumps(spec, sort_keys=True) + "\n").encode()


def files_of(model, drafter, mib):
    """{relative path: bytes} of one stand-in model; the bytes depend only on the model id and size.
    The real engine's model (lab-vllm-cpu) is a real checkpoint instead (tiny_llama.py)."""
    if model == tiny_llama.MODEL_ID:
        return tiny_llama.files(CORPUS.read_text())
    config = {
        "architectures": ["SparkfleetLabForCausalLM"], "model_type": "sparkfleet-lab", "_name_or_path": model,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "hidden_size": 256,
        "head_dim": 64, "vocab_size": 1024, "max_position_embeddings": 1048576,
    }
    out = {"config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
           "tokenizer.json": tokenizer_json()}
    size = max(1, mib // 4 if drafter else mib // 2) * MIB
    shards = 1 if drafter else 2
    rng = random.Random(hashlib.sha256(f"{model}|{size}".encode()).digest())
    for i in range(1, shards + 1):
        out[f"model-{i:05d}-of-{shards:05d}.safetensors"] = rng.randbytes(size)
    return out


def main(dest):
    mib = int(os.environ.get("SFL_LAB_MODEL_MIB", "24"))
    for model, drafter in model_ids():
        root = Path(dest) / model
        lines, files = [], files_of(model, drafter, mib)
        for rel, data in sorted(files.items()):
            path = root / rel
            if not path.exists() or path.read_bytes() != data:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_bytes(data)
                tmp.replace(path)
            lines.append(f"{hashlib.sha256(data).hexdigest()}\t{len(data)}\t{rel}")
        manifest = "# sparkfleet weights manifest v1\n# model: " + model + "\n" + "\n".join(lines) + "\n"
        # like the files: replaced whole, and only when it changes (every `lab.sh up` runs this while
        # the model server may be sending it to a deploy, the other pair's in make test)
        path = Path(dest) / f"{model}.manifest"
        if not path.exists() or path.read_text() != manifest:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(manifest)
            tmp.replace(path)
        total = sum(len(data) for data in files.values())
        print(f"{model}: {len(lines)} files, {total / MIB:.1f} MiB")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
