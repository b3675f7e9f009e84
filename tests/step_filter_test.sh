#!/usr/bin/env bash
# A step filter over a lesson's several check targets (`bazel test //lesson1_amp:all --test_arg=--test-case=
# '*step3*'`): a target with no check of that step passes, saying so, where the lesson's page has the step; a step
# the page lacks, a misspelt pattern and a filter without the page fail (tests/main.cc).
#   step_filter_test.sh CHECK_BINARY PAGE     (lesson 1's autocast_test: steps 1 and 2 of the page's 7)
set -uo pipefail
binary=$1
page=$2
failures=0

expect() {  # expect STATUS MESSAGE ARGS...
  local want=$1 message=$2
  shift 2
  local out status
  out=$("$binary" "$@" 2>&1)
  status=$?
  if [[ "$want" == pass && $status -ne 0 ]] || [[ "$want" == fail && $status -eq 0 ]] ||
    ! grep -qF -- "$message" <<<"$out"; then
    echo "FAILED: $* -> exit $status, wanted $want with \"$message\""
    echo "$out" | tail -5
    failures=$((failures + 1))
  else
    echo "ok: $* -> exit $status, \"$message\""
  fi
}

expect pass "no check of this target is in the selected step(s)" "--workshop-page=$page" "--test-case=*step3*"
expect pass "no check of this target is in the selected step(s)" "--workshop-page=$page" "--test-case=*step4*,*step7*"
expect fail "the lesson has no step 9" "--workshop-page=$page" "--test-case=*step9*"
expect fail "the lesson has no step 8" "--workshop-page=$page" "--test-case=*step3*,*step8*"
expect fail "the filters select no test case" "--workshop-page=$page" "--test-case=*setp3*"
expect fail "the filters select no test case" "--test-case=*step3*"
expect fail "the lesson has no step 3" "--workshop-page=/nonexistent/README.md" "--test-case=*step3*"
expect pass "test cases" "--workshop-page=$page" "--test-case=*step1*"
exit $((failures > 0))
