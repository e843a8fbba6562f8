"""Data of roles/api_proxy: the head's API behind the key, whatever routes the engine registers.

Why a proxy: each engine checks the key on some paths only. vLLM 0.33.0's own check guards paths
starting with /v1, /v2, /inference or /cohere (vllm/entrypoints/serve/middleware/authenticate.py,
GUARDED_PREFIX), and the app it builds (vllm/entrypoints/launchers/app.py build_app) registers, by
default, POST /invocations (SageMaker, vllm/entrypoints/serve/sagemaker/api_router.py, from
entrypoints/launchers/api_server/routers.py), which runs the same chat and completion handlers, and
/docs, /openapi.json, /load, /version, /metrics; flags add more (/abort_requests with --tokens-only,
the dev routes with VLLM_SERVER_DEV_MODE). SGLang 0.5.23's key middleware
(sglang/srt/utils/auth.py, decide_request_auth) leaves every path starting with /health
(/health_generate runs a generation), /ready or /metrics open, and OPTIONS. So the engine serves HTTP on 127.0.0.1 only, at
api_proxy_engine_port, and HAProxy (the distribution's package) listens on the profile's port and
answers 401 to any request without the key, except the paths of OPEN_PATHS. The engine itself holds
no key (its check would add nothing behind the proxy): only root's and the proxy's sockets reach its
port (sparkfleet/firewall_rules.py).

Part of sparkfleet/config.py's NodeConfig; read on the head of each serving group.
"""
from pydantic import BaseModel, Field

# The only requests answered without the key: path (exact, before any '?') -> why it is safe. A
# path spelled otherwise (/health/, //health, %-escaped) needs the key too.
OPEN_PATHS = {
    # Readiness: the deploy's and the prewarm's waits, smg's health checks (roles/router), load
    # balancers. Each engine answers it from its own state, without running the model (vLLM
    # entrypoints/serve/instrumentator/health.py; SGLang srt/entrypoints/http_server.py).
    "/health": ("GET", "HEAD"),
}

# The user HAProxy's workers run as (the package creates it; the firewall names it, so the package is
# installed before the firewall: roles/api_proxy/install_tasks.py).
PROXY_USER = "haproxy"


class ApiProxyData(BaseModel):
    api_proxy_engine_port: int = Field(
        18000, ge=1024, le=65535, description="the port of the engine's own HTTP server on each head, on 127.0.0.1 "
        "only, behind the API proxy on the profile's `port`; must differ from every other port on the head. See "
        "docs/security.md#every-route-behind-the-key"
    )
    api_proxy_timeout_s: int = Field(
        3600, ge=30, description="seconds the API proxy waits with no byte moving on either side before it closes a "
        "connection (a long request that is not streamed sends nothing until it is done)"
    )
