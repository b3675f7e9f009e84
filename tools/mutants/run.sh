#!/usr/bin/env bash
# Mutation testing of the lessons' checks (a maintainer command, not part of CI; it takes long: one Bazel
# build and one lesson's reference checks per mutant).
#
#   tools/mutants/run.sh                      # every mutant of the lessons (solutions/lessonN_*/mutants.py) and tools
#   tools/mutants/run.sh 'l1_*' l2_amp_no_zero_grad   # some of them (globs on the mutants' names)
#   tools/mutants/run.sh --gpu 'l6_gpu_*'     # the CUDA kernels' mutants: only on a machine with a GPU
#
# Each mutant is a small patch against solutions/ (a plausible bug), written at the start of the run by
# tools/mutants/mutants.py from the definitions in solutions/lessonN_*/mutants.py into a temporary folder (removed at
# the end; nothing generated is committed). A definition that no longer applies stops the run before it starts.
# For each one the runner applies it, runs `bazel test //solutions/<lesson>:all` (the lesson's reference
# checks), reverts it, and prints CAUGHT (a check failed), SURVIVED (every check passed: no check looks at
# that behaviour) or BROKEN (the mutant does not apply or does not compile: not counted). At the end: the
# score, caught / (caught + survived), and the survivors. The tree is always restored (trap on exit and on
# Ctrl-C), and the runner refuses to start when solutions/ has uncommitted changes.
# Results also go to $MUTANTS_OUT (default: .bazel/mutants/results.txt, one line per mutant); the score belongs in
# the maintainers' page of the docs (docs/maintainers.md), not in a committed log.
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=${MUTANTS_OUT:-$ROOT/.bazel/mutants/results.txt}
BAZEL=${BAZEL:-bazel}

if ! git diff --quiet -- solutions/ tools/ tests/ || [ -n "$(git status --porcelain -- solutions/ tools/ tests/)" ]; then
  echo "run.sh: solutions/, tools/ or tests/ has uncommitted changes; commit or stash them first (the runner" >&2
  echo "        restores what a mutant patched (solutions/, or the file of a tool's mutant) after every mutant" >&2
  echo "        and must not mix your edits with a mutant's)" >&2
  exit 2
fi

BACKUP=$(mktemp -d)
PATCHES="$BACKUP/patches"
python3 tools/mutants/mutants.py --out "$PATCHES" "$@" || { rm -rf "$BACKUP"; exit 2; }
cp -a solutions "$BACKUP/solutions"
restore() {
  rm -rf "$ROOT/solutions"
  cp -a "$BACKUP/solutions" "$ROOT/solutions"
}
tool_file=""  # the file of the tool's mutant being run, if any
cleanup() {
  restore
  if [ -n "$tool_file" ]; then cp "$BACKUP/tool_file" "$tool_file"; fi
  rm -rf "$BACKUP"
}
trap cleanup EXIT
trap 'echo; echo "interrupted: restoring solutions/"; exit 130' INT TERM

selected=("$PATCHES"/*.patch)
[ -f "${selected[0]}" ] || { echo "run.sh: no mutant matches" >&2; exit 2; }

mkdir -p "$(dirname "$OUT")"
: > "$OUT"
caught=0
survived=0
broken=0
survivors=()
start_all=$(date +%s)
for patch in "${selected[@]}"; do
  name=$(basename "$patch" .patch)
  why=$(sed -n 's/^Mutant: //p' "$patch" | head -1)
  lesson=$(sed -n 's|^+++ b/solutions/\([^/]*\)/.*|\1|p' "$patch" | head -1)
  # A mutant of a lesson's build file (its compiler flags, in lessonN_topic/): that lesson's reference checks.
  [ -n "$lesson" ] || lesson=$(sed -n 's|^+++ b/\(lesson[0-9]*_[^/]*\)/.*|\1|p' "$patch" | head -1)
  target=$(sed -n 's/^Target: //p' "$patch" | head -1)
  [ -n "$target" ] || target="//solutions/$lesson:all"
  file=$(sed -n 's|^+++ b/||p' "$patch" | head -1)
  # A tool's mutant (a file outside solutions/): keep that file to put it back.
  case $file in solutions/*) ;; *) cp "$file" "$BACKUP/tool_file"; tool_file=$file ;; esac
  start=$(date +%s)
  if ! patch -p1 --silent --forward --no-backup-if-mismatch -r - < "$patch" > /dev/null; then
    verdict=BROKEN
    detail="does not apply"
  else
    log=$(mktemp)
    "$BAZEL" test "$target" --test_output=errors --test_timeout=600 \
      --test_arg=--abort-after=1 > "$log" 2>&1
    rc=$?
    case $rc in
      0) verdict=SURVIVED; detail="every check passed" ;;
      3) verdict=CAUGHT
         detail=$(grep -o '//[^ ]*  *FAILED[^ ]*' "$log" | head -3 | tr -s ' ' | paste -sd, -)
         [ -n "$detail" ] || detail="a check failed" ;;
      *) verdict=BROKEN; detail="bazel exit $rc: $(grep -m1 -E 'error:|ERROR:' "$log" | cut -c1-160)" ;;
    esac
    rm -f "$log"
  fi
  restore
  if [ -n "$tool_file" ]; then cp "$BACKUP/tool_file" "$tool_file"; tool_file=""; fi
  elapsed=$(( $(date +%s) - start ))
  case $verdict in
    CAUGHT) caught=$((caught + 1)) ;;
    SURVIVED) survived=$((survived + 1)); survivors+=("$name: $why") ;;
    BROKEN) broken=$((broken + 1)) ;;
  esac
  printf '%-9s %-48s %4ss  %s\n' "$verdict" "$name" "$elapsed" "$detail" | tee -a "$OUT"
done
counted=$((caught + survived))
echo
echo "mutants: ${#selected[@]} (broken, not counted: $broken); caught $caught of $counted" \
     "($(( counted ? 100 * caught / counted : 0 )) %) in $(( $(date +%s) - start_all ))s" | tee -a "$OUT"
if [ ${#survivors[@]} -gt 0 ]; then
  echo "survivors (no check sees these bugs):" | tee -a "$OUT"
  for s in "${survivors[@]}"; do echo "  $s" | tee -a "$OUT"; done
fi
