#!/usr/bin/env python3
"""The slot check: every lesson's core fits one workshop slot (60-120 minutes), measured from the manifest and the
files, so that a lesson cannot quietly grow back into a reference manual (issue #42).

  slot_check.py [--root DIR] [--table]     # DIR: the workspace (default: found from this script's real path)

For each lesson of the manifest (tools/lessons.bzl; its `core` field lists the core steps) it measures
  core words      prose words of the page's core: from its top to the end of its last core step's section, plus
                  the `## Check your work` section (at most CORE_WORDS);
  page words      prose words of the whole page (at most PAGE_WORDS);
  goal bullets    top-level bullets of `## Goal` (at most GOAL_BULLETS), which says "You will learn";
  core lines      lines of code (not blank, not a comment) of the reference solution's learner files, less the
                  snippet regions (`// [tag]` pairs) whose skeleton TODOs are all going-further steps (at most
                  CORE_LINES);
and it fails on
  - a limit exceeded; a `core` that is not the steps 1..K of the page;
  - a going-further step whose heading does not end its title with "(going further)", or a core step whose does;
  - a TODO comment in a learner file longer than TODO_LINES lines, or one that does not end with the answer's
    size, "(about N lines)" (longer specification belongs in the page's hints, messages in the header);
  - a dated run diary on a lesson page (a time "HH:MM UTC", a date "2026-12-04", a load average): results files
    carry date, machine and command;
  - a deep-dive page (docs/pages/lessonN_in_depth.md) that the lesson page does not link, or that lacks its anchor.
Prose words: whitespace-separated tokens holding a letter or digit, outside fenced code, HTML comments, `\\snippet`
lines and `[TOC]`. `--table` prints the measured table (Markdown); the docs' "Running the workshop" page shows the
same table, made by table_markdown() when the site is built.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import conventions  # noqa: E402

CORE_WORDS = 4000
PAGE_WORDS = 8000
GOAL_BULLETS = 5
CORE_LINES = 400
TODO_LINES = 2

GOING_FURTHER = "(going further)"
_WORD = re.compile(r"[A-Za-z0-9]")
_H2 = re.compile(r"^## ")
_SNIPPET_LINE = re.compile(r"^\s*\\snippet\s")
_MARKER = re.compile(r"^\s*// \[([A-Za-z0-9_]+)\]\s*$")
_TODO = re.compile(r"^\s*// TODO\(lesson(\d+), step (\d+)\)")
_SIZE = re.compile(r"\(about \d+(?:-\d+)? lines?\)")
_DIARY = [
    (re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})? ?UTC\b"), "a time of day (UTC)"),
    (re.compile(r"\b20\d\d-\d\d-\d\d\b"), "a date"),
    (re.compile(r"\bload(?: average)?(?: of)? \d", re.IGNORECASE), "a load average"),
]


def field(lesson, name, default=None):
    """A manifest field of a lesson given as a manifest struct (tools/manifest.py) or a dict (lessons.json)."""
    if isinstance(lesson, dict):
        return lesson.get(name, default)
    return getattr(lesson, name, default)


def prose_lines(text):
    """(index, line) of the lines of a page that hold prose: outside fences and HTML comments, not \\snippet."""
    in_comment = False
    for i, line, fenced in conventions._fences(text.splitlines()):
        if fenced:
            continue
        if in_comment:
            if "-->" in line:
                in_comment = False
                line = line.split("-->", 1)[1]
            else:
                continue
        while "<!--" in line:
            before, after = line.split("<!--", 1)
            if "-->" in after:
                line = before + after.split("-->", 1)[1]
            else:
                line, in_comment = before, True
        if _SNIPPET_LINE.match(line) or line.strip() == "[TOC]":
            continue
        yield i, line


def words(lines):
    return sum(1 for _, line in lines for token in line.split() if _WORD.search(token))


def sections(text):
    """[(heading line index, heading text)] of the level-2 headings outside fences."""
    return [(i, line) for i, line, fenced in conventions._fences(text.splitlines()) if not fenced and _H2.match(line)]


def section_span(heads, k, text):
    """(first line, line after the last) of the k-th level-2 section of `sections(text)`."""
    return heads[k][0], heads[k + 1][0] if k + 1 < len(heads) else len(text.splitlines())


def measure_page(text, core, path="README.md"):
    """(core words, page words, goal bullets, goal says 'you will learn', problems) of one lesson page."""
    problems = []
    steps = conventions.steps(text, path)
    heads = sections(text)
    numbers = [s.number for s in steps]
    if not core or sorted(core) != list(range(1, len(core) + 1)) or not set(core) <= set(numbers):
        problems.append("%s: the manifest's core %s is not steps 1..K of the page (steps %s)" % (path, core, numbers))
    for s in steps:
        title = s.title or ""
        further = title.rstrip().endswith(GOING_FURTHER)
        if s.number in core and further:
            problems.append("%s:%d: step %d is a core step but its heading says %s" % (path, s.line, s.number,
                                                                                   GOING_FURTHER))
        if s.number not in core and not further:
            problems.append("%s:%d: step %d goes further than the core (%s): its heading's title must end with "
                            "'%s'" % (path, s.line, s.number, core, GOING_FURTHER))
    lines = list(prose_lines(text))
    last_core = max([s for s in steps if s.number in core], key=lambda s: s.number, default=None)
    end_core = len(text.splitlines())
    if last_core:
        after = [i for i, _ in heads if i > last_core.line - 1]
        end_core = after[0] if after else end_core
    check = [k for k, (i, h) in enumerate(heads) if h.startswith("## Check your work")]
    in_core = lambda i: i < end_core  # noqa: E731
    if check:
        start, stop = section_span(heads, check[0], text)
        in_core = lambda i: i < end_core or start <= i < stop  # noqa: E731
    else:
        problems.append("%s: no '## Check your work' section" % path)
    core_words = words([(i, l) for i, l in lines if in_core(i)])
    page_words = words(lines)
    goal = [k for k, (i, h) in enumerate(heads) if h.strip() == "## Goal"]
    bullets, learn = 0, False
    if goal:
        start, stop = section_span(heads, goal[0], text)
        body = [l for i, l in lines if start < i < stop]
        bullets = sum(1 for l in body if re.match(r"^(?:[-*+]|\d+\.)\s", l))
        learn = "you will learn" in " ".join(body).lower()
    else:
        problems.append("%s: no '## Goal' section" % path)
    return core_words, page_words, bullets, learn, problems


def snippet_regions(lines):
    """{tag: [(first, last)]} of the `// [tag]` pairs of a source file (line indices of the two markers)."""
    out, open_at = {}, {}
    for i, line in enumerate(lines):
        m = _MARKER.match(line)
        if not m:
            continue
        tag = m.group(1)
        if tag in open_at:
            out.setdefault(tag, []).append((open_at.pop(tag), i))
        else:
            open_at[tag] = i
    return out


def is_code(line):
    s = line.strip()
    return bool(s) and not s.startswith(("//", "/*", "*"))


def core_lines(skeleton, solution, core):
    """Lines of code of `solution` outside the regions whose skeleton TODOs are all going-further steps."""
    sk, so = skeleton.splitlines(), solution.splitlines()
    further = set()
    for tag, spans in snippet_regions(sk).items():
        steps = {int(m) for a, b in spans for m in re.findall(r"TODO\(lesson\d+, step (\d+)\)", "\n".join(sk[a:b]))}
        if steps and not steps & set(core):
            further.add(tag)
    skip = set()
    for tag, spans in snippet_regions(so).items():
        if tag in further:
            for a, b in spans:
                skip.update(range(a, b + 1))
    return sum(1 for i, line in enumerate(so) if i not in skip and is_code(line))


def todo_problems(text, path):
    """A TODO comment block longer than TODO_LINES, or without the answer's size."""
    problems = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not _TODO.match(lines[i]):
            i += 1
            continue
        j = i + 1
        while (j < len(lines) and lines[j].strip().startswith("//") and lines[j].strip() != "//"
               and not _TODO.match(lines[j]) and not _MARKER.match(lines[j])):
            j += 1
        block = " ".join(l.strip().lstrip("/").strip() for l in lines[i:j])
        if j - i > TODO_LINES:
            problems.append("%s:%d: a TODO of %d lines (at most %d: say what to do and how big the answer is; the "
                            "rest goes to the page's hints, messages to the header)" % (path, i + 1, j - i,
                                                                                        TODO_LINES))
        if not _SIZE.search(block):
            problems.append("%s:%d: the TODO does not end with the answer's size, e.g. '(about 12 lines)'"
                            % (path, i + 1))
        i = j
    return problems


