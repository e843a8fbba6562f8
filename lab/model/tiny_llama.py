"""A real, tiny, randomly initialised Llama for the lab's real vLLM (the lab-vllm-cpu profile): every
file a Hugging Face checkpoint of LlamaForCausalLM has, written with the standard library only, so
the lab's model server needs neither torch nor the `tokenizers` library and the bytes are the same
on every machine (a fixed seed; Python's Mersenne Twister and IEEE float32 rounding are portable).

- config.json: LlamaForCausalLM, hidden 256, 2 layers, 4 heads, 2 KV heads, vocab 2048
  (2.2 M parameters), as the real engine ran it on this kind of machine (LAB-NOTES.md); stored in
  bfloat16 (4.5 MB), the dtype vLLM's CPU platform runs it in (a float32 checkpoint is loaded into
  bfloat16 parameters with one warning per tensor).
- model.safetensors: the safetensors format (an 8-byte little-endian header length, a JSON header,
  the raw little-endian tensors), weights N(0, 0.02), norms 1, rounded to bfloat16 (nearest, ties to even).
- tokenizer.json: a byte-level BPE (the `tokenizers` library's JSON: GPT-2's byte-to-unicode
  alphabet and pre-tokenizer regex), its merges learned here from the receipt's corpus
  (roles/receipt/corpus.txt), the rest of the vocabulary plain words, so every id the model can emit
  decodes to text.
- tokenizer_config.json (PreTrainedTokenizerFast, its chat template), generation_config.json.
"""
import itertools
import json
import random
import re
import struct
import sys
from array import array
from collections import Counter

MODEL_ID = "sparkfleet-lab/tiny-llama"
SEED = "sparkfleet-lab tiny-llama v1"
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 256, 2, 4, 2, 512, 2048
HEAD_DIM = HIDDEN // HEADS
MAX_POSITIONS = 32768
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS = SPECIALS[0], SPECIALS[3]
# ChatML, the turns of the request's messages, then the assistant's turn opened.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# GPT-2's pre-tokenizer pattern, which the `tokenizers` ByteLevel pre-tokenizer applies (use_regex).
PRETOKEN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def train_merges(text: str, budget: int) -> list[tuple[str, str]]:
    """Byte-level BPE merges from `text`: the most frequent adjacent pair each round (ties by the
    pair itself, so the result is the same everywhere), until `budget` merges or no pair occurs twice."""
    alphabet = byte_alphabet()
    words = Counter(tuple(alphabet[b] for b in w.encode()) for w in PRETOKEN.findall(text))
    merges = []
    while len(merges) < budget:
        pairs = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best, count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if count < 2:
            break
        merges.append(best)
        joined, merged = best[0] + best[1], Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return merges


def tokenizer_files(corpus: str) -> dict[str, bytes]:
    alphabet = byte_alphabet()
    vocab = {ch: i for i, ch in enumerate(alphabet[b] for b in range(256))}
    merges = train_merges(corpus, VOCAB - 256 - len(SPECIALS))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    # The rest of the vocabulary: plain words (" aa", " ab", ... " zz", then three letters), which no
    # merge produces but which decode to text: a random model's reply is then words, not nothing (a
    # reserved special token, as Llama 3 fills its vocabulary with, is dropped from the reply).
    space, letters = alphabet[ord(" ")], "abcdefghijklmnopqrstuvwxyz"
    fillers = (space + a + b for a in letters for b in letters)
    fillers = itertools.chain(fillers, (space + a + b + c for a in letters for b in letters for c in letters))
    for word in fillers:
        if len(vocab) >= VOCAB - len(SPECIALS):
            break
        vocab.setdefault(word, len(vocab))
    added = []
    for token in SPECIALS:
        added.append({"id": len(vocab), "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
        vocab[token] = len(vocab)
    assert len(vocab) == VOCAB, len(vocab)
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": EOS,
              "add_bos_token": False, "model_max_length": MAX_POSITIONS, "clean_up_tokenization_spaces": False,
              "chat_template": CHAT_TEMPLATE}
    return {"tokenizer.json": dumps(spec), "tokenizer_config.json": dumps(config)}


def dumps(obj) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()


def tensor_shapes() -> list[tuple[str, tuple[int, ...]]]:
    kv = KV_HEADS * HEAD_DIM
    shapes = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (HIDDEN,)), (p + "post_attention_layernorm.weight", (HIDDEN,)),
                   (p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)), (p + "self_attn.k_proj.weight", (kv, HIDDEN)),
                   (p + "self_attn.v_proj.weight", (kv, HIDDEN)), (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
                   (p + "mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN)), (p + "mlp.up_proj.weight", (INTERMEDIATE, HIDDEN)),
                   (p + "mlp.down_proj.weight", (HIDDEN, INTERMEDIATE))]
    return shapes + [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]


def safetensors() -> bytes:
    rng = random.Random(SEED)
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape in tensor_shapes():
        n = 1
        for d in shape:
            n *= d
        values = array("f", [1.0] * n if name.endswith("norm.weight") else [rng.gauss(0.0, 0.02) for _ in range(n)])
        bits = array("I", values.tobytes())  # float32 -> bfloat16: the top 16 bits, rounded to nearest even
        blob_words = array("H", [(b + 0x7FFF + ((b >> 16) & 1)) >> 16 for b in bits])
        if sys.byteorder == "big":
            blob_words.byteswap()
        blob = blob_words.tobytes()
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned, as the format recommends
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def files(corpus: str) -> dict[str, bytes]:
    """{relative path: bytes} of the checkpoint."""
    tok = tokenizer_files(corpus)
    vocab = json.loads(tok["tokenizer.json"])["model"]["vocab"]
    ids = {t: vocab[t] for t in SPECIALS}
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB, "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False, "mlp_bias": False,
        "bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "initializer_range": 0.02,
    }
    generation = {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "do_sample": False}
    return {"config.json": dumps(config), "generation_config.json": dumps(generation), **tok,
            "model.safetensors": safetensors()}
