"""The lab as two pairs, without the lab: which hosts a process drives (lab/pair.py, SFL_LAB_PAIR) in the
inventories and the test helpers, and lab/lab.sh's choices made before it touches anything (the size and
the fabric, each host's renderer, the lock two callers share, the recipe repository it leaves alone).

lab.sh's functions run for real in bash, its file sourced without its last line (`main "$@"`), against a
state directory of the test's own; none of them boots, links or firewalls anything.
"""
import os
import runpy
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB_SH = REPO / "lab" / "lab.sh"
PAIR = runpy.run_path(str(REPO / "lab" / "pair.py"))


def test_the_pair_is_spark_a_and_b_unless_sfl_lab_pair_names_the_second():
    assert PAIR["lab_pair"]({}) == ("spark-a", "spark-b")
    assert PAIR["lab_pair"]({"SFL_LAB_PAIR": ""}) == ("spark-a", "spark-b")
    assert PAIR["lab_pair"]({"SFL_LAB_PAIR": " spark-c , spark-d "}) == ("spark-c", "spark-d")
    for wrong in ("spark-d,spark-c", "spark-a,spark-c", "spark-c", "spark-c,spark-d,spark-a"):
        with pytest.raises(ValueError) as refused:
            PAIR["lab_pair"]({"SFL_LAB_PAIR": wrong})
        assert f"SFL_LAB_PAIR={wrong!r}" in str(refused.value)
        assert "spark-a,spark-b or spark-c,spark-d" in str(refused.value)


def inventory(path: str, monkeypatch, pair: str | None, state: Path) -> dict[str, dict]:
    """The inventory file's hosts as pyinfra reads them, under that SFL_LAB_PAIR and lab state."""
    if pair is None:
        monkeypatch.delenv("SFL_LAB_PAIR", raising=False)
    else:
        monkeypatch.setenv("SFL_LAB_PAIR", pair)
    monkeypatch.setenv("SFL_LAB_STATE", str(state))
    return dict(runpy.run_path(str(REPO / path))["spark_hosts"])


def test_the_lab_inventory_is_the_pair_with_its_management_addresses_and_each_hosts_renderer(monkeypatch, tmp_path):
    first = inventory("lab/inventory.py", monkeypatch, None, tmp_path)
    assert list(first) == ["spark-a", "spark-b"]
    assert [(h["ssh_hostname"], h["rank"], h["fabric_address"], h["netplan_renderer"]) for h in first.values()] == [
        ("198.18.0.11", 0, "198.19.77.1/30", "NetworkManager"), ("198.18.0.12", 1, "198.19.77.2/30", "NetworkManager")]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "renderer-spark-c").write_text("networkd\n")  # what use_renderer on the second pair leaves
    second = inventory("lab/inventory.py", monkeypatch, "spark-c,spark-d", tmp_path)
    assert list(second) == ["spark-c", "spark-d"]
    # its own cable: the same fabric addresses as the first pair's
    assert [(h["ssh_hostname"], h["rank"], h["fabric_address"], h["fabric_twin_address"], h["netplan_renderer"])
            for h in second.values()] == [("198.18.0.13", 0, "198.19.77.1/30", "198.19.77.5/30", "networkd"),
                                          ("198.18.0.14", 1, "198.19.77.2/30", "198.19.77.6/30", "NetworkManager")]
    assert second["spark-c"]["ssh_key"] == f"{tmp_path}/id_ed25519"
    # a lab brought up before the renderer was per host: its one file holds for every host
    (tmp_path / "run" / "renderer").write_text("networkd\n")
    assert {h["netplan_renderer"] for h in inventory("lab/inventory.py", monkeypatch, None, tmp_path).values()} == {"networkd"}


def test_the_real_engines_inventories_follow_the_pair_and_the_fleets_do_not(monkeypatch, tmp_path):
    for path in ("lab/inventory_vllm_cpu.py", "lab/inventory_vllm_cpu_previous.py"):
        hosts = inventory(path, monkeypatch, "spark-c,spark-d", tmp_path)
        assert [(name, h["ssh_hostname"], h["rank"], h["serving_env_pins"]["VLLM_CPU_OMP_THREADS_BIND"])
                for name, h in hosts.items()] == [("spark-c", "198.18.0.13", 0, "0"), ("spark-d", "198.18.0.14", 1, "1")]
        assert list(inventory(path, monkeypatch, None, tmp_path)) == ["spark-a", "spark-b"]
    fleet = inventory("lab/inventory_fleet.py", monkeypatch, "spark-c,spark-d", tmp_path)
    assert [(n, h["ssh_hostname"]) for n, h in fleet.items()] == [
        ("spark-a", "198.18.0.11"), ("spark-b", "198.18.0.12"), ("spark-c", "198.18.0.13"), ("spark-d", "198.18.0.14")]


