#!/usr/bin/env python3
"""Maintainer check: every step of every lesson stands alone.

  bazel run //tools:step_invariant                      # every lesson
  bazel run //tools:step_invariant -- --lesson=1 --steps=3,4

For lesson N and each K, the skeleton with steps 1..K done (taken from the reference solution) must pass every
[step1]..[stepK] check and fail every later step's checks (GPU cases may be skipped). A check of step K that
needs step K+1 to pass breaks this: a learner who finished step K is told step K is still failing.

How a variant is made: in each learner source that holds TODO(lessonN, step K) markers, the code between a pair of
`// [tag]` snippet markers (the ones the lesson page's \\snippet commands use) is one unit. A unit whose skeleton
version holds TODOs of steps <= K comes from solutions/<dir>/<same file>; every other unit stays as in the
skeleton. Code outside the markers comes from the solution (helpers, includes); a TODO outside any marker pair is
an error (it could not be spliced). K = the last step must give a variant that passes every check (a check on the
splicing itself): when that variant is the reference solution byte for byte, which is what a complete set of
markers gives, it is not rebuilt here, because the test command's //solutions/<dir>:all runs the same checks on
the same code (--all_variants builds it anyway).

The variants are built in a scratch copy of the workspace (default $TMPDIR/workshop-step-invariant, reused so
that later runs are incremental; --work=DIR to choose) with its own Bazel server, which is shut down at the end;
the shared --disk_cache of .bazelrc makes unchanged actions cheap. Your workspace is not touched. Writes the
findings to stdout and, with --report=FILE, to FILE. Exit status 1 if any (lesson, K) breaks the invariant.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conventions  # noqa: E402  (step headings, [stepK] tags, TODO and // [tag] markers)
from progress import first_failure  # noqa: E402  (the same reading of doctest's XML as //:progress)

SKIP_DIRS = {".bazel", ".git", ".portable", "docs/html"}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def regions(lines, path):
    """[(tag, first line index, last line index)] of the `// [tag]` marker pairs (the marker lines included)."""
    return [tuple(m) for m in conventions.markers(lines, path)]


def todo_lines(text, lesson, path):
    """{line index: K} of the lesson's TODO markers in `text`."""
    return {line - 1: k for line, k in conventions.todos(text, lesson, path)}


def learner_units(lesson, skeleton_path):
    """{tag: (lines, steps)} of the skeleton file, and the problems found (TODOs outside any unit)."""
    text = read(skeleton_path)
    marked = todo_lines(text, lesson, skeleton_path)
    lines = text.splitlines(keepends=True)
    units, inside, problems = {}, set(), []
    for tag, first, last in regions(lines, skeleton_path):
        body = lines[first:last + 1]
        steps = sorted({k for i, k in marked.items() if first <= i <= last})
        units[tag] = (body, steps)
        inside.update(range(first, last + 1))
        if len(steps) > 1:
            problems.append("%s: the code between the [%s] markers holds TODOs of steps %s; split it so "
                            "that each step can be done alone" % (skeleton_path, tag, steps))
    for i in sorted(marked):
        if i not in inside:
            problems.append("%s:%d: TODO outside any // [tag] marker pair: the step checker cannot splice it"
                            % (skeleton_path, i + 1))
    return units, problems


def variant(lesson, skeleton_path, solution_path, k):
    """The text of `skeleton_path` with the units of steps <= k taken from `solution_path`."""
    units, problems = learner_units(lesson, skeleton_path)
    if problems:
        raise ValueError("\n".join(problems))
    lines = read(solution_path).splitlines(keepends=True)
    solution_regions = regions(lines, solution_path)
    solution_tags = {tag for tag, _, _ in solution_regions}
    for tag, (_, steps) in units.items():
        if steps and tag not in solution_tags:
            raise ValueError("%s has no [%s] markers around the answer to %s's [%s]"
                             % (solution_path, tag, skeleton_path, tag))
    for tag, first, last in sorted(solution_regions, key=lambda r: -r[1]):
        if tag not in units:
            continue
        body, steps = units[tag]
        if steps and max(steps) > k:
            lines[first:last + 1] = body
    return "".join(lines)


