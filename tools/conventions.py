#!/usr/bin/env python3
"""The course's conventions, parsed in one place. Every script that reads a lesson imports this module:
tools/maintainer_check.py, tools/step_invariant.py, tools/progress.py and docs/gen_pages.py.

What each convention is (and nothing else is):
  step heading   a level-2 heading in a lesson's README.md, outside fenced code:
                   ## Step K                      (K = 1, 2, ...; the steps of a page are numbered 1..n in order)
                   ## Step K — Title
                   ## Step K — Title {#lessonN_stepK}
                 A line that looks like one but is not (`### Step 3`, `#Step 3`, `## Step3`, `## step 3`,
                 `## Step 3: title`) is an error, not a silent non-step: every script rejects it the same way.
  test tag       a doctest case whose name starts with "[stepK] " (then the behaviour, in words).
  TODO marker    `TODO(lessonN, step K)` in a skeleton source; a near miss (`TODO(lesson1,step 2)`,
                 `TODO(lesson1, Step 2)`) is an error.
  snippet marker a line `// [tag]` (tag: letters, digits, `_`); a pair of equal lines encloses one snippet.
                 `//[tag]` or `//  [tag]` is an error (Doxygen's \\snippet would not find it).
  hint           in the README's `## Hints` section, a bullet `- Step K: ...` (continuation lines indented).

Each parser raises ConventionError with "path:line: what is wrong" for anything that breaks these rules.
"""
import collections
import re


class ConventionError(ValueError):
    """A lesson file breaks one of the course's conventions (the message names the file and line)."""


# The files of a lesson that hold its code (a learner may edit any of them; lesson 6 has a CUDA file).
SOURCE_SUFFIXES = (".cc", ".h", ".cu")

Step = collections.namedtuple("Step", "number title anchor line")
Marker = collections.namedtuple("Marker", "tag first last")  # line indices (0-based) of the two marker lines

_STEP = re.compile(r"^## Step (\d+)(?: — (.*?))?(?: \{#([\w-]+)\})?\s*$")
_STEP_LIKE = re.compile(r"^\s*#+\s*step\b|^\s*#+\s*step\d", re.IGNORECASE)
_TAG = re.compile(r"^\[step(\d+)\] \S")
_TAG_LIKE = re.compile(r"^\s*\[\s*step", re.IGNORECASE)
_TODO = r"TODO\(lesson%s, step (\d+)\)"
_TODO_LIKE = re.compile(r"TODO\(\s*lesson[^)]*\)?", re.IGNORECASE)
_TODO_ANY = re.compile(_TODO % r"(\d+)")
_MARKER = re.compile(r"^\s*// \[([A-Za-z0-9_]+)\]\s*$")
_MARKER_LIKE = re.compile(r"^\s*//\s*\[\s*[A-Za-z0-9_-]+\s*\]\s*$")
_TEST_CASE = re.compile(r'^\s*(GPU_)?TEST_CASE\s*\(\s*"((?:[^"\\]|\\.)*)"')
_HINT = re.compile(r"^- Step (\d+):\s*(.*)$")


def _fences(lines):
    """Yields (index, line, inside_fence) for Markdown lines; a ``` line toggles the fence."""
    fenced = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            yield i, line, True
            continue
        yield i, line, fenced


def step_heading(line, where="README.md:?"):
    """The Step of a README line that is a step heading; None for any other line; ConventionError for a line
    that looks like a step heading but does not follow the rule (see the module's doc)."""
    m = _STEP.match(line)
    if m:
        return Step(int(m.group(1)), m.group(2) or "", m.group(3), None)
    if _STEP_LIKE.match(line):
        raise ConventionError("%s: %r looks like a step heading but is not one; a step heading is "
                              "'## Step K', '## Step K — Title' or '## Step K — Title {#anchor}'"
                              % (where, line.strip()))
    return None


def steps(text, path="README.md"):
    """[Step] of a lesson page, in order; they must be numbered 1..n."""
    found = []
    for i, line, fenced in _fences(text.splitlines()):
        if fenced:
            continue
        step = step_heading(line, "%s:%d" % (path, i + 1))
        if step:
            found.append(step._replace(line=i + 1))
    numbers = [s.number for s in found]
    if numbers != list(range(1, len(numbers) + 1)):
        raise ConventionError("%s: the step headings are numbered %s; they must be 1..n in order"
                              % (path, numbers))
    return found


def read_steps(path):
    with open(path, encoding="utf-8") as f:
        return steps(f.read(), path)


def test_step(name):
    """K of a doctest case named "[stepK] ...", None for a name without a step tag; ConventionError for a
    malformed tag ("[Step3] x", "[step3]x", "[ step 3] x")."""
    m = _TAG.match(name)
    if m:
        return int(m.group(1))
    if _TAG_LIKE.match(name):
        raise ConventionError("test case %r: a step tag is '[stepK] ' at the start of the name" % name)
    return None


