#!/usr/bin/env python3
"""Checks of the GPU run's verdict, on any machine:
  - tools/gpu_log.py fails a log without Bazel's test summary, with a failed or unbuilt test, and on a GPU machine
    a log where a GPU case was skipped, failed, or none ran, or a binary saw no CUDA device; it passes clean logs;
  - tests/main.cc counts the GPU-suite cases that ran (a probe binary with one passing and one failing);
  - tools/gpu_check.sh stops at once (no demo, no bench) when Bazel does not say its version, the build fails,
    the log has no summary or a GPU case was skipped on the GPU machine, and goes through every phase on a clean
    run. A stand-in `bazel` and `nvcc` on PATH play the machine.

  gpu_log_test.py GPU_LOG_PY GPU_CHECK_SH PROBE_BINARY
"""
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap

gpu_log_py, gpu_check_sh, probe = [os.path.abspath(p) for p in sys.argv[1:4]]
sys.path.insert(0, os.path.dirname(gpu_log_py))
import gpu_log  # noqa: E402
from expectations import Expectations  # noqa: E402

checks = Expectations()
check = checks.expect


def binary_output(label, device, doctest, gpu_run=None, gpu_skipped=0):
    lines = ["==================== Test output for %s:" % label, "[workshop] LibTorch 2.11.0, " + device]
    if gpu_skipped:
        lines += ["[workshop] %d GPU case(s) SKIPPED here: no CUDA device" % gpu_skipped, "           - a case"]
    lines += ["[doctest] doctest version is \"2.4.9\""]
    if gpu_run is not None:
        lines.append("[workshop] %d GPU case(s) RUN here: %d passed, %d failed" % (gpu_run[0], gpu_run[0] - gpu_run[1],
                                                                                gpu_run[1]))
    lines += ["[doctest] test cases: %2d | %2d passed | %2d failed | %2d skipped" % doctest,
              "[doctest] Status: SUCCESS!", "=" * 80]
    return lines


def log(*binaries, summary="Executed 2 out of 2 tests: 2 tests pass.", extra=()):
    lines = ["INFO: Analyzed 40 targets (0 packages loaded, 0 targets configured)."]
    for b in binaries:
        lines += b
    lines += list(extra)
    if summary:
        lines.append(summary)
    return "\n".join(lines) + "\n"


CUDA = "CUDA devices: 1"
CPU = "CPU only"

# ---- the verdict on canned logs ---------------------------------------------------------------------------
gpu_pass = log(binary_output("//solutions/lesson1_amp:grad_scaler_test", CUDA, (30, 30, 0, 0), gpu_run=(4, 0)),
               binary_output("//tests:memory_meter_test", CUDA, (5, 5, 0, 0)))
reasons, lines = gpu_log.judge(gpu_pass, "cuda")
check(reasons == [], "a clean GPU log passes on the GPU machine (%s)" % reasons)
check("GPU cases run: 4 (failed 0); GPU cases skipped: 0" in lines, "the summary counts the GPU cases run")

cpu_pass = log(binary_output("//solutions/lesson1_amp:grad_scaler_test", CPU, (30, 26, 0, 4), gpu_skipped=4),
               binary_output("//tests:memory_meter_test", CPU, (5, 5, 0, 0)))
reasons, _ = gpu_log.judge(cpu_pass, "cpu")
check(reasons == [], "a clean CPU log with skipped GPU cases passes the CPU rehearsal (%s)" % reasons)
reasons, _ = gpu_log.judge(cpu_pass, "cuda")
check(any("SKIPPED on the GPU machine" in r for r in reasons), "skipped GPU cases fail a GPU run")
check(any("without a CUDA device" in r for r in reasons), "a binary without a CUDA device fails a GPU run")
check(any("no GPU case ran" in r for r in reasons), "a GPU run where no GPU case ran fails")

