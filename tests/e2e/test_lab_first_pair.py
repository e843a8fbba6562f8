"""The README's real-hardware path, followed literally on the lab (issue 45's done-when): a site directory
made from site.example outside the checkout, its inventory given the lab's addresses and its
group_data and profiles/ the lab's, then the README's steps through the checkout's inventory.py: `sparkfleet
config`, `make plan`, `sparkfleet deploy --yes`, the state checks, and docs/first-pair.md's
OpenAI-client example against the pair it brought up.

This module runs first in a lab session (tests/conftest.py orders it so): on the fresh lab `make test`
brings up, its deploy is the pair's bring-up from nothing, the one the later modules find done (a
module run alone on a deployed lab proves the same path on a pair that serves already, and says so).
The lab's own inventory (lab/inventory.py) declares the same nodes with the same data, so the next
module's deploy through it changes nothing the site's did not also want.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_examples import client_example
from tests.e2e.lab import BIN, HOSTS, LAB_STATE, REPO, SSH_CONFIG, ca_file, deploy, head_api, host_renderer, on, run

pytestmark = pytest.mark.lab

# site.example's documentation addresses (RFC 5737 and its fabric subnets) -> the lab's: the README's
# "each node's management IP ... fabric_address and fabric_twin_address". Each must be found once,
# so a change of site.example's shape fails here instead of deploying something else.
LAB_ADDRESSES = {
    '"192.0.2.11"': '"198.18.0.11"', '"192.0.2.12"': '"198.18.0.12"',
    '"10.77.77.1/30"': '"198.19.77.1/30"', '"10.77.78.1/30"': '"198.19.77.5/30"',
    '"10.77.77.2/30"': '"198.19.77.2/30"', '"10.77.78.2/30"': '"198.19.77.6/30"',
}


def make_site(root: Path) -> Path:
    """README step 2: `cp -r site.example site` (here outside the checkout: SPARKFLEET_SITE), the lab's
    addresses in its inventory.py, the lab's settings in its group_data/all.py (with how this machine
    reaches the lab's hosts over SSH, as a user's site names its key)."""
    site = root / "site"
    shutil.copytree(REPO / "site.example", site)
    inventory = site / "inventory.py"
    text = inventory.read_text()
    for example, lab in LAB_ADDRESSES.items():
        assert text.count(example) == 1, f"site.example/inventory.py: {example} found {text.count(example)} times"
        text = text.replace(example, lab)
    inventory.write_text(text)
    # The lab's profiles (lab/profiles/: the shipped one with the lab's memory share), as this site's own:
    # the lab's inventory then renders what the site's did, and the bring-up's admission is the lab's.
    shutil.copytree(REPO / "lab" / "profiles", site / "profiles", dirs_exist_ok=True)
    renderer = host_renderer(HOSTS[0])  # the site's one setting for both: use_renderer switches the pair
    settings = site / "group_data" / "all.py"
    settings.write_text(settings.read_text() + "\n# The lab's settings (lab/group_data/all.py), as this site's own:\n"
                        + (REPO / "lab" / "group_data" / "all.py").read_text()
                        + f"\n# How this machine reaches the lab's hosts, and the renderer they run:\n"
                        f"ssh_key = {str(LAB_STATE / 'id_ed25519')!r}\n"
                        f"ssh_known_hosts_file = {str(LAB_STATE / 'known_hosts')!r}\n"
                        f"ssh_strict_host_key_checking = 'yes'\n"
                        f"netplan_renderer = {renderer!r}\n")
    return site


def test_the_readme_path_with_a_site_directory_brings_the_pair_up_and_the_client_example_answers(tmp_path):
    fresh = all(on(h, "test -e /etc/sparkfleet && echo deployed || echo fresh").strip() == "fresh" for h in HOSTS)
    site = make_site(tmp_path)
    env = {**os.environ, "SPARKFLEET_SITE": str(site)}
    # Step 4: what each node will get, then the plan alone (Terraform's exit codes: 2, changes to make).
    config = run([str(BIN / "sparkfleet"), "config", "inventory.py"], env=env)
    assert config.returncode == 0, config.output
    assert "spark-a" in config.output and "spark-b" in config.output and "198.18.0.11" in config.output, config.output
    planned = run(["make", "-s", "plan", "INVENTORY=inventory.py"], env=env)
    assert planned.returncode in ((2,) if fresh else (0, 2)), planned.output[-5000:]
    # Step 5: the front door, --yes as in scripts: validate, plan, pyinfra -y.
    brought_up = deploy(inventory="inventory.py", front_door=True, env=env)
    assert brought_up.returncode == 0, brought_up.output[-20000:]
    if fresh:
        assert ("Install haproxy (the API proxy)", "spark-a") in brought_up.changed(), brought_up.changed()
    # Step 6: the state checks, their expected values from the same inventory (the site's).
    checks = run([str(BIN / "pytest"), "tests/state", "-q", "-p", "no:cacheprovider", "--hosts=ssh://spark-a,ssh://spark-b",
                  f"--ssh-config={SSH_CONFIG}", "--inventory=inventory.py"], env=env)
    assert checks.returncode == 0, checks.output[-8000:]
    # docs/first-pair.md: the key copied from the head into a 0600 file, the example run as the page says.
    key_file = tmp_path / "api-key"
    descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(on("spark-a", "cat /etc/sparkfleet/api-key"))
    # The fleet's CA file, fetched from the head as the page says, its fingerprint the one the deploy printed.
    ca = ca_file()
    printed = re.findall(r"the fleet CA on spark-a, SHA-256 ((?:[0-9A-F]{2}:){31}[0-9A-F]{2})", brought_up.output)
    assert printed, brought_up.output[-4000:]
    fingerprint = subprocess.run(["openssl", "x509", "-in", str(ca), "-noout", "-fingerprint", "-sha256"],
                                 capture_output=True, text=True, check=True).stdout.strip().split("=", 1)[1]
    assert fingerprint == printed[-1]
    script = tmp_path / "client.py"
    script.write_text(client_example())
    client_env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    client_env.update(SPARKFLEET_API_URL=f"{head_api()}/v1", SPARKFLEET_MODEL="glm-5.3-flash",
                      SPARKFLEET_API_KEY_FILE=str(key_file), SPARKFLEET_CA_FILE=str(ca))
    answered = subprocess.run([sys.executable, str(script)], env=client_env, capture_output=True, text=True, timeout=120)
    assert answered.returncode == 0, answered.stderr[-5000:]
    model, _, text = answered.stdout.partition("\n")
    assert model == "glm-5.3-flash" and text.strip(), answered.stdout
    print(f"\n  first pair ({'from nothing' if fresh else 'on a deployed lab'}): the README's path served "
          f"{model!r}: {text.strip()[:80]!r}")
