#!/usr/bin/env python3
"""Maintainer checks of the exercise invariants, run as a test (//tests:lessonN_invariants_test).

For every lesson given as --lesson N DIR SOLUTION_DIR TEST_BINARY...:
  * the lesson's README lists steps ("Step K" headings); the checks' test cases carry matching "[stepK]" tags
    and every test case has one;
  * against the pristine skeleton, every test case of every step FAILS (a GPU case may be skipped where there
    is no GPU): a check that passes against the skeleton cannot tell a learner anything;
  * the skeleton's sources hold a "TODO(lessonN, step K)" marker for every step, and no solution source holds
    any "TODO(lesson" marker;
  * every message substring a check requires (CHECK_THROWS_WITH*(..., Contains("..."))) is announced to the
    learner: it appears in the lesson's headers or skeleton sources (a doc comment or a TODO), so nobody has to
    guess the wording. Numbers in it stand for values the message reports, and a substring the call itself
    spells out (a path it passes) is an echo of the input;
  * in each skeleton source the TODOs appear in step order (a learner reads the file top to bottom).
  * the functions of each skeleton source and of its solution come in the same order (a `diff` of the two
    shows only the answers).
The skeleton test binaries were built by Bazel, which is itself the check that every skeleton compiles.
The conventions (step headings, [stepK] tags, TODO markers) are parsed by tools/conventions.py.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conventions  # noqa: E402

THROWS_WITH = re.compile(r"\b(?:CHECK|REQUIRE|WARN)_THROWS_WITH(?:_AS)?(?:_MESSAGE)?\s*\(")
CONTAINS = re.compile(r'Contains\(\s*"((?:[^"\\]|\\.)*)"\s*\)')
NUMBER = re.compile(r"-?\d[\d.e+-]*")


def fail(problems, message):
    problems.append(message)
    print("  FAIL: " + message)


def run_tests(binary):
    """Returns [(name, outcome)] with outcome in {'passed', 'failed', 'skipped'} for each test case."""
    env = dict(os.environ)
    env.setdefault("TEST_TMPDIR", os.environ.get("TEST_TMPDIR", "/tmp"))
    result = subprocess.run([binary, "--reporters=xml", "--no-version"], capture_output=True, text=True,
                            timeout=1800, env=env)
    try:
        root = ET.fromstring(result.stdout[result.stdout.index("<?xml"):] if "<?xml" in result.stdout
                             else result.stdout)
    except (ET.ParseError, ValueError) as error:
        raise RuntimeError("%s: unreadable doctest XML (%s); stderr:\n%s" % (binary, error, result.stderr[-2000:]))
    cases = []
    for case in root.iter("TestCase"):
        name = case.get("name")
        if case.get("skipped") == "true":
            cases.append((name, "skipped"))
            continue
        results = case.find("OverallResultsAsserts")
        ok = results is not None and results.get("test_case_success") == "true"
        cases.append((name, "passed" if ok else "failed"))
    return cases


def sources(folder):
    return [p for p in glob.glob(os.path.join(folder, "*")) if p.endswith(conventions.SOURCE_SUFFIXES)]


def is_check_or_demo(path):
    """A check source or the demo: not the learner's code (a learner file may be called scaffold_demo.cc)."""
    return path.endswith("_test.cc") or os.path.basename(path) == "demo.cc"


def throws_with_calls(text):
    """[(line, argument text)] of every CHECK_THROWS_WITH*(...) call in `text` (strings and parentheses aware)."""
    calls = []
    for match in THROWS_WITH.finditer(text):
        i, depth = match.end(), 1
        while depth and i < len(text):
            c = text[i]
            if c == '"':
                i += 1
                while i < len(text) and text[i] != '"':
                    i += 2 if text[i] == "\\" else 1
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            i += 1
        calls.append((text.count("\n", 0, match.start()) + 1, text[match.end():i - 1]))
    return calls


def unannounced_messages(lesson_dir, test_sources):
    """[(test file:line, substring)] the checks require but no learner-visible file of the lesson mentions."""
    learner = [p for p in sources(lesson_dir) if not is_check_or_demo(p)]
    announced = "".join(open(p, encoding="utf-8").read() for p in learner)
    missing = []
    for path in test_sources:
        text = open(path, encoding="utf-8").read()
        # Messages the checks raise themselves (a segment that throws on purpose), minus the matchers.
        raised_by_test = "".join(re.findall(r'TORCH_CHECK\([^;]*;', CONTAINS.sub("", text)))
        for line, call in throws_with_calls(text):
            expression = CONTAINS.sub("", call)
            for wanted in CONTAINS.findall(call):
                if wanted in expression:
                    continue  # the message echoes an argument the call passes (a path, a name)
                if '"%s"' % wanted in raised_by_test:
                    continue  # the test's own code raises it: it passes through the lesson's code unchanged
                pieces = [p.strip() for p in NUMBER.split(wanted) if p.strip()]
                if not all(p in announced for p in pieces):
                    missing.append(("%s:%d" % (os.path.basename(path), line), wanted))
    return missing


