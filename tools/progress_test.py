#!/usr/bin/env python3
"""Checks //:progress (tools/progress.py) from the runfiles, where the lessons are the pristine skeletons.

  progress_test.py PROGRESS_PY LESSONS_JSON

1. With the prebuilt learner test binaries: every lesson reports step 1 as the next step, with the file:line
   of a TODO(lessonN, step 1) marker, the first failing check and a hint from the lesson page.
2. With a stand-in `bazel` whose build of the last lesson fails with a compiler error: that lesson is reported as
   not compiling (with the error's file:line), the others are still checked, and the tool exits 0.
3. A subcase's exception is reported by its real message.
4. With stand-in test binaries where every check passes and one GPU check is skipped, on the pristine skeleton of
   the last lesson (its TODOs all there): not "done", the TODOs left and the skipped check are named.
5. Stand-in binaries of a lesson with going-further steps whose core steps pass and the first going-further step
   fails: "core done", the going-further step next, its one command (its own check binary).
6. --step=K builds and runs only that step's check binary (a lesson with one binary per step) and prints the same
   one command; for every lesson and step, the command printed is the one the page's own binary naming gives.
"""
import json
import os
import re
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from expectations import Expectations  # noqa: E402

progress, lessons_json = sys.argv[1:3]
lessons = [l for l in json.load(open(lessons_json))]
root = os.getcwd()  # the runfiles root: lesson sources and test binaries
checks = Expectations(quiet=True)
check = checks.expect


