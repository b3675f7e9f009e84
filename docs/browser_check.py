#!/usr/bin/env python3
"""Opens the built docs site in a headless Chromium (//docs:browser_test).

  browser_check.py SITE_DIR LESSONS_JSON

Drives Debian's chromium through chromedriver (plain WebDriver over HTTP on 127.0.0.1, no network needed) and, for
the main page, the results page and every lesson's page:
- reads the browser's log: any failed resource load (a script, a stylesheet, an image, the navigation tree's
  data) or JavaScript error is a failure;
- asks the page whether every <img> loaded and has a size, and whether its code fragments rendered;
- saves screenshots (1280x2000) as <page>.png, <page>_code.png (scrolled to the first code fragment) and
  <page>_plot.png (scrolled to the first plot) into $TEST_UNDECLARED_OUTPUTS_DIR, which Bazel zips into
  .bazel/testlogs/docs/browser_test/test.outputs/outputs.zip.
Prints "N passed, M failed".
"""
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        "--hide-scrollbars", "--window-size=1280,2000"]

PAGE_STATE = """
const images = Array.from(document.images);
return {
  ready: document.readyState,
  title: document.title,
  images: images.length,
  broken_images: images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src')),
  fragments: document.querySelectorAll('div.fragment').length,
  navtree: document.querySelectorAll('#nav-tree-contents li').length,
};
"""


def find(names):
    for name in names:
        path = shutil.which(name) or (name if os.path.isfile(name) else None)
        if path:
            return path
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Driver:
    def __init__(self, chromedriver, chromium, profile):
        self.port = free_port()
        self.log = open(os.path.join(profile, "chromedriver.log"), "w")
        self.process = subprocess.Popen([chromedriver, "--port=%d" % self.port], stdout=self.log, stderr=self.log)
        self.base = "http://127.0.0.1:%d" % self.port
        deadline = time.time() + 30
        while True:
            try:
                self.call("GET", "/status")
                break
            except OSError:
                if time.time() > deadline or self.process.poll() is not None:
                    raise RuntimeError("chromedriver did not start")
                time.sleep(0.1)
        options = {"binary": chromium, "args": ARGS + ["--user-data-dir=" + os.path.join(profile, "chromium")]}
        session = self.call("POST", "/session", {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": options, "goog:loggingPrefs": {"browser": "ALL"},
            "timeouts": {"pageLoad": 60000, "script": 30000}}}})
        self.session = "/session/" + session["sessionId"]

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())["value"]

    def open(self, url):
        self.call("POST", self.session + "/url", {"url": url})

    def script(self, code):
        return self.call("POST", self.session + "/execute/sync", {"script": code, "args": []})

    def browser_log(self):
        return self.call("POST", self.session + "/se/log", {"type": "browser"})

    def screenshot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.call("GET", self.session + "/screenshot")))

    def close(self):
        try:
            self.call("DELETE", self.session)
        except Exception:  # noqa: BLE001 - the browser may be gone already; stop the driver anyway
            pass
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def main():
    site, lessons_json = os.path.abspath(sys.argv[1]), sys.argv[2]
    lessons = json.load(open(lessons_json))
    chromium = find(["chromium", "/usr/lib/chromium/chromium", "chromium-browser", "google-chrome"])
    chromedriver = find(["chromedriver", "/usr/lib/chromium/chromedriver"])
    if not chromium or not chromedriver:
        print("FAIL: chromium and chromedriver are needed (Debian: apt-get install chromium chromium-driver; "
              "tools/setup.sh installs them)")
        sys.exit(1)
    outputs = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or tempfile.mkdtemp()
    profile = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    os.environ["HOME"] = profile  # chromium writes under $HOME

    pages = [("index.html", "main page", 0), ("results.html", "results", 0)]
    pages += [("lesson%d.html" % l["number"], "lesson %d" % l["number"], 1) for l in lessons]
    passed = failed = 0

    def check(ok, message):
        nonlocal passed, failed
        if ok:
            passed += 1
        else:
            failed += 1
            print("FAIL: " + message)

    driver = Driver(chromedriver, chromium, profile)
    try:
        for name, what, min_fragments in pages:
            path = os.path.join(site, name)
            check(os.path.isfile(path), "%s (%s) is not in the site" % (name, what))
            if not os.path.isfile(path):
                continue
            driver.open("file://" + path)
            state = driver.script(PAGE_STATE)
            deadline = time.time() + 20  # the navigation tree fills in after load
            while (state["ready"] != "complete" or state["navtree"] == 0) and time.time() < deadline:
                time.sleep(0.2)
                state = driver.script(PAGE_STATE)
            shot = os.path.join(outputs, name.replace(".html", ".png"))
            driver.screenshot(shot)
            problems = [e["message"] for e in driver.browser_log() if e.get("level") in ("SEVERE", "WARNING")]
            print("%-14s %-10s title=%r images=%d fragments=%d navtree=%d log problems=%d screenshot=%s" % (
                name, what, state["title"], state["images"], state["fragments"], state["navtree"], len(problems),
                os.path.basename(shot)))
            for problem in problems:
                print("    " + problem)
            check(not problems, "%s: the browser reported failed loads or errors" % name)
            check(not state["broken_images"], "%s: images that did not render: %s" % (name, state["broken_images"]))
            check(state["navtree"] > 0, "%s: the navigation tree did not load" % name)
            check(state["fragments"] >= min_fragments, "%s: no code fragment rendered" % name)
            if name.startswith("lesson") or name == "results.html":
                check(state["images"] > 0, "%s: no plot on the page" % name)
            check(os.path.getsize(shot) > 10000, "%s: the screenshot looks empty" % name)
            # The page scrolls inside Doxygen's content pane: also photograph its first code and its first plot.
            for part, selector in (("code", "div.fragment"), ("plot", "div.contents div.image img")):
                if driver.script("const e = document.querySelector('%s'); if (!e) return false; "
                                 "e.scrollIntoView(); return true;" % selector):
                    driver.screenshot(shot.replace(".png", "_%s.png" % part))
    finally:
        driver.close()
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