HELPERS = """
from tests.e2e import drills, lab
print(lab.HOSTS, lab.HEAD, lab.WORKER, drills.HEAD, drills.WORKER, sorted(drills.UNITS.items()))
print([f.__defaults__ for f in (lab.head_api, lab.models_command, lab.ca_file, lab.ca_on, lab.tls_context, lab.use_renderer)])
"""


@pytest.mark.parametrize("pair, head, worker", [(None, "spark-a", "spark-b"), ("spark-c,spark-d", "spark-c", "spark-d")])
def test_the_test_helpers_drive_the_pair_the_variable_names(pair, head, worker):
    env = {k: v for k, v in os.environ.items() if k != "SFL_LAB_PAIR"} | ({"SFL_LAB_PAIR": pair} if pair else {})
    out = subprocess.run([sys.executable, "-c", HELPERS], cwd=REPO, env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == (f"('{head}', '{worker}') {head} {worker} {head} {worker} "
                      f"{sorted({head: 'sparkfleet-head', worker: 'sparkfleet-worker'}.items())}")
    assert out[1] == (f"[('{head}', 8000), ('{head}',), ('{head}',), ('{head}',), ('{head}',), "
                      f"(('{head}', '{worker}'),)]")


def lab_sh(snippet: str, state: Path, **env) -> subprocess.CompletedProcess:
    """`snippet` run in bash after lab.sh's definitions (its file less `main "$@"`), SELF set as lab.sh sets it."""
    script = f'source <(sed \'/^main "\\$@"$/d\' {LAB_SH}); SELF={LAB_SH}; {snippet}'
    base = {k: v for k, v in os.environ.items() if not k.startswith("SFL_LAB_")}
    return subprocess.run(["bash", "-c", script], env={**base, "SFL_LAB_STATE": str(state), **env},
                          capture_output=True, text=True, timeout=60)


def test_lab_sh_sourced_defines_and_runs_nothing(tmp_path):
    ran = lab_sh("echo $SIZE $FABRIC ${HOSTS[*]}", tmp_path)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "2 pair spark-a spark-b\n", "")
    assert list(tmp_path.iterdir()) == []


SHOW = 'set_size; echo "$SIZE $FABRIC ${HOSTS[*]}"; lab_pairs'


def test_two_hosts_are_one_pair_and_refuse_a_fabric(tmp_path):
    assert lab_sh(SHOW, tmp_path).stdout == "2 pair spark-a spark-b\nspark-a spark-b\n"
    refused = lab_sh(SHOW, tmp_path, SFL_LAB_FABRIC="pairs")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "SFL_LAB_FABRIC=pairs is for four hosts (SFL_LAB_HOSTS=4)" in refused.stderr
    refused = lab_sh(SHOW, tmp_path, SFL_LAB_HOSTS="4", SFL_LAB_FABRIC="ring")
    assert refused.returncode == 1 and "SFL_LAB_FABRIC must be switch or pairs (got 'ring')" in refused.stderr


