#!/usr/bin/env python3
"""//tools:slot_check: every lesson's core fits a workshop slot, and copies of the workspace with one planted
defect each (500 more words in a core step, a long TODO, a sixth Goal bullet, ...) fail the check with the right
message (a check that cannot fail is a defect).

  slot_check_test.py            # the workspace is found from this script's real path
"""
import os
import shutil
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import conventions  # noqa: E402
import course_check  # noqa: E402
import manifest  # noqa: E402
import slot_check  # noqa: E402
from expectations import Expectations, replace_once as edit  # noqa: E402

checks = Expectations()
expect = checks.expect

lessons = manifest.load(os.path.join(ROOT, "tools", "lessons.bzl"))
rows, problems = slot_check.check(ROOT, lessons)
print(slot_check.table_markdown(rows))
for p in problems:
    print("  workspace: " + p)
expect(not problems, "every lesson's core fits a slot (%d lessons)" % len(rows))

# The word count: prose only (no fenced code, HTML comments, \snippet lines, [TOC]); a core that ends at the last
# core step's section and takes "Check your work" with it.
PAGE = """# Lesson 9 — T {#lesson9}

[TOC]

## Goal

You will learn:
- one thing;
- another.

<!-- figures: docs/results/x.md
a comment of several words -->
## Step 1 — First {#lesson9_step1}

one two three
\\snippet lesson9_x/x.cc tag
```
code words that are not prose
```

## Step 2 — Second (going further) {#lesson9_step2}

four five six seven

## Check your work

eight nine — =
"""
core_words, page_words, bullets, learn, found = slot_check.measure_page(PAGE, [1], "README.md")
expect((bullets, learn, found) == (2, True, []), "a page's Goal bullets and shape are read (got %s)"
       % ((bullets, learn, found),))
# core: "# Lesson 9 — T {#lesson9}" (4: "#" and "—" are not words) + "## Goal" (1) + "You will learn:" (3) +
# "- one thing;" (2) + "- another." (1) + "## Step 1 — First {#lesson9_step1}" (4) + "one two three" (3) +
# "## Check your work" (3) + "eight nine — =" (2) = 23; the page adds step 2: heading (6) + four words (4) = 33.
expect((core_words, page_words) == (23, 33), "words count prose only, and the core ends at its last step's section "
       "plus 'Check your work' (23, 33; got %d, %d)" % (core_words, page_words))

first = lessons[0]
further = [l for l in lessons if len(l.core) < len(conventions.steps(
    open(os.path.join(ROOT, l.dir, "README.md"), encoding="utf-8").read()))]
deep = further[-1] if further else lessons[-1]
todo_file = os.path.join(first.dir, first.learner[0])


def grow_core(w):
    """500 more words in the last core step of the first lesson."""
    path = os.path.join(w, first.dir, "README.md")
    text = open(path, encoding="utf-8").read()
    steps = conventions.steps(text)
    last = [s for s in steps if s.number == max(first.core)][0]
    lines = text.splitlines()
    lines.insert(last.line, "\n" + " ".join(["word"] * (slot_check.CORE_WORDS + 500)) + "\n")
    open(path, "w", encoding="utf-8").write("\n".join(lines) + "\n")


def grow_page(w):
    path = os.path.join(w, deep.dir, "README.md")
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n## Appendix\n\n" + " ".join(["word"] * slot_check.PAGE_WORDS) + "\n")


def long_todo(w):
    path = os.path.join(w, todo_file)
    text = open(path, encoding="utf-8").read()
    i = text.index("// TODO(lesson%d, step" % first.number)
    j = text.index("\n", i)
    open(path, "w", encoding="utf-8").write(
        text[:j] + "\n  // a third line\n  // and a fourth (about 3 lines)" + text[j:])


def todo_without_size(w):
    path = os.path.join(w, todo_file)
    text = open(path, encoding="utf-8").read()
    i = text.index("// TODO(lesson%d, step" % first.number)
    k = text.index("(about ", i)
    open(path, "w", encoding="utf-8").write(text[:k] + "(some lines)" + text[text.index(")", k) + 1:])


def sixth_bullet(w):
    path = os.path.join(w, first.dir, "README.md")
    text = open(path, encoding="utf-8").read()
    i = text.index("## Goal")
    j = text.index("\n- ", i)
    open(path, "w", encoding="utf-8").write(text[:j] + "\n- a\n- b\n- c\n- d\n- e\n- f" + text[j:])


def no_going_further(w):
    path = os.path.join(w, deep.dir, "README.md")
    text = open(path, encoding="utf-8").read()
    open(path, "w", encoding="utf-8").write(text.replace(" (going further)", "", 1))


def core_lines(w):
    """200 more lines of code in the reference of the first lesson's first learner file, outside any region."""
    path = os.path.join(w, "solutions", todo_file)
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join("static int extra_%d = %d;\n" % (i, i) for i in range(slot_check.CORE_LINES)))


def diary(w):
    path = os.path.join(w, first.dir, "README.md")
    with open(path, "a", encoding="utf-8") as f:
        f.write("\nMeasured at 03:27 UTC on 2026-12-05 with load average 3.1.\n")


def unlinked_deep_dive(w):
    os.makedirs(os.path.join(w, "docs", "pages"), exist_ok=True)
    with open(os.path.join(w, "docs", "pages", "lesson%d_in_depth.md" % first.number), "w") as f:
        f.write("# Lesson %d in depth {#lesson%d_in_depth}\n" % (first.number, first.number))


DEFECTS = [
    ("500 words more than the limit in a core step", grow_core, "lesson %d: core words" % first.number),
    ("a page above the page limit", grow_page, "lesson %d: page words" % deep.number),
    ("a TODO of four lines", long_todo, "%s:" % todo_file),
    ("a TODO without the answer's size", todo_without_size, "does not end with the answer's size"),
    ("a Goal of more than five bullets", sixth_bullet, "lesson %d: Goal bullets" % first.number),
    ("a going-further step whose heading does not say so", no_going_further, "goes further than the core"),
    ("a core reference above the line limit", core_lines, "lesson %d: core reference lines" % first.number),
    ("a run diary on a lesson page", diary, "a time of day (UTC)"),
    ("a deep-dive page the lesson does not link", unlinked_deep_dive,
     "does not link it (\\ref lesson%d_in_depth)" % first.number),
]

for what, plant, message in DEFECTS:
    work = course_check.copy_of_workspace(ROOT)
    try:
        plant(work)
        _, found = slot_check.check(work, manifest.load(os.path.join(work, "tools", "lessons.bzl")))
        ok = any(message in p for p in found)
        expect(ok, "%s fails the slot check with '%s'%s" % (what, message, "" if ok else ": got %s" % found))
    finally:
        shutil.rmtree(work, ignore_errors=True)

checks.finish()
