#!/bin/sh
# Managed by sparkfleet (roles/serving); installed as /usr/local/libexec/sparkfleet/sfl_gid.sh on RDMA
# nodes and run by the rank's unit before every start (ExecStartPre).
#
#   sfl_gid.sh HCA IPV4 NETDEV ENV_FILE     one HCA: fix NCCL_IB_GID_INDEX in ENV_FILE
#   sfl_gid.sh --check HCA IPV4 NETDEV      each of two HCAs (both halves of the port)
#   sfl_gid.sh --now HCA IPV4 NETDEV        only the metric below, now (-1: no such GID); always exit 0
#
# With SFL_GID_TEXTFILE_DIR set (the node exporter's textfile directory; roles/monitoring), a start
# that found the index writes it there as sparkfleet_rdma_gid_index_at_start{hca,device}, and --now
# (sparkfleet-gid-metrics.timer) as sparkfleet_rdma_gid_index: the alert SparkfleetGidMoved fires when
# they differ, i.e. the index moved under a running engine. A metric that cannot be written is said
# on stderr and never fails the start.
#
# The RoCE v2 GID index of this rank's fabric address moves: it was 3 and then 4 on one Spark within
# half an hour, and a pinned NCCL_IB_GID_INDEX then hangs the TP handshake (ibv_modify_qp err 61). The
# deploy writes the index it read from sysfs into ENV_FILE; a reboot or a link event without a deploy
# can move it. So at every start this reads it again, the way the deploy does (roles/serving/facts.py
# pick_gid_index: the GID ::ffff:IPV4, type "RoCE v2", on NETDEV, port 1 of HCA), and rewrites the
# NCCL_IB_GID_INDEX line of ENV_FILE when it moved (a deploy renders the same value from the same
# sysfs, so it sees no change). No such GID yet (the fabric address is not up after a boot): exit 1,
# and systemd starts the unit again after RestartSec; the rank waits for its fabric that way.
#
# With both halves of the port NCCL_IB_GID_INDEX is -1 (one index for every HCA cannot fit two that
# differ) and NCCL chooses on each HCA the first valid IPv4 GID of type RoCE v2 (NVIDIA/nccl
# v2.28.9-1 src/transport/net_ib.cc ncclUpdateGidIndex). --check writes nothing: it exits 1 unless
# that choice is the GID of IPV4 on NETDEV (no address yet, or another IPv4 address comes first).
# SFL_SYSFS (tests only) replaces /sys.
set -eu
check= now=
if [ "${1:-}" = --check ] || [ "${1:-}" = --now ]; then
  if [ "$1" = --check ]; then check=1; else now=1 check=1; fi
  usage="usage: sfl_gid.sh $1 HCA IPV4 NETDEV"
  shift
  [ $# -eq 3 ] || { echo "$usage" >&2; exit 2; }
else
  [ $# -eq 4 ] || { echo "usage: sfl_gid.sh HCA IPV4 NETDEV ENV_FILE" >&2; exit 2; }
fi
hca=$1 ip=$2 netdev=$3 env_file=${4:-}
base=${SFL_SYSFS:-/sys}/class/infiniband/$hca/ports/1

# ::ffff:a.b.c.d as sysfs prints it: 0000:0000:0000:0000:0000:ffff:aabb:ccdd
old_ifs=$IFS
IFS=.
# shellcheck disable=SC2086
set -- $ip
IFS=$old_ifs
[ $# -eq 4 ] || { echo "sfl_gid.sh: $ip is not an IPv4 address" >&2; exit 2; }
want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$1" "$2" "$3" "$4")

# root_only_dir DIR: DIR made when absent, component by component (mkdir, never -p), every directory of
# it from / down a real directory owned by root and writable by root alone (a sticky one on the way
# allowed, as /tmp: others cannot move root's entries in it); a symlink or another user's directory
# on the way fails naming it, so no other user can swap a path under root's writes (issue 43 item 5;
# the same rules as sparkfleet/root_paths.py's root_only_chain_command).
root_only_dir() (
  IFS=/; d=
  for c in $1; do
    [ -n "$c" ] || continue
    d="$d/$c"
    if [ -L "$d" ]; then echo "sparkfleet: $d is a symlink, not a root-only directory: refused" >&2; exit 1; fi
    [ -e "$d" ] || mkdir -m 0755 "$d" || exit 1
    if [ -L "$d" ] || [ ! -d "$d" ]; then echo "sparkfleet: $d is not a directory: refused" >&2; exit 1; fi
    owner=$(stat -c %u "$d") && perms=$(stat -c %a "$d") || exit 1
    if [ "$owner" != 0 ] || { [ $(( 0$perms & 022 )) -ne 0 ] && { [ $(( 0$perms & 01000 )) -eq 0 ] || [ "$d" = "$1" ]; }; }; then
      echo "sparkfleet: $d is owned by uid $owner with mode $perms, not a root-only directory: refused" >&2; exit 1
    fi
  done
)

# write_metric NAME INDEX FILE: one gauge of this HCA, replaced whole (the collector never reads half):
# written to a file mktemp made (O_EXCL) in the root-only textfile directory, then renamed over FILE.
write_metric() {
  [ -n "${SFL_GID_TEXTFILE_DIR:-}" ] || return 0
  t=
  if ! { root_only_dir "$SFL_GID_TEXTFILE_DIR" && t=$(mktemp "$SFL_GID_TEXTFILE_DIR/.$3.XXXXXX") &&
    printf '# HELP %s The RoCE v2 GID index of the fabric address on this HCA (%s).\n# TYPE %s gauge\n%s{hca="%s",device="%s"} %s\n' \
      "$1" "$4" "$1" "$1" "$hca" "$netdev" "$2" >"$t" && chmod 0644 "$t" &&
    mv -f "$t" "$SFL_GID_TEXTFILE_DIR/$3"; }; then
    [ -z "$t" ] || rm -f "$t"
    echo "sparkfleet: could not write $SFL_GID_TEXTFILE_DIR/$3 (the metric only; the start goes on)" >&2
  fi
  return 0
}

index= seen= first=
for f in $(ls "$base"/gids 2>/dev/null | sort -n | sed "s|^|$base/gids/|"); do
  [ -r "$f" ] || continue
  i=${f##*/}
  gid=$(cat "$f" 2>/dev/null) || continue
  [ "$gid" = 0000:0000:0000:0000:0000:0000:0000:0000 ] && continue
  type=$(cat "$base/gid_attrs/types/$i" 2>/dev/null) || type=
  ndev=$(cat "$base/gid_attrs/ndevs/$i" 2>/dev/null) || ndev=
  seen="$seen $i:$gid/$type/$ndev;"
  lgid=$(echo "$gid" | tr 'A-F' 'a-f') ltype=$(echo "$type" | tr 'A-Z' 'a-z')
  # NCCL's own choice: the first IPv4-mapped RoCE v2 GID (not zero, not fe80::, which are skipped above)
  case $lgid in 0000:0000:0000:0000:0000:ffff:*) [ -z "$first" ] && [ "$ltype" = "roce v2" ] && first=$i ;; esac
  if [ -n "$check" ] && [ -n "$index" ]; then continue; fi
  if [ "$(echo "$gid" | tr 'A-F' 'a-f')" = "$want" ] && [ "$(echo "$type" | tr 'A-Z' 'a-z')" = "roce v2" ] &&
    [ "$ndev" = "$netdev" ]; then
    index=$i
    [ -n "$check" ] || break
  fi
done
if [ -n "$now" ]; then
  write_metric sparkfleet_rdma_gid_index "${index:--1}" "sparkfleet-gid-$hca.prom" "now; -1: none"
  exit 0
fi
if [ -z "$index" ]; then
  echo "sparkfleet: no RoCE v2 GID for $ip on $hca/$netdev yet (sysfs shows${seen:- no GIDs}); is the fabric address up? systemd tries again" >&2
  exit 1
fi
if [ -n "$check" ]; then
  if [ "$first" != "$index" ]; then
    echo "sparkfleet: NCCL would choose GID index $first on $hca, not $index ($ip on $netdev): it takes the first IPv4 RoCE v2 GID (sysfs shows$seen); remove the other IPv4 address from $netdev" >&2
    exit 1
  fi
  write_metric sparkfleet_rdma_gid_index_at_start "$index" "sparkfleet-gid-start-$hca.prom" "when the engine last started"
  echo "sparkfleet: RoCE v2 GID index $index for $ip on $hca/$netdev, the one NCCL chooses"
  exit 0
fi

current=$(sed -n 's/^NCCL_IB_GID_INDEX=//p' "$env_file" | tail -n 1)
write_metric sparkfleet_rdma_gid_index_at_start "$index" "sparkfleet-gid-start-$hca.prom" "when the engine last started"
if [ "$current" = "$index" ]; then
  echo "sparkfleet: RoCE v2 GID index $index for $ip on $hca/$netdev, as $env_file has it"
  exit 0
fi
tmp=$env_file.gid.$$
if [ -n "$current" ]; then # in place: the file stays byte for byte what a deploy renders now
  sed "s/^NCCL_IB_GID_INDEX=.*/NCCL_IB_GID_INDEX=$index/" "$env_file" >"$tmp"
else
  { cat "$env_file"; echo "NCCL_IB_GID_INDEX=$index"; } >"$tmp"
fi
chmod 0600 "$tmp"
mv -f "$tmp" "$env_file"
echo "sparkfleet: RoCE v2 GID index for $ip on $hca/$netdev moved from ${current:-none} to $index; $env_file updated"
