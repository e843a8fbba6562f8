"""One chat completion POSTed to a head's API from the head itself, through its API proxy and TLS as a
client reaches it: the kernel-cache prewarm's warm-up requests (roles/kernel_cache) and a rolling
turn's probe (roles/rolling)."""
import json
import shlex


def request_command(api: str, tls: str, body: dict, curl_config: str | None = None) -> str:
    """POST one chat completion through the head's API proxy as clients reach it (`api`, its certificate
    verified with curl's `tls` options: sparkfleet/model/tls.py); the API key's header from curl's
    root-only config file (roles/serving/api_key.py), never on a command line."""
    data = shlex.quote(json.dumps(body))
    key = f"-K {shlex.quote(curl_config)} " if curl_config else ""
    verify = f"{tls} " if tls else ""
    return (
        f"printf '%s' {data} | curl {key}{verify}-sS -m 600 -o /dev/stderr -w '%{{http_code}}' "
        f"-H 'Content-Type: application/json' --data-binary @- {api}/v1/chat/completions"
    )