def diary_problems(text, path):
    problems = []
    for i, line in prose_lines(text):
        for pattern, what in _DIARY:
            m = pattern.search(line)
            if m:
                problems.append("%s:%d: %s on a lesson page (%r): a run diary belongs to the results file, which "
                                "carries date, machine and command" % (path, i + 1, what, m.group(0)))
    return problems


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def deep_dive_path(root, lesson):
    return os.path.join(root, "docs", "pages", "lesson%d_in_depth.md" % field(lesson, "number"))


def measure(root, lesson):
    """One lesson's row (a dict) and its problems."""
    number, folder = field(lesson, "number"), field(lesson, "dir")
    core = list(field(lesson, "core", []) or [])
    page_path = os.path.join(folder, "README.md")
    page = read(os.path.join(root, page_path))
    core_words, page_words, bullets, learn, problems = measure_page(page, core, page_path)
    steps = [s.number for s in conventions.steps(page, page_path)]
    lines = 0
    for name in field(lesson, "learner", []):
        skeleton = read(os.path.join(root, folder, name))
        solution = read(os.path.join(root, "solutions", folder, name))
        lines += core_lines(skeleton, solution, core)
        problems += todo_problems(skeleton, os.path.join(folder, name))
    problems += diary_problems(page, page_path)
    deep = deep_dive_path(root, lesson)
    anchor = "lesson%d_in_depth" % number
    if os.path.exists(deep):
        first = read(deep).splitlines()[:1]
        if not first or "{#%s}" % anchor not in first[0]:
            problems.append("%s: the first line must be '# Lesson %d in depth {#%s}'" % (os.path.relpath(deep, root),
                                                                                       number, anchor))
        if "\\ref %s" % anchor not in page:
            problems.append("%s: the lesson has a deep-dive page (%s) but does not link it (\\ref %s)"
                            % (page_path, os.path.relpath(deep, root), anchor))
    for what, value, limit in (("core words", core_words, CORE_WORDS), ("page words", page_words, PAGE_WORDS),
                               ("Goal bullets", bullets, GOAL_BULLETS), ("core reference lines", lines, CORE_LINES)):
        if value > limit:
            problems.append("lesson %d: %s %d, above the slot's limit of %d" % (number, what, value, limit))
    if not learn:
        problems.append("%s: the Goal does not say what the attendee will learn ('You will learn ...')" % page_path)
    row = {
        "number": number,
        "title": field(lesson, "title"),
        "core": [s for s in steps if s in core],
        "further": [s for s in steps if s not in core],
        "core_words": core_words,
        "page_words": page_words,
        "goal_bullets": bullets,
        "core_lines": lines,
        "deep_dive": os.path.exists(deep),
    }
    return row, problems


