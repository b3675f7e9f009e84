#!/usr/bin/env python3
"""The learner's editor understands the code: clangd reports no error in any learner file, lesson header or check.

  bazel run //:compile_commands && python3 tools/clangd_check.py        # what CI's `clangd` leg runs (.ci/run)
  python3 tools/clangd_check.py lesson1_amp/grad_scaler.cc              # some files only
  python3 tools/clangd_check.py --no_definition                         # without the go-to-definition probe
  python3 tools/clangd_check.py --all                                   # also every other file of the database

Runs Debian's `clangd --check=FILE` (package clangd; tools/setup.sh installs it; $CLANGD names another) against
compile_commands.json at the repository root, the way an editor would: the root's .clangd applies, headers get the
command clangd infers from their neighbours. Files, from the manifest (tools/lessons.bzl): every lesson's learner
files (their .cc and .cu) and the reference's files of the same names (solutions/<dir>/), every lesson header, and
the first check source of each lesson. A file fails when clangd prints an error diagnostic (its `E[...]` lines) or
has no compile command but clangd's generic fallback. It also fails when:
  - there is no compile_commands.json (clangd is still run, to show what an editor sees then);
  - an entry names a file or an include folder that does not exist, or a file twice, or a checked source file has
    no entry of its own;
  - the database's LibTorch defines differ from what Bazel's @libtorch says now (the WORKSPACE found another
    LibTorch since the database was written: run `bazel run //:compile_commands` again);
  - go-to-definition on `torch::optim::Optimizer` in lesson1_amp/grad_scaler.cc (through clangd's language server
    protocol, as an editor asks) does not reach LibTorch's torch/optim/optimizer.h. The location is printed.
The clangd processes run in parallel (--jobs, default: the number of CPUs); each takes about 5 s here.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import manifest  # noqa: E402  (tools/lessons.bzl from Python)

ROOT = os.environ.get("BUILD_WORKSPACE_DIRECTORY") or os.path.dirname(HERE)
DATABASE = "compile_commands.json"
INCLUDE_FLAGS = ("-iquote", "-isystem", "-I", "-idirafter")
DEFINITION_FILE = "lesson1_amp/grad_scaler.cc"
DEFINITION_SYMBOL = "torch::optim::Optimizer"
DEFINITION_EXPECTED = "torch/optim/optimizer.h"


def checked_files(lessons):
    files = []
    for lesson in lessons:
        files += ["%s/%s" % (lesson.dir, f) for f in lesson.learner]
        files += ["solutions/%s/%s" % (lesson.dir, f) for f in lesson.learner]
        files += ["%s/%s" % (lesson.dir, f) for f in lesson.headers]
        files += ["%s/%s" % (lesson.dir, f) for f in lesson.checks if f.endswith(".cc")][:1]
    return files


def entry_arguments(entry):
    if "arguments" in entry:
        return entry["arguments"]
    import shlex
    return shlex.split(entry["command"])


def check_database(path, files):
    """Problems with the database itself: missing paths, duplicates, checked sources without an entry."""
    problems = []
    with open(path, encoding="utf-8") as f:
        database = json.load(f)
    seen = {}
    for entry in database:
        directory = entry["directory"]
        source = os.path.normpath(os.path.join(directory, entry["file"]))
        if source in seen:
            problems.append("%s: two entries" % entry["file"])
        seen[source] = entry
        if not os.path.exists(source):
            problems.append("%s: no such file" % entry["file"])
        args = entry_arguments(entry)
        for flag, value in zip(args, args[1:]):
            if flag in INCLUDE_FLAGS and not os.path.isdir(os.path.join(directory, value)):
                problems.append("%s: %s %s does not exist" % (entry["file"], flag, value))
    for f in files:
        if not f.endswith(".h") and os.path.join(ROOT, f) not in seen:
            problems.append("%s: no entry (a source file Bazel compiles should have one)" % f)
    return database, problems


def libtorch_staleness(database):
    """Problems when @libtorch's defines (Bazel's BUILD for it, now) are not those of the database's commands."""
    folders = {v for e in database for flag, v in zip(entry_arguments(e), entry_arguments(e)[1:])
               if flag == "-isystem" and v.endswith(os.path.join("external", "libtorch", "include"))}
    problems = []
    for folder in folders:
        build = os.path.join(os.path.dirname(folder), "BUILD")
        if not os.path.exists(build):
            problems.append("%s is gone (bazel clean?): run `bazel run //:compile_commands`" % build)
            continue
        with open(build, encoding="utf-8") as f:
            match = re.search(r"defines = \[([^\]]*)\]", f.read())
        defines = re.findall(r'"([^"]+)"', match.group(1)) if match else []
        for entry in database:
            args = entry_arguments(entry)
            if folder in args and any("-D" + d not in args for d in defines):
                problems.append("the database's LibTorch defines are not @libtorch's (%s): the WORKSPACE found another "
                                "LibTorch since it was written; run `bazel run //:compile_commands`" % ", ".join(defines))
                break
    return problems


