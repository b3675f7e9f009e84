#!/usr/bin/env python3
"""The tour: every lesson's demo on the reference solutions, then one table of what each lesson buys.

  bazel run //:tour                                  # full settings, best device (CUDA if there is one)
  bazel run //:tour -- --quick                       # small, fast CPU settings (what the docs build runs)
  bazel run //:tour -- --device=cpu --csv_dir=out    # keep every demo's CSV files in ./out
  bazel run //:tour -- --device=cuda --record=docs/results/2025-01-31-h100.csv
                                                     # a recorded GPU run for the docs' results page

Each demo's output streams through, indented, with the elapsed time; the table at the end has one row per
measurement: lesson, what was measured, baseline, improved, ratio (baseline / improved), device. Then the course in
workshop slots: each lesson's core steps (one slot) and its going-further steps (the manifest's `core`, the steps
of the lesson's page).
"""
import argparse
import csv
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conventions  # noqa: E402  (the step headings of a lesson page)
from slot_check import steps_text  # noqa: E402  ("1-3", "4, 5", "none": as the docs' tables write steps)


def user_path(path):
    """Paths on the command line are relative to where `bazel run` was started, not to the runfiles."""
    base = os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd())
    return path if os.path.isabs(path) else os.path.join(base, path)


def run_demo(number, total, lesson, demo, args):
    command = [demo] + args
    label = "//%s:demo" % lesson["dir"]
    print("[%d/%d] lesson %d, %s: %s %s" % (number, total, lesson["number"], lesson["title"], label, " ".join(args)),
          flush=True)
    start = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    last_line = [time.time()]
    done = threading.Event()

    def heartbeat():  # long, silent stretches still show that the demo is alive
        while not done.wait(10):
            if time.time() - last_line[0] >= 10:
                print("      ... %s still running, %.0f s" % (label, time.time() - start), flush=True)

    threading.Thread(target=heartbeat, daemon=True).start()
    for line in process.stdout:
        last_line[0] = time.time()
        print("    | " + line.rstrip("\n"), flush=True)
    code = process.wait()
    done.set()
    elapsed = time.time() - start
    print("[%d/%d] lesson %d %s in %.1f s\n" % (number, total, lesson["number"],
                                                "done" if code == 0 else "FAILED (exit %d)" % code, elapsed),
          flush=True)
    return code == 0


def number(text):
    value = float(text)
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
        return "%.3g" % value
    return "%.4g" % value


def print_table(rows):
    header = ["lesson", "what was measured", "baseline", "improved", "ratio", "device"]
    cells = [[r["lesson"], r["measure"], number(r["baseline"]), number(r["improved"]), number(r["ratio"]) + "x",
              r["device"]] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(header)]
    line = lambda values: "  ".join(v.ljust(w) if i in (0, 1, 5) else v.rjust(w)
                                    for i, (v, w) in enumerate(zip(values, widths))).rstrip()
    print(line(header))
    print("-" * len(line(header)))
    for c in cells:
        print(line(c))


def print_slots(lessons, root):
    """Each lesson's core steps and going-further steps (the page's steps; the manifest's core)."""
    print("\nThe course in workshop slots (a core is one slot of 60-120 minutes; bazel run //:progress says "
          "\"core done\"):\n")
    print("%-34s %-11s %s" % ("lesson", "core steps", "going further"))
    for l in lessons:
        page = os.path.join(root, l["dir"], "README.md")
        steps = [s.number for s in conventions.read_steps(page)] if os.path.exists(page) else []
        core = [k for k in steps if k in (l.get("core") or steps)]
        further = [k for k in steps if k not in core]
        print("%-34s %-11s %s" % ("%d %s" % (l["number"], l["title"]), steps_text(core), steps_text(further)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lessons", required=True, help=argparse.SUPPRESS)
    parser.add_argument("--demo", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="small, fast CPU settings for every demo")
    parser.add_argument("--device", default="best", help="best (default), cpu, cuda or cuda:N")
    parser.add_argument("--csv_dir", help="keep the demos' CSV files (and summary.csv) in this folder")
    parser.add_argument("--record", help="also write the table as a recorded run (device, date, command) to "
                                         "this file, e.g. docs/results/<date>-<gpu>.csv, relative to the workspace")
    args = parser.parse_args()

    lessons = [l for l in json.load(open(args.lessons))]
    if len(args.demo) != len(lessons):
        sys.exit("tour: %d demos for %d lessons" % (len(args.demo), len(lessons)))
    csv_dir = user_path(args.csv_dir) if args.csv_dir else tempfile.mkdtemp(prefix="tour-")
    os.makedirs(csv_dir, exist_ok=True)
    summary = os.path.join(csv_dir, "summary.csv")
    if os.path.exists(summary):
        os.remove(summary)  # one tour, one table
    demo_args = (["--quick"] if args.quick else []) + ["--device=" + args.device, "--csv_dir=" + csv_dir]

    start = time.time()
    print("The tour: %d lesson demo%s on the reference solutions (%s)\n" % (
        len(lessons), "" if len(lessons) == 1 else "s", " ".join(demo_args[:-1])), flush=True)
    failed = [l["number"] for i, (l, demo) in enumerate(zip(lessons, args.demo))
              if not run_demo(i + 1, len(lessons), l, os.path.abspath(demo), demo_args)]

    rows = []
    if os.path.exists(summary):
        with open(summary, newline="") as f:
            rows = list(csv.DictReader(f))
    print("Summary (ratio = baseline / improved; %.0f s in all; CSV files in %s)\n" % (time.time() - start, csv_dir))
    print_table(rows)
    print_slots(lessons, os.path.dirname(os.path.dirname(os.path.abspath(args.lessons))))
    if failed:
        print("\nlesson demo(s) %s failed; see their output above" % ", ".join(map(str, failed)))

    if args.record:
        workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY", os.getcwd())
        path = args.record if os.path.isabs(args.record) else os.path.join(workspace, args.record)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        devices = sorted({r["device"] for r in rows})
        command = "bazel run //:tour -- " + " ".join(a for a in sys.argv[1:] if a.startswith("--") and
                                                     not a.startswith(("--lessons", "--demo", "--record", "--csv_dir")))
        with open(path, "w", newline="") as f:
            f.write("# device: %s\n# date: %s\n# command: %s\n" % (
                ", ".join(devices) or "unknown", datetime.date.today().isoformat(), command.strip()))
            writer = csv.writer(f)
            writer.writerow(["lesson", "measure", "baseline", "improved", "ratio", "device"])
            for r in rows:
                writer.writerow([r["lesson"], r["measure"], r["baseline"], r["improved"], r["ratio"], r["device"]])
        print("\nrecorded in %s (commit it: the docs' results page shows it)" % path)
    sys.exit(1 if failed or not rows else 0)


if __name__ == "__main__":
    main()
