#!/usr/bin/env python3
"""The course check: the lesson folders, and every list of lessons outside the manifest, agree with the manifest
(tools/lessons.bzl), as rustlings' `dev check` holds its exercises to info.toml.

  course_check.py [--root DIR]      # DIR: the workspace (default: found from this script's real path)

It fails on
  - a file in lessonN_*/ or solutions/lessonN_*/ that the manifest does not name, and a named file that is missing;
  - a lesson folder (lessonN_*) or solution folder the manifest does not have, numbers that are not 1..N in order,
    a folder not called lesson<number>_*;
  - a lesson without one of its parts: README.md with {#lessonN}, BUILD, demo.cc, a learner file, a header, a
    check source, its `tests` targets in both BUILD files, a bench case in its solution folder that registers
    itself as "lN", a mutants module there whose MUTANTS patch only that lesson's solution or its own folder (lessonN_topic/, e.g. its compiler flags);
  - a list of lessons elsewhere that disagrees: the README's numbered course list (every lesson that is not a
    draft, and no other), a bench case file or mutants module left in the old places (bench/lessonN.cc,
    tools/mutants/lessonN.py), a case registered for a lesson the manifest lacks.
Every problem is printed; exit status 1 if there is any.
"""
import argparse
import ast
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import manifest  # noqa: E402

PARTS = ("README.md", "BUILD", "demo.cc")


def files_under(folder):
    """Every file below `folder`, relative to it (no hidden files are expected in a lesson)."""
    out = set()
    for base, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for f in files:
            out.add(os.path.relpath(os.path.join(base, f), folder))
    return out


