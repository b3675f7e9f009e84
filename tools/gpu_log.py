#!/usr/bin/env python3
"""The verdict on the checks' log of tools/gpu_check.sh: passed, or failed with every reason.

  gpu_log.py LOG --kind=cuda|cpu [--summary FILE]

LOG is the output of `bazel test --test_output=all ...` over the repository's checks. The run passed only if:
  - Bazel printed its test summary ("Executed N out of N tests: N tests pass.", N > 0): a log without one is a
    build that stopped, a Bazel that did not start, or the wrong file;
  - no test failed, timed out, was flaky or failed to build;
  - with --kind=cuda (a GPU machine): every test binary named a CUDA device, no GPU case was skipped
    ("[workshop] N GPU case(s) SKIPPED here", printed by tests/main.cc), and GPU cases ran ("[workshop] N GPU
    case(s) RUN here: P passed, F failed") with none failed.
The summary (FILE, and standard output) has one row per test binary: its doctest counts, GPU cases run and
skipped; then the totals. Exit status: 0 passed, 1 failed.
"""
import argparse
import re
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SUMMARY = re.compile(r"^Executed (\d+) out of (\d+) tests?: (.*)$")
ALL_PASS = re.compile(r"^(\d+) tests? pass(?:es)?\.?$")
OUTPUT_FOR = re.compile(r"^=+ Test output for (//\S+):")
DOCTEST = re.compile(r"^\[doctest\] test cases:\s*(\d+) \|\s*(\d+) passed \|\s*(\d+) failed \|\s*(\d+) skipped")
DEVICE = re.compile(r"^\[workshop\] LibTorch (\S+), (.*)$")
SKIPPED = re.compile(r"^\[workshop\] (\d+) GPU case\(s\) SKIPPED here: (.*)$")
RUN = re.compile(r"^\[workshop\] (\d+) GPU case\(s\) RUN here: (\d+) passed, (\d+) failed$")
BAD_STATUS = re.compile(r"^(//\S+)\s+(FAILED|TIMEOUT|NO STATUS|FLAKY|FAILED TO BUILD|INCOMPLETE)\b")


class Binary:
    def __init__(self, label):
        self.label = label
        self.device = ""
        self.doctest = None  # (cases, passed, failed, skipped)
        self.gpu_run = 0
        self.gpu_failed = 0
        self.gpu_skipped = 0
        self.skip_reason = ""


def parse(text):
    """Returns (binaries by label, Bazel's summary line or None, labels Bazel reported as not passing)."""
    binaries = {}
    current = None
    summary = None
    bad = []
    for raw in text.splitlines():
        line = ANSI.sub("", raw).rstrip()
        match = OUTPUT_FOR.match(line)
        if match:
            current = binaries.setdefault(match.group(1), Binary(match.group(1)))
            continue
        match = SUMMARY.match(line)
        if match:
            summary = match
            continue
        match = BAD_STATUS.match(line)
        if match:
            bad.append("%s %s" % (match.group(1), match.group(2)))
            continue
        if current is None:
            continue
        # A binary's output may be printed twice (a test that is retried): the last one counts.
        match = DEVICE.match(line)
        if match:
            current.device = match.group(2)
            continue
        match = DOCTEST.match(line)
        if match:
            current.doctest = tuple(int(g) for g in match.groups())
            continue
        match = SKIPPED.match(line)
        if match:
            current.gpu_skipped, current.skip_reason = int(match.group(1)), match.group(2)
            continue
        match = RUN.match(line)
        if match:
            current.gpu_run, current.gpu_failed = int(match.group(1)), int(match.group(3))
    return binaries, summary, bad


def judge(text, kind):
    """Returns (reasons the run failed, summary lines)."""
    binaries, summary, bad = parse(text)
    reasons = []
    if summary is None:
        reasons.append("the log has no Bazel test summary ('Executed N out of N tests'): the build or Bazel "
                       "stopped before the tests ran")
    else:
        executed, total, rest = int(summary.group(1)), int(summary.group(2)), summary.group(3)
        passing = ALL_PASS.match(rest)
        if total == 0:
            reasons.append("Bazel ran no test")
        elif executed != total or not passing or int(passing.group(1)) != total:
            reasons.append("not every test passed: " + summary.group(0))
    reasons += ["Bazel reported " + b for b in bad]
    doctest_binaries = [b for b in binaries.values() if b.doctest is not None]
    if summary is not None and not doctest_binaries:
        reasons.append("no doctest binary printed its counts (was --test_output=all given?)")
    if kind == "cuda":
        for b in doctest_binaries:
            if not b.device.startswith("CUDA devices"):
                reasons.append("%s ran without a CUDA device (%s)" % (b.label, b.device or "no device line"))
        skipped = sum(b.gpu_skipped for b in binaries.values())
        if skipped:
            names = ", ".join(b.label for b in binaries.values() if b.gpu_skipped)
            reasons.append("%d GPU case(s) were SKIPPED on the GPU machine (%s)" % (skipped, names))
        if sum(b.gpu_run for b in binaries.values()) == 0:
            reasons.append("no GPU case ran")
        failed = sum(b.gpu_failed for b in binaries.values())
        if failed:
            reasons.append("%d GPU case(s) failed" % failed)

    rows = ["| test binary | device | cases | passed | failed | skipped | GPU run | GPU failed | GPU skipped |",
            "|---|---|---|---|---|---|---|---|---|"]
    for b in sorted(binaries.values(), key=lambda b: b.label):
        counts = b.doctest or ("-",) * 4
        rows.append("| %s | %s | %s | %s | %s | %s | %d | %d | %d |" % (
            (b.label, b.device or "-") + tuple(counts) + (b.gpu_run, b.gpu_failed, b.gpu_skipped)))
    totals = [sum(b.doctest[i] for b in doctest_binaries) for i in range(4)]
    rows += ["", "Bazel: " + (summary.group(0) if summary else "no test summary"),
             "doctest cases: %d, passed %d, failed %d, skipped %d" % tuple(totals),
             "GPU cases run: %d (failed %d); GPU cases skipped: %d" % (
                 sum(b.gpu_run for b in binaries.values()), sum(b.gpu_failed for b in binaries.values()),
                 sum(b.gpu_skipped for b in binaries.values()))]
    reasons_text = ["verdict: " + ("PASSED" if not reasons else "FAILED")] + ["  - " + r for r in reasons]
    return reasons, rows + reasons_text


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log")
    parser.add_argument("--kind", choices=["cuda", "cpu"], required=True)
    parser.add_argument("--summary", help="also write the summary to this file")
    args = parser.parse_args()
    with open(args.log, errors="replace") as f:
        reasons, lines = judge(f.read(), args.kind)
    text = "\n".join(lines) + "\n"
    if args.summary:
        with open(args.summary, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    sys.exit(1 if reasons else 0)


if __name__ == "__main__":
    main()
