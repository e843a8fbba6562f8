"""One chat completion POSTed to a head's API from the head itself: the kernel-cache prewarm's
warm-up requests (roles/kernel_cache) and a rolling turn's probe (roles/rolling)."""
import json
import shlex


def request_command(port: int, body: dict, curl_config: str | None = None) -> str:
    """POST one warm-up request through the head; the API key's header from curl's root-only config
    file (roles/serving/api_key.py), never on a command line."""
    data = shlex.quote(json.dumps(body))
    key = f"-K {shlex.quote(curl_config)} " if curl_config else ""
    return (
        f"printf '%s' {data} | curl {key}-sS -m 600 -o /dev/stderr -w '%{{http_code}}' -H 'Content-Type: application/json' "
        f"--data-binary @- http://127.0.0.1:{int(port)}/v1/chat/completions"
    )
