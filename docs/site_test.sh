#!/usr/bin/env bash
# The site was built (Doxygen warnings fail that build). Check that the pages exist and hold their code.
set -euo pipefail
site=$1
fail=0
need() { [[ -e $site/$1 ]] || { echo "missing page: $1"; fail=1; }; }
need index.html
lesson1=$site/lesson1.html  # the page id {#lesson1} names the file
need lesson1.html
if [[ -e $lesson1 ]]; then
  grep -q "Lesson 1 — Mixed precision" "$lesson1" || { echo "lesson1.html has not the lesson's title"; fail=1; }
  for snippet in "underflow_fraction" "AutocastGuard::AutocastGuard" "GradScaler::unscale_" "train_step("; do
    grep -q "$snippet" "$lesson1" || { echo "$lesson1 lacks the snippet containing '$snippet'"; fail=1; }
  done
fi
echo "$(( fail == 0 ? 1 : 0 )) passed, $fail failed"
exit $fail
