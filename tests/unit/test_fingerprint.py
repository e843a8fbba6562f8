"""roles/fingerprint: the fact's command and parsing, the group's verdict and table, the data key."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roles.fingerprint.checks import (
    IMAGE_FIELDS, INSTALLED_BY_THE_DEPLOY, group_verdict, mismatches, must_match, note, problems, summary,
)
from roles.fingerprint.facts import Fingerprint, parse_fingerprint, visible_files
from sparkfleet.model.fingerprint import FINGERPRINT_FIELDS
from sparkfleet.config import ConfigError, build_cluster
from sparkfleet.model.serving import node_profile
from tests.unit.capture_views import (
    command_output, docker_server_version, ibstat_fw_ver, path_with, smi_query_value, stand_in, uname_release,
)
from tests.unit.helpers import CAPTURES, capture, pair

FIXTURES = Path(__file__).parent / "fixtures"
LAB_IMAGE = "sha256:3d632a13c1a27c105df7356a3ffd0ab374d9175717ef3a5b75b1bb723814e0e9"


def recorded(name: str) -> dict:
    return parse_fingerprint((FIXTURES / name).read_text().splitlines())


def command(ref="sparkfleet/x:1", engine="vllm") -> str:
    return Fingerprint().command(netdev="enp1s0f0np0", ref=ref, engine=engine)


# --- the fact ------------------------------------------------------------------------------------

def test_the_lab_hosts_have_no_driver_firmware_engine_or_nccl():
    for host in ("spark-a", "spark-b"):
        assert recorded(f"fingerprint-lab-{host}.txt") == {
            "kernel": "6.18.44-fc-v669", "gpu_driver": None, "cx7_firmware": None, "docker": "20.10.24+dfsg1",
            "image_id": LAB_IMAGE, "engine": None, "nccl": None,
        }


def test_a_dgx_spark_reads_as_its_top_layers_show_it():
    fp = recorded("fingerprint-dgx-spark.txt")
    assert fp["kernel"] == "6.17.0-1032-nvidia" and fp["gpu_driver"] == "580.173.02"
    assert fp["cx7_firmware"] == "28.45.4028"  # ethtool's PSID is the board's, not the firmware's
    # vllm 0.10.2 and the pip NCCL 2.27.7 were replaced in later layers; the base's NCCL_VERSION is stale
    assert fp["engine"] == "vllm 0.11.1rc2.dev59+g1a2b3c4d5.cu130"
    assert fp["nccl"] == "pip 2.28.3, lib 2.28.9"


# --- the command on what real Sparks print (tests/unit/capture_views.py derives each input) ------

def spark_run(tmp_path, *, nvrm=None, fw_ver=None, uname_a, smi=None, ethtool=None, dpkg_docker) -> dict:
    """The fact's command with a Spark's sources: /proc/driver/nvidia/version (`nvrm`, a capture's
    name, or none), the netdev's RDMA device's sysfs fw_ver, and stand-ins printing what `uname -r`,
    `nvidia-smi --query-gpu=driver_version --format=csv,noheader`, `ethtool -i` and `docker version`
    print on the machines the captures came from. No image: the image's fields are absent."""
    sys_net = tmp_path / "sys" / "class" / "net"
    (sys_net / "enp1s0f0np0").mkdir(parents=True)
    if fw_ver:  # the netdev's PCI device's RDMA device, as on a Spark: enp1s0f0np0 -> rocep1s0f0
        fw = sys_net / "enp1s0f0np0" / "device" / "infiniband" / "rocep1s0f0" / "fw_ver"
        fw.parent.mkdir(parents=True)
        fw.write_text(fw_ver + "\n")
    bin_dir = tmp_path / "bin"
    stand_in(bin_dir, "uname", uname_release(uname_a), first_arg="-r")
    stand_in(bin_dir, "nvidia-smi", smi, first_arg="--query-gpu=driver_version")
    stand_in(bin_dir, "ethtool", ethtool, first_arg="-i")
    stand_in(bin_dir, "docker", docker_server_version(dpkg_docker), first_arg="version")
    text = (command().replace("/proc/driver/nvidia/version", str(CAPTURES / nvrm) if nvrm else str(tmp_path / "none"))
            .replace("/sys/class/net", str(sys_net)))
    out = subprocess.run(["sh", "-c", text], env=path_with(bin_dir), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return {"lines": out.stdout.splitlines(), **parse_fingerprint(out.stdout.splitlines())}


SESSION = capture("session_dgxspark03_os_df_free.txt")  # dgxspark03: uname -a
SPARK_3BEE = capture("smi_query_name_driver_spark3bee.txt")  # spark-3bee: uname -a, nvidia-smi query, dpkg -l
DOCKER_CE = [line.split()[1] for line in command_output(
    SPARK_3BEE, 'dpkg -l | grep -E "nvidia-container-toolkit |docker-ce " | awk \'{print $2, $3}\'')
    if line.startswith("docker-ce ")][0]


def test_a_spark_s_kernel_driver_and_firmware_are_read_where_the_spark_keeps_them(tmp_path):
    """/proc's NVRM line (580.126.09) and sysfs' fw_ver (ibstat's 28.45.4028) are read first: the
    nvidia-smi and ethtool stand-ins print something else and are not asked."""
    fp = spark_run(tmp_path, nvrm="nvrm_version_580_126_09.txt",
                   fw_ver=ibstat_fw_ver(capture("ibstat_dell_gb10_excerpt.txt"), "rocep1s0f0"),
                   uname_a=command_output(SESSION, "uname -a")[0], smi="999.99", ethtool="firmware-version: 0.0.0",
                   dpkg_docker=DOCKER_CE)
    assert {k: fp[k] for k in ("kernel", "gpu_driver", "cx7_firmware", "docker")} == {
        "kernel": "6.17.0-1021-nvidia", "gpu_driver": "580.126.09", "cx7_firmware": "28.45.4028", "docker": "29.2.1"}
    assert all(fp[f] is None for f in IMAGE_FIELDS)


def test_without_proc_and_sysfs_the_driver_comes_from_nvidia_smi_and_the_firmware_from_ethtool(tmp_path):
    fp = spark_run(tmp_path, uname_a=command_output(SPARK_3BEE, "uname -a")[0],
                   smi=smi_query_value(command_output(
                       SPARK_3BEE, "nvidia-smi --query-gpu=name,driver_version --format=csv"), "driver_version"),
                   ethtool="\n".join(command_output(capture("ethtool_i_enP2p1s0f0np0.txt"), "ethtool -i enP2p1s0f0np0")),
                   dpkg_docker=DOCKER_CE)
    assert (fp["kernel"], fp["gpu_driver"], fp["cx7_firmware"]) == ("6.17.0-1032-nvidia", "580.173.02", "28.45.4028")
    assert "cx7_firmware=28.45.4028 (NVD0000000087)" in fp["lines"]  # the PSID ethtool adds, dropped by the parser
    # the fixture's node lines are these, read off spark-3bee and the ethtool capture (its image lines are assembled)
    fixture = (FIXTURES / "fingerprint-dgx-spark.txt").read_text().splitlines()
    assert [line for line in fixture if line.split("=")[0] in ("kernel", "gpu_driver", "cx7_firmware", "docker")] \
        == fp["lines"]


def test_neither_source_of_the_driver_or_firmware_leaves_them_absent(tmp_path):
    fp = spark_run(tmp_path, uname_a=command_output(SESSION, "uname -a")[0], dpkg_docker=DOCKER_CE)
    assert fp["gpu_driver"] is None and fp["cx7_firmware"] is None and fp["kernel"] == "6.17.0-1021-nvidia"


def test_two_sparks_of_the_field_differ_on_kernel_and_driver_and_are_refused_naming_both(tmp_path):
    """dgxspark03 (6.17.0-1021-nvidia, 580.126.09 in /proc) and spark-3bee (6.17.0-1032-nvidia, 580.173.02
    from nvidia-smi) as one group: the refusal names both fields, the second node and each fix."""
    a = spark_run(tmp_path / "a", nvrm="nvrm_version_580_126_09.txt", uname_a=command_output(SESSION, "uname -a")[0],
                  ethtool="\n".join(command_output(capture("ethtool_i_enP2p1s0f0np0.txt"), "ethtool -i enP2p1s0f0np0")),
                  dpkg_docker=DOCKER_CE)
    b = spark_run(tmp_path / "b", uname_a=command_output(SPARK_3BEE, "uname -a")[0],
                  smi=smi_query_value(command_output(
                      SPARK_3BEE, "nvidia-smi --query-gpu=name,driver_version --format=csv"), "driver_version"),
                  ethtool="\n".join(command_output(capture("ethtool_i_enP2p1s0f0np0.txt"), "ethtool -i enP2p1s0f0np0")),
                  dpkg_docker=DOCKER_CE)
    prints = {n: {f: fp[f] for f in FINGERPRINT_FIELDS} for n, fp in (("spark-a", a), ("spark-b", b))}
    refusal = group_verdict(prints, [f for f in FINGERPRINT_FIELDS if f not in IMAGE_FIELDS])
    assert refusal is not None and mismatches(prints, FINGERPRINT_FIELDS) == ["kernel", "gpu_driver"]
    text = refusal.block()
    assert "spark-b: kernel 6.17.0-1032-nvidia, spark-a has 6.17.0-1021-nvidia" in text
    assert "install GPU driver 580.126.09 on spark-b" in text


def test_a_deletion_in_a_later_layer_hides_the_file_below():
    layers = [(3, "has", "a"), (1, "whiteout", "a"), (2, "has", "b"), (3, "has", "b")]
    assert visible_files(layers) == ["b"]


def test_without_layers_the_images_env_is_the_fallback_and_says_so():
    fp = parse_fingerprint(["kernel=6.11.0-1016-nvidia", "id=sha256:ab", "env_NCCL_VERSION=2.27.7-1",
                            "env_VLLM_VERSION=0.11.0"])
    assert fp["nccl"] == "env 2.27.7-1" and fp["engine"] == "vllm 0.11.0 (env)"


def test_no_image_no_image_fields():
    fp = parse_fingerprint(["kernel=6.11.0-1016-nvidia", "docker=28.3.3", "layer 1 has vllm-0.11.0.dist-info"])
    assert all(fp[f] is None for f in IMAGE_FIELDS) and fp["docker"] == "28.3.3"


def test_the_command_starts_no_container():
    text = command()
    assert "docker run" not in text and "docker exec" not in text and "docker create" not in text


def test_the_command_reads_the_images_layers_top_first(tmp_path):
    """The command itself, with a stand-in `docker` whose image has three overlay2 layers."""
    top, middle, bottom = (tmp_path / n for n in ("upper", "l1", "l2"))
    (top / "usr/local/lib/python3.12/dist-packages/vllm-0.11.0.dist-info").mkdir(parents=True)
    (middle / "opt/venv/lib/python3.12/site-packages/nvidia_nccl_cu12-2.27.3.dist-info").mkdir(parents=True)
    (bottom / "usr/lib/aarch64-linux-gnu").mkdir(parents=True)
    (bottom / "usr/lib/aarch64-linux-gnu/libnccl.so.2.26.2").write_text("")
    (bottom / "usr/local/lib/python3.12/dist-packages/sglang-0.5.0.dist-info").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = version ]; then echo 24.0.7; exit 0; fi\n'
        f'if [ "$1 $2" = "image inspect" ]; then printf "id=sha256:feed\\nlayers={top}:{middle}:{bottom}\\n'
        'env_PATH=/usr/bin\\nenv_NCCL_VERSION=2.21.5-1\\n"; exit 0; fi\nexit 1\n'
    )
    (bin_dir / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = subprocess.run(["sh", "-c", command()], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    fp = parse_fingerprint(out.stdout.splitlines())
    assert fp["docker"] == "24.0.7" and fp["image_id"] == "sha256:feed"
    assert fp["engine"] == "vllm 0.11.0"  # the profile's engine only: sglang is not looked for
    assert fp["nccl"] == "pip 2.27.3, lib 2.26.2"


# --- the group's verdict -------------------------------------------------------------------------

def lab_pair(**changes_by_node) -> dict[str, dict]:
    prints = {n: recorded(f"fingerprint-lab-{n}.txt") for n in ("spark-a", "spark-b")}
    for name, changes in changes_by_node.items():
        prints[name] = {**prints[name], **changes}
    return prints


def test_the_lab_pair_matches():
    assert group_verdict(lab_pair(), FINGERPRINT_FIELDS) is None
    assert summary(lab_pair(), ["kernel", "gpu_driver", "docker"], ["image_id"]).startswith(
        "2 nodes match on kernel, docker; absent on every node: gpu_driver")


def test_a_differing_kernel_is_refused_with_a_table():
    prints = lab_pair(**{"spark-b": {"kernel": "6.8.0-1030-nvidia"}})
    refusal = group_verdict(prints, FINGERPRINT_FIELDS)
    assert refusal is not None
    text = refusal.block()
    assert "differ on kernel (fingerprint_must_match); nothing was changed" in text
    assert "spark-b: kernel 6.8.0-1030-nvidia, spark-a has 6.18.44-fc-v669" in text
    assert "boot spark-b into kernel 6.18.44-fc-v669" in text and "drop 'kernel' from fingerprint_must_match" in text
    rows = {line.split()[1] if line.split()[0] == "!" else line.split()[0]: line for line in text.splitlines()[-8:]}
    assert rows["kernel"].lstrip().startswith("!") and "6.8.0-1030-nvidia" in rows["kernel"]
    assert not rows["docker"].lstrip().startswith("!") and rows["gpu_driver"].split()[1:] == ["-", "-"]
    assert rows["field"].split() == ["field", "spark-a", "spark-b"]


def test_a_kernel_dropped_from_must_match_passes_and_is_shown_as_unchecked():
    prints = lab_pair(**{"spark-b": {"kernel": "6.8.0-1030-nvidia"}})
    assert group_verdict(prints, [f for f in FINGERPRINT_FIELDS if f != "kernel"]) is None
    assert mismatches(prints, FINGERPRINT_FIELDS) == ["kernel"]


def test_absent_on_one_node_is_a_mismatch_absent_on_all_is_not():
    assert mismatches(lab_pair(), ["gpu_driver", "cx7_firmware"]) == []
    prints = lab_pair(**{"spark-a": {"gpu_driver": "580.95.05"}})
    refusal = group_verdict(prints, ["gpu_driver"])
    assert refusal is not None and "spark-b: gpu_driver -, spark-a has 580.95.05" in refusal.block()


def test_a_node_the_deploy_gives_docker_is_not_refused_before_it_has_it():
    prints = lab_pair(**{"spark-b": {"docker": None}})
    assert group_verdict(prints, ["docker"], absent_ok=INSTALLED_BY_THE_DEPLOY) is None
    assert group_verdict(prints, ["docker"]) is not None  # the doctor's verdict, after a deploy
    prints = lab_pair(**{"spark-a": {"docker": None}, "spark-b": {"docker": "28.3.3"}})
    prints["spark-c"] = {**prints["spark-b"], "docker": "27.5.1"}
    found = problems(prints, ["docker"], "spark-a", absent_ok=INSTALLED_BY_THE_DEPLOY)
    assert [p.hosts for p in found] == [("spark-c",)] and "spark-b has 28.3.3" in found[0]


def test_a_stale_worker_image_fails_where_the_image_fields_are_compared():
    prints = lab_pair(**{"spark-b": {"image_id": "sha256:0123456789abcdef" + "0" * 48}})
    found = problems(prints, FINGERPRINT_FIELDS, "spark-a")
    assert [p.hosts for p in found] == [("spark-b",)]
    assert "image_id sha256:0123456789ab, spark-a has sha256:3d632a13c1a2" in found[0]
    assert "roles/image ships the head's image" in found[0].fix


def test_the_doctor_note_shows_every_field_absent_as_dash():
    assert note(recorded("fingerprint-lab-spark-a.txt")) == (
        "kernel 6.18.44-fc-v669, gpu_driver -, cx7_firmware -, docker 20.10.24+dfsg1, "
        "image_id sha256:3d632a13c1a2, engine -, nccl -")


# --- data ----------------------------------------------------------------------------------------

def test_every_field_must_match_by_default():
    cluster = build_cluster(pair())
    assert must_match(cluster.nodes) == list(FINGERPRINT_FIELDS)


def test_a_field_listed_on_any_node_is_checked():
    cluster = build_cluster(pair(**{"spark-a": {"fingerprint_must_match": ["docker"]},
                                    "spark-b": {"fingerprint_must_match": ["kernel"]}}))
    assert must_match(cluster.nodes) == ["kernel", "docker"]


def test_an_unknown_field_is_refused_naming_host_key_and_allowed_values():
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**{"spark-b": {"fingerprint_must_match": ["kernel", "bios"]}}))
    text = err.value.block()
    assert "spark-b: key 'fingerprint_must_match.1' = 'bios'" in text
    assert all(f"'{f}'" in text for f in FINGERPRINT_FIELDS)