def test_four_hosts_are_on_the_switch_unless_they_are_two_pairs_and_the_lab_remembers_which(tmp_path):
    assert lab_sh(SHOW, tmp_path, SFL_LAB_HOSTS="4").stdout == "4 switch spark-a spark-b spark-c spark-d\n"
    assert lab_sh(SHOW, tmp_path, SFL_LAB_HOSTS="4", SFL_LAB_FABRIC="pairs").stdout == (
        "4 pairs spark-a spark-b spark-c spark-d\nspark-a spark-b\nspark-c spark-d\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "size").write_text("4\n")
    assert lab_sh(SHOW, tmp_path).stdout.startswith("4 switch ")  # four hosts made before the fabric was remembered
    (run / "fabric").write_text("pairs\n")  # what `up` of SFL_LAB_HOSTS=4 SFL_LAB_FABRIC=pairs left
    assert lab_sh(SHOW, tmp_path).stdout.startswith("4 pairs ")  # reboot, status, up: no variable needed
    assert lab_sh(SHOW, tmp_path, SFL_LAB_HOSTS="4").stdout.startswith("4 pairs ")
    refused = lab_sh(SHOW, tmp_path, SFL_LAB_FABRIC="switch")
    assert refused.returncode == 1
    assert ("the lab's four hosts are on fabric 'pairs'; `SFL_LAB_HOSTS=4 SFL_LAB_FABRIC=switch lab.sh reset` "
            "makes one on 'switch' (fresh hosts)") in refused.stderr
    # reset's: whatever runs now is going; the fleet tier's SFL_LAB_HOSTS=4 gets the switch, not the pairs
    fresh = 'set_size fresh; echo "$SIZE $FABRIC"'
    assert lab_sh(fresh, tmp_path, SFL_LAB_HOSTS="4").stdout == "4 switch\n"
    assert lab_sh(fresh, tmp_path).stdout == "2 pair\n"


RENDERERS = ('set_size; check_renderer_vars; plan_renderers; '
             'for h in "${HOSTS[@]}"; do echo "$h ${WANT_RENDERER[$h]}"; done')


def test_up_switches_the_renderer_of_the_hosts_named_and_the_others_keep_theirs(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "size").write_text("4\n")
    (run / "fabric").write_text("pairs\n")
    (run / "renderer-spark-c").write_text("networkd\n")  # the second pair's head, switched before
    assert lab_sh(RENDERERS, tmp_path).stdout.split("\n")[:4] == [
        "spark-a NetworkManager", "spark-b NetworkManager", "spark-c networkd", "spark-d NetworkManager"]
    assert lab_sh(RENDERERS, tmp_path, SFL_LAB_RENDERER="networkd", SFL_LAB_RENDERER_HOSTS="spark-a spark-b").stdout \
        .split("\n")[:4] == ["spark-a networkd", "spark-b networkd", "spark-c networkd", "spark-d NetworkManager"]
    assert lab_sh(RENDERERS, tmp_path, SFL_LAB_RENDERER="NetworkManager").stdout.split("\n")[:4] == [
        f"{h} NetworkManager" for h in ("spark-a", "spark-b", "spark-c", "spark-d")]  # unnamed: every host
    (run / "renderer").write_text("networkd\n")  # before per host: every host's
    (run / "renderer-spark-c").unlink()
    assert set(lab_sh(RENDERERS, tmp_path).stdout.split()[1::2]) == {"networkd"}


@pytest.mark.parametrize("env, message", [
    ({"SFL_LAB_RENDERER": "wicked"}, "SFL_LAB_RENDERER must be NetworkManager or networkd (got 'wicked')"),
    ({"SFL_LAB_RENDERER_HOSTS": "spark-a"}, "SFL_LAB_RENDERER_HOSTS ('spark-a') names the hosts SFL_LAB_RENDERER "
                                            "switches; set SFL_LAB_RENDERER too"),
    ({"SFL_LAB_RENDERER": "networkd", "SFL_LAB_RENDERER_HOSTS": "spark-a spark-c"},
     "SFL_LAB_RENDERER_HOSTS: 'spark-c' is not a host of this lab (hosts: spark-a spark-b)"),
])
def test_bad_renderer_variables_are_refused_naming_the_value_and_what_is_allowed(tmp_path, env, message):
    refused = lab_sh(RENDERERS, tmp_path, **env)
    assert refused.returncode == 1 and refused.stdout == "" and message in refused.stderr, refused.stderr


def held_lock(state: Path, seconds: float | None) -> subprocess.Popen:
    """Another process holding the lab's lock for `seconds` (as a running lab.sh does), once it says so;
    `seconds` None: until a line reaches its stdin."""
    state.mkdir(parents=True, exist_ok=True)
    hold = "sys.stdin.readline()" if seconds is None else f"time.sleep({seconds})"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time\n"
        f"f = open({str(state / 'lock')!r}, 'w'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True)\n"
        f"{hold}")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_second_lab_sh_waits_for_the_lock_and_says_how_long(tmp_path):
    """The lock is let go 1 s after lab.sh said it waits for it (a state, not a guess at how long a
    loaded machine takes to start bash): it waited at least that long, and no longer than it ran."""
    holder = held_lock(tmp_path, None)
    script = f'source <(sed \'/^main "\\$@"$/d\' {LAB_SH}); SELF={LAB_SH}; lock; echo locked'
    base = {k: v for k, v in os.environ.items() if not k.startswith("SFL_LAB_")}
    began = time.monotonic()
    lab = subprocess.Popen(["bash", "-c", script], env={**base, "SFL_LAB_STATE": str(tmp_path), "LAB_CMD": "reboot spark-d"},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = select.select([lab.stdout], [], [], 30)[0]  # said once it found the lock held
    first = lab.stdout.readline() if said else ""
    if not said:
        holder.communicate("go\n", timeout=10)
        lab.kill()
        pytest.fail("lab.sh said nothing in 30 s while another held the lock")
    time.sleep(1.0)
    holder.communicate("go\n", timeout=10)
    rest, err = lab.communicate(timeout=60)
    took = time.monotonic() - began
    assert lab.returncode == 0, err
    lines = (first + rest).splitlines()
    assert lines[0].startswith("lab: another lab.sh holds the lock (") and "waiting for it, at most 900s" in lines[0]
    assert lines[1].startswith("lab: waited ") and lines[1].endswith(" s for another lab.sh") and lines[2] == "locked"
    waited = float(lines[1].split()[2])
    assert 0.95 <= waited <= took + 0.05, (waited, took)  # printed to a tenth
    from tests.e2e.lab import _WAITED  # what reboot() takes off a drill's clock
    assert [float(w) for w in _WAITED.findall(first + rest)] == [waited]


def test_the_lock_is_held_until_the_caller_ends_and_a_wait_has_a_bound(tmp_path):
    # taken twice in one run (reboot, then its `up`): still held, not dropped and taken again
    ran = lab_sh('lock; lock; flock -n "$SFL_LAB_STATE/lock" true && echo free || echo held', tmp_path)
    assert ran.stdout == "held\n", ran.stderr
    assert lab_sh('lock; echo locked', tmp_path).stdout == "locked\n"  # no wait when nobody holds it
    holder = held_lock(tmp_path, 4)
    refused = lab_sh("lock; echo locked", tmp_path, SFL_LAB_LOCK_WAIT="1")
    holder.kill()
    assert refused.returncode == 1 and "locked" not in refused.stdout
    assert "another lab.sh still holds the lock after 1s" in refused.stderr


def test_up_leaves_the_served_recipe_repository_alone_when_it_holds_the_pinned_commits(tmp_path):
    """ensure_recipe_repo rebuilds (deletes and recreates) the repository only when recipe_tags differ from
    lab/recipe/COMMITS: the other pair's deploy may be fetching it."""
    pinned = (REPO / "lab" / "recipe" / "COMMITS").read_text().strip()
    tags = 'GIT_DIR_LAB=$SFL_LAB_STATE/git; recipe_tags'
    assert lab_sh(tags, tmp_path).stdout.strip() != pinned  # none yet
    subprocess.run(["bash", str(REPO / "lab" / "recipe" / "make-repo.sh"), str(tmp_path / "git" / "recipe.git")],
                   check=True, capture_output=True)
    assert lab_sh(tags, tmp_path).stdout.strip() == pinned


def test_the_ssh_files_change_by_a_rename_and_only_when_their_content_does(tmp_path):
    dest, new = tmp_path / "ssh_config", tmp_path / "new"
    dest.write_text("Host spark-a\n")
    inode = dest.stat().st_ino
    new.write_text("Host spark-a\n")
    assert lab_sh(f"replace_file {new} {dest}", tmp_path).returncode == 0
    assert dest.stat().st_ino == inode  # unchanged: not written at all
    new.write_text("Host spark-a\nHost spark-c\n")
    assert lab_sh(f"replace_file {new} {dest}", tmp_path).returncode == 0
    assert dest.read_text() == "Host spark-a\nHost spark-c\n" and dest.stat().st_ino != inode
    assert oct(dest.stat().st_mode & 0o777) == "0o644" and not (tmp_path / "ssh_config.new").exists()


# lab.sh's ensure_fabric on four stand-in hosts: a network namespace each (a sleeping process's, as
# nsenter finds a host by its PID 1), all inside one namespace of the test's own that plays the machine
# (its veths and names never meet the machine's own links, nor a running lab's).
FABRIC = r'''
set -e
hosts=(spark-a spark-b spark-c spark-d)
boot() {  # its own network namespace, once unshare has made it (then the sleep is the pid)
  unshare -n sleep 600 </dev/null >/dev/null 2>&1 & LEADER[$1]=$!
  until [[ $(readlink "/proc/${LEADER[$1]}/ns/net") != "$(readlink /proc/$$/ns/net)" ]]; do sleep 0.05; done
}
trap 'kill -9 "${LEADER[@]}" 2>/dev/null' EXIT
ifindex() { local l; l=$(fabric_link "${LEADER[$1]}" "$2"); echo "${l%% *}"; }
show() {  # every host's halves: its netdev's index, and whose end its peer is
  for h in "${hosts[@]}"; do for half in 0 1; do
    for p in "${hosts[@]}"; do
      [[ $p != "$h" ]] && fabric_pair_whole "${LEADER[$h]}" "${LEADER[$p]}" "$half" && echo "$1 $h:$half $(ifindex "$h" "$half") to $p"
    done
  done; done
  return 0
}
ip link set lo up
FABRIC=pairs HOSTS=("${hosts[@]}")
for h in "${hosts[@]}"; do boot "$h"; done
ensure_fabric >/dev/null; echo "new ${FABRIC_NEW[*]}"; show first
FABRIC_NEW=(); ensure_fabric >/dev/null; echo "again ${FABRIC_NEW[*]}"
kill -9 "${LEADER[spark-b]}"; boot spark-b  # a reboot of spark-b: its ends gone, and their peers with them
FABRIC_NEW=(); ensure_fabric >/dev/null; echo "rebooted-b ${FABRIC_NEW[*]}"; show after-b
kill -9 "${LEADER[spark-c]}" "${LEADER[spark-d]}"; boot spark-c; boot spark-d  # a power cut of the second pair
FABRIC_NEW=(); ensure_fabric >/dev/null; echo "cut-cd ${FABRIC_NEW[*]}"; show after-cd
echo "machine $(ip -o link show type veth | wc -l) veths"
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (make test runs as root)")
def test_each_pair_is_cabled_on_its_own_and_a_reboot_re_creates_only_its_pairs_veths(tmp_path):
    ran = subprocess.run(["unshare", "-n", "bash", "-c", f'source <(sed \'/^main "\\$@"$/d\' {LAB_SH}); {FABRIC}'],
                         env={**os.environ, "SFL_LAB_STATE": str(tmp_path)}, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = ran.stdout.splitlines()
    halves = [f"{h}:{half}" for h in ("spark-a", "spark-b", "spark-c", "spark-d") for half in (0, 1)]
    peer = {"spark-a": "spark-b", "spark-b": "spark-a", "spark-c": "spark-d", "spark-d": "spark-c"}

    def cabled(when: str) -> dict[str, str]:
        """host:half -> its netdev's ifindex, each the other end of its peer's and of no one else's"""
        lines = [line.split() for line in out if line.startswith(when + " ")]
        assert sorted(f"{w[1]} {w[3]} {w[4]}" for w in lines) == sorted(f"{h} to {peer[h.split(':')[0]]}" for h in halves), out
        return {w[1]: w[2] for w in lines}

    assert out[0] == "new spark-a:0 spark-b:0 spark-a:1 spark-b:1 spark-c:0 spark-d:0 spark-c:1 spark-d:1"
    first = cabled("first")
    assert "again " in out  # whole cables: nothing made again
    assert "rebooted-b spark-a:0 spark-b:0 spark-a:1 spark-b:1" in out
    after_b = cabled("after-b")
    assert all(after_b[h] == first[h] for h in halves if h.startswith(("spark-c", "spark-d")))  # untouched
    assert "cut-cd spark-c:0 spark-d:0 spark-c:1 spark-d:1" in out
    after_cd = cabled("after-cd")
    assert all(after_cd[h] == after_b[h] for h in halves if h.startswith(("spark-a", "spark-b")))
    assert "machine 0 veths" in out  # every end moved into its host, under the half's name
