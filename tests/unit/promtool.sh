#!/usr/bin/env bash
# promtool and amtool for the monitoring tests (tests/unit/test_monitoring.py), and the Prometheus and
# node exporter the exporters' TLS is tested with (tests/unit/test_monitoring_tls.py): each the one in the
# OS's package at the version the lab's hosts run (lab/group_data/all.py monitoring_prometheus_version,
# monitoring_alertmanager_version and monitoring_node_exporter_version; a unit test holds them equal),
# taken out of the package with dpkg -x (nothing is installed, no service starts) and cached outside the
# checkout.
#   promtool.sh [promtool]                prints promtool's path (the `prometheus` package)
#   promtool.sh amtool                    prints amtool's path (the `prometheus-alertmanager` package)
#   promtool.sh prometheus                prints Prometheus' own path (the `prometheus` package)
#   promtool.sh prometheus-node-exporter  prints the node exporter's path (`prometheus-node-exporter`)
#   promtool.sh docker-registry           prints the registry's path (`docker-registry`: the head's, which
#                                         roles/image installs; roles/image/sfl_push.py is tested against it)
set -euo pipefail

NAME=${1:-promtool}
case $NAME in
  promtool) PACKAGE=prometheus VERSION=2.42.0 ;;
  amtool) PACKAGE=prometheus-alertmanager VERSION=0.25.0 ;;
  prometheus) PACKAGE=prometheus VERSION=2.42.0 ;;
  prometheus-node-exporter) PACKAGE=prometheus-node-exporter VERSION=1.5.0 ;;
  docker-registry) PACKAGE=docker-registry VERSION=2.8.2 ;;
  *) echo "promtool.sh: promtool, amtool, prometheus, prometheus-node-exporter or docker-registry, not $NAME" >&2; exit 2 ;;
esac
CACHE=${SFL_PROMTOOL_CACHE:-/var/cache/sparkfleet/promtool}
TOOL=$CACHE/$VERSION/$NAME

if [[ ! -x $TOOL ]]; then
  mkdir -p "$CACHE"
  BUILD=$(mktemp -d "$CACHE/.build-XXXXXX")
  trap 'rm -rf "$BUILD"' EXIT
  pick() { apt-cache madison "$PACKAGE" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}' |
           while read -r o; do u=${o#*:}; u=${u%%[-+~]*}; [[ $u == "$VERSION" ]] && { echo "$o"; break; }; done; }
  full=$(pick)
  [[ -n $full ]] || { apt-get update -qq >/dev/null; full=$(pick); }
  [[ -n $full ]] || { echo "promtool.sh: this machine's package sources offer no $PACKAGE $VERSION" >&2; exit 1; }
  (cd "$BUILD" && apt-get download -q "$PACKAGE=$full" >/dev/null 2>&1) ||
    { echo "promtool.sh: apt-get download $PACKAGE=$full failed" >&2; exit 1; }
  dpkg -x "$BUILD/${PACKAGE}_"*.deb "$BUILD/x"
  "$BUILD/x/usr/bin/$NAME" --version >/dev/null 2>&1
  mkdir -p "$CACHE/$VERSION"
  mv "$BUILD/x/usr/bin/$NAME" "$TOOL.new" && mv "$TOOL.new" "$TOOL"
  echo "promtool.sh: $NAME $VERSION from $PACKAGE $full at $TOOL" >&2
fi
printf '%s\n' "$TOOL"