def order_problem(skeleton, solution):
    """None if every function `skeleton` defines is defined in `solution` too, in the same order (the solution
    may add helpers of its own anywhere); otherwise what differs."""
    mine = conventions.functions(open(skeleton, encoding="utf-8").read())
    theirs = conventions.functions(open(solution, encoding="utf-8").read())
    missing = [f for f in mine if f not in theirs]
    if missing:
        return "%s defines %s, which %s does not" % (skeleton, ", ".join(missing), solution)
    shared = [f for f in theirs if f in mine]
    if shared != mine:
        return ("%s and %s define their functions in different orders (skeleton: %s; solution: %s); keep them in "
                "the same order so that a diff of the two shows only the answers"
                % (skeleton, solution, ", ".join(mine), ", ".join(shared)))
    return None


def check_lesson(number, lesson_dir, solution_dir, binaries, problems):
    print("lesson %s (%s):" % (number, lesson_dir))
    readme = os.path.join(lesson_dir, "README.md")
    if not os.path.exists(readme):
        fail(problems, "%s is missing" % readme)
        return
    try:
        steps = [s.number for s in conventions.read_steps(readme)]
    except conventions.ConventionError as error:
        fail(problems, str(error))
        return
    if not steps:
        fail(problems, "%s lists no '## Step K' headings" % readme)
    print("  steps in the prose: %s" % steps)

    # TODO markers in the skeleton, in step order within each file; none in the solution.
    found = set()
    for path in sources(lesson_dir):
        if is_check_or_demo(path):
            continue
        try:
            order = [k for _, k in conventions.todos(open(path, encoding="utf-8").read(), number, path)]
        except conventions.ConventionError as error:
            fail(problems, str(error))
            continue
        found.update(order)
        if order != sorted(order):
            fail(problems, "%s: the TODOs are not in step order (steps %s, top to bottom); a learner reads the "
                 "file from the top" % (path, order))
    for k in steps:
        if k not in found:
            fail(problems, "no 'TODO(lesson%s, step %d)' marker in the skeleton of %s" % (number, k, lesson_dir))
    for path in sources(solution_dir):
        if conventions.has_todo(open(path, encoding="utf-8").read()):
            fail(problems, "%s contains a TODO(lesson...) marker; solutions ship solved" % path)

    # Skeleton and solution read alike: the skeleton's functions, in the same order, in the solution.
    for path in sources(solution_dir):
        skeleton = os.path.join(lesson_dir, os.path.basename(path))
        if not os.path.exists(skeleton):
            continue
        problem = order_problem(skeleton, path)
        if problem:
            fail(problems, problem)

    # The wording of every required message is announced in a header or the skeleton.
    test_sources = [p for p in sources(lesson_dir) if p.endswith("_test.cc")]
    for where, wanted in unannounced_messages(lesson_dir, test_sources):
        fail(problems, '%s requires the message to contain "%s", but no header or TODO of %s says so; announce '
             "it in the doc comment of the function (or its TODO)" % (where, wanted, lesson_dir))
    print("  required message wording checked in %d test file(s)" % len(test_sources))

    # Every test case fails against the pristine skeleton.
    tagged_steps = set()
    for binary in binaries:
        for name, outcome in run_tests(binary):
            try:
                k = conventions.test_step(name)
            except conventions.ConventionError as error:
                k, name = None, "%s (%s)" % (name, error)
            if k is None:
                fail(problems, "%s: test case '%s' has no [stepK] tag" % (os.path.basename(binary), name))
                continue
            tagged_steps.add(k)
            if k not in steps:
                fail(problems, "test case '%s' names step %d, which the README does not list" % (name, k))
            if outcome == "passed":
                fail(problems, "test case '%s' PASSES against the pristine skeleton: it cannot fail" % name)
            else:
                print("  ok (%s against the skeleton): %s" % (outcome, name))
    for k in steps:
        if k not in tagged_steps:
            fail(problems, "step %d of lesson %s has no test case tagged [step%d]" % (k, number, k))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lesson", nargs="+", action="append", required=True,
                        metavar=("N DIR SOLUTION_DIR", "TEST_BINARY"))
    args = parser.parse_args()
    problems = []
    for spec in args.lesson:
        if len(spec) < 4:
            parser.error("--lesson needs N DIR SOLUTION_DIR and at least one test binary")
        check_lesson(spec[0], spec[1], spec[2], spec[3:], problems)
    total = len(problems)
    print("%d passed, %d failed" % (0 if total else 1, 1 if total else 0))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
