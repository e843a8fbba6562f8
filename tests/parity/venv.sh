#!/usr/bin/env bash
# The real engine's virtualenv for the parity tier: built once per lock file from
# tests/parity/<engine>-<version>.txt (exact pins, --no-deps), cached under $SFL_PARITY_CACHE by the
# lock's hash, so a CI run on a machine that has built it before installs nothing, and a changed lock
# builds a new one beside the old (the hash covers the engine's own pin, so each version has its own).
#   venv.sh ENGINE VERSION    (vllm | sglang, a version with a lock file) prints the virtualenv's python
set -euo pipefail

ENGINE=${1:?usage: venv.sh vllm|sglang VERSION}
VERSION=${2:?usage: venv.sh vllm|sglang VERSION}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOCK=$HERE/$ENGINE-$VERSION.txt
[[ -f $LOCK ]] || { echo "venv.sh: no lock file $LOCK (the versions with one: $(cd "$HERE" && ls "$ENGINE"-*.txt 2>/dev/null | tr '\n' ' '))" >&2; exit 2; }
CACHE=${SFL_PARITY_CACHE:-/var/cache/sparkfleet/parity}
PYTHON=${PYTHON:-python3}
KEY=$({ cat "$LOCK"; "$PYTHON" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)
VENV=$CACHE/$ENGINE-$KEY

if [[ ! -x $VENV/bin/python ]]; then
  mkdir -p "$CACHE"
  # Built beside its final place and moved in whole: an interrupted build leaves no half venv.
  BUILD=$(mktemp -d "$CACHE/.build-$ENGINE-XXXXXX")
  trap 'rm -rf "$BUILD"' EXIT
  start=$(date +%s)
  echo "venv.sh: building the $ENGINE $VERSION parity virtualenv from $LOCK (once per lock file)" >&2
  "$PYTHON" -m venv "$BUILD" 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv && "$PYTHON" -m venv "$BUILD"; }
  "$BUILD/bin/pip" install -q --disable-pip-version-check --no-deps -r "$LOCK" 2> >(grep -v '^WARNING: Location' >&2)
  "$BUILD/bin/python" -c "import $ENGINE" >/dev/null 2>&1 || { echo "venv.sh: $ENGINE does not import in the built venv" >&2; exit 1; }
  built=$("$BUILD/bin/python" -c "import importlib.metadata as m; print(m.version('$ENGINE'))")
  [[ $built == "$VERSION" ]] || { echo "venv.sh: $LOCK installs $ENGINE $built, not $VERSION" >&2; exit 1; }
  rm -rf "$VENV"
  mv "$BUILD" "$VENV"
  trap - EXIT
  echo "venv.sh: $ENGINE $VERSION virtualenv built in $(( $(date +%s) - start )) s at $VENV" >&2
fi
printf '%s\n' "$VENV/bin/python"