def learner_files(lesson, root):
    """The lesson's skeleton sources that hold TODO markers (relative paths)."""
    folder = os.path.join(root, lesson["dir"])
    out = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.endswith(conventions.SOURCE_SUFFIXES) and not name.endswith("_test.cc") and \
                conventions.todos(read(path), lesson["number"], path):
            out.append(os.path.join(lesson["dir"], name))
    return out


def workspace_files(root):
    """Files of the workspace to copy: git's tracked and untracked-but-not-ignored files, plus the rc files."""
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard", "-z"],
                                capture_output=True, check=True).stdout.decode().split("\0")
        files = [f for f in listed if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder, dirs, names in os.walk(root):
            rel = os.path.relpath(folder, root)
            dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(rel, d)) not in SKIP_DIRS
                       and not d.startswith("bazel-")]
            files += [os.path.normpath(os.path.join(rel, n)) for n in names]
    for rc in ("user.bazelrc", "machine.bazelrc"):  # ignored by git, but they shape the build
        if os.path.exists(os.path.join(root, rc)):
            files.append(rc)
    return sorted({f for f in files if os.path.isfile(os.path.join(root, f))})


def write_if_changed(path, data):
    if os.path.exists(path):
        with open(path, "rb") as f:
            if f.read() == data:
                return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def sync_copy(root, work):
    """Makes `work` a copy of the workspace's sources (unchanged files are left alone, stale ones removed)."""
    files = workspace_files(root)
    keep = set(files)
    for f in files:
        with open(os.path.join(root, f), "rb") as src:
            write_if_changed(os.path.join(work, f), src.read())
    for folder, dirs, names in os.walk(work):
        rel = os.path.relpath(folder, work)
        dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(rel, d)) not in SKIP_DIRS
                   and not d.startswith("bazel-")]
        for n in names:
            f = os.path.normpath(os.path.join(rel, n))
            if f not in keep:
                os.remove(os.path.join(work, f))


def run_cases(binary, cwd):
    """[(name, outcome, message)] of a doctest binary; outcome in passed/failed/skipped."""
    env = dict(os.environ)
    env["TEST_TMPDIR"] = tempfile.mkdtemp(prefix="step-invariant-")
    try:
        result = subprocess.run([binary, "--reporters=xml", "--no-version"], cwd=cwd, capture_output=True,
                                text=True, timeout=1800, env=env)
    except subprocess.TimeoutExpired:
        return None, "did not finish in 30 minutes"
    finally:
        shutil.rmtree(env["TEST_TMPDIR"], ignore_errors=True)
    text = result.stdout
    try:
        tree = ET.fromstring(text[text.index("<?xml"):] if "<?xml" in text else text)
    except (ET.ParseError, ValueError):
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        return None, "crashed (exit %d): %s" % (result.returncode, " / ".join(tail))
    cases = []
    for case in tree.iter("TestCase"):
        if case.get("skipped") == "true":
            cases.append((case.get("name"), "skipped", ""))
            continue
        overall = case.find("OverallResultsAsserts")
        ok = overall is not None and overall.get("test_case_success") == "true"
        message = ""
        if not ok:
            where, message = first_failure(case, "%s:%s" % (case.get("filename"), case.get("line")))
            message = ("%s: %s" % (where, message))[:300]
        cases.append((case.get("name"), "passed" if ok else "failed", message))
    return cases, None


def bazel(args, work, bazel_bin):
    return subprocess.run([bazel_bin] + args, cwd=work, capture_output=True, text=True)


def lesson_steps(lesson, root):
    """The step numbers of the lesson's page (tools/conventions.py: ConventionError for a malformed heading)."""
    return [s.number for s in conventions.read_steps(os.path.join(root, lesson["dir"], "README.md"))]