def mutant_files(path):
    """The files a mutants module patches (the second field of each MUTANTS tuple), read without importing it."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    constants = {}
    files = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                constants[name] = node.value.value
            elif name in ("MUTANTS", "GPU_MUTANTS") and isinstance(node.value, ast.List):
                for item in node.value.elts:
                    if isinstance(item, ast.Tuple) and len(item.elts) >= 2:
                        field = item.elts[1]
                        if isinstance(field, ast.Name):
                            files.append(constants.get(field.id, "?" + field.id))
                        elif isinstance(field, ast.Constant):
                            files.append(field.value)
    return files


def copy_of_workspace(root):
    """A temporary copy of what the course check reads (README.md, bench/, the manifest, tools/mutants/, every
    lesson and solution folder), for tests that plant a defect or scaffold a lesson in it. The caller removes it."""
    work = tempfile.mkdtemp(prefix="course_check-")
    shutil.copy(os.path.join(root, "README.md"), work)
    shutil.copytree(os.path.join(root, "bench"), os.path.join(work, "bench"))
    os.makedirs(os.path.join(work, "tools"))
    shutil.copy(os.path.join(root, "tools", "lessons.bzl"), os.path.join(work, "tools"))
    shutil.copytree(os.path.join(root, "tools", "mutants"), os.path.join(work, "tools", "mutants"))
    os.makedirs(os.path.join(work, "solutions"))
    for lesson in manifest.load(os.path.join(root, "tools", "lessons.bzl")):
        shutil.copytree(os.path.join(root, lesson.dir), os.path.join(work, lesson.dir))
        shutil.copytree(os.path.join(root, "solutions", lesson.dir), os.path.join(work, "solutions", lesson.dir))
    return work


def check(root):
    problems = []
    lessons = manifest.load(os.path.join(root, "tools", "lessons.bzl"))
    numbers = [l.number for l in lessons]
    if numbers != list(range(1, len(lessons) + 1)):
        problems.append("the manifest's lesson numbers are %s, not 1..%d in order" % (numbers, len(lessons)))
    listed_dirs = {l.dir for l in lessons}
    for top, label in ((root, "lesson folder"), (os.path.join(root, "solutions"), "solution folder")):
        for name in sorted(os.listdir(top)):
            if re.match(r"lesson\d+_", name) and os.path.isdir(os.path.join(top, name)) and name not in listed_dirs:
                problems.append("%s %s is not in the manifest (tools/lessons.bzl)" % (label, os.path.relpath(
                    os.path.join(top, name), root)))

    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    for lesson in lessons:
        n, d = lesson.number, lesson.dir
        where = "lesson %d (%s)" % (n, d)
        if not d.startswith("lesson%d_" % n):
            problems.append("%s: its folder must be called lesson%d_<topic>" % (where, n))
        lesson_dir = os.path.join(root, d)
        solution_dir = os.path.join(root, "solutions", d)
        if not os.path.isdir(lesson_dir) or not os.path.isdir(solution_dir):
            problems.append("%s: %s/ and solutions/%s/ must both exist" % (where, d, d))
            continue
        for field in ("learner", "headers", "checks", "tests"):
            if not getattr(lesson, field):
                problems.append("%s: the manifest's `%s` is empty (every lesson has one)" % (where, field))

        # Every file named, every file there.
        named = set(PARTS) | set(lesson.learner) | set(lesson.headers) | set(lesson.checks) | set(lesson.given) \
            | set(lesson.extra) | set(getattr(lesson, "demo", []))
        named_solution = {"BUILD", lesson.bench, lesson.mutants} | set(lesson.learner) | set(lesson.solution_extra)
        for folder, expected, shown in ((lesson_dir, named, d), (solution_dir, named_solution, "solutions/" + d)):
            present = files_under(folder)
            for f in sorted(present - expected):
                problems.append("%s/%s is not named in the manifest (tools/lessons.bzl, lesson %d): add it to "
                                "learner, headers, checks, given, extra, demo or solution_extra" % (shown, f, n))
            for f in sorted(expected - present):
                problems.append("%s/%s is named in the manifest but missing" % (shown, f))

        page = os.path.join(lesson_dir, "README.md")
        if os.path.exists(page) and "{#lesson%d}" % n not in open(page, encoding="utf-8").read():
            problems.append("%s/README.md has no {#lesson%d} anchor" % (d, n))
        # Both BUILD files are written from the manifest (tools/lesson_package.bzl), for this lesson's number.
        for folder, shown, macro in ((lesson_dir, d, "lesson_package"), (solution_dir, "solutions/" + d,
                                                                          "solution_package")):
            build_path = os.path.join(folder, "BUILD")
            build = open(build_path, encoding="utf-8").read() if os.path.exists(build_path) else ""
            if not re.search(r"^%s\(\s*%d\b" % (macro, n), build, re.M):
                problems.append("%s/BUILD does not call %s(%d) (tools/lesson_package.bzl)" % (shown, macro, n))
        for test in lesson.tests:
            if test + ".cc" not in lesson.checks:
                problems.append("%s: the check target %s has no %s.cc in `checks`" % (where, test, test))
        # The bench case and the mutants module, in the solution's folder.
        bench = os.path.join(solution_dir, lesson.bench)
        if not os.path.exists(bench):
            problems.append("%s: its bench case solutions/%s/%s is missing" % (where, d, lesson.bench))
        elif not re.search(r'\bRegistered\s+\w+\(\s*%d\s*,\s*(?:bench::)?Case\{"l%d",' % (n, n),
                           open(bench, encoding="utf-8").read()):
            problems.append('%s: solutions/%s/%s does not register its case (const bench::Registered '
                            'registered(%d, bench::Case{"l%d", ...}))' % (where, d, lesson.bench, n, n))
        module = os.path.join(solution_dir, lesson.mutants)
        shown_module = "solutions/%s/%s" % (d, lesson.mutants)
        if not os.path.exists(module):
            problems.append("%s: its mutants module %s is missing" % (where, shown_module))
        else:
            files = mutant_files(module)
            if not files:
                problems.append("%s has no MUTANTS" % shown_module)
            # The reference, or the lesson's own build files (its compiler flags: lesson6_fusion/kernel_copts.bzl).
            for f in sorted(set(files)):
                if not (f.startswith("solutions/%s/" % d) or f.startswith("%s/" % d)):
                    problems.append("%s patches %s, outside solutions/%s/ and %s/" % (shown_module, f, d, d))
        if getattr(lesson, "draft", False):
            continue  # a draft is not in the README's course list yet
        # An item may go on over indented lines.
        if not re.search(r"^%d\. \*\*%s\*\*(?:[^\n]|\n(?=[ \t]))*`%s/`" % (n, re.escape(lesson.title), re.escape(d)),
                         readme, re.M):
            problems.append("README.md's course list has no line '%d. **%s** ... (`%s/`...)'" % (n, lesson.title, d))

    # Lists outside the manifest that must not name a lesson it lacks (or a draft), and the old places.
    published = len([l for l in lessons if not getattr(l, "draft", False)])
    for line in re.findall(r"^(\d+)\. \*\*", readme, re.M):
        if int(line) > published:
            problems.append("README.md's course list has a lesson %s; the manifest has %d published lessons" % (
                line, published))
    for name in sorted(os.listdir(os.path.join(root, "bench"))):
        if re.match(r"lesson\d+\.cc$", name):
            problems.append("bench/%s: a lesson's bench case belongs in its solution's folder (the manifest's "
                            "`bench`)" % name)
    for name in sorted(os.listdir(os.path.join(root, "tools", "mutants"))):
        if re.match(r"lesson\d+\.py$", name):
            problems.append("tools/mutants/%s: a lesson's mutants belong in its solution's folder (the manifest's "
                            "`mutants`)" % name)
    for path in [os.path.join(root, "bench", f) for f in sorted(os.listdir(os.path.join(root, "bench")))
                 if f.endswith(".cc")]:
        for case in re.findall(r'Case\{"l(\d+)",', open(path, encoding="utf-8").read()):
            problems.append("%s registers a lesson case l%s: lesson cases live in the solutions' folders" % (
                os.path.relpath(path, root), case))
    return lessons, problems


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", help="the workspace (default: two folders above this script's real path)")
    args = parser.parse_args()
    root = args.root or os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    lessons, problems = check(root)
    for p in problems:
        print("course_check: " + p)
    print("course_check: %d lessons, %d problem(s) (workspace %s)" % (len(lessons), len(problems), root))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
