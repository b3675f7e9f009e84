#!/usr/bin/env python3
"""Your progress through the workshop: runs each lesson's checks against YOUR code and says what is next.

  bazel run //:progress                           # every lesson
  bazel run //:progress -- --lesson=2             # one lesson
  bazel run //:progress -- --lesson=7 --step=3    # one step: builds and runs only that step's check binary

Per lesson and step: passed / failing (GPU-only checks count as skipped on a machine without CUDA), and which
steps are the core (one workshop slot; the manifest's `core`) and which go further. A lesson is "core done" when
its core steps pass, "done" when every step does and no TODO is left. For the first failing step: where its TODO
is (file:line), the first failing check and its message, the hint for that step from the lesson page's "Hints"
section, and the one command that runs that step's checks alone (the same command the page and the TODO give). A lesson whose code does not compile is reported with the compiler's
first errors; the other lessons are still checked.

Under `bazel run` it builds each lesson's checks with `bazel build` in your workspace (one lesson at a time, so
one broken lesson does not stop the others) and runs the test binaries itself. The maintainers' test gives
--binaries (prebuilt test binaries) instead.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conventions  # noqa: E402  (step headings, [stepK] tags, TODO markers, hints)

COMPILER_ERROR = re.compile(r"^([^\s:]+\.(?:cc|h|cpp|hpp)):(\d+):(?:(\d+):)? (?:fatal )?error: (.*)$")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def with_heartbeat(message, function):
    """Runs function(); prints `message ... N s` every 15 s while it runs."""
    done, start = threading.Event(), time.time()

    def beat():
        while not done.wait(15):
            print("    ... %s, %.0f s" % (message, time.time() - start), flush=True)

    threading.Thread(target=beat, daemon=True).start()
    try:
        return function()
    finally:
        done.set()


def step_target(lesson, step):
    """The check target that holds only step K's checks (`..._stepK_test`), or None (a target shared by steps)."""
    mine = [t for t in lesson["tests"] if re.search(r"_step%d_test$" % step, t)]
    return mine[0] if len(mine) == 1 else None


def step_command(lesson, step, targets_of_step=()):
    """The one command that runs step K's checks, building only what holds them."""
    own = step_target(lesson, step)
    if own:
        return "bazel test //%s:%s" % (lesson["dir"], own)
    targets = sorted(set(targets_of_step)) or lesson["tests"]
    where = "//%s:%s" % (lesson["dir"], targets[0]) if len(targets) == 1 else "//%s:all" % lesson["dir"]
    return "bazel test %s --test_arg=--test-case='*step%d*'" % (where, step)


def tests_to_run(lesson, step):
    """The check targets to build and run: all of the lesson's, or with --step only the step's own target."""
    if step is None:
        return list(lesson["tests"])
    own = step_target(lesson, step)
    return [own] if own else list(lesson["tests"])


def core_of(lesson):
    """The lesson's core steps (manifest `core`; a lesson without it: every step is core)."""
    return set(lesson.get("core") or [])


def build(bazel, root, lesson, tests=None):
    """Builds the lesson's checks; returns (ok, [compiler error lines], bazel's output tail)."""
    targets = ["//%s:%s" % (lesson["dir"], t) for t in (tests or lesson["tests"])]
    print("  building %s ..." % " ".join(targets), flush=True)
    result = with_heartbeat("building lesson %d" % lesson["number"], lambda: subprocess.run(
        [bazel, "build", "--keep_going", "--color=no", "--curses=no"] + targets, cwd=root,
        capture_output=True, text=True))
    output = result.stdout + result.stderr
    errors = []
    for line in output.splitlines():
        m = COMPILER_ERROR.match(line.strip())
        if m and line.strip() not in errors:
            errors.append(line.strip())
    return result.returncode == 0, errors, output.strip().splitlines()[-8:]


