#!/usr/bin/env python3
"""Generates the docs site's pages (Doxygen markdown) and plots from the lessons and one run of their demos.

Run by //docs:pages (docs/site.bzl); every input is given on the command line:

  gen_pages.py --lessons lessons.json --csv DIR --mainpage docs/mainpage.md --plots docs/plots
               --readme README.md --maintainers docs/maintainers.md [--recorded docs/results/x.csv ...] --out DIR

Writes into --out:
  mainpage.md                 docs/mainpage.md with the lesson table of lessons.json in place of @LESSON_TABLE@
  <lesson dir>/README.md      each lesson's README with: previous/next links; after every step its checks and
                              a link to one answer; at the end the demo (its code, its plots, its tables from the
                              run), the checks by step and the reference solution's snippets
  results.md                  the summary of every demo run here (CPU) and the recorded GPU results
  readme.md                   the repository's README.md as the quick-start page (id md_README), titled "Quick
                              start" so that the side navigation does not show the course's title twice
  maintainers.md              docs/maintainers.md, the maintainers' page (id maintainers)
  <name>.md                   each --page (docs/pages/*.md: the deep-dive pages lessonN_in_depth.md, the
                              instructors' workshop.md, whose @SLOT_TABLE@ line becomes tools/slot_check.py's table
                              of every lesson's core and going-further steps, words and reference lines)
  images/*.png                the plots (gnuplot, docs/plots/lessonN.gp)
  images/*.svg                committed pictures of recorded runs (--image, docs/results/*.svg)
"""
import argparse
import csv
import html
import json
import os
import re
import shutil
import subprocess
import sys

# The course's conventions (step headings, [stepK] names, // [tag] markers) are parsed by tools/conventions.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import conventions  # noqa: E402
import slot_check  # noqa: E402

SNIPPET = re.compile(r"^\s*\\snippet\s+(\S+)\s+(\S+)\s*$")
CODE_SPAN = re.compile(r"``.+?``|`[^`]*`")  # code spans, found left to right so that backticks pair up


def protect_quoted_spans(line):
    """Rewrites `span with a '` as ``span with a '`` (Doxygen 1.9 ends a single-backtick span at a quote)."""
    def fix(match):
        span = match.group(0)
        if span.startswith("``") or "'" not in span:
            return span
        return "``" + span[1:-1] + "``"
    return CODE_SPAN.sub(fix, line)
MAX_TABLE_ROWS = 24


def die(message):
    print("gen_pages: " + message, file=sys.stderr)
    sys.exit(1)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def write(path, text):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        rows = [row for row in csv.reader(line for line in f if not line.startswith("#"))]
    return (rows[0], rows[1:]) if rows else ([], [])


def cell(text):
    """Text for an HTML table cell in a Doxygen page: HTML-escaped, Doxygen's command characters escaped."""
    text = html.escape(text, quote=False)
    return text.replace("\\", "\\\\").replace("@", "\\@").replace("#", "\\#")


