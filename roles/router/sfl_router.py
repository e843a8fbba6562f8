#!/usr/bin/env python3
"""sparkfleet's router program on the router node: runs the pinned router (smg, the Shepherd Model
Gateway, the SGLang project's router under its own name) and drives its admin API. Python standard
library only, except `run`, which the router's own virtualenv runs (it imports smg).

  sfl_router.py run CONFIG        start the router in this process (its unit's ExecStart)
  sfl_router.py check CONFIG      exit 0 when CONFIG is one the router can start from
  sfl_router.py routing CONFIG    JSON on stdout: every backend of CONFIG and the router's verdict on it
  sfl_router.py drain CONFIG URL  take a backend out of routing; returns once the router no longer has it
  sfl_router.py undrain CONFIG URL  put it back; returns once the router routes to it (healthy)

CONFIG (/etc/sparkfleet/router.json, root-only, written by roles/router) names the CA file smg verifies
the heads' certificates with (`ca_file`: the heads' https:// backends; roles/tls writes it), the router
hop's client certificate smg presents to them (`client_cert_file`) and two key files, never a key: each is read
from its root-only file into this process and goes to smg in memory (`run`) or in a request body or header
on loopback (the admin commands). Neither is ever in argv, the unit, the environment or a log line: smg
1.13 logs no argument value of its RouterArgs.

smg listens on loopback (`listen_host`, `port`), behind the router's gate (HAProxy on the router port,
roles/router/gate.py), which checks the fleet's API key (`key_file`) on every request but /health.
With `client_cert_file` (TLS on), the gate removes the key once checked and smg is given none: it
presents the router hop's client certificate (the fleet CA issued it on the router node with clientAuth
only, its own key, never copied) to every head, smg's client_cert_path and client_key_path, and each
head admits that certificate from the router node's address alone (docs/security.md#the-router-hop):
the hop carries a credential of its own, not the clients' key. Without it (TLS off) smg is given the API key: it checks it too, and presents it to
every head (its health checks and polls; a forwarded request carries the client's own header).

The control-plane key (`control_key_file`, generated on the router node, no client has it): smg's
`control_plane_api_keys` (smg/router_args.py, `--control-plane-api-keys id:name:role:key`, one entry
with role admin). With it set, smg guards its worker routes (/workers, /workers/{id}) and admin routes
(/get_loads, /flush_cache, ...) with its control-plane middleware alone, which takes only those keys:
the API key there is 401 (smg model_gateway/src/server.rs build_app `apply_control_plane_auth`;
crates/auth/src/middleware.rs `control_plane_auth_middleware`). So no client can add a backend of its
own (and be sent other clients' prompts) or remove one; and through the gate, which lets one
Authorization header through, the fleet's key, and removes it with TLS on, no control-plane key
reaches smg at all: only this program on the router node, as root, on loopback.
A drained backend is removed from smg's registry (DELETE /workers/{id}: smg first marks it draining
and lets in-flight requests finish) and added back (POST /workers, the body naming the API key smg
presents to it, when it presents one); a router restart routes every backend of CONFIG again.
"""
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

KEYS = ("listen_host", "port", "backends", "key_file", "control_key_file", "health_check_interval_s",
        "health_check_timeout_s", "health_failure_threshold", "health_success_threshold", "health_check_endpoint",
        "policy", "request_timeout_s", "log_level")


def load(path: str) -> dict:
    with open(path) as f:
        config = json.load(f)
    missing = [k for k in KEYS if k not in config]
    if missing:
        raise SystemExit(f"sfl_router: {path}: missing {', '.join(missing)}")
    if not isinstance(config["backends"], list) or not all(isinstance(b, str) and b.startswith(("http://", "https://"))
                                                           for b in config["backends"]):
        raise SystemExit(f"sfl_router: {path}: backends must be a list of http:// or https:// URLs")
    if any(b.startswith("https://") for b in config["backends"]) and not config.get("ca_file"):
        raise SystemExit(f"sfl_router: {path}: https:// backends need ca_file, the CA that verifies them")
    return config


def read_key(config: dict, which: str = "key_file") -> str:
    """The key in CONFIG's `which` file (key_file: the API key; control_key_file: the control plane's)."""
    try:
        with open(config[which]) as f:
            key = f.read().strip()
    except OSError as e:  # named, not a traceback (the path and the error; never a key)
        raise SystemExit(f"sfl_router: cannot read {config[which]}: {e.strerror}")
    if not key or "\n" in key:
        raise SystemExit(f"sfl_router: {config[which]} must hold one line, the "
                         f"{'API' if which == 'key_file' else 'control-plane'} key")
    return key


def control_key(config: dict) -> str:
    key = read_key(config, "control_key_file")
    if key == read_key(config):
        raise SystemExit(f"sfl_router: {config['control_key_file']} holds the API key; the control-plane key must "
                         f"be one no client has")
    return key


def smg_key(config: dict) -> str | None:
    """The API key smg is given: none when it presents the router hop's certificate (client_cert_file)."""
    return None if config.get("client_cert_file") else read_key(config)