# --- the fingerprint as a metric -----------------------------------------------------------------

def test_the_node_s_program_writes_the_fingerprint_of_the_image_its_container_runs(tmp_path, promtool):
    """sfl_fingerprint.py as the timer runs it, with a stand-in `docker` whose engine container runs an
    image of two overlay2 layers: the same fields the deploy's fact reads, one info series, valid
    exposition text; the program the deploy ships is the one the fact parses with."""
    from roles.fingerprint import sfl_fingerprint

    assert sfl_fingerprint.FIELDS == FINGERPRINT_FIELDS
    top, bottom = tmp_path / "upper", tmp_path / "l1"
    (top / "usr/local/lib/python3.12/dist-packages/vllm-0.11.0.dist-info").mkdir(parents=True)
    (bottom / "usr/lib/aarch64-linux-gnu").mkdir(parents=True)
    (bottom / "usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        'if [ "$1 $4" = "inspect sparkfleet-head" ]; then echo sha256:cafe; exit 0; fi\n'
        'if [ "$1" = version ]; then echo 27.5.1; exit 0; fi\n'
        f'if [ "$1 $2 $5" = "image inspect sha256:cafe" ]; then printf "id=sha256:cafe\\nlayers={top}:{bottom}\\n"; exit 0; fi\n'
        "exit 1\n"
    )
    (bin_dir / "docker").chmod(0o755)
    textfile = tmp_path / "node-exporter" / "sparkfleet-fingerprint.prom"
    script = Path(sfl_fingerprint.__file__)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    run = subprocess.run([sys.executable, str(script), "--netdev", "enp1s0f0np0", "--engine", "vllm",
                          "--container", "sparkfleet-head", "--textfile", str(textfile)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    text = textfile.read_text()
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    (series,) = [line for line in text.splitlines() if not line.startswith("#")]
    assert series.endswith(" 1") and f'kernel="{os.uname().release}"' in series
    for label in ('docker="27.5.1"', 'image_id="sha256:cafe"', 'engine="vllm 0.11.0"', 'nccl="lib 2.28.9"'):
        assert label in series, series
    # no engine container (a node before its first start): the image's fields are empty, the rest is there
    run = subprocess.run([sys.executable, str(script), "--netdev", "enp1s0f0np0", "--engine", "vllm",
                          "--container", "sparkfleet-worker", "--textfile", str(textfile)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and 'image_id="",engine="",nccl=""' in textfile.read_text(), textfile.read_text()


def test_every_node_runs_the_fingerprint_timer_with_monitoring_on_and_none_without():
    from roles.fingerprint.checks import METRICS_SCRIPT, METRICS_TEXTFILE, metrics_files

    on = build_cluster(pair(**{h: {"monitoring_enabled": True, "monitoring_fingerprint_interval_s": 30}
                               for h in ("spark-a", "spark-b")}))
    head = metrics_files(on.node("spark-a"))
    service = head["/etc/systemd/system/sparkfleet-fingerprint-metrics.service"]
    assert (f"ExecStart=/usr/bin/python3 {METRICS_SCRIPT} --netdev enp1s0f0np0 --engine "
            f"{node_profile(on.head).engine} --container sparkfleet-head --textfile {METRICS_TEXTFILE}") in service
    assert "--container sparkfleet-worker" in metrics_files(on.node("spark-b"))[
        "/etc/systemd/system/sparkfleet-fingerprint-metrics.service"]
    assert "OnUnitActiveSec=30s" in head["/etc/systemd/system/sparkfleet-fingerprint-metrics.timer"]
    off = build_cluster(pair(**{h: {"monitoring_enabled": False} for h in ("spark-a", "spark-b")}))
    assert metrics_files(off.node("spark-a")) == {}
