"""No secret in monitoring data (issue 43 item 6): every credential of an Alertmanager receiver or of the
remote write is read from a root-only file on the controller, copied to the monitoring node's
/etc/prometheus/secrets (roles/monitoring/secrets.py), and the rendered configurations name the copy.
Each refused form is refused at config load, before any connection, naming the key and never showing
the secret; each accepted `*_file` form is rendered and run through the OS's own amtool (Debian 12's
0.25.0) or promtool (2.42.0); the version gate is held to what that amtool itself refuses."""
import hashlib
import os
import subprocess

import pytest
import yaml
from pyinfra.api.exceptions import DeployError

from roles.monitoring.checks import alertmanager_config_text, monitoring_node, prometheus_config_text, rules_text
from roles.monitoring.secrets import controller_file_problem, read_secrets, stale
from sparkfleet.config import build_cluster
from sparkfleet.model.monitoring import SECRETS_DIR, secret_files
from tests.unit.test_router_render import fleet_hosts, refused

EVERY = ("spark-a", "spark-b", "spark-c", "spark-d")
SECRET = "s3cr3t-T0KEN"
RECEIVERS = "monitoring_alertmanager_receivers"


def hosts(**data):
    return fleet_hosts(**{n: data for n in EVERY})


def alerting(receivers, version="0.25.0", **more):
    return hosts(monitoring_alertmanager_enabled=True, monitoring_alertmanager_version=version,
                 monitoring_alertmanager_receivers=receivers, **more)


def hook(**settings):
    return [{"name": "ops", "webhook_configs": [{"url": "https://hooks.example/alerts", **settings}]}]


# Each form that would put a secret in data (and so in the inventory, its repository, `make config` and a
# world-readable file): (what, data, the key named, a text the refusal says).
REFUSED = [
    ("a token in a webhook url's query", hook(url=f"https://hooks.example/alerts?token={SECRET}"), RECEIVERS,
     "carries a query"),
    ("user:password@ in a webhook url", hook(url=f"https://bot:{SECRET}@hooks.example/alerts"), RECEIVERS,
     "carries credentials"),
    ("user:password@ in proxy_url", hook(http_config={"proxy_url": f"http://me:{SECRET}@proxy.example:3128/"}),
     RECEIVERS, "carries credentials"),
    ("bearer_token", hook(http_config={"bearer_token": SECRET}), RECEIVERS,
     "http_config.bearer_token is a secret in data"),
    ("basic_auth.password", hook(http_config={"basic_auth": {"username": "me", "password": SECRET}}), RECEIVERS,
     "http_config.basic_auth.password is a secret in data"),
    ("authorization.credentials", hook(http_config={"authorization": {"credentials": SECRET}}), RECEIVERS,
     "http_config.authorization.credentials is a secret in data"),
    ("oauth2.client_secret", hook(http_config={"oauth2": {"client_id": "c", "client_secret": SECRET,
                                                          "token_url": "https://idp.example/token"}}), RECEIVERS,
     "http_config.oauth2.client_secret is a secret in data"),
    ("proxy_connect_header", hook(http_config={"proxy_url": "http://proxy.example:3128/",
                                               "proxy_connect_header": {"Proxy-Authorization": [SECRET]}}), RECEIVERS,
     "http_config.proxy_connect_header is a secret in data"),
    ("slack's api_url inline", [{"name": "chat", "slack_configs": [
        {"api_url": f"https://hooks.slack.com/services/T0/B0/{SECRET}", "channel": "#ops"}]}], RECEIVERS,
     "slack_configs[0].api_url is a secret in data"),
    ("telegram's bot_token at 0.25.0", [{"name": "tg", "telegram_configs": [{"bot_token": SECRET, "chat_id": 1}]}],
     RECEIVERS, "bot_token_file first came in Alertmanager 0.26.0"),
    ("webhook url_file at 0.25.0", [{"name": "ops", "webhook_configs": [{"url_file": "/home/me/hook-url"}]}],
     RECEIVERS, "url_file is not read by Alertmanager 0.25.0"),
    ("a relative *_file", [{"name": "p", "pagerduty_configs": [{"routing_key_file": "pd-key"}]}], RECEIVERS,
     "must be an absolute path"),
]
REMOTE_REFUSED = [
    ("remote write over http", {"monitoring_remote_write_url": "http://prom.example/api/v1/write"},
     "monitoring_remote_write_url", "not a URL https://"),
    ("a token in the remote write url's query",
     {"monitoring_remote_write_url": f"https://prom.example/api/v1/write?api_key={SECRET}"},
     "monitoring_remote_write_url", "carries a query"),
    ("user:password@ in the remote write url",
     {"monitoring_remote_write_url": f"https://me:{SECRET}@prom.example/api/v1/write"},
     "monitoring_remote_write_url", "carries credentials"),
    ("a password file without a user", {"monitoring_remote_write_url": "https://prom.example/api/v1/write",
                                        "monitoring_remote_write_password_file": "/home/me/prom-password"},
     "monitoring_remote_write_username", "basic auth takes both"),
    ("both a password and a bearer token", {"monitoring_remote_write_url": "https://prom.example/api/v1/write",
                                            "monitoring_remote_write_username": "me",
                                            "monitoring_remote_write_password_file": "/home/me/p",
                                            "monitoring_remote_write_credentials_file": "/home/me/t"},
     "monitoring_remote_write_credentials_file", "one of basic_auth and authorization"),
    ("credentials with no remote write", {"monitoring_remote_write_credentials_file": "/home/me/t"},
     "monitoring_remote_write_url", "nowhere to send them"),
]