def check_lesson(lesson, root, work, bazel_bin, only_steps, log, all_variants=False):
    n, folder = lesson["number"], lesson["dir"]
    findings = []
    structure = []
    try:
        steps = lesson_steps(lesson, root)
        files = learner_files(lesson, root)
        for f in files:
            structure += learner_units(n, os.path.join(root, f))[1]
            if not os.path.exists(os.path.join(root, "solutions", f)):
                structure.append("solutions/%s is missing" % f)
            else:
                regions(read(os.path.join(root, "solutions", f)).splitlines(), "solutions/" + f)
    except conventions.ConventionError as error:
        structure.append(str(error))
    if structure:
        for p in structure:
            log("lesson %d: cannot splice: %s" % (n, p))
        return ["lesson %d: cannot splice: %s" % (n, p) for p in structure]
    targets = ["//%s:%s" % (folder, t) for t in lesson["tests"]]
    info = bazel(["info", "bazel-bin"], work, bazel_bin)
    if info.returncode != 0:
        return ["lesson %d: `bazel info` failed in %s: %s" % (n, work, info.stderr[-500:])]
    bin_dir = info.stdout.strip()
    for k in steps:
        if only_steps and k not in only_steps:
            continue
        start = time.time()
        texts = {f: variant(n, os.path.join(root, f), os.path.join(root, "solutions", f), k) for f in files}
        if k == steps[-1] and not all_variants and all(texts[f] == read(os.path.join(root, "solutions", f))
                                                        for f in files):
            log("lesson %d K=%d: the variant is the reference solution itself, checked by //solutions/%s:all "
                "in the test command: not rebuilt" % (n, k, folder))
            continue
        for f in files:
            write_if_changed(os.path.join(work, f), texts[f].encode("utf-8"))
        built = bazel(["build", "--color=no", "--curses=no", "--keep_going"] + targets, work, bazel_bin)
        if built.returncode != 0:
            errors = [l for l in (built.stdout + built.stderr).splitlines() if "error:" in l][:5]
            findings.append("lesson %d K=%d: steps 1..%d from the reference do not compile: %s"
                            % (n, k, k, " / ".join(errors) or built.stderr[-500:]))
            log(findings[-1])
            continue
        bad = []
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        for t in lesson["tests"]:
            cases, problem = run_cases(os.path.join(bin_dir, folder, t), work)
            if problem:
                bad.append("%s %s" % (t, problem))
                continue
            for name, outcome, message in cases:
                counts[outcome] += 1
                step = conventions.test_step(name)
                if outcome == "skipped" or step is None:
                    continue
                if step <= k and outcome == "failed":
                    bad.append("%s: '%s' FAILS although steps 1..%d are done (%s)" % (t, name, k, message))
                elif step > k and outcome == "passed":
                    bad.append("%s: '%s' PASSES although step %d is not done" % (t, name, step))
        log("lesson %d K=%d: %d passed, %d failed, %d skipped; %s (%.0f s)" % (
            n, k, counts["passed"], counts["failed"], counts["skipped"],
            "invariant holds" if not bad else "%d broken" % len(bad), time.time() - start))
        for b in bad:
            findings.append("lesson %d K=%d: %s" % (n, k, b))
            log("  " + findings[-1])
    # Leave the copy pristine, so that the next run starts from the skeleton.
    for f in files:
        with open(os.path.join(root, f), "rb") as src:
            write_if_changed(os.path.join(work, f), src.read())
    return findings


# Files a change of which cannot change what a variant builds or how its checks run.
NOT_BUILD_INPUTS = {"tools/debian13_check.sh", "tools/gpu_check.sh", "tools/loop_bench.sh", "tools/setup.sh",
                    "tools/portable_bazel.sh", "tools/tour.py", "tools/progress_test.py", "tools/conventions_test.py",
                    "tools/format_check.py"}


