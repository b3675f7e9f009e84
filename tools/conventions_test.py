#!/usr/bin/env python3
"""Checks tools/conventions.py, and that the four scripts that read lessons see the same conventions through it.

  conventions_test.py TOOLS_DIR DOCS_DIR      (//tools:conventions_test; from the repository root: tools docs)

1. The parsers: what each accepts, what it returns, and that each near miss is an error naming file and line.
2. The scripts: a lesson page with a `### Step 3` heading is rejected in the same words by
   tools/maintainer_check.py, tools/step_invariant.py, tools/progress.py and docs/gen_pages.py, and the same page
   with `## Step 3` gives all four the same steps.
"""
import io
import os
import sys
import tempfile
import contextlib

tools_dir, docs_dir = (os.path.abspath(p) for p in sys.argv[1:3])
sys.path.insert(0, tools_dir)
sys.path.insert(0, docs_dir)
import conventions  # noqa: E402
from conventions import ConventionError  # noqa: E402
from expectations import Expectations  # noqa: E402

checks = Expectations(quiet=True)
check = checks.expect


def raises(function, *args):
    """The ConventionError's message, or None when `function(*args)` does not raise one."""
    try:
        function(*args)
    except ConventionError as error:
        return str(error)
    return None


# 1. The parsers.
PAGE = "# Lesson 9 — x {#lesson9}\n\n## Goal\n\n## Step 1\n\n```\n### Step 7 inside a fence is code\n```\n\n" \
       "## Step 2 — Two {#lesson9_step2}\n\n## Step 3 — Three\n\n## Hints\n\n- Step 2: first\n  more\n- Step 3: x\n"
steps = conventions.steps(PAGE, "p.md")
check([s.number for s in steps] == [1, 2, 3], "steps: %s" % (steps,))
check(steps[1].title == "Two" and steps[1].anchor == "lesson9_step2" and steps[1].line == 11, "step 2: %s" % (steps[1],))
check(steps[2].title == "Three" and steps[2].anchor is None, "step 3: %s" % (steps[2],))
for bad in ["### Step 3", "#Step 3", "## Step3", "## step 3", "## Step 3: Three", "## Step three", "#### Step 3 — x"]:
    message = raises(conventions.steps, PAGE.replace("## Step 3 — Three", bad), "p.md")
    check(message is not None and message.startswith("p.md:13: ") and repr(bad) in message,
          "%r is not rejected with file:line (%s)" % (bad, message))
check(raises(conventions.steps, "## Step 1\n## Step 3\n", "p.md") is not None, "steps 1, 3 are accepted")
check(raises(conventions.steps, "## Step 2\n## Step 1\n", "p.md") is not None, "steps 2, 1 are accepted")
check(conventions.steps("## Steps ahead\n## Stepping stones\n") == [], "'## Steps ...' is taken for a step")
check(conventions.hints(PAGE) == {2: ["first more"], 3: ["x"]}, "hints: %s" % conventions.hints(PAGE))

check(conventions.test_step("[step4] a step with inf") == 4, "[step4] tag")
check(conventions.test_step("no tag") is None, "untagged name")
for bad in ["[Step4] x", "[step4]x", "[ step4] x"]:
    check(raises(conventions.test_step, bad) is not None, "test name %r is accepted" % bad)
cases = conventions.test_cases('TEST_CASE("[step1] a") {}\n  GPU_TEST_CASE("[step2] b") {}\nTEST_CASE("c") {}\n', "t.cc")
check(cases == [("[step1] a", 1, 1, False), ("[step2] b", 2, 2, True), ("c", None, 3, False)], "test_cases: %s" % cases)

SOURCE = "a\n  // TODO(lesson3, step 2): do it\n  TORCH_CHECK(false, \"TODO(lesson3, step 2): f\");\n// TODO(lesson3, step 4): g\n"
check(conventions.todos(SOURCE, 3, "s.cc") == [(2, 2), (3, 2), (4, 4)], "todos: %s" % conventions.todos(SOURCE, 3))
for bad in ["// TODO(lesson3,step 2): x", "// TODO(lesson3, Step 2): x", "// TODO(lesson 3, step 2)"]:
    message = raises(conventions.todos, "ok\n" + bad + "\n", 3, "s.cc")
    check(message is not None and message.startswith("s.cc:2: "), "TODO near miss %r: %s" % (bad, message))