def bazel_bin(bazel, root):
    result = subprocess.run([bazel, "info", "bazel-bin"], cwd=root, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("progress: `bazel info bazel-bin` failed:\n" + result.stderr)
    return result.stdout.strip()


def run_checks(binary, root):
    """[(name, outcome, where, message)] for each test case of a doctest binary."""
    env = dict(os.environ)
    env.setdefault("TEST_TMPDIR", tempfile.mkdtemp(prefix="progress-"))
    try:
        result = subprocess.run([binary, "--reporters=xml", "--no-version"], cwd=root, capture_output=True,
                                text=True, timeout=1800, env=env)
    except subprocess.TimeoutExpired:
        return None, "%s did not finish within 30 minutes" % binary
    text = result.stdout
    try:
        tree = ET.fromstring(text[text.index("<?xml"):] if "<?xml" in text else text)
    except (ET.ParseError, ValueError):
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        return None, "%s crashed (exit %d): %s" % (os.path.basename(binary), result.returncode, " / ".join(tail))
    cases = []
    for case in tree.iter("TestCase"):
        name = case.get("name")
        where = "%s:%s" % (case.get("filename"), case.get("line"))
        if case.get("skipped") == "true":
            cases.append((name, "skipped", where, ""))
            continue
        overall = case.find("OverallResultsAsserts")
        ok = overall is not None and overall.get("test_case_success") == "true"
        message = ""
        if not ok:
            where, message = first_failure(case, where)
        cases.append((name, "passed" if ok else "failed", where, message))
    return cases, None


PLACEHOLDER = "will translate later"  # doctest's note for an exception thrown inside a SUBCASE


def first_failure(case, where):
    """(file:line, message) that best explains why a doctest <TestCase> failed.

    Candidates in document order: failed assertions (with the exception they caught, if any) and exceptions
    that escaped the test case. doctest reports an exception that leaves a SUBCASE twice: inside the subcase as
    a placeholder ("will translate later") and at the test case's end with the real message; the placeholder is
    skipped. A message naming a TODO wins (the innermost unimplemented code is what to do next); otherwise
    the first candidate.
    """
    candidates, thrown_in = [], [""]  # thrown_in: the subcase an exception left, from doctest's placeholder

    def visit(node, subcase):
        for child in node:
            if child.tag == "SubCase":
                visit(child, (subcase + " / " if subcase else "") + (child.get("name") or ""))
            elif child.tag == "Expression" and child.get("success") == "false":
                detail = child.find("Exception")
                if detail is None:
                    detail = child.find("Expanded")
                if detail is None:
                    detail = child.find("Original")
                text = " ".join((detail.text or "").split()) if detail is not None else ""
                candidates.append(("%s:%s" % (child.get("filename"), child.get("line")), text, subcase))
            elif child.tag == "Exception" and PLACEHOLDER in (child.text or ""):
                thrown_in[0] = subcase
            elif child.tag == "Exception":
                candidates.append((where, "threw: " + " ".join((child.text or "").split()), subcase or thrown_in[0]))

    visit(case, "")
    if not candidates:
        return where, ""
    todo = [c for c in candidates if "TODO(" in c[1]]
    place, text, subcase = (todo or candidates)[0]
    if subcase:
        text = "in subcase \"%s\": %s" % (subcase, text)
    return place, text


def steps_of(lesson, root):
    """{K: title} of the lesson page's steps (ConventionError for a malformed step heading)."""
    return {s.number: s.title for s in conventions.read_steps(os.path.join(root, lesson["dir"], "README.md"))}


def todos(lesson, root, step=None):
    """[(file:line, text)] of the TODO(lessonN, step K) markers in the learner's files (every step's: step=None)."""
    found = []
    marker = "TODO(lesson%d, step %s)" % (lesson["number"], step if step is not None else "")
    folder = os.path.join(root, lesson["dir"])
    for name in sorted(os.listdir(folder)):
        if not name.endswith(conventions.SOURCE_SUFFIXES) or name.endswith("_test.cc") or name == "demo.cc":
            continue
        path = os.path.join(folder, name)
        lines = read(path).splitlines()
        for number, k in conventions.todos("\n".join(lines), lesson["number"], path):
            line = lines[number - 1]
            if step is None:
                mine = marker[:-1] in line
            else:
                mine = k == step and marker in line
            if mine and line.strip().startswith("//"):  # the comment, not the TORCH_CHECK
                text = line.strip().lstrip("/ ")
                nxt = lines[number].strip() if number < len(lines) else ""
                if nxt.startswith("//") and "TODO(" not in nxt and not re.match(r"^// \[\w+\]$", nxt):
                    text += " " + nxt.lstrip("/ ")  # a TODO is two lines at most: the second says its size
                found.append(("%s/%s:%d" % (lesson["dir"], name, number), text))
    return found


def hints(lesson, root, step):
    """The bullets starting '- Step K:' of the README's Hints section (with their continuation lines)."""
    return conventions.hints(read(os.path.join(root, lesson["dir"], "README.md"))).get(step, [])


def explain_failing(lesson, root, k, failing):
    """What to do about failing step K: its TODO (file:line and text), the first failing check, the hints."""
    n = lesson["number"]
    markers = todos(lesson, root, k)
    if markers:
        print("    TODO at %s" % markers[0][0])
        print("      %s" % markers[0][1])
        if len(markers) > 1:
            print("    (%d more TODO(lesson%d, step %d) markers: %s)" % (
                len(markers) - 1, n, k, ", ".join(m[0] for m in markers[1:])))
    else:
        print("    no TODO(lesson%d, step %d) left; the checks still fail:" % (n, k))
    name, _, where, message = failing[0]
    print("    first failing check: %s (%s)" % (name, where))
    if message:
        print("      %s" % message[:300])
    for hint in hints(lesson, root, k):
        print("    hint: %s" % hint)


def report(lesson, root, binaries, only_step=None):
    n = lesson["number"]
    steps = steps_of(lesson, root)
    core = core_of(lesson) or set(steps)
    cases, problems, targets_of = [], [], {}
    for test in tests_to_run(lesson, only_step):
        path = os.path.join(binaries, lesson["dir"], test)
        if not os.path.exists(path):
            problems.append("%s was not built" % test)
            continue
        result, problem = with_heartbeat("running %s" % test, lambda: run_checks(path, root))
        if problem:
            problems.append(problem)
        else:
            cases += result
            for case in result:
                targets_of.setdefault(conventions.test_step(case[0]) or 0, set()).add(test)
    if only_step is not None:
        return report_step(lesson, root, steps, cases, problems, only_step, targets_of)
    by_step = {k: [] for k in steps}
    for case in cases:
        by_step.setdefault(conventions.test_step(case[0]) or 0, []).append(case)
    first_failing = None
    core_failing = False
    for k in sorted(by_step):
        mine = by_step[k]
        passed = sum(1 for c in mine if c[1] == "passed")
        failed = sum(1 for c in mine if c[1] == "failed")
        skipped = sum(1 for c in mine if c[1] == "skipped")
        if failed:
            status = "failing"
            if first_failing is None:
                first_failing = k
            core_failing = core_failing or k in core or k == 0
        elif passed:
            status = "passed"
        else:
            status = "no checks ran"
        if not passed + failed + skipped:
            core_failing = core_failing or k in core
        title = steps.get(k, "checks without a step tag" if k == 0 else "")
        kind = "" if k == 0 else ("core " if k in core else "further ")
        print("  step %-2d %-8s %-8s%2d/%-2d checks pass%s   %s" % (
            k, kind, status, passed, passed + failed, ", %d skipped (GPU)" % skipped if skipped else "", title))
    for problem in problems:
        print("  problem: " + problem)
    if first_failing is None:
        if problems:
            return "lesson %d: could not run every check" % n
        # Passing checks are not the whole story: a check skipped here (a GPU case on a machine without CUDA) did
        # not look at the code it is for, and a TODO marker left means code that no check here reached.
        skipped = [c for c in cases if c[1] == "skipped"]
        left = todos(lesson, root)
        if skipped:
            print("  not checked here: %d check(s) skipped (they need a CUDA device):" % len(skipped))
            for name, _, where, _ in skipped[:5]:
                print("    - %s (%s)" % (name, where))
            if len(skipped) > 5:
                print("    - ... and %d more" % (len(skipped) - 5))
        if left:
            print("  %d TODO(lesson%d, ...) marker(s) left in your files, code no check here has looked at:"
                  % (len(left), n))
            for where, text in left[:5]:
                print("    %s  %s" % (where, text[:100]))
            if len(left) > 5:
                print("    ... and %d more" % (len(left) - 5))
            print("  every check that ran passes, but the lesson is not done: do those TODOs (a GPU machine runs "
                  "the skipped checks: README, \"The GPU run\")" if skipped else
                  "  every check passes, but the lesson is not done: do those TODOs")
            return "lesson %d: checks pass, %d TODO(s) left%s" % (
                n, len(left), ", %d check(s) not run here" % len(skipped) if skipped else "")
        print("  all %d steps pass. Run your demo: bazel run //%s:my_demo -- --quick" % (len(steps), lesson["dir"]))
        if skipped:
            return "lesson %d: done on this machine (%d GPU check(s) not run here)" % (n, len(skipped))
        return "lesson %d: done" % n
    k = first_failing
    core_done = not core_failing and not problems and core != set(steps)
    if core_done:
        print("  core done: steps %s pass (the workshop slot's part). Going further:" % ", ".join(
            str(c) for c in sorted(core)))
    print("  next: step %d — %s" % (k, steps.get(k, "")))
    explain_failing(lesson, root, k, [c for c in by_step[k] if c[1] == "failed"])
    print("    checks of this step: %s" % step_command(lesson, k, targets_of.get(k, ())))
    if core_done:
        return "lesson %d: core done; step %d of %d (going further) next" % (n, k, len(steps))
    return "lesson %d: step %d of %d next" % (n, k, len(steps))


def report_step(lesson, root, steps, cases, problems, k, targets_of):
    """--step=K: that step's checks only."""
    n = lesson["number"]
    if k not in steps:
        return "lesson %d has no step %d (steps %s)" % (n, k, ", ".join(str(s) for s in sorted(steps)))
    mine = [c for c in cases if conventions.test_step(c[0]) == k]
    passed = sum(1 for c in mine if c[1] == "passed")
    failing = [c for c in mine if c[1] == "failed"]
    skipped = sum(1 for c in mine if c[1] == "skipped")
    kind = "core" if k in (core_of(lesson) or set(steps)) else "going further"
    print("  step %d (%s) — %s: %d/%d checks pass%s" % (k, kind, steps[k], passed, passed + len(failing),
                                                      ", %d skipped (GPU)" % skipped if skipped else ""))
    for problem in problems:
        print("  problem: " + problem)
    if failing:
        explain_failing(lesson, root, k, failing)
    print("    checks of this step: %s" % step_command(lesson, k, targets_of.get(k, ())))
    if failing or problems or not passed:
        return "lesson %d: step %d failing" % (n, k)
    return "lesson %d: step %d passes" % (n, k)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lessons", required=True, help=argparse.SUPPRESS)
    parser.add_argument("--lesson", type=int, help="only this lesson")
    parser.add_argument("--step", type=int, help="only this step of --lesson (builds only its check binary)")
    parser.add_argument("--root", help="the workspace (default: where `bazel run` was started from)")
    parser.add_argument("--bazel", default=os.environ.get("BAZEL", "bazel"), help="the bazel to build with")
    parser.add_argument("--binaries", help="prebuilt test binaries under DIR/<lesson dir>/<test> (no build)")
    args = parser.parse_args()

    lessons = [l for l in json.load(open(args.lessons))]
    if args.lesson is not None:
        lessons = [l for l in lessons if l["number"] == args.lesson]
        if not lessons:
            sys.exit("progress: no lesson %d (tools/lessons.bzl)" % args.lesson)
    if args.step is not None and args.lesson is None:
        sys.exit("progress: --step needs --lesson (e.g. --lesson=7 --step=3)")
    root = os.path.abspath(args.root or os.environ.get("BUILD_WORKSPACE_DIRECTORY") or os.getcwd())
    binaries = os.path.abspath(args.binaries) if args.binaries else None

    try:
        for lesson in lessons:
            steps_of(lesson, root)
    except conventions.ConventionError as error:
        sys.exit("progress: %s" % error)
    print("Your progress (checks against YOUR code in %s)\n" % root, flush=True)
    verdicts = []
    for lesson in lessons:
        print("Lesson %d — %s (%s/)" % (lesson["number"], lesson["title"], lesson["dir"]), flush=True)
        if binaries is None:
            ok, errors, tail = build(args.bazel, root, lesson, tests_to_run(lesson, args.step))
            if not ok:
                print("  does not compile yet:")
                for line in (errors[:5] or tail):
                    print("    " + line)
                print("  fix the first error, then run this again (bazel build //%s:all shows everything)"
                      % lesson["dir"])
                verdicts.append("lesson %d: does not compile" % lesson["number"])
                print(flush=True)
                continue
            binaries_here = bazel_bin(args.bazel, root)
        else:
            binaries_here = binaries
        verdicts.append(report(lesson, root, binaries_here, args.step))
        print(flush=True)
    print("Summary: " + "; ".join(verdicts))


if __name__ == "__main__":
    main()