for kind in ("cpu", "cuda"):
    reasons, _ = gpu_log.judge(log(binary_output("//a:t", CUDA, (1, 1, 0, 0), gpu_run=(1, 0)), summary=None), kind)
    check(any("no Bazel test summary" in r for r in reasons), "a log without a test summary fails (%s)" % kind)
    reasons, _ = gpu_log.judge(log(binary_output("//a:t", CUDA, (2, 1, 1, 0), gpu_run=(1, 0)),
                                   summary="Executed 2 out of 2 tests: 1 test passes and 1 fails locally.",
                                   extra=["//a:t                    FAILED in 3.1s"]), kind)
    check(any("not every test passed" in r for r in reasons) and any("//a:t FAILED" in r for r in reasons),
          "a failed test fails the run (%s)" % kind)
    reasons, _ = gpu_log.judge(log(binary_output("//a:t", CUDA, (1, 1, 0, 0), gpu_run=(1, 0)),
                                   summary="Executed 1 out of 2 tests: 1 test passes and 1 fails to build."), kind)
    check(any("not every test passed" in r for r in reasons), "a test that failed to build fails (%s)" % kind)
    reasons, _ = gpu_log.judge(log(summary="Executed 0 out of 0 tests: "), kind)
    check(reasons != [], "a run of no test fails (%s)" % kind)
reasons, _ = gpu_log.judge(log(binary_output("//a:t", CUDA, (3, 2, 1, 0), gpu_run=(2, 1)),
                               summary="Executed 1 out of 1 test: 1 test passes."), "cuda")
check(any("1 GPU case(s) failed" in r for r in reasons), "a failed GPU case fails the GPU run even if Bazel passed")
colour = "\x1b[32mExecuted 1 out of 1 test: 1 test passes.\x1b[0m"
reasons, _ = gpu_log.judge(log(binary_output("//a:t", CPU, (1, 1, 0, 0)), summary=colour), "cpu")
check(reasons == [], "colour codes around the summary are read through (%s)" % reasons)