check(raises(conventions.todos, "// TODO(lesson4, step 1): x\n", 3, "s.cc") is not None, "another lesson's TODO")
check(conventions.has_todo("x TODO(lesson1,step 1)") and not conventions.has_todo("// TODO: later"), "has_todo")

LINES = ["// [a]", "int f() {", "// [a]", "  // [b]", "x", "  // [b]", "// [shape, batch] is prose"]
check(conventions.markers(LINES, "m.cc") == [("a", 0, 2), ("b", 3, 5)], "markers: %s" % conventions.markers(LINES))
for bad in ["//[a]", "//  [a]", "// [a-b]"]:
    check(raises(conventions.markers, [bad], "m.cc") is not None, "marker %r is accepted" % bad)
check(raises(conventions.markers, ["// [a]", "// [b]", "// [b]", "// [a]"], "m.cc") is not None, "nested markers")
check(raises(conventions.markers, ["// [a]"], "m.cc") is not None, "unclosed marker")

CPP = """namespace ns {
namespace {
int helper(int x) { return x; }  // f() in a comment
const char* s = "g() {";
}  // namespace
struct S { int inline_member() { return 1; } };
Foo::Foo(int a) : a_(a) {}
Foo::~Foo() {}
std::vector<int> make(const std::function<void(int)>& f,
                      int n) {
  auto lambda = [](int y) { return y; };
  if (n) { return {}; }
  return {};
}
const std::vector<int> kTable = {1, 2};
}  // namespace ns
"""
check(conventions.functions(CPP) == ["helper", "Foo::Foo", "Foo::~Foo", "make"],
      "functions: %s" % conventions.functions(CPP))

# 2. The four scripts, on one lesson folder.
import maintainer_check  # noqa: E402
import progress  # noqa: E402
import step_invariant  # noqa: E402
import gen_pages  # noqa: E402

root = tempfile.mkdtemp(prefix="conventions-test-")
os.makedirs(os.path.join(root, "lesson9_x"))
os.makedirs(os.path.join(root, "solutions", "lesson9_x"))
lesson = {"number": 9, "dir": "lesson9_x", "title": "x", "tests": []}


def page(third):
    with open(os.path.join(root, "lesson9_x", "README.md"), "w", encoding="utf-8") as f:
        f.write("# Lesson 9 — x {#lesson9}\n\n## Step 1 — One\n\n## Step 2 — Two\n\n%s — Three\n" % third)


def seen_by_all():
    """{script: the steps it sees, or the error it reports}."""
    out = {}
    problems = []
    with contextlib.redirect_stdout(io.StringIO()):
        maintainer_check.check_lesson("9", os.path.join(root, "lesson9_x"), os.path.join(root, "solutions",
                                      "lesson9_x"), [], problems)
    steps_line = [p for p in problems if "Step" in p or "step heading" in p]
    out["maintainer_check"] = steps_line[0] if steps_line else "steps ok"
    for name, read_steps in [("step_invariant", lambda: step_invariant.lesson_steps(lesson, root)),
                             ("progress", lambda: sorted(progress.steps_of(lesson, root)))]:
        out[name] = raises(read_steps) or "steps ok"
    cwd = os.getcwd()
    os.chdir(root)
    try:
        out["gen_pages"] = raises(gen_pages.process_lesson, [lesson], 0, root, {}, ([], [])) or "steps ok"
    finally:
        os.chdir(cwd)
    return out


page("### Step 3")
seen = seen_by_all()
print("`### Step 3`: %s" % seen)
messages = set(m.split(": ", 1)[-1] for m in seen.values())
check(len(messages) == 1 and "looks like a step heading" in messages.pop(),
      "the four scripts do not reject `### Step 3` alike: %s" % seen)
page("## Step 3")
seen = seen_by_all()
print("`## Step 3`: %s" % seen)
check(set(seen.values()) == {"steps ok"}, "the four scripts do not accept `## Step 3` alike: %s" % seen)
check(step_invariant.lesson_steps(lesson, root) == sorted(progress.steps_of(lesson, root)) == [1, 2, 3],
      "step_invariant and progress see different steps")

checks.finish()
