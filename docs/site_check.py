#!/usr/bin/env python3
"""Checks the built docs site (//docs:site_test).

  site_check.py SITE_DIR PAGES_DIR LESSONS_JSON      (run from the runfiles root: the sources are there)

- the main page, the results page, the quick start and every lesson's page exist;
- every internal link (href/src) of every HTML file points at a file of the site, and its #anchor exists there;
- every image is a non-empty file, and every plot a page asks for (\\image) is on that page;
- every \\snippet of a lesson page is on the built page, character for character (whitespace aside);
- every lesson page links to the previous and next lessons, the results page, and each step to its checks;
- no page's file name or text shows Bazel's output tree (bazel-out, k8-fastbuild, ...);
- the pages use the doxygen-awesome theme (Debian's doxygen-awesome-css) with its dark-mode toggle and the copy
  buttons on code fragments.
Prints "N passed, M failed" and exits non-zero on any failure.
"""
import html
import html.parser
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import conventions  # noqa: E402  (step headings and // [tag] markers, as the generator reads them)

SNIPPET = re.compile(r"^\s*\\snippet\s+(\S+)\s+(\S+)\s*$", re.M)
IMAGE = re.compile(r"^\s*\\image\s+html\s+(\S+)", re.M)


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.links, self.images, self.text = set(), [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        for key in ("href", "src"):
            if attrs.get(key):
                self.links.append(attrs[key])
        if tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"])
        if tag == "object" and attrs.get("data"):  # Doxygen shows an SVG as <object data=...>
            self.images.append(attrs["data"])
            self.links.append(attrs["data"])

    def handle_data(self, data):
        self.text.append(data)


def parse(path):
    page = Page()
    with open(path, encoding="utf-8", errors="replace") as f:
        page.feed(f.read())
    page.flat = " ".join(" ".join(page.text).split())
    page.dense = "".join(page.flat.split())  # Doxygen's code listings space tokens their own way
    return page


def snippet_text(path, tag):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for marker in conventions.markers(lines, path):
        if marker.tag == tag:
            return "\n".join(lines[marker.first + 1:marker.last])
    return None


def main():
    site, pages_dir, lessons_json = sys.argv[1:4]
    lessons = json.load(open(lessons_json))
    ready = lessons
    checks = {"passed": 0, "failed": 0}

    def check(ok, message):
        checks["passed" if ok else "failed"] += 1
        if not ok:
            print("FAIL: " + message)

    required = ["index.html", "results.html", "md_README.html", "maintainers.html"] + [
        "lesson%d.html" % l["number"] for l in ready]
    for name in required:
        check(os.path.isfile(os.path.join(site, name)), "missing page " + name)

    # The side navigation lists every page once, and only the main page carries the course's title.
    navtree = os.path.join(site, "navtreedata.js")
    if os.path.isfile(navtree):
        text = open(navtree, encoding="utf-8").read()
        root = re.search(r'^  \[ "([^"]*)"', text, re.M)
        entries = re.findall(r'^    \[ "([^"]*)", "([^"#]*)"', text, re.M)
        titles = [t for t, _ in entries]
        check(len(set(titles)) == len(titles), "the side navigation lists an entry twice: %s" % titles)
        check(root is not None and not any(t.startswith(root.group(1)) for t in titles),
              "a page of the side navigation repeats the site's title: %s" % titles)
        check(any(f == "maintainers.html" for _, f in entries), "the side navigation has no maintainers' page")
    else:
        check(False, "no navtreedata.js (GENERATE_TREEVIEW)")

    # The subtitle does not count the lessons (or counts them right).
    brief = re.search(r'id="projectbrief">([^<]*)<', open(os.path.join(site, "index.html"), encoding="utf-8").read()
                      if os.path.isfile(os.path.join(site, "index.html")) else "")
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    if brief:
        counted = [w for w in words if re.search(r"\b%s\b" % w, brief.group(1), re.I)]
        check(not counted or counted == [words[len(lessons) - 1]],
              "the subtitle '%s' counts the lessons wrong (%d lessons)" % (brief.group(1), len(lessons)))

    output_tree = re.compile(r"bazel-out|k8-fastbuild|_2bin_2|execroot")
    leaks = []
    for root, _, files in os.walk(site):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), site)
            if output_tree.search(rel):
                leaks.append("file name " + rel)
            elif name.endswith((".html", ".js")):
                text = open(os.path.join(root, name), encoding="utf-8", errors="replace").read()
                m = output_tree.search(text)
                if m:
                    leaks.append("%s shows '%s'" % (rel, text[max(0, m.start() - 40):m.end() + 40].strip()))
    for leak in leaks[:10]:
        print("FAIL: Bazel's output tree shows in the site: " + leak)
    check(not leaks, "%d page names or texts show Bazel's output tree" % len(leaks))

    index = open(os.path.join(site, "index.html"), encoding="utf-8").read() if os.path.isfile(
        os.path.join(site, "index.html")) else ""
    for asset in ["doxygen-awesome.css", "doxygen-awesome-darkmode-toggle.js",
                  "doxygen-awesome-fragment-copy-button.js"]:
        check(asset in index and os.path.isfile(os.path.join(site, asset)),
              "the theme's %s is not on the site (install doxygen-awesome-css: bash tools/setup.sh)" % asset)
    check("DoxygenAwesomeDarkModeToggle.init" in index and "DoxygenAwesomeFragmentCopyButton.init" in index,
          "the dark-mode toggle and the copy buttons are not switched on in the page header")

    pages = {}
    for root, _, files in os.walk(site):
        for name in files:
            if name.endswith(".html"):
                path = os.path.join(root, name)
                pages[os.path.relpath(path, site)] = parse(path)

    broken = []
    for name, page in sorted(pages.items()):
        for link in page.links:
            if re.match(r"^(https?:|mailto:|javascript:|data:)", link) or link.startswith("//"):
                continue
            target, _, anchor = link.partition("#")
            target_rel = os.path.normpath(os.path.join(os.path.dirname(name), target)) if target else name
            target_path = os.path.join(site, target_rel)
            if not os.path.isfile(target_path):
                broken.append("%s: link to missing file %s" % (name, link))
            elif anchor and target_rel.endswith(".html") and anchor not in pages[target_rel].ids:
                # Doxygen 1.9.4 lists "Classes" in a class's summary bar even when its only nested class is
                # private (and not documented): the one dead in-page link it makes on its own.
                if not target and anchor == "nested-classes":
                    continue
                broken.append("%s: link to missing anchor %s" % (name, link))
        for image in page.images:
            path = os.path.join(site, os.path.dirname(name), image)
            if os.path.isfile(path) and os.path.getsize(path) == 0:
                broken.append("%s: empty image %s" % (name, image))
    for problem in broken:
        print("FAIL: " + problem)
    checks["failed" if broken else "passed"] += 1
    print("checked %d links and %d images in %d pages" % (sum(len(p.links) for p in pages.values()),
                                                          sum(len(p.images) for p in pages.values()), len(pages)))

    results = pages.get("results.html")
    for i, lesson in enumerate(lessons):
        n = lesson["number"]
        page = pages.get("lesson%d.html" % n)
        source = open(os.path.join(pages_dir, lesson["dir"], "README.md"), encoding="utf-8").read()
        if page is None:
            continue
        snippets = SNIPPET.findall(source)
        check(len(snippets) > 0, "lesson%d.html: its page has no \\snippet" % n)
        for path, tag in snippets:
            text = snippet_text(path, tag)
            check(text is not None, "%s has no snippet [%s]" % (path, tag))
            if text is not None:
                dense = "".join(text.split())
                check(dense in page.dense, "lesson%d.html lacks the snippet %s [%s]" % (n, path, tag))
        images = IMAGE.findall(source)
        if not lesson.get("draft"):  # a scaffolded lesson (tools/new_lesson.py) has no plot yet
            check(len(images) > 0, "lesson%d.html has no plot" % n)
        for image in images:
            check(image in page.images, "lesson%d.html does not show %s" % (n, image))
            # The plots of the demos' CSV are on the results page too; a committed picture of a recorded run
            # (docs/results/*.svg) only on its lesson's page.
            if results is not None and image.endswith(".png"):
                check(image in results.images, "results.html does not show %s" % image)
        hrefs = " ".join(page.links)
        for other in (lessons[i - 1] if i > 0 else None, lessons[i + 1] if i + 1 < len(lessons) else None):
            if other:
                check("lesson%d.html" % other["number"] in hrefs,
                      "lesson%d.html does not link to lesson %d" % (n, other["number"]))
        check("results.html" in hrefs, "lesson%d.html does not link to the results page" % n)
        steps = [s.number for s in conventions.read_steps(os.path.join(lesson["dir"], "README.md"))]
        check(len(steps) > 0, "lesson%d has no steps" % n)
        for k in steps:
            check("#lesson%d_checks_step%d" % (n, k) in hrefs, "lesson%d.html: step %d does not link to its checks" % (n, k))
            check("#lesson%d_step%d" % (n, k) in hrefs, "lesson%d.html: the checks of step %d do not link back" % (n, k))
    index = pages.get("index.html")
    if index is not None:
        for lesson in ready:
            check("lesson%d.html" % lesson["number"] in " ".join(index.links),
                  "the main page does not link to lesson %d" % lesson["number"])
    if results is not None:
        check("Recorded GPU results" in results.flat, "results.html has no 'Recorded GPU results' section")
        named = re.search(r"Device: (.*?) \(CPU\)", results.flat)
        check(named is not None, "results.html does not name the build's device")
        if named:
            devices = named.group(1).split(", ")
            check(len(set(devices)) == len(devices), "results.html names a device twice: %s" % named.group(1))

    print("%d passed, %d failed" % (checks["passed"], checks["failed"]))
    sys.exit(1 if checks["failed"] else 0)


if __name__ == "__main__":
    main()