def steps_text(numbers):
    if not numbers:
        return "none"
    if numbers == list(range(numbers[0], numbers[-1] + 1)) and len(numbers) > 2:
        return "%d-%d" % (numbers[0], numbers[-1])
    return ", ".join(str(n) for n in numbers)


def reading_minutes(words_count):
    """Reading time at 200 words a minute (technical prose, read closely), rounded up to 5 minutes."""
    return -(-words_count // 1000) * 5


def table_markdown(rows):
    header = ("| Lesson | Core steps | Going further | Core words (read, min) | Page words | Core reference "
              "lines | Deep dive |\n|---|---|---|---|---|---|---|\n")
    body = "".join("| %d %s | %s | %s | %s (%d) | %s | %d | %s |\n" % (
        r["number"], r["title"], steps_text(r["core"]), steps_text(r["further"]), format(r["core_words"], ","),
        reading_minutes(r["core_words"]), format(r["page_words"], ","), r["core_lines"],
        "yes" if r["deep_dive"] else "no") for r in rows)
    limits = ("\nLimits (tools/slot_check.py): core at most %s words and %d reference lines, page at most %s words, "
              "Goal at most %d bullets.\n" % (format(CORE_WORDS, ","), CORE_LINES, format(PAGE_WORDS, ","),
                                               GOAL_BULLETS))
    return header + body + limits


def check(root, lessons):
    rows, problems = [], []
    for lesson in lessons:
        row, found = measure(root, lesson)
        rows.append(row)
        problems += found
    return rows, problems


def main():
    import manifest  # only outside Bazel's docs action, which passes lessons.json instead

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    parser.add_argument("--table", action="store_true", help="print the measured table (Markdown)")
    args = parser.parse_args()
    lessons = manifest.load(os.path.join(args.root, "tools", "lessons.bzl"))
    try:
        rows, problems = check(args.root, lessons)
    except conventions.ConventionError as e:
        print("slot_check: %s" % e)
        return 1
    if args.table or problems:
        print(table_markdown(rows))
    for p in problems:
        print("slot_check: " + p)
    if problems:
        print("slot_check: %d problem(s)" % len(problems))
        return 1
    print("slot_check: every lesson's core fits a slot (%d lessons)" % len(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