@pytest.mark.parametrize("what, receivers, key, says", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_receiver_s_secret_in_data_is_refused_at_config_load_naming_the_key_never_the_secret(what, receivers,
                                                                                               key, says):
    err = refused(alerting(receivers))
    named = [p for p in err.problems if p.key == key and says in p]
    assert named, err.problems
    assert all(p.hosts for p in named) and all(p.fix for p in named)
    assert SECRET not in str(err) and all(SECRET not in (p.fix or "") for p in err.problems), err


@pytest.mark.parametrize("what, data, key, says", REMOTE_REFUSED, ids=[r[0] for r in REMOTE_REFUSED])
def test_a_remote_write_secret_in_data_or_plain_http_is_refused_at_config_load(what, data, key, says):
    err = refused(hosts(**data))
    named = [p for p in err.problems if p.key == key and says in p]
    assert named, err.problems
    assert SECRET not in str(err), err


def test_what_each_inline_secret_is_refused_for_names_its_file_form_or_the_release_that_lacks_it():
    [slack] = [p for p in refused(alerting(REFUSED[8][1])).problems if "api_url" in p]
    assert slack.fix.startswith("put it in a root-only file on the controller (chmod 0600) and name that file in "
                                "slack_configs[0].api_url_file")
    [bearer] = [p for p in refused(alerting(REFUSED[3][1])).problems if "bearer_token" in p]
    assert "webhook_configs[0].http_config.authorization.credentials_file" in bearer.fix
    # at 0.26.0 telegram reads bot_token_file: the inline token is asked for in that form
    [tg] = [p for p in refused(alerting(REFUSED[9][1], version="0.26.0")).problems if "bot_token" in p]
    assert "telegram_configs[0].bot_token_file" in tg.fix
    [discord] = [p for p in refused(alerting([{"name": "d", "discord_configs": [{"webhook_url": "https://d.example/x"}]}],
                                             version="0.26.0")).problems if "webhook_url" in p]
    assert discord.fix.startswith("Alertmanager 0.26.0 reads it inline only")


# Every file form Debian 12's Alertmanager 0.25.0 reads, each naming a controller file.
FILE_FORMS = [
    {"name": "hook", "webhook_configs": [{"url": "https://hooks.example/alerts", "http_config": {
        "authorization": {"credentials_file": "/home/me/hook-token"}}}]},
    {"name": "basic", "webhook_configs": [{"url": "https://relay.example/a", "http_config": {
        "basic_auth": {"username": "me", "password_file": "/home/me/relay-password"},
        "proxy_url": "http://proxy.example:3128/"}}]},
    {"name": "oauth", "webhook_configs": [{"url": "https://relay.example/b", "http_config": {"oauth2": {
        "client_id": "sparkfleet", "client_secret_file": "/home/me/oauth-secret",
        "token_url": "https://idp.example/token"}}}]},
    {"name": "chat", "slack_configs": [{"api_url_file": "/home/me/slack-url", "channel": "#ops"}]},
    {"name": "mail", "email_configs": [{"to": "ops@example.com", "from": "spark@example.com",
                                        "smarthost": "mail.example:587", "auth_username": "spark",
                                        "auth_password_file": "/home/me/smtp-password"}]},
    {"name": "pager", "pagerduty_configs": [{"routing_key_file": "/home/me/pd-routing"}]},
    {"name": "pagerv1", "pagerduty_configs": [{"service_key_file": "/home/me/pd-service"}]},
    {"name": "genie", "opsgenie_configs": [{"api_key_file": "/home/me/opsgenie-key"}]},
    {"name": "vops", "victorops_configs": [{"api_key_file": "/home/me/victorops-key", "routing_key": "ops"}]},
    {"name": "webex", "webex_configs": [{"room_id": "r1", "http_config": {
        "authorization": {"credentials_file": "/home/me/webex-token"}}}]},
]


def test_every_file_form_0_25_0_reads_renders_its_node_copy_and_amtool_accepts_it(amtool, tmp_path):
    fleet = build_cluster(alerting(FILE_FORMS))
    node = monitoring_node(fleet)
    text = alertmanager_config_text(node)
    (tmp_path / "alertmanager.yml").write_text(text)
    run = subprocess.run([amtool, "check-config", "alertmanager.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "/home/me" not in text  # the configuration names the node's copies only
    files = secret_files(node)
    assert len(files) == 10 and all(p.startswith(f"{SECRETS_DIR}/") for p in files)
    assert files[f"{SECRETS_DIR}/hook.webhook_configs.0.http_config.authorization.credentials_file"] == (
        "monitoring_alertmanager_receivers hook.webhook_configs[0].http_config.authorization.credentials_file",
        "/home/me/hook-token")
    rendered = yaml.safe_load(text)["receivers"]
    assert rendered[3]["slack_configs"][0]["api_url_file"] == f"{SECRETS_DIR}/chat.slack_configs.0.api_url_file"
    assert {v[1] for v in files.values()} == {
        "/home/me/hook-token", "/home/me/relay-password", "/home/me/oauth-secret", "/home/me/slack-url",
        "/home/me/smtp-password", "/home/me/pd-routing", "/home/me/pd-service", "/home/me/opsgenie-key",
        "/home/me/victorops-key", "/home/me/webex-token"}


@pytest.mark.parametrize("receiver", [
    {"name": "ops", "webhook_configs": [{"url_file": "/etc/x"}]},
    {"name": "po", "pushover_configs": [{"user_key_file": "/etc/x", "token_file": "/etc/x"}]},
    {"name": "tg", "telegram_configs": [{"bot_token_file": "/etc/x", "chat_id": 1}]},
    {"name": "d", "discord_configs": [{"webhook_url_file": "/etc/x"}]},
])
def test_the_forms_refused_at_0_25_0_are_the_ones_its_amtool_refuses(amtool, tmp_path, receiver):
    """The version gate is the real tool's: Debian 12's amtool refuses each of these (0.26.0 added the first
    three, config/notifiers.go; discord reads its URL inline only there too), and sparkfleet refuses them
    at config load when monitoring_alertmanager_version is 0.25.0."""
    (tmp_path / "a.yml").write_text(yaml.safe_dump({"route": {"receiver": receiver["name"]}, "receivers": [receiver]}))
    run = subprocess.run([amtool, "check-config", "a.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode != 0 and "not found in type" in run.stdout + run.stderr, run.stdout + run.stderr
    assert refused(alerting([receiver])).problems


def test_the_0_26_0_file_forms_are_accepted_and_copied_at_0_26_0():
    """Not run through an amtool 0.26.0 (none is cached here): held to config/notifiers.go at v0.26.0."""
    receivers = [{"name": "ops", "webhook_configs": [{"url_file": "/home/me/hook-url"}]},
                 {"name": "po", "pushover_configs": [{"user_key_file": "/home/me/po-user", "token_file": "/home/me/po"}]},
                 {"name": "tg", "telegram_configs": [{"bot_token_file": "/home/me/tg", "chat_id": 1}]}]
    node = monitoring_node(build_cluster(alerting(receivers, version="0.26.0")))
    assert sorted(v[1] for v in secret_files(node).values()) == ["/home/me/hook-url", "/home/me/po", "/home/me/po-user",
                                                                 "/home/me/tg"]
    assert f"url_file: {SECRETS_DIR}/ops.webhook_configs.0.url_file" in alertmanager_config_text(node)


@pytest.mark.parametrize("auth, rendered", [
    ({"monitoring_remote_write_username": "spark", "monitoring_remote_write_password_file": "/home/me/prom-pw"},
     {"basic_auth": {"username": "spark", "password_file": f"{SECRETS_DIR}/remote_write.password_file"}}),
    ({"monitoring_remote_write_credentials_file": "/home/me/prom-token"},
     {"authorization": {"credentials_file": f"{SECRETS_DIR}/remote_write.credentials_file"}}),
])
def test_remote_write_credentials_are_read_from_the_node_s_copy_and_promtool_accepts_them(promtool, tmp_path, auth,
                                                                                          rendered):
    url = "https://prom.example:9090/api/v1/write"
    fleet = build_cluster(hosts(monitoring_remote_write_url=url, **auth))
    text = prometheus_config_text(fleet)
    assert yaml.safe_load(text)["remote_write"] == [{"url": url, **rendered}]
    assert "/home/me" not in text
    (tmp_path / "sparkfleet.rules.yml").write_text(rules_text(fleet))
    (tmp_path / "prometheus.yml").write_text(text.replace("/etc/prometheus/sparkfleet.rules.yml", "sparkfleet.rules.yml"))
    run = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    [(what, source)] = secret_files(monitoring_node(fleet)).values()
    assert source.startswith("/home/me/prom-") and what.startswith("monitoring_remote_write_")


def test_a_controller_file_is_used_only_when_it_is_the_deployer_s_alone(tmp_path):
    uid = os.getuid()
    good = tmp_path / "token"
    good.write_text(SECRET)
    good.chmod(0o600)
    assert controller_file_problem("spark-b", "k", str(good), os.stat(good), uid) is None
    good.chmod(0o640)
    why = controller_file_problem("spark-b", "k", str(good), os.stat(good), uid)
    assert why.startswith(f"spark-b: k names {good}, owned by uid {uid} with mode 0640") and "chmod 0600" in why
    assert "must be yours" in controller_file_problem("spark-b", "k", str(good), os.stat(good), uid + 1)
    assert "does not exist" in controller_file_problem("spark-b", "k", str(tmp_path / "none"), None, uid)
    assert "not a regular file" in controller_file_problem("spark-b", "k", str(tmp_path), os.stat(tmp_path), uid)
    assert SECRET not in why


def test_the_secrets_are_read_at_prepare_and_every_unusable_file_is_named_at_once(tmp_path):
    hook_token, pd = tmp_path / "hook-token", tmp_path / "pd"
    hook_token.write_bytes(SECRET.encode())
    hook_token.chmod(0o600)
    pd.write_text("x")
    pd.chmod(0o644)
    receivers = [{"name": "ops", "webhook_configs": [{"url": "https://h.example/", "http_config": {
                     "authorization": {"credentials_file": str(hook_token)}}}]},
                 {"name": "pager", "pagerduty_configs": [{"routing_key_file": str(pd)}]}]
    remote = {"monitoring_remote_write_url": "https://prom.example/w",
              "monitoring_remote_write_credentials_file": str(tmp_path / "missing")}
    node = monitoring_node(build_cluster(alerting(receivers, **remote)))
    with pytest.raises(DeployError) as err:
        read_secrets(node)
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and SECRET not in str(err.value)
    assert any(f"{pd}, owned by uid" in line and "mode 0644" in line for line in lines)
    assert any("monitoring_remote_write_credentials_file names" in line and "does not exist" in line for line in lines)
    pd.chmod(0o600)
    (tmp_path / "missing").write_text("tok")
    (tmp_path / "missing").chmod(0o600)
    found = read_secrets(node)
    assert found[f"{SECRETS_DIR}/ops.webhook_configs.0.http_config.authorization.credentials_file"] == SECRET.encode()
    # what the node holds decides what is written: only a copy whose content, owner or mode differs
    same = {p: {"user": "root", "group": "prometheus", "mode": "640", "sha1": hashlib.sha1(c).hexdigest()}
            for p, c in found.items()}
    assert stale(found, same) == []
    path = sorted(found)[0]
    assert stale(found, {**same, path: {**same[path], "mode": "644"}}) == [path]
    assert stale(found, {**same, path: None}) == [path]
    assert stale(found, {**same, path: {**same[path], "sha1": "0" * 40}}) == [path]
