#!/usr/bin/env bash
# promtool for the alert rules' unit tests (tests/unit/test_monitoring.py): the one in the OS's
# `prometheus` package at the version the lab's hosts run (lab/group_data/all.py
# monitoring_prometheus_version; a unit test holds the two equal), taken out of the package with
# dpkg -x (nothing is installed, no service starts) and cached outside the checkout.
#   promtool.sh    prints promtool's path
set -euo pipefail

VERSION=2.42.0
CACHE=${SFL_PROMTOOL_CACHE:-/var/cache/sparkfleet/promtool}
TOOL=$CACHE/$VERSION/promtool

if [[ ! -x $TOOL ]]; then
  mkdir -p "$CACHE"
  BUILD=$(mktemp -d "$CACHE/.build-XXXXXX")
  trap 'rm -rf "$BUILD"' EXIT
  pick() { apt-cache madison prometheus 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}' |
           while read -r o; do u=${o#*:}; u=${u%%[-+~]*}; [[ $u == "$VERSION" ]] && { echo "$o"; break; }; done; }
  full=$(pick)
  [[ -n $full ]] || { apt-get update -qq >/dev/null; full=$(pick); }
  [[ -n $full ]] || { echo "promtool.sh: this machine's package sources offer no prometheus $VERSION" >&2; exit 1; }
  (cd "$BUILD" && apt-get download -q "prometheus=$full" >/dev/null 2>&1) ||
    { echo "promtool.sh: apt-get download prometheus=$full failed" >&2; exit 1; }
  dpkg -x "$BUILD"/prometheus_*.deb "$BUILD/x"
  "$BUILD/x/usr/bin/promtool" --version >/dev/null
  mkdir -p "$CACHE/$VERSION"
  mv "$BUILD/x/usr/bin/promtool" "$TOOL.new" && mv "$TOOL.new" "$TOOL"
  echo "promtool.sh: promtool $VERSION from prometheus $full at $TOOL" >&2
fi
printf '%s\n' "$TOOL"