def test_cases(text, path="?_test.cc"):
    """[(name, step or None, line number, gpu_only)] of the TEST_CASE / GPU_TEST_CASE lines of a test source."""
    out = []
    for i, line in enumerate(text.splitlines()):
        m = _TEST_CASE.match(line)
        if m:
            try:
                k = test_step(m.group(2))
            except ConventionError as error:
                raise ConventionError("%s:%d: %s" % (path, i + 1, error))
            out.append((m.group(2), k, i + 1, bool(m.group(1))))
    return out


def todos(text, lesson, path="?"):
    """[(line number, K)] of the TODO(lessonN, step K) markers of lesson `lesson` in `text`, in file order.
    A near miss, or a marker of another lesson, is a ConventionError."""
    exact = re.compile(_TODO % lesson)
    out = []
    for i, line in enumerate(text.splitlines()):
        for m in _TODO_LIKE.finditer(line):
            e = exact.match(line, m.start())
            if e:
                out.append((i + 1, int(e.group(1))))
            elif _TODO_ANY.match(line, m.start()):
                raise ConventionError("%s:%d: %r belongs to another lesson than lesson %s"
                                      % (path, i + 1, m.group(0), lesson))
            else:
                raise ConventionError("%s:%d: %r is not a TODO marker; write TODO(lesson%s, step K)"
                                      % (path, i + 1, m.group(0), lesson))
    return out


def has_todo(text):
    """Whether `text` holds any TODO(lesson...) marker, well-formed or not (solutions must hold none)."""
    return _TODO_LIKE.search(text) is not None


def marker_tag(line, where="?"):
    """The tag of a `// [tag]` marker line, None for other lines, ConventionError for a malformed one."""
    m = _MARKER.match(line)
    if m:
        return m.group(1)
    if _MARKER_LIKE.match(line):
        raise ConventionError("%s: %r is not a snippet marker; write '// [tag]' (one space, tag of letters, "
                              "digits, _)" % (where, line.strip()))
    return None


def markers(lines, path="?"):
    """[Marker] of the `// [tag]` pairs of a source (as a list of lines), in file order; unclosed and nested
    pairs are errors."""
    found, open_at = [], {}
    for i, line in enumerate(lines):
        tag = marker_tag(line, "%s:%d" % (path, i + 1))
        if tag is None:
            continue
        if tag in open_at:
            found.append(Marker(tag, open_at.pop(tag), i))
        else:
            if open_at:
                raise ConventionError("%s:%d: marker [%s] opens inside [%s]; nested markers are not supported"
                                      % (path, i + 1, tag, next(iter(open_at))))
            open_at[tag] = i
    if open_at:
        tag, i = next(iter(open_at.items()))
        raise ConventionError("%s:%d: marker [%s] is never closed" % (path, i + 1, tag))
    return sorted(found, key=lambda m: m.first)


def marker_tags(text, path="?"):
    """The distinct tags of a source's marker pairs, in file order."""
    out = []
    for m in markers(text.splitlines(), path):
        if m.tag not in out:
            out.append(m.tag)
    return out


def hints(text):
    """{K: [hint, ...]} from the bullets '- Step K: ...' of the README's '## Hints' section."""
    out, inside, current = {}, False, None
    for _, line, fenced in _fences(text.splitlines()):
        if not fenced and line.startswith("## "):
            inside = line.startswith("## Hints")
            current = None
            continue
        if not inside:
            continue
        m = _HINT.match(line)
        if m:
            current = int(m.group(1))
            out.setdefault(current, []).append(m.group(2))
        elif line.startswith("- "):
            current = None
        elif current is not None and line.strip():
            out[current][-1] += " " + line.strip()
    return out


def _strip_cpp(text):
    """`text` with comments, string and character literals blanked out (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


_FUNCTION_NAME = re.compile(r"((?:[A-Za-z_]\w*\s*::\s*)*~?[A-Za-z_]\w*|operator\s*[^\s(]+)\s*\(")
_NOT_A_FUNCTION = re.compile(r"\b(namespace|struct|class|union|enum)\b|=")


def functions(text):
    """The names of the functions a C++ source defines outside any class body, in file order
    (`ns::Class::method` as written, overloads repeated), e.g. for comparing a skeleton with its solution."""
    code = _strip_cpp(text)
    names, depth, head = [], [], []  # depth: stack of "namespace" / "other" braces
    for c in code:
        if c == "{":
            statement = "".join(head).strip()
            head = []
            if all(d == "namespace" for d in depth):
                if re.search(r"\bnamespace\b[^;]*$|\bextern\s+\"", statement):
                    depth.append("namespace")
                    continue
                if "(" in statement and not _NOT_A_FUNCTION.search(statement.split("(")[0]):
                    m = _FUNCTION_NAME.search(statement)
                    if m:
                        names.append(re.sub(r"\s+", "", m.group(1)))
            depth.append("other")
        elif c == "}":
            if depth:
                depth.pop()
            head = []
        elif c == ";":
            head = []
        elif all(d == "namespace" for d in depth):
            head.append(c)
    return names
