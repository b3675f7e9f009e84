#!/usr/bin/env python3
"""//tools:figure_check: every lesson page and the README pass the figure check, and a copy with one planted
defect at a time fails it with the right message (a check that cannot fail is a defect); napkin arithmetic, rules
and settings pass.

  figure_check_test.py            # the workspace is found from this script's real path
"""
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import figure_check  # noqa: E402
import manifest  # noqa: E402
from expectations import Expectations, replace_once as edit  # noqa: E402

checks = Expectations()
expect = checks.expect


problems = figure_check.check(ROOT)
for p in problems:
    print("  workspace: " + p)
pages = figure_check.pages(ROOT)
expect(not problems, "every measured figure on the README and %d lesson pages is in its named results file"
       % (len(pages) - 1))


def copy_of_pages():
    """A temporary root with what the figure check reads: the manifest, the pages and docs/results/."""
    work = tempfile.mkdtemp(prefix="figure_check_test.")
    os.makedirs(os.path.join(work, "tools"))
    shutil.copy(os.path.join(ROOT, "tools", "lessons.bzl"), os.path.join(work, "tools"))
    shutil.copytree(os.path.join(ROOT, "docs", "results"), os.path.join(work, "docs", "results"))
    for path, _ in pages:
        os.makedirs(os.path.dirname(os.path.join(work, path)) or work, exist_ok=True)
        shutil.copy(os.path.join(ROOT, path), os.path.join(work, path))
    return work


def append(path, text):
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def edit_where(work, old, new):
    """Replaces `old` on every page that holds it (a lesson page or a page of its own, e.g. a deep dive: sections
    move between them, and a lesson page may quote a figure its deep dive also shows)."""
    holders = [path for path, text in pages if old in text]
    if not holders:
        raise AssertionError("%r is on no page; the planted defect needs one" % old)
    for path in holders:
        edit(os.path.join(work, path), old, new)


lessons = manifest.load(os.path.join(ROOT, "tools", "lessons.bzl"))
page1 = os.path.join(lessons[0].dir, "README.md")
SECTION = "\n\n## Planted {#planted}\n\n"
DEFECTS = [
    ("a sourced figure that drifted from its results file (23.72 ms typed as 23.27 ms)",
     lambda w: edit_where(w, "step took 23.72 ms", "step took 23.27 ms"),
     '"23.27 ms" is not in docs/results/bench/bench_cpu.md'),
    ("a sourced figure without a unit that drifted (a table cell, 232.74 typed as 232.47)",
     lambda w: edit_where(w, "232.74", "232.47"),
     '"232.47" is not in docs/results/bench/lesson5_demo_cpu.md'),
    ("a sourced figure whose unit changed (6.65x typed as 6.65 ms)",
     lambda w: edit_where(w, "speed met (6.65x,", "speed met (6.65 ms,"),
     '"6.65 ms" is not in docs/results/bench/lesson6_demo_cpu.md'),
    ("a measured time typed with no results file named",
     lambda w: append(os.path.join(w, page1), SECTION + "On this machine the step took 12.5 ms.\n"),
     '"12.5 ms" is a measured figure with no results file named for it'),
    ("a measured speed-up typed with no results file named",
     lambda w: append(os.path.join(w, page1), SECTION + "Autocast made it 1.79x faster.\n"),
     '"1.79x" is a measured figure with no results file named for it'),
    ("a measured share typed with no results file named",
     lambda w: append(os.path.join(w, page1), SECTION + "The kernel reached 71 % of the copy ceiling.\n"),
     '"71 %" is a measured figure with no results file named for it'),
    ("a marker that names a results file that does not exist",
     lambda w: append(os.path.join(w, page1), SECTION + "<!-- figures: docs/results/nosuch.md -->\nIt took 3 ms.\n"),
     "the figures' results file docs/results/nosuch.md does not exist"),
    ("a measured time typed with no results file named, on the instructors' page (docs/pages/)",
     lambda w: append(os.path.join(w, "docs", "pages", "workshop.md"), SECTION + "The build took 95 s.\n"),
     '"95 s" is a measured figure with no results file named for it'),
    ("a marker's scope ends at the next heading",
     lambda w: append(os.path.join(w, page1), SECTION + "<!-- figures: docs/results/bench/bench_cpu.md -->\n"
                      "It took 68.93 ms.\n\n## Next {#next}\n\nIt took 68.93 ms.\n"),
     '"68.93 ms" is a measured figure with no results file named for it'),
]

ALLOWED = [
    ("napkin arithmetic in a paragraph that says so",
     SECTION + "By the napkin the fused step needs 7.5 ms at 60 GB/s.\n"),
    ("a product and an equation", SECTION + "That is 23 × 64 MiB = 1.44 GiB, and 16 × Linear layers.\n"),
    ("a rule or a goal", SECTION + "The check asks at least 3× and a goal of 70 % within 1.5 s.\n"),
    ("figures in inline code", SECTION + "Run it with `--budget=4 ms` and read `timed out after 1500 ms`.\n"),
    ("a sourced figure that is in the file (rounded to the page's precision)",
     SECTION + "<!-- figures: docs/results/bench/bench_cpu.md -->\nThe float32 step took 68.9 ms, 94.9% of the "
     "ceiling.\n"),
]

for what, plant, message in DEFECTS:
    work = copy_of_pages()
    try:
        plant(work)
        found = figure_check.check(work)
        expect(any(message in p for p in found), "fails on %s (%s)" % (what, found[:2] if found else "no problem"))
    finally:
        shutil.rmtree(work)

for what, text in ALLOWED:
    work = copy_of_pages()
    try:
        append(os.path.join(work, page1), text)
        found = [p for p in figure_check.check(work) if p not in problems]  # only what the text added
        expect(not found, "passes %s (%s)" % (what, found[:2] if found else "no problem"))
    finally:
        shutil.rmtree(work)

checks.finish()