# ---- tests/main.cc counts the GPU-suite cases that ran -----------------------------------------------------
run = subprocess.run([probe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
check(run.returncode != 0, "the probe fails (one of its GPU-suite cases fails on purpose)")
check("[workshop] 2 GPU case(s) RUN here: 1 passed, 1 failed" in run.stdout.splitlines(),
      "tests/main.cc prints the GPU cases run, passed and failed:\n" + textwrap.indent(run.stdout, "    | "))
probe_log = "==================== Test output for //tests:gpu_count_probe:\n" + run.stdout + \
            "Executed 1 out of 1 test: 1 test passes.\n"
binaries, _, _ = gpu_log.parse(probe_log)
probe_binary = binaries.get("//tests:gpu_count_probe")
check(probe_binary is not None and (probe_binary.gpu_run, probe_binary.gpu_failed, probe_binary.gpu_skipped) ==
      (2, 1, 1) and probe_binary.doctest is not None, "gpu_log.py reads the probe's real output")

# ---- tools/gpu_check.sh stops at once ---------------------------------------------------------------------
FAKE_BAZEL = r"""#!/usr/bin/env bash
# A stand-in Bazel: SCENARIO picks what it does; every call is written to $CALLS.
echo "$*" >> "$CALLS"
for arg in "$@"; do
  case $arg in
    --version) [[ $SCENARIO == no_version ]] || echo "bazel 9.9.9-stand-in"; exit 0 ;;
    build) [[ $SCENARIO == build_fails ]] && { echo "ERROR: /x/BUILD:1:1: compiling failed"; exit 1; }; exit 0 ;;
    test)
      device="CPU only"; run=""; skipped=""
      if [[ $SCENARIO == gpu_pass ]]; then device="CUDA devices: 1"; run="[workshop] 3 GPU case(s) RUN here: 3 passed, 0 failed"; fi
      if [[ $SCENARIO == gpu_skipped ]]; then skipped="[workshop] 3 GPU case(s) SKIPPED here: no CUDA"; fi
      echo "==================== Test output for //solutions/x:t:"
      echo "[workshop] LibTorch 2.11.0, $device"
      [[ -n $skipped ]] && echo "$skipped"
      [[ -n $run ]] && echo "$run"
      echo "[doctest] test cases: 3 | 3 passed | 0 failed | 0 skipped"
      [[ $SCENARIO == no_summary ]] && exit 1
      echo "Executed 1 out of 1 test: 1 test passes."
      exit 0 ;;
    run) exit 0 ;;
  esac
done
exit 0
"""
FAKE_NVCC = "#!/bin/sh\necho 'nvcc: stand-in'\necho 'Cuda compilation tools, release 99.0, V99.0'\necho 'Build x'\n"


def write_program(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def gpu_check(scenario, allow_cpu, phases=None):
    """Runs a copy of gpu_check.sh with the stand-ins; returns (status, output, the stand-in Bazel's calls)."""
    work = tempfile.mkdtemp(prefix="gpu_check_test-")
    try:
        os.makedirs(os.path.join(work, "repo", "tools"))
        os.makedirs(os.path.join(work, "bin"))
        shutil.copy(gpu_check_sh, os.path.join(work, "repo", "tools", "gpu_check.sh"))
        shutil.copy(gpu_log_py, os.path.join(work, "repo", "tools", "gpu_log.py"))
        write_program(os.path.join(work, "bin", "bazel"), FAKE_BAZEL)
        write_program(os.path.join(work, "bin", "nvcc"), FAKE_NVCC)
        calls = os.path.join(work, "calls")
        open(calls, "w").close()
        env = dict(os.environ, PATH=os.path.join(work, "bin") + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
                   SCENARIO=scenario, CALLS=calls, OUT=os.path.join(work, "out"), ALLOW_CPU="1" if allow_cpu else "0",
                   BAZEL_OUTPUT_BASE=os.path.join(work, "ob"))
        env.pop("KEEP_GOING", None)
        env.pop("PHASES", None)
        if phases is not None:
            env["PHASES"] = phases
        env.pop("GPU_MUTANTS", None)
        done = subprocess.run(["bash", os.path.join(work, "repo", "tools", "gpu_check.sh")], env=env, timeout=120,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        with open(calls) as f:
            return done.returncode, done.stdout, f.read()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def runs(calls):
    """The stand-in Bazel's `run` calls (the tour, the bench), one string each."""
    return [line for line in calls.splitlines() if " run " in " %s " % line]


def ran_demos(calls):
    return bool(runs(calls))


for scenario, allow_cpu, expect in [
        ("no_version", False, "--version printed nothing"),
        ("build_fails", False, "the build failed"),
        ("no_summary", False, "the checks did not pass"),
        ("gpu_skipped", False, "the checks did not pass"),
        ("cpu_pass", False, "the checks did not pass"),  # a CPU machine is not a GPU run
]:
    status, output, calls = gpu_check(scenario, allow_cpu)
    failed_line = [line for line in output.splitlines() if "FAIL: " in line]
    check(status == 1 and len(failed_line) == 1 and expect in failed_line[0] and not ran_demos(calls),
          "gpu_check.sh stops at once with status 1 ('%s') on %s, before any demo (status %d, calls: %s)\n%s" % (
              expect, scenario, status, calls.split(), textwrap.indent(output[-1500:], "    | ")))
status, output, calls = gpu_check("gpu_pass", False)
check(status == 0 and any("//:tour" in r for r in runs(calls)) and any("//bench" in r for r in runs(calls)) and
      "bazel 9.9.9-stand-in" in output,
      "a clean GPU run goes through the tour and the bench, and names the Bazel version (status %d)\n%s" % (
          status, textwrap.indent(output[-1500:], "    | ")))
status, output, calls = gpu_check("cpu_pass", True)
check(status == 0 and all("--device=best" in r and "--quick" in r for r in runs(calls)) and len(runs(calls)) == 2,
      "the CPU rehearsal settings (ALLOW_CPU=1) pass a CPU log and run the demos with --device=best --quick "
      "(status %d)" % status)

status, output, calls = gpu_check("gpu_pass", False, phases="checks")
check(status == 0 and " test " in calls and not ran_demos(calls), "PHASES=checks builds and tests, and runs no demo")
status, output, calls = gpu_check("gpu_pass", False, phases="demos")
check(status == 0 and " test " not in calls and len(runs(calls)) == 2, "PHASES=demos runs the tour and the bench only")
status, output, calls = gpu_check("gpu_pass", False, phases="check")
check(status == 2 and not calls.strip(), "an unknown phase stops the script before Bazel starts")

checks.finish()