def html_table(header, rows):
    out = ["<table class=\"doxtable\">", "<tr>" + "".join("<th>%s</th>" % cell(h) for h in header) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join("<td>%s</td>" % cell(c) for c in row) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def number(text):
    try:
        value = float(text)
    except ValueError:
        return text
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
        return "%.3g" % value
    return "%.4g" % value


def summary_table(header, rows):
    """The tour's table: lesson, measure, baseline, improved, ratio (baseline / improved), device."""
    index = {name: i for i, name in enumerate(header)}
    need = ["lesson", "measure", "baseline", "improved", "ratio", "device"]
    missing = [n for n in need if n not in index]
    if missing:
        die("summary table lacks columns %s (has %s)" % (missing, header))
    shown = [[row[index["lesson"]], row[index["measure"]], number(row[index["baseline"]]),
              number(row[index["improved"]]), number(row[index["ratio"]]) + "×", row[index["device"]]] for row in rows]
    return html_table(["lesson", "what was measured", "baseline", "improved", "ratio (baseline / improved)", "device"],
                      shown)


def plots(lesson, plots_dir, csv_dir, images_dir):
    """Runs docs/plots/lessonN.gp if it exists; returns [(png name, caption)] from its `# plot:` lines."""
    script = os.path.join(plots_dir, "lesson%d.gp" % lesson["number"])
    if not os.path.exists(script):
        return []
    declared = []
    for line in read(script).splitlines():
        m = re.match(r"^# plot: (\S+\.png): (.+)$", line)
        if m:
            declared.append((m.group(1), m.group(2)))
    command = ["gnuplot", "-e", "csv_dir='%s'; out_dir='%s'" % (csv_dir, images_dir), script]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        die("%s failed:\n%s%s" % (script, result.stdout, result.stderr))
    for name, _ in declared:
        path = os.path.join(images_dir, name)
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            die("%s declares %s but did not write it" % (script, name))
    return declared


def test_cases(lesson):
    """{step: [(name, file, line)]} from the TEST_CASE lines of the lesson's *_test.cc files."""
    cases = {}
    folder = lesson["dir"]
    for name in sorted(os.listdir(folder)):
        if not name.endswith("_test.cc"):
            continue
        path = os.path.join(folder, name)
        for case, k, number_, gpu in conventions.test_cases(read(path), path):
            if k is not None:
                cases.setdefault(k, []).append((case + (" — GPU only" if gpu else ""), path, number_))
    return cases


def tags(path):
    if not os.path.exists(path):
        return []
    return conventions.marker_tags(read(path), path)


def lesson_ref(lesson, arrow_left):
    label = "Lesson %d — %s" % (lesson["number"], lesson["title"])
    return "\\ref lesson%d \"%s%s%s\"" % (lesson["number"], "← " if arrow_left else "", label,
                                          "" if arrow_left else " →")


def navigation(lessons, i):
    parts = []
    if i > 0:
        parts.append("Previous: " + lesson_ref(lessons[i - 1], True))
    parts.append("\\ref mainpage \"All lessons\"")
    parts.append("\\ref results \"Results\"")
    if i + 1 < len(lessons):
        parts.append("Next: " + lesson_ref(lessons[i + 1], False))
    return " · ".join(parts)


def process_lesson(lessons, i, csv_dir, images, summary):
    lesson = lessons[i]
    n, folder = lesson["number"], lesson["dir"]
    solution_dir = os.path.join("solutions", folder)
    lines = read(os.path.join(folder, "README.md")).splitlines()
    if not lines or "{#lesson%d}" % n not in lines[0]:
        die("%s/README.md must start with '# Lesson %d — ... {#lesson%d}'" % (folder, n, n))
    readme = os.path.join(folder, "README.md")
    conventions.read_steps(readme)  # a malformed step heading stops the build (ConventionError)
    cases = test_cases(lesson)
    nav = navigation(lessons, i)

    out = [lines[0], "", nav, ""]
    answers = []  # (step, file, tag)
    step = None
    fenced = False

    def close_step():
        if step is None:
            return
        k = step
        count = len(cases.get(k, []))
        text = ("<b>Checks of step %d:</b> \\ref lesson%d_checks_step%d \"%d check%s\" — "
                "``bazel test //%s:all --test_arg=--test-case='*step%d*'``"
                % (k, n, k, count, "" if count == 1 else "s", folder, k))
        mine = [(f, t) for (s, f, t) in answers if s == k]
        if mine:
            text += ". One answer: " + ", ".join("\\ref lesson%d_answer_%s \"%s\"" % (n, t, t) for _, t in mine)
        out.extend(["", text + ".", ""])

    generated_at = None
    for number_, line in enumerate(lines[1:], 2):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            close_step()
            step = None
            heading = conventions.step_heading(line, "%s:%d" % (readme, number_))
            if heading:
                step = heading.number
                if not heading.anchor:
                    line = line.rstrip() + " {#lesson%d_step%d}" % (n, step)
            elif line.startswith("## Next") and generated_at is None:
                generated_at = len(out)
        if not fenced and step is not None:
            m = SNIPPET.match(line)
            if m and m.group(1).startswith(folder + "/"):
                answer = os.path.join(solution_dir, os.path.basename(m.group(1)))
                if m.group(2) in tags(answer) and not any(t == m.group(2) for _, _, t in answers):
                    answers.append((step, answer, m.group(2)))
        if not fenced and not line.startswith("    "):
            # Doxygen 1.9 ends a `code span` at a "'" (it reads `...' as quotes); ``code span`` is safe.
            line = protect_quoted_spans(line)
        out.append(line)
    close_step()

    extra = [""]
    # The demo: what it shows (its code), measured here (plots and tables).
    extra += ["## What the demo shows {#lesson%d_demo}" % n, "",
              "The docs build ran `bazel run //%s:demo -- --quick --device=cpu --csv_dir=DIR` (the reference "
              "solution, small CPU settings) and drew these from its CSV files. \\ref results \"Results\" has every "
              "lesson's numbers side by side, and recorded GPU runs." % folder, ""]
    for name, caption in images.get(n, []):
        extra += ["\\image html %s \"%s\"" % (name, caption.replace('"', "'")), ""]
    rows = [r for r in summary[1] if r and r[0].startswith("%d " % n)]
    if rows:
        extra += ["The headline numbers of this run:", "", summary_table(summary[0], rows), ""]
    for path in sorted(os.listdir(csv_dir)):
        if path.startswith("lesson%d_" % n) and path.endswith(".csv"):
            header, body = read_csv(os.path.join(csv_dir, path))
            if 0 < len(body) <= MAX_TABLE_ROWS:
                extra += ["<b>%s</b> (%s):" % (cell(path), "all rows"), "", html_table(header, body), ""]
            elif body:
                extra += ["<b>%s</b>: %d rows (in the plots above)." % (cell(path), len(body)), ""]
    # demo.cc and the demo's other files (the manifest's `demo`, lesson 7: one mode per file).
    for name in ["demo.cc"] + [f for f in lesson.get("demo", []) if f.endswith(".cc")]:
        demo_tags = tags(os.path.join(folder, name))
        if demo_tags:
            extra += ["How the demo measures it (%s/%s):" % (folder, name), ""]
            for tag in demo_tags:
                extra += ["\\snippet %s/%s %s" % (folder, name, tag), ""]

    extra += ["## The checks, step by step {#lesson%d_checks}" % n, "",
              "Every check is a doctest case in the lesson's `*_test.cc` files, named after the behaviour it proves. "
              "`bazel run //:progress` runs them all and says which step to work on next.", ""]
    for k in sorted(cases):
        extra += ["### Step %d {#lesson%d_checks_step%d}" % (k, n, k), "",
                  "Back to \\ref lesson%d_step%d \"step %d\". Run: ``bazel test //%s:all --test_arg=--test-case='*step%d*'``"
                  % (n, k, k, folder, k), ""]
        for name, path, line_no in cases[k]:
            # <tt>, not a code span: Doxygen reads "a::b" in a code span as a link request.
            extra.append("- <tt>%s</tt> (%s:%d)" % (cell(name).replace("::", "\\::"), path, line_no))
        extra.append("")

    if answers:
        extra += ["## One answer {#lesson%d_answers}" % n, "",
                  "The reference solution in `%s/`, which the same checks run against "
                  "(`bazel test //%s:all`). Try the step yourself first: the checks and hints are there for that."
                  % (solution_dir, solution_dir), ""]
        for k, path, tag in answers:
            extra += ["### Step %d: %s {#lesson%d_answer_%s}" % (k, tag, n, tag), "",
                      "\\snippet %s %s" % (path, tag), ""]
    extra += ["", nav, ""]

    if generated_at is None:
        out += extra
    else:
        out = out[:generated_at] + extra + out[generated_at:]
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lessons", required=True)
    parser.add_argument("--csv", required=True)
    parser.add_argument("--mainpage", required=True)
    parser.add_argument("--plots", required=True)
    parser.add_argument("--recorded", action="append", default=[])
    parser.add_argument("--bench", action="append", default=[])
    parser.add_argument("--image", action="append", default=[], help="a committed picture, copied into images/")
    parser.add_argument("--readme", required=True)
    parser.add_argument("--maintainers", required=True)
    parser.add_argument("--page", action="append", default=[],
                        help="a page of its own (docs/pages/*.md), copied; @SLOT_TABLE@ becomes the slot table")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    lessons = json.loads(read(args.lessons))
    ready = lessons
    images_dir = os.path.join(args.out, "images")
    os.makedirs(images_dir, exist_ok=True)
    for picture in args.image:  # committed pictures of recorded runs, for the pages' \image html lines
        shutil.copy(picture, os.path.join(images_dir, os.path.basename(picture)))
    csv_dir = os.path.abspath(args.csv)

    summary_path = os.path.join(csv_dir, "summary.csv")
    if not os.path.exists(summary_path):
        die("the demos wrote no summary.csv into %s" % csv_dir)
    summary = read_csv(summary_path)

    images = {l["number"]: plots(l, args.plots, csv_dir, os.path.abspath(images_dir)) for l in ready}

    # The main page: the course table.
    # The core steps and the going-further ones come from the manifest and the page (tools/slot_check.py).
    rows = {}
    try:
        for row in slot_check.check(".", lessons)[0]:
            rows[row["number"]] = row
    except conventions.ConventionError as error:
        die(str(error))
    page_names = [os.path.splitext(os.path.basename(p))[0] for p in args.page]
    table = ["| lesson | you learn | core steps (one slot) · going further | you need |",
             "|--------|-----------|-------------------------------------|----------|"]
    for l in lessons:
        name = "%d. %s%s" % (l["number"], l["title"], " (draft)" if l.get("draft") else "")
        link = "\\ref lesson%d \"%s\"" % (l["number"], name)
        row = rows[l["number"]]
        steps = "%s · %s" % (slot_check.steps_text(row["core"]), slot_check.steps_text(row["further"]))
        if "lesson%d_in_depth" % l["number"] in page_names:
            steps += " · \\ref lesson%d_in_depth \"in depth\"" % l["number"]
        table.append("| %s | %s | %s | %s |" % (link, l["learn"], steps, l["need"]))
    mainpage = read(args.mainpage)
    if "@LESSON_TABLE@" not in mainpage:
        die("%s has no @LESSON_TABLE@ line" % args.mainpage)
    write(os.path.join(args.out, "mainpage.md"), mainpage.replace("@LESSON_TABLE@", "\n".join(table)))

    for i, lesson in enumerate(lessons):
        try:
            page = process_lesson(lessons, i, csv_dir, images, summary)
        except conventions.ConventionError as error:
            die(str(error))
        write(os.path.join(args.out, lesson["dir"], "README.md"), page)

    # The quick start (the README) and the maintainers' page.
    readme = read(args.readme).splitlines()
    if not readme or not readme[0].startswith("# "):
        die("%s must start with a '# ' title" % args.readme)
    write(os.path.join(args.out, "readme.md"),
          "\n".join(["# Quick start and setup {#md_README}"] + [protect_quoted_spans(l) for l in readme[1:]]) + "\n")
    maintainers = read(args.maintainers)
    if "{#maintainers}" not in maintainers.splitlines()[0]:
        die("%s must start with '# ... {#maintainers}'" % args.maintainers)
    write(os.path.join(args.out, "maintainers.md"), "\n".join(protect_quoted_spans(l) if not l.startswith("    ") else l
                                                              for l in maintainers.splitlines()) + "\n")

    # The pages of their own: the deep dives and the instructors' page.
    for path in args.page:
        text = read(path)
        first = text.splitlines()[:1]
        if not first or not re.match(r"^# .* \{#\w+\}\s*$", first[0]):
            die("%s must start with '# Title {#anchor}'" % path)
        if "@SLOT_TABLE@" in text:
            text = text.replace("@SLOT_TABLE@", slot_check.table_markdown([rows[l["number"]] for l in lessons]))
        elif os.path.basename(path) == "workshop.md":
            die("%s has no @SLOT_TABLE@ line" % path)
        write(os.path.join(args.out, os.path.basename(path)),
              "\n".join(protect_quoted_spans(l) if not l.startswith("    ") else l for l in text.splitlines()) + "\n")

    # The results page. A device column may add a note after the device's name ("AMD EPYC (2 threads), Gloo
    # over loopback"): the page names each device once.
    devices = []
    for row in summary[1]:
        name = row[-1].split(", ")[0] if row else ""
        if name and name not in devices:
            devices.append(name)
    page = ["# Results {#results}", "", "[TOC]", "",
            "Every number on this page comes from a real run of the lessons' demos on their reference solutions; "
            "nothing is typed in by hand. The first table is measured while this site is built, on the build "
            "machine's CPU with the demos' small `--quick` settings; the recorded runs below it were made on GPUs "
            "with `bazel run //:tour` and committed to `docs/results/`.", "",
            "## This build: CPU, quick settings {#results_cpu}", "",
            "<b>Device:</b> %s (CPU). <b>Command:</b> each lesson's `bazel run //lessonN_x:demo -- --quick "
            "--device=cpu --csv_dir=DIR`, as `bazel run //:tour -- --quick --device=cpu` runs them. Bytes and counts are "
            "the same on every run; times come from a small, possibly shared machine and move from run to run."
            % cell(", ".join(devices) or "unknown"), "",
            summary_table(*summary), ""]
    for lesson in ready:
        n = lesson["number"]
        page += ["### Lesson %d — %s {#results_lesson%d}" % (n, lesson["title"], n), "",
                 "Details on the lesson page: \\ref lesson%d_demo \"what the demo shows\"." % n, ""]
        for name, caption in images.get(n, []):
            page += ["\\image html %s \"%s\"" % (name, caption.replace('"', "'")), ""]
    page += ["## Recorded GPU results {#results_gpu}", ""]
    if not args.recorded:
        page += ["<b>No GPU run has been recorded yet.</b> On a machine with an NVIDIA GPU and a CUDA LibTorch "
                 "(see the README), run", "",
                 "    bazel run //:tour -- --device=cuda --record=docs/results/$(date +%F)-<gpu>.csv", "",
                 "and commit the file: it holds the tour's table with the device, the date and the command, and "
                 "appears here beside the CPU numbers.", ""]
    for path in sorted(args.recorded):
        meta = {}
        for line in read(path).splitlines():
            m = re.match(r"^#\s*(\w+):\s*(.*)$", line)
            if m:
                meta[m.group(1)] = m.group(2)
        for key in ("device", "date", "command"):
            if key not in meta:
                die("%s lacks its '# %s: ...' line" % (path, key))
        header, rows = read_csv(path)
        page += ["### %s, %s {#results_gpu_%s}" % (cell(meta["device"]), cell(meta["date"]),
                                                   re.sub(r"\W", "_", os.path.basename(path))), "",
                 "<b>GPU run, recorded.</b> Device: %s. Date: %s. Command: `%s`. File: `%s`."
                 % (cell(meta["device"]), cell(meta["date"]), meta["command"].replace("`", "'"),
                    os.path.basename(path)), "",
                 summary_table(header, rows), ""]
    page += ["## Benchmarks, side by side {#results_bench}", "",
             "`bazel run //bench -- --out_dir=DIR` runs every lesson's baseline and improved variants in one "
             "process, warmed up, repeated and synchronised, and measures the device's matmul and copy ceilings in "
             "the same run, so that each speed is also a fraction of what the device can do. In the same run it "
             "times PyTorch's own implementations of the same techniques from Python (`bench/peer.py`: "
             "`torch.autocast`, PyTorch's GradScaler, the accumulation loop, `checkpoint_sequential`) on the same "
             "workloads, seeds, threads and device, and puts ours and theirs side by side; the GradScaler's own "
             "cost gets its napkin math. These tables were recorded with it and committed to "
             "`docs/results/bench/`.", ""]
    if not args.bench:
        page += ["No benchmark run has been recorded yet.", ""]
    for path in sorted(args.bench):
        kind = "GPU" if "cuda" in os.path.basename(path) else "CPU"
        text = read(path)
        page += ["### %s run: %s {#results_bench_%s}" % (kind, os.path.basename(path),
                                                        re.sub(r"\W", "_", os.path.basename(path))), "", text, ""]
    write(os.path.join(args.out, "results.md"), "\n".join(page) + "\n")


if __name__ == "__main__":
    main()