def changed_lessons(root, lessons, rev, log):
    """The lessons whose folder or solution folder changed since `rev` (committed or not); every lesson when
    anything else that a build reads changed (common/, tests/, tools/, third_party/, BUILD files, rc files), or
    when git does not know `rev`."""
    diff = subprocess.run(["git", "-C", root, "diff", "--name-only", rev, "--"], capture_output=True, text=True)
    if diff.returncode != 0:
        log("step invariant: git does not know %s (%s): every lesson" % (rev, diff.stderr.strip()[:200]))
        return lessons
    changed = [f for f in diff.stdout.splitlines() if f]
    own = {}
    for lesson in lessons:
        for prefix in (lesson["dir"] + "/", "solutions/%s/" % lesson["dir"]):
            own[prefix] = lesson
    shared = [f for f in changed if not any(f.startswith(p) for p in own) and not f.endswith(".md")
              and not f.startswith(("docs/", "bench/", ".ci/", "tools/mutants/", ".clang-format"))
              and f not in NOT_BUILD_INPUTS]
    if shared:
        log("step invariant: %s changed since %s: every lesson" % (shared[0], rev))
        return lessons
    picked = [l for l in lessons if any(f.startswith(p) and own[p] is l for f in changed for p in own)]
    log("step invariant: changed since %s: lessons %s" % (rev, [l["number"] for l in picked] or "none"))
    return picked


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lessons", required=True, help=argparse.SUPPRESS)
    parser.add_argument("--lesson", type=int, action="append", help="only this lesson (repeatable)")
    parser.add_argument("--steps", help="only these K, comma-separated")
    parser.add_argument("--root", help="the workspace (default: where `bazel run` was started)")
    parser.add_argument("--work", help="scratch copy of the workspace (default $TMPDIR/workshop-step-invariant)")
    parser.add_argument("--bazel", default=os.environ.get("BAZEL", "bazel"))
    parser.add_argument("--report", help="also write the findings to this file")
    parser.add_argument("--keep_server", action="store_true", help="do not shut the scratch Bazel server down")
    parser.add_argument("--all_variants", action="store_true",
                        help="also build the last step's variant when it is the reference solution itself")
    parser.add_argument("--changed_since", metavar="REV",
                        help="only the lessons whose files changed since git revision REV (all of them when a file "
                             "outside the lessons' folders changed, or when REV is unknown)")
    args = parser.parse_args()

    root = os.path.abspath(args.root or os.environ.get("BUILD_WORKSPACE_DIRECTORY") or os.getcwd())
    work = os.path.abspath(args.work or os.path.join(tempfile.gettempdir(), "workshop-step-invariant"))
    if os.path.abspath(work) == root:
        sys.exit("step_invariant: --work must not be the workspace itself")
    lessons = [l for l in json.load(open(args.lessons))]
    if args.lesson:
        lessons = [l for l in lessons if l["number"] in args.lesson]
    only_steps = {int(s) for s in args.steps.split(",")} if args.steps else None
    if args.changed_since:
        lessons = changed_lessons(root, lessons, args.changed_since, print)

    def log(line):
        print(line, flush=True)

    log("step invariant: variants of %s built in %s" % (root, work))
    sync_copy(root, work)
    findings = []
    try:
        for lesson in lessons:
            findings += check_lesson(lesson, root, work, args.bazel, only_steps, log, args.all_variants)
    finally:
        if not args.keep_server:
            bazel(["shutdown"], work, args.bazel)
    summary = ("every (lesson, K) holds the invariant" if not findings
               else "%d finding(s): a check of a step needs a later step, or fails although its step is done"
               % len(findings))
    log(summary)
    if args.report:
        with open(args.report, "w", encoding="utf-8") as f:
            f.write("# tools/step_invariant.py, %s\n" % time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
            f.write("".join(line + "\n" for line in findings) or "none\n")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