def blocks(output):
    """{lesson number: its part of the report}."""
    parts = re.split(r"^Lesson (\d+) — ", output, flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def run(args):
    result = subprocess.run([sys.executable, progress, "--lessons", lessons_json, "--root", root] + args,
                            capture_output=True, text=True, timeout=3000)
    print(result.stdout)
    print(result.stderr, file=sys.stderr)
    check(result.returncode == 0, "progress exited %d" % result.returncode)
    return result.stdout


# 1. The pristine skeletons.
report = blocks(run(["--binaries", root]))
for lesson in lessons:
    n, block = lesson["number"], report.get(lesson["number"], "")
    check(bool(block), "no report for lesson %d" % n)
    check(re.search(r"^  step 1 +core +failing", block, re.M) is not None, "lesson %d: step 1 is not failing (a core step)" % n)
    check("  next: step 1 " in block, "lesson %d: the next step is not step 1" % n)
    check(re.search(r"TODO at %s/\w+\.cc:\d+" % lesson["dir"], block) is not None,
          "lesson %d: no file:line of the step 1 TODO" % n)
    check("TODO(lesson%d, step 1)" % n in block, "lesson %d: the TODO's text is missing" % n)
    check("first failing check: [step1]" in block, "lesson %d: no first failing check of step 1" % n)
    check("    hint: " in block, "lesson %d: no hint for step 1" % n)
    check("Summary: " in report.get(lessons[-1]["number"], ""), "no summary line")

# 2. A lesson that does not compile.
broken = lessons[-1]
fake = os.path.join(os.environ.get("TEST_TMPDIR", tempfile.mkdtemp()), "fake_bazel.sh")
with open(fake, "w") as f:
    f.write("""#!/bin/sh
if [ "$1" = info ]; then echo "%(root)s"; exit 0; fi
case "$*" in
  *//%(dir)s:*) echo "ERROR: %(dir)s/BUILD:1:1: Compiling %(dir)s/broken.cc failed" >&2
                echo "%(dir)s/broken.cc:12:5: error: expected ';' before '}' token" >&2
                echo "FAILED: Build did NOT complete successfully" >&2; exit 1;;
esac
exit 0
""" % {"root": root, "dir": broken["dir"]})
os.chmod(fake, os.stat(fake).st_mode | stat.S_IEXEC)
output = run(["--bazel", fake])
report = blocks(output)
check("does not compile" in report.get(broken["number"], ""), "lesson %d: not reported as not compiling" % broken["number"])
check("%s/broken.cc:12:5: error: expected ';'" % broken["dir"] in report.get(broken["number"], ""),
      "lesson %d: the compiler's error is not shown" % broken["number"])
for lesson in lessons[:-1]:
    check("  next: step 1 " in report.get(lesson["number"], ""),
          "lesson %d is not checked when lesson %d does not compile" % (lesson["number"], broken["number"]))
check("lesson %d: does not compile" % broken["number"] in output, "the summary does not say it")

# 3. An exception that leaves a SUBCASE: doctest's XML holds a placeholder inside the subcase and the real
# message at the test case's end; progress reports the real one (the innermost TODO) and the subcase.
sys.path.insert(0, os.path.dirname(os.path.abspath(progress)))
import progress as progress_module  # noqa: E402
import xml.etree.ElementTree as ET  # noqa: E402

case = ET.fromstring("""<TestCase name="[step4] misuse" filename="t.cc" line="3">
  <SubCase name="before scale()" filename="t.cc" line="4"></SubCase>
  <SubCase name="after step()" filename="t.cc" line="8">
    <Exception crash="false">exception thrown in subcase - will translate later when the whole test case has
      been exited (cannot translate while there is an active exception)</Exception>
  </SubCase>
  <Exception crash="false">TODO(lesson1, step 5): GradScaler::step() is not implemented yet</Exception>
  <OverallResultsAsserts successes="1" failures="0" test_case_success="false"/>
</TestCase>""")
where, message = progress_module.first_failure(case, "t.cc:3")
check("TODO(lesson1, step 5)" in message and "will translate later" not in message,
      "a subcase's exception is reported as %r, not as the TODO that threw" % message)
check('"after step()"' in message, "the subcase is not named: %r" % message)

# 4. Every check that ran passes, one was skipped, and the learner's files still have their TODOs (lesson 6 on a
# machine without a GPU before issue 27: "done" while fused_adamw_cuda.cu had every TODO).
last = lessons[-1]
fake_bin = os.path.join(os.environ.get("TEST_TMPDIR", tempfile.mkdtemp()), "fake_binaries")
os.makedirs(os.path.join(fake_bin, last["dir"]), exist_ok=True)
steps = sorted(s.number for s in progress_module.conventions.read_steps(os.path.join(root, last["dir"], "README.md")))
cases = "".join('<TestCase name="[step%d] passes" filename="t.cc" line="%d"><OverallResultsAsserts successes="1" '
                'failures="0" test_case_success="true"/></TestCase>' % (k, k) for k in steps)
skipped = '<TestCase name="[step%d] CUDA: a GPU case" filename="t.cc" line="99" skipped="true"/>' % steps[-1]
for i, test in enumerate(last["tests"]):  # one skipped case in all, in the first check target (a lesson may have several)
    path = os.path.join(fake_bin, last["dir"], test)
    with open(path, "w") as f:
        f.write("#!/bin/sh\ncat <<'EOF'\n<?xml version=\"1.0\"?>\n<doctest>%s</doctest>\nEOF\n" %
                (cases + (skipped if i == 0 else "")))
    os.chmod(path, 0o755)
output = run(["--binaries", fake_bin, "--lesson=%d" % last["number"]])
check("lesson %d: done" % last["number"] not in output, "a lesson with every TODO left is reported done")
check(re.search(r"lesson %d: checks pass, \d+ TODO\(s\) left, 1 check\(s\) not run here" % last["number"], output)
      is not None, "the summary does not name the TODOs left and the check not run")
check(re.search(r"^    %s/\w+\.(cc|cu):\d+  TODO\(lesson%d, step \d+\)" % (last["dir"], last["number"]), output, re.M)
      is not None, "the TODOs left are not listed with file:line")
check("[step%d] CUDA: a GPU case (t.cc:99)" % steps[-1] in output, "the skipped check is not named")

# 5. Core done: the core steps pass, the first going-further step fails.
further = [l for l in lessons if l.get("core") and len(l["core"]) < len(
    progress_module.conventions.read_steps(os.path.join(root, l["dir"], "README.md")))]
check(bool(further), "no lesson has going-further steps (the manifest's core)")
if further:
    lesson = further[-1]
    steps = sorted(s.number for s in progress_module.conventions.read_steps(
        os.path.join(root, lesson["dir"], "README.md")))
    first_further = min(k for k in steps if k not in lesson["core"])
    fake_bin = os.path.join(os.environ.get("TEST_TMPDIR", tempfile.mkdtemp()), "fake_core")
    os.makedirs(os.path.join(fake_bin, lesson["dir"]), exist_ok=True)
    for test in lesson["tests"]:
        m = re.search(r"_step(\d+)_test$", test)
        mine = [int(m.group(1))] if m else steps
        body = "".join(
            '<TestCase name="[step%d] a check" filename="t.cc" line="%d"><OverallResultsAsserts successes="1" '
            'failures="%d" test_case_success="%s"/></TestCase>' % (
                k, k, 0 if k in lesson["core"] else 1, "true" if k in lesson["core"] else "false") for k in mine)
        path = os.path.join(fake_bin, lesson["dir"], test)
        with open(path, "w") as f:
            f.write("#!/bin/sh\ncat <<'EOF'\n<?xml version=\"1.0\"?>\n<doctest>%s</doctest>\nEOF\n" % body)
        os.chmod(path, 0o755)
    output = run(["--binaries", fake_bin, "--lesson=%d" % lesson["number"]])
    check("  core done: steps %s pass" % ", ".join(str(c) for c in lesson["core"]) in output,
          "lesson %d: core steps pass but 'core done' is not said" % lesson["number"])
    check("lesson %d: core done; step %d of %d (going further) next" % (lesson["number"], first_further, len(steps))
          in output, "lesson %d: the summary does not say core done and the going-further step next"
          % lesson["number"])
    check(re.search(r"^  step %d +further +failing" % first_further, output, re.M) is not None,
          "the going-further step is not marked as such")
    own = progress_module.step_target(lesson, first_further)
    if own:
        check("checks of this step: bazel test //%s:%s\n" % (lesson["dir"], own) in output,
              "the going-further step's command is not its own binary")

# 6. --step=K: only that step's binary runs (a stand-in for every other binary would fail if run).
per_step = [l for l in lessons if progress_module.step_target(l, 1)]
check(bool(per_step), "no lesson has one check binary per step")
if per_step:
    lesson = per_step[-1]
    fake_bin = os.path.join(os.environ.get("TEST_TMPDIR", tempfile.mkdtemp()), "fake_step")
    os.makedirs(os.path.join(fake_bin, lesson["dir"]), exist_ok=True)
    for test in lesson["tests"]:
        path = os.path.join(fake_bin, lesson["dir"], test)
        with open(path, "w") as f:
            if test == progress_module.step_target(lesson, 2):
                f.write("#!/bin/sh\ncat <<'EOF'\n<?xml version=\"1.0\"?>\n<doctest><TestCase name=\"[step2] a check\" "
                        "filename=\"t.cc\" line=\"2\"><OverallResultsAsserts successes=\"1\" failures=\"0\" "
                        "test_case_success=\"true\"/></TestCase></doctest>\nEOF\n")
            else:
                f.write("#!/bin/sh\necho 'ran %s, which --step=2 must not run' >&2; exit 3\n" % test)
        os.chmod(path, 0o755)
    output = run(["--binaries", fake_bin, "--lesson=%d" % lesson["number"], "--step=2"])
    check("lesson %d: step 2 passes" % lesson["number"] in output, "--step=2 does not report step 2 passing")
    check("which --step=2 must not run" not in output and "crashed" not in output,
          "--step=2 ran another step's binary")
    check("checks of this step: bazel test //%s:%s" % (lesson["dir"], progress_module.step_target(lesson, 2))
          in output, "--step=2 does not print the step's one command")
for lesson in lessons:
    for k in lesson.get("core") or []:
        command = progress_module.step_command(lesson, k)
        check(command.startswith("bazel test //%s:" % lesson["dir"]), "lesson %d step %d: %s" % (
            lesson["number"], k, command))

checks.finish()
