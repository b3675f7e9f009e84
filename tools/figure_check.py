#!/usr/bin/env python3
"""The figure check: every measured figure a lesson page or the README shows is in the committed results file the
page names for it, so a page cannot drift from the recorded runs.

A page names its source with a marker, which holds until the next heading or the next marker:

    <!-- figures: docs/results/bench/bench_cpu.md, docs/results/bench/lesson6_demo_cpu.md -->

A figure is a number with a unit of time, rate, ratio or share (ms, µs, s, x, ×, %, GB/s, GiB/s, GFLOP/s, MB,
MiB, GiB, KiB). Under a marker, each one must appear in one of the named files: the same value at the page's
precision (6.65x on the page matches 6.65x or 6.6512 in the file; 29 % matches 29.4% or a fraction 0.294).
Outside any marker, a measured-looking figure is an error. Not figures: numbers in inline code and \\snippet
lines; arithmetic (a number next to =, ×, ·, / or +, e.g. `23 × 64 MiB = 1.44 GiB`); rules and goals (a number
after "at least", "at most", "within", "below", "above", "under", "over", "more than", "less than", "up to",
"goal", "≥", "≤", "<", ">"); versions (PyTorch 2.4); and, outside a marker, every number of a paragraph that calls itself napkin
arithmetic (the word "napkin" in it). Under a marker a number with a decimal point and no unit is checked too.

  python3 tools/figure_check.py [ROOT]        # the README, every lesson page of the manifest, docs/pages/*.md
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import manifest  # noqa: E402

# Units of what a run measures (time, rate, ratio, share) and of sizes; a size is a figure only under a marker
# (outside one it is a setting: "buckets of 1 MiB"). "×" before a number is a product, not a ratio.
MEASURED_UNITS = ("GFLOP/s", "TFLOP/s", "GB/s", "GiB/s", "MB/s", "ms", "µs", "us", "s", "x", "×", "%")
SIZE_UNITS = ("MiB", "MB", "GiB", "GB", "KiB")
UNIT = "(?:" + "|".join(re.escape(u) for u in MEASURED_UNITS + SIZE_UNITS) + ")"
FIGURE = re.compile(r"(?<![\w.\-/])(\d+(?:,\d{3})*(?:\.\d+)?)(?:\s?[–-]\s?(\d+(?:\.\d+)?))?\s?(" + UNIT +
                    r")(?![\w/])")
PRODUCT_AFTER = re.compile(r"^\s*(\d|\(|[A-Z]|numel\b|[a-zA-Z]\b)")  # "16 × Linear(...)", "2 × 4": a product
MARKER = re.compile(r"<!--\s*figures:\s*(.*?)\s*-->")
RULE_AFTER = re.compile(r"^[^.;,]{0,16}\b(bound|timeout|limit|goal|budget|per call)\b")
RULE_BEFORE = re.compile(r"\b(at least|at most|within|below|above|under|over|more than|less than|up to|goal|"
                         r"threshold)\b|[≥≤<>]")
ARITHMETIC = re.compile(r"[=≈×·/+]\s*$")
ARITHMETIC_AFTER = re.compile(r"^\s*[=×·/+]")
NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")


def pages(root):
    """(path relative to root, text) of the README, each lesson page in course order, and the pages of their own
    (docs/pages/*.md: the deep dives and the instructors' page)."""
    out = [("README.md", open(os.path.join(root, "README.md"), encoding="utf-8").read())]
    for lesson in manifest.load(os.path.join(root, "tools", "lessons.bzl")):
        path = os.path.join(lesson.dir, "README.md")
        full = os.path.join(root, path)
        if os.path.exists(full):
            out.append((path, open(full, encoding="utf-8").read()))
    own = os.path.join(root, "docs", "pages")
    if os.path.isdir(own):
        for name in sorted(os.listdir(own)):
            if name.endswith(".md"):
                path = os.path.join("docs", "pages", name)
                out.append((path, open(os.path.join(root, path), encoding="utf-8").read()))
    return out


def strip_code_spans(line):
    """The line with `inline code` and bold markers blanked (same length, so columns still point into the
    page)."""
    line = re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), line)
    return line.replace("**", "  ")  # bold is not arithmetic


def paragraphs(lines):
    """[(first line number, [lines])]: blocks split at blank lines, headings and list items."""
    blocks, current, start = [], [], 0
    for i, line in enumerate(lines, 1):
        new_item = re.match(r"\s{0,3}([-*]|\d+\.)\s", line) is not None and not line.startswith("    ")
        if not line.strip() or line.startswith("#") or new_item:
            if current:
                blocks.append((start, current))
            current, start = [], i
            if not line.strip() or line.startswith("#"):
                blocks.append((i, [line]))
                current = []
                continue
        if not current:
            start = i
        current.append(line)
    if current:
        blocks.append((start, current))
    return blocks


FILE_NUMBER = re.compile(r"(\d+(?:,\d{3})*(?:\.\d+)?)(?:\s?(" + UNIT + r")(?![\w/]))?")


def values_in(text):
    """[(value, unit)] of every number in a results file; unit "" for a bare one (a table cell)."""
    return [(float(m.group(1).replace(",", "")), canonical(m.group(2) or "")) for m in FILE_NUMBER.finditer(text)]


def canonical(unit):
    return "x" if unit == "×" else unit


def decimals(number_text):
    return len(number_text.split(".")[1]) if "." in number_text else 0


def matches(number_text, unit, file_values):
    """Whether the page's number is one of the file's values at the page's precision, with the same unit or none
    in the file (6.65x does not match a 6.65 ms; a bare number on the page matches any); a share also matches a
    bare fraction that reads as it."""
    value = float(number_text.replace(",", ""))
    places = decimals(number_text)
    tolerance = 0.5 * 10 ** -places + 1e-9
    unit = canonical(unit)
    for v, file_unit in file_values:
        if unit and file_unit not in ("", unit):
            continue
        if abs(v - value) <= tolerance:
            return True
        if unit == "%" and not file_unit and abs(100 * v - value) <= tolerance:
            return True
    return False


VERSION_BEFORE = re.compile(r"\b(PyTorch|LibTorch|CUDA|cuDNN|gcc|Debian|Python|Bazel|version|sm_)\s?$")


def is_rule_or_arithmetic(line, start, end):
    if VERSION_BEFORE.search(line[max(0, start - 12):start]):
        return True  # a version, not a figure
    before = line[max(0, start - 28):start].lower()
    after = line[end:end + 3]
    if ARITHMETIC.search(before) or ARITHMETIC_AFTER.match(after):
        return True
    return RULE_BEFORE.search(before) is not None or RULE_AFTER.match(line[end:]) is not None


BARE_DECIMAL = re.compile(r"(?<![\w.\-/:])(\d+\.\d+)(?![\w.:/%×]|\s?(?:" + UNIT[3:-1] + r")(?![\w/]))")


def bare_decimals(path, line_number, line, sources, file_values):
    """Under a marker, a number with a decimal point and no unit ("33.18 against 31.16 ms", a pasted table's
    cells) must be in the named files too."""
    pool = [v for name in sources for v in file_values.get(name, [])]
    out = []
    for m in BARE_DECIMAL.finditer(line):
        if is_rule_or_arithmetic(line, m.start(), m.end()):
            continue
        if not matches(m.group(1), "", pool):
            out.append("%s:%d: \"%s\" is not in %s" % (path, line_number, m.group(1), " or ".join(sources)))
    return out


def check_page(root, path, text):
    problems = []
    lines = text.split("\n")
    sources = None  # None: no marker since the last heading; else the named files
    file_values = {}  # each named file's numbers, read once per page
    for start, block in paragraphs(lines):
        joined = "\n".join(block)
        if block[0].startswith("#"):
            sources = None
            continue
        for marker in MARKER.finditer(joined):
            named = [s.strip() for s in marker.group(1).split(",") if s.strip()]
            sources = named
            for name in named:
                full = os.path.join(root, name)
                if not os.path.isfile(full):
                    problems.append("%s:%d: the figures' results file %s does not exist" % (path, start, name))
                    file_values[name] = []
                elif name not in file_values:
                    file_values[name] = values_in(open(full, encoding="utf-8").read())
        if "napkin" in joined.lower() and not sources:
            continue  # napkin arithmetic, typed; under a marker every figure is checked, napkin or not
        for offset, raw in enumerate(block):
            if "\\snippet" in raw or MARKER.search(raw) or "\\ref" in raw and "results" not in raw:
                continue
            line = strip_code_spans(raw)
            if sources:
                problems += bare_decimals(path, start + offset, line, sources, file_values)
            for m in FIGURE.finditer(line):
                if m.group(3) == "×" and PRODUCT_AFTER.match(line[m.end():]):
                    continue
                if is_rule_or_arithmetic(line, m.start(), m.end()):
                    continue
                shown = m.group(0).strip()
                if not sources and m.group(3) in SIZE_UNITS:
                    continue
                if not sources:
                    problems.append("%s:%d: \"%s\" is a measured figure with no results file named for it (add "
                                    "<!-- figures: docs/results/... --> above it, or say it is napkin arithmetic)"
                                    % (path, start + offset, shown))
                    continue
                pool = [v for name in sources for v in file_values.get(name, [])]
                for number in [m.group(1)] + ([m.group(2)] if m.group(2) else []):
                    if not matches(number, m.group(3), pool):
                        problems.append("%s:%d: \"%s\" is not in %s" % (path, start + offset, shown,
                                                                         " or ".join(sources)))
                        break
    return problems


def check(root):
    problems = []
    for path, text in pages(root):
        problems += check_page(root, path, text)
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.getcwd()
    problems = check(root)
    for p in problems:
        print("figure check: " + p)
    if problems:
        print("figure check: %d figure(s) not backed by a committed results file" % len(problems))
        return 1
    print("figure check: every measured figure on %d pages is in its named results file" % len(pages(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
