#!/usr/bin/env python3
"""//tools:course_check: the workspace passes the course check, and a copy of it with one planted defect at a
time fails it with the right message (a check that cannot fail is a defect).

  course_check_test.py            # the workspace is found from this script's real path
"""
import os
import shutil
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import course_check  # noqa: E402
import manifest  # noqa: E402
from expectations import Expectations, replace_once as edit  # noqa: E402

checks = Expectations()
expect = checks.expect


lessons, problems = course_check.check(ROOT)
for p in problems:
    print("  workspace: " + p)
expect(not problems, "the workspace agrees with its manifest (%d lessons)" % len(lessons))


first, last = lessons[0], lessons[-1]
published = [l for l in lessons if not getattr(l, "draft", False)]
last_published = published[-1]
DEFECTS = [
    ("an unlisted file in a lesson folder",
     lambda w: open(os.path.join(w, first.dir, "notes.txt"), "w").close(),
     "%s/notes.txt is not named in the manifest" % first.dir),
    ("an unlisted file in a solution folder",
     lambda w: open(os.path.join(w, "solutions", last.dir, "scratch.cc"), "w").close(),
     "solutions/%s/scratch.cc is not named in the manifest" % last.dir),
    ("a listed learner file that is missing",
     lambda w: os.remove(os.path.join(w, first.dir, first.learner[0])),
     "%s/%s is named in the manifest but missing" % (first.dir, first.learner[0])),
    ("a lesson without its demo",
     lambda w: os.remove(os.path.join(w, last.dir, "demo.cc")),
     "%s/demo.cc is named in the manifest but missing" % last.dir),
    ("a lesson page without its anchor",
     lambda w: edit(os.path.join(w, first.dir, "README.md"), "{#lesson%d}" % first.number, "{#lesson_x}"),
     "%s/README.md has no {#lesson%d} anchor" % (first.dir, first.number)),
    ("a lesson folder the manifest does not have",
     lambda w: os.makedirs(os.path.join(w, "lesson%d_extra" % (len(lessons) + 1))),
     "lesson folder lesson%d_extra is not in the manifest" % (len(lessons) + 1)),
    ("the README's course list without a lesson",
     lambda w: edit(os.path.join(w, "README.md"), "%d. **%s**" % (last_published.number, last_published.title),
                    "%d. **Something else**" % last_published.number),
     "README.md's course list has no line '%d. **%s**" % (last_published.number, last_published.title)),
    ("a bench case that does not register itself",
     lambda w: edit(os.path.join(w, "solutions", first.dir, first.bench), 'Case{"l%d",' % first.number,
                    'Case{"lx",'),
     "solutions/%s/%s does not register its case" % (first.dir, first.bench)),
    ("a lesson's bench case file missing",
     lambda w: os.remove(os.path.join(w, "solutions", last.dir, last.bench)),
     "its bench case solutions/%s/%s is missing" % (last.dir, last.bench)),
    ("a lesson case left in bench/",
     lambda w: shutil.copy(os.path.join(w, "solutions", first.dir, first.bench),
                           os.path.join(w, "bench", "lesson%d.cc" % first.number)),
     "bench/lesson%d.cc: a lesson's bench case belongs in its solution's folder" % first.number),
    ("a mutants module left in tools/mutants/",
     lambda w: shutil.copy(os.path.join(w, "solutions", first.dir, first.mutants),
                           os.path.join(w, "tools", "mutants", "lesson%d.py" % first.number)),
     "tools/mutants/lesson%d.py: a lesson's mutants belong in its solution's folder" % first.number),
    ("a lesson's mutants module missing",
     lambda w: os.remove(os.path.join(w, "solutions", last.dir, last.mutants)),
     "its mutants module solutions/%s/%s is missing" % (last.dir, last.mutants)),
    ("a mutants module that patches another lesson",
     lambda w: edit(os.path.join(w, "solutions", last.dir, last.mutants), '"solutions/%s/' % last.dir,
                    '"solutions/%s/' % first.dir),
     "patches solutions/%s/" % first.dir),
    ("a solution BUILD that is not written from the manifest",
     lambda w: edit(os.path.join(w, "solutions", first.dir, "BUILD"), "solution_package(%d" % first.number,
                    "solution_package(%d" % last.number),
     "solutions/%s/BUILD does not call solution_package(%d)" % (first.dir, first.number)),
    ("a published lesson missing from the README's list once its draft flag is gone, and a draft that is listed",
     lambda w: edit(os.path.join(w, "tools", "lessons.bzl"), 'number = %d,' % last_published.number,
                    'number = %d,\n        draft = True,' % last_published.number),
     "README.md's course list has a lesson %d; the manifest has %d published lessons" % (
         last_published.number, len(published) - 1)),
]

for what, plant, message in DEFECTS:
    work = course_check.copy_of_workspace(ROOT)
    try:
        plant(work)
        _, found = course_check.check(work)
        expect(any(message in p for p in found), "%s fails the course check with '%s'%s" % (
            what, message, "" if any(message in p for p in found) else ": got %s" % found))
    finally:
        shutil.rmtree(work, ignore_errors=True)

# The manifest stays one file that Python can read (tools/manifest.py): the scripts outside Bazel use it.
expect([l.dir for l in manifest.load()] == [l.dir for l in lessons], "tools/manifest.py reads the same lessons")

checks.finish()
