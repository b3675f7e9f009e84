#!/usr/bin/env python3
"""//tools:new_lesson_test: tools/new_lesson.py, on a copy of the workspace's lesson files and manifest.

The next lesson scaffolded there touches only lessonN_<name>/, solutions/lessonN_<name>/ and tools/lessons.bzl;
the copy then passes the course check (every file named, every part there, the README's list still right: a
draft is not in it); the manifest still reads from Python, with the new lesson last and marked draft; and bad
input (a number that is not the next one, a name that cannot be a folder, a lesson that exists) is refused
with nothing written. That the scaffold builds and its check fails on the skeleton and passes on the solution is
shown in docs/maintainers.md ("Adding a lesson"), on a clone, with the README's test command.
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import course_check  # noqa: E402
import slot_check  # noqa: E402
import manifest  # noqa: E402
from expectations import Expectations  # noqa: E402

checks = Expectations()
expect = checks.expect


def snapshot(root):
    """{relative path: bytes} of every file under root."""
    out = {}
    for base, _, files in os.walk(root):
        for f in files:
            path = os.path.join(base, f)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


lessons = manifest.load()
work = course_check.copy_of_workspace(ROOT)
try:

    def scaffold(*args):
        return subprocess.run([sys.executable, os.path.join(HERE, "new_lesson.py"), "--root", work] + list(args),
                              capture_output=True, text=True)

    n = len(lessons) + 1
    before = snapshot(work)
    for args, wanted in (([str(n + 1), "topic", "Title"], "the next lesson is number %d" % n),
                         ([str(n), "Topic-X", "Title"], "NAME must be lower case"),
                         ([str(n), "topic", 'A "quoted" title'], "without quotes"),
                         ([str(n), "demo", "A demo lesson"], "its BUILD would not load"),
                         ([str(n), "my_demo", "A demo lesson"], "its BUILD would not load"),
                         ([str(n), "headers", "Headers"], "its BUILD would not load"),
                         ([str(n), "sources", "Sources"], "its BUILD would not load"),
                         ([str(n), "bench_case", "Bench"], "its BUILD would not load"),
                         ([str(n), "check_headers", "Checks"], "its BUILD would not load")):
        result = scaffold(*args)
        expect(result.returncode != 0 and wanted in result.stderr and snapshot(work) == before,
               "new_lesson %s is refused with '%s', nothing written (got %d: %s)" % (
                   " ".join(args), wanted, result.returncode, result.stderr.strip()[-200:]))

    result = scaffold(str(n), "topic", "A new lesson")
    expect(result.returncode == 0, "new_lesson %d topic writes a lesson (%s)" % (n, result.stderr.strip()[-300:]))
    after = snapshot(work)
    d = "lesson%d_topic" % n
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    allowed = (d + os.sep, os.path.join("solutions", d) + os.sep, os.path.join("tools", "lessons.bzl"))
    outside = [p for p in changed if not p.startswith(allowed)]
    expect(not outside, "it changes files only under %s/, solutions/%s/ and tools/lessons.bzl (outside: %s)" % (
        d, d, outside))
    expect(any(p.startswith(d + os.sep) for p in changed) and any(p.startswith("solutions") for p in changed),
           "it writes both folders (%d files changed)" % len(changed))
    scaffolded = manifest.load(os.path.join(work, "tools", "lessons.bzl"))
    expect(len(scaffolded) == n and scaffolded[-1].dir == d and getattr(scaffolded[-1], "draft", False),
           "the manifest reads from Python with lesson %d last, a draft" % n)
    _, problems = course_check.check(work)
    expect(not problems, "the scaffolded copy passes the course check (%s)" % problems)
    _, found = slot_check.measure(work, scaffolded[-1])
    expect(not found and scaffolded[-1].core == [1],
           "the scaffolded lesson has its core (%s) and fits a slot: Goal, TODO size (%s)" % (
               getattr(scaffolded[-1], "core", None), found))
    text = open(os.path.join(work, d, "topic.cc"), encoding="utf-8").read()
    expect("TODO(lesson%d, step 1)" % n in text, "the skeleton holds TODO(lesson%d, step 1)" % n)

    scope = {}
    exec(open(os.path.join(work, "solutions", d, "mutants.py"), encoding="utf-8").read(), scope)
    shapes = [len(m) for m in scope.get("MUTANTS", [])]
    expect(shapes and all(k == 5 for k in shapes),
           "its mutants are (name, file, old, new, what the bug is) tuples, as run.sh takes them (%s)" % shapes)
    solution = open(os.path.join(work, "solutions", d, "topic.cc"), encoding="utf-8").read()
    expect(all(solution.count(m[2]) == 1 for m in scope.get("MUTANTS", [])),
           "each mutant's snippet occurs exactly once in the generated solution")

    again = scaffold(str(n + 1), "topic", "A new lesson")
    expect(again.returncode == 0, "a second lesson after it gets number %d (%s)" % (n + 1, again.stderr[-200:]))
    os.makedirs(os.path.join(work, "lesson%d_clash" % (n + 2)))
    open(os.path.join(work, "lesson%d_clash" % (n + 2), "clash.h"), "w").write("// someone's work\n")
    before = snapshot(work)
    clash = scaffold(str(n + 2), "clash", "Clash")
    expect(clash.returncode != 0 and "exists already" in clash.stderr and snapshot(work) == before,
           "a file that exists already stops it, nothing written (%s)" % clash.stderr.strip()[-200:])
finally:
    shutil.rmtree(work, ignore_errors=True)

checks.finish()