def run_clangd(clangd, path):
    """(path, errors, command source, seconds) of `clangd --check=path`."""
    start = time.time()
    # --check-lines=1: the per-token feature tests (hover, completion...) only on line 1 (a comment): the parse,
    # its diagnostics and the index are what is checked. clangd 14 and 19 both take it.
    result = subprocess.run([clangd, "--check=" + path, "--check-lines=1"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, universal_newlines=True)
    lines = result.stdout.splitlines()
    errors = [l for l in lines if l.startswith("E[")]
    fallback = any("Generic fallback command" in l for l in lines)
    if fallback:
        errors.insert(0, "(no compile command: clangd used its generic fallback)")
    if result.returncode != 0 and not errors:
        errors.append("(clangd exited with %d)" % result.returncode)
    return path, errors, time.time() - start


class Lsp:
    """The smallest language-server client: clangd over stdin/stdout, one request at a time."""

    def __init__(self, clangd):
        self.process = subprocess.Popen([clangd, "--log=error", "--background-index=false"], cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.next_id = 0

    def send(self, method, params, request=True):
        message = {"jsonrpc": "2.0", "method": method, "params": params}
        if request:
            self.next_id += 1
            message["id"] = self.next_id
        body = json.dumps(message).encode()
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()
        return self.next_id if request else None

    def receive(self, wanted_id):
        while True:
            length = None
            while True:
                line = self.process.stdout.readline()
                if not line:
                    raise RuntimeError("clangd closed its output")
                line = line.strip()
                if not line:
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            message = json.loads(self.process.stdout.read(length))
            if message.get("id") == wanted_id and "method" not in message:
                return message

    def request(self, method, params):
        return self.receive(self.send(method, params))

    def close(self):
        try:
            self.request("shutdown", None)
            self.send("exit", None, request=False)
            self.process.wait(timeout=30)
        except Exception:  # noqa: BLE001  (best effort: clangd is killed below anyway)
            pass
        if self.process.poll() is None:
            self.process.kill()


def definition(clangd, relative, symbol):
    """Where go-to-definition on the last name of `symbol`'s first use in `relative` leads: (line, col, path)."""
    path = os.path.join(ROOT, relative)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    at = text.index(symbol) + len(symbol) - len(symbol.split("::")[-1])
    line = text.count("\n", 0, at)
    column = at - (text.rfind("\n", 0, at) + 1)
    uri = "file://" + path
    lsp = Lsp(clangd)
    try:
        lsp.request("initialize", {"processId": os.getpid(), "rootUri": "file://" + ROOT, "capabilities": {}})
        lsp.send("initialized", {}, request=False)
        lsp.send("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "cpp", "version": 1,
                                                           "text": text}}, request=False)
        answer = lsp.request("textDocument/definition", {"textDocument": {"uri": uri},
                                                         "position": {"line": line, "character": column}})
    finally:
        lsp.close()
    found = answer.get("result") or []
    if isinstance(found, dict):
        found = [found]
    places = []
    for place in found:
        target = place.get("uri") or place.get("targetUri", "")
        where = place.get("range") or place.get("targetSelectionRange")
        places.append("%s:%d:%d" % (target.replace("file://", "", 1), where["start"]["line"] + 1,
                                    where["start"]["character"] + 1))
    return "%s:%d:%d" % (relative, line + 1, column + 1), places


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", help="files to check, relative to the repository root "
                        "(default: the learner files, their references, the headers, one check per lesson)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--no_definition", action="store_true", help="skip the go-to-definition probe")
    parser.add_argument("--all", action="store_true", help="also every other source file of the database (slow)")
    options = parser.parse_args()
    start = time.time()
    clangd = os.environ.get("CLANGD") or shutil.which("clangd")
    if not clangd:
        raise SystemExit("clangd_check: no clangd on PATH (Debian: apt-get install clangd; tools/setup.sh does)")
    version = subprocess.run([clangd, "--version"], stdout=subprocess.PIPE, universal_newlines=True).stdout
    print("clangd_check: %s" % version.splitlines()[0].strip())
    files = options.files or checked_files(manifest.load())
    if options.all and os.path.exists(os.path.join(ROOT, DATABASE)):
        with open(os.path.join(ROOT, DATABASE), encoding="utf-8") as f:
            listed = [os.path.relpath(os.path.join(e["directory"], e["file"]), ROOT) for e in json.load(f)]
        files += [f for f in listed if f not in files]
    problems = []
    database_path = os.path.join(ROOT, DATABASE)
    if os.path.exists(database_path):
        database, found = check_database(database_path, files)
        problems += found + libtorch_staleness(database)
        print("clangd_check: %s holds %d entries" % (DATABASE, len(database)))
    else:
        problems.append("no %s at the repository root: run `bazel run //:compile_commands` (clangd runs anyway, "
                        "to show what an editor sees without it)" % DATABASE)
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        for path, errors, seconds in pool.map(lambda f: run_clangd(clangd, f), files):
            if errors:
                failed += 1
                print("FAIL %s: %d error(s) (%.1f s)" % (path, len(errors), seconds))
                for line in errors[:5]:
                    print("     " + line)
            else:
                print("ok   %s (%.1f s)" % (path, seconds))
    if not options.no_definition and os.path.exists(database_path) and not options.files:
        origin, places = definition(clangd, DEFINITION_FILE, DEFINITION_SYMBOL)
        print("go-to-definition of %s at %s -> %s" % (DEFINITION_SYMBOL, origin, ", ".join(places) or "nothing"))
        if not any(DEFINITION_EXPECTED in p for p in places):
            problems.append("go-to-definition of %s does not reach LibTorch's %s" % (DEFINITION_SYMBOL,
                                                                                    DEFINITION_EXPECTED))
    for problem in problems:
        print("FAIL " + problem)
    print("clangd_check: %d files, %d with errors, %d other problems (%.0f s, %d jobs)"
          % (len(files), failed, len(problems), time.time() - start, options.jobs))
    sys.exit(1 if failed or problems else 0)


if __name__ == "__main__":
    main()