def router_args(config: dict, key: str | None, control: str):
    """smg's RouterArgs from CONFIG: the backends, the API key (smg_key: None behind the gate with a client
    certificate), the control-plane key (smg's only admin credential: (id, name, key, role), as smg's
    _parse_control_plane_api_keys makes them), the client certificate, the health checks."""
    from smg.router_args import RouterArgs

    cert = config.get("client_cert_file")
    return RouterArgs(
        worker_urls=list(config["backends"]),
        host=config["listen_host"],
        port=config["port"],
        api_key=key,
        control_plane_api_keys=[("sparkfleet", "sparkfleet controller", control, "admin")],
        policy=config["policy"],
        health_check_interval_secs=config["health_check_interval_s"],
        health_check_timeout_secs=config["health_check_timeout_s"],
        health_failure_threshold=config["health_failure_threshold"],
        health_success_threshold=config["health_success_threshold"],
        health_check_endpoint=config["health_check_endpoint"],
        request_timeout_secs=config["request_timeout_s"],
        log_level=config["log_level"],
        history_backend="none",  # keep no conversation or response on the router
        prometheus_host=config["metrics_host"],
        prometheus_port=config["metrics_port"],
        # The heads' TLS: smg adds this CA to its roots for every backend's connection (its health checks
        # and requests); without it smg refuses their certificates (UnknownIssuer).
        ca_cert_paths=[config["ca_file"]] if config.get("ca_file") else [],
        # The router hop's credential: its client certificate, then its key, in one root-only file
        # (smg reads both paths and joins them: model_gateway/src/config/builder.rs read_mtls_certificates).
        client_cert_path=cert or None,
        client_key_path=cert or None,
    )


def run(config: dict) -> None:
    from smg.router import Router

    args = router_args(config, smg_key(config), control_key(config))
    args._validate_router_args()
    hop = (f"presenting {config['client_cert_file']}" if config.get("client_cert_file")
           else "presenting the API key")
    print(f"sfl_router: smg on {config['listen_host']}:{config['port']}, backends {', '.join(config['backends'])} "
          f"({hop}), health {config['health_check_endpoint']} every {config['health_check_interval_s']} s", flush=True)
    Router.from_args(args).start()


def admin(config: dict, method: str, path: str, body: dict | None = None, timeout: float = 10.0):
    """(status, parsed JSON or None) of a call to the router's admin API on loopback, with the
    control-plane key."""
    url = f"http://127.0.0.1:{config['port']}{path}"
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {control_key(config)}"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, None


def registered(config: dict) -> dict:
    """url -> smg's worker record, for every backend the router has now."""
    status, body = admin(config, "GET", "/workers")
    if status != 200 or not isinstance(body, dict):
        raise SystemExit(f"sfl_router: GET /workers answered {status}")
    return {w["url"].rstrip("/"): w for w in body.get("workers", [])}


def routing(config: dict) -> list[dict]:
    """Every backend of CONFIG, and any other the router has: routed (registered, healthy and ready),
    unhealthy (registered, failing its health checks), draining, or drained (not registered)."""
    have = registered(config)
    out = []
    for url in list(config["backends"]) + sorted(set(have) - set(config["backends"])):
        w = have.get(url)
        if w is None:
            state = "drained"
        elif w.get("status") == "draining":
            state = "draining"
        elif w.get("is_healthy") and w.get("status", "ready") == "ready":
            state = "routed"
        else:
            state = "unhealthy"
        out.append({"url": url, "state": state, "configured": url in config["backends"],
                    "status": None if w is None else w.get("status")})
    return out


def wait(what: str, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"sfl_router: {what} not done after {timeout:g} s")
        time.sleep(0.25)


def drain(config: dict, url: str, timeout: float) -> None:
    url = url.rstrip("/")
    w = registered(config).get(url)
    if w is not None and w.get("status") != "draining":
        status, body = admin(config, "DELETE", f"/workers/{urllib.parse.quote(w['id'], safe='')}")
        if status not in (200, 202, 404):
            raise SystemExit(f"sfl_router: DELETE {url} answered {status}: {body}")
    wait(f"drain of {url}", lambda: url not in registered(config), timeout)


def undrain(config: dict, url: str, timeout: float) -> None:
    url = url.rstrip("/")
    if url not in registered(config):
        key = smg_key(config)  # none: the client certificate is smg's, for every backend
        status, body = admin(config, "POST", "/workers", {"url": url, **({"api_key": key} if key else {})})
        if status not in (200, 201, 202, 409):
            raise SystemExit(f"sfl_router: POST {url} answered {status}: {body}")

    def routed():
        w = registered(config).get(url)
        return w is not None and w.get("is_healthy") and w.get("status", "ready") == "ready"

    wait(f"undrain of {url} (routed and healthy)", routed, timeout)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("run", "check", "routing", "drain", "undrain"):
        print(__doc__, file=sys.stderr)
        return 2
    command, config = argv[0], load(argv[1])
    if command == "run":
        run(config)
    elif command == "check":
        control_key(config)
        cert = config.get("client_cert_file")
        if cert and not os.access(cert, os.R_OK):
            raise SystemExit(f"sfl_router: cannot read client_cert_file {cert}: the router hop's client "
                             f"certificate (roles/tls issues it)")
    elif command == "routing":
        print(json.dumps(routing(config), sort_keys=True))
    elif len(argv) not in (3, 4):
        print(f"sfl_router: {command} CONFIG URL [TIMEOUT_S]", file=sys.stderr)
        return 2
    else:
        timeout = float(argv[3]) if len(argv) == 4 else 120.0
        (drain if command == "drain" else undrain)(config, argv[2], timeout)
        print(json.dumps(routing(config), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
