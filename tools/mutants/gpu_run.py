"""Mutants of the GPU run's tooling (tools/gpu_check.sh, tools/gpu_log.py, the GPU-case count in tests/main.cc):
each is a way the prepared GPU run could pass or go on when it must stop. //tools:gpu_log_test must catch them.

(name, file, old, new, what the bug is), as in the lessons' modules; TARGET names the checks that run.
"""

TARGET = "//tools:gpu_log_test"
CHECK_SH = "tools/gpu_check.sh"
LOG_PY = "tools/gpu_log.py"

MUTANTS = [
    ("gpu_goes_on_after_failed_checks", CHECK_SH,
     '[[ ${KEEP_GOING:-0} == 1 ]] || fail "the checks did not pass',
     '[[ ${KEEP_GOING:-1} == 1 ]] || fail "the checks did not pass',
     "failed checks do not stop the run: it goes on to the demos for ten more minutes"),
    ("gpu_build_failure_ignored", CHECK_SH,
     '    fail "the build failed (the first errors are above; all of it is in tests.log)"',
     '    say "the build failed (the first errors are above; all of it is in tests.log)"',
     "a failed build is reported and the run goes on"),
    ("gpu_no_version_check", CHECK_SH,
     '[[ -n $bazel_version ]] || fail',
     '[[ -n $bazel_version ]] || say',
     "a Bazel that prints no version (does not start) is not noticed"),
    ("gpu_skips_allowed", LOG_PY,
     "        if skipped:\n",
     "        if skipped and kind == \"cpu\":\n",
     "GPU cases skipped on the GPU machine pass"),
    ("gpu_summary_optional", LOG_PY,
     "    if summary is None:\n        reasons.append(",
     "    if summary is None and False:\n        reasons.append(",
     "a log without Bazel's test summary (a build that stopped) passes"),
    ("gpu_failed_cases_ignored", LOG_PY,
     "        if failed:\n            reasons.append(\"%d GPU case(s) failed\" % failed)",
     "        if failed and False:\n            reasons.append(\"%d GPU case(s) failed\" % failed)",
     "GPU cases that failed pass when Bazel's own summary passed"),
    ("gpu_count_misses_failures", "tests/main.cc",
     "    if (g_in_gpu_case && !stats.testCaseSuccess) ++g_gpu_failed;",
     "    (void)stats;",
     "the count of GPU cases run never counts a failure"),
]
