"""The fixed warm-up request set a prewarm drives through the head: every kernel shape a
production request would need compiled, before production traffic can stall one rank on it."""
import base64
import struct
import zlib

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def png_data_url(size: int = 64) -> str:
    """A small grey PNG as a data: URL (no file, no network needed by the engine)."""
    raw = b"".join(b"\x00" + b"\x80" * (size * 3) for _ in range(size))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(png).decode()


def warmup_requests(profile, long_prompt_words: int) -> list[tuple[str, dict]]:
    """(label, /v1/chat/completions body): short prompt, long prefill, a tool call (when the profile
    parses tool calls: vLLM answers 400 to tool_choice "auto" without --enable-auto-tool-choice and
    --tool-call-parser, vllm/entrypoints/openai/chat_completion/serving.py), an image (vision)."""
    model = profile.api_model_name

    def body(content, **extra):
        return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 16,
                "temperature": 0, **extra}

    long_text = " ".join(f"w{i % 997}" for i in range(long_prompt_words))
    requests = [
        ("short prompt", body("Say hello in one word.")),
        (f"long prefill ({long_prompt_words} words)", body("Summarise: " + long_text)),
    ]
    if profile.tool_call_parser:
        requests.append(("tool call", body("What is the weather in Paris?", tools=[TOOL], tool_choice="auto")))
    if profile.vision:
        requests.append(("image", body([
            {"type": "text", "text": "Describe this image in one word."},
            {"type": "image_url", "image_url": {"url": png_data_url()}},
        ])))
    return requests
