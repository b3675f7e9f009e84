#!/usr/bin/env python3
"""Draws one training step of a Chrome trace (the trace-event format Kineto and lesson 3 write) as an SVG timeline,
the picture a trace viewer shows, for the docs site: one lane per nesting depth, each complete event ("ph": "X")
a box as long as its duration, labelled where the box has room. Also prints a Markdown summary of the trace.

  python3 docs/trace_timeline.py TRACE.json --step=2 --svg=OUT.svg > OUT.md

--step=K picks the K-th range named --step_range (default "phase:data", the start of a lesson-3 step) and draws
from its start to the start of the next one. Only the standard library: it runs where the docs are built.
"""
import argparse
import collections
import html
import json
import sys

COLOURS = {"user_annotation": "#f4a261", "cpu_op": "#2a9d8f", "kernel": "#e76f51", "gpu_memcpy": "#8d99ae"}
LANE, TOP, WIDTH, LEFT = 22, 34, 1100, 8


def load(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return data if isinstance(data, dict) else {}, events


def complete_events(events):
    return [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]


def step_window(events, name, k):
    starts = sorted(e["ts"] for e in events if e.get("name") == name)
    if len(starts) < k + 1:
        sys.exit("trace_timeline: the trace has %d ranges named %r; --step=%d needs %d" % (len(starts), name, k,
                                                                                          k + 1))
    return starts[k - 1], starts[k]


def lanes(events):
    """Depth of each event by time nesting within its thread (the outermost is 0)."""
    depth = {}
    by_thread = collections.defaultdict(list)
    for i, e in enumerate(events):
        by_thread[(e.get("pid"), e.get("tid"))].append(i)
    for indices in by_thread.values():
        indices.sort(key=lambda i: (events[i]["ts"], -events[i]["dur"]))
        open_ends = []
        for i in indices:
            e = events[i]
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            depth[i] = len(open_ends)
            open_ends.append(e["ts"] + e["dur"])
    return depth


def svg(events, start, end, title):
    chosen = [e for e in events if start <= e["ts"] < end]
    depth = lanes(chosen)
    span = end - start
    height = TOP + LANE * (max(depth.values(), default=0) + 1) + 30
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="11">' % (WIDTH + 2 * LEFT + 40, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18" font-size="13">%s</text>' % (LEFT, html.escape(title))]
    legend_x = LEFT + WIDTH - 500
    for k, (cat, colour) in enumerate([("user_annotation", "the lesson's phase ranges"), ("cpu_op", "ATen ops")]):
        out.append('<rect x="%d" y="8" width="12" height="12" fill="%s"/><text x="%d" y="18">%s (%s)</text>' % (
            legend_x + 260 * k, COLOURS[cat], legend_x + 260 * k + 16, colour, cat))
    for i, e in enumerate(chosen):
        x = LEFT + WIDTH * (e["ts"] - start) / span
        w = max(WIDTH * e["dur"] / span, 0.5)
        y = TOP + LANE * depth[i]
        colour = COLOURS.get(e.get("cat"), "#adb5bd")
        label = html.escape(e["name"])
        out.append('<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s" stroke="white" stroke-width="0.5">'
                   '<title>%s: %.1f us</title></rect>' % (x, y, w, LANE - 3, colour, label, e["dur"]))
        if w > 6.5 * len(e["name"]):
            out.append('<text x="%.2f" y="%d" fill="white">%s</text>' % (x + 3, y + LANE - 8, label))
    axis_y = height - 12
    for tick in range(0, 11):
        x = LEFT + WIDTH * tick / 10
        out.append('<text x="%.1f" y="%d" fill="#555">%.0f us</text>' % (x, axis_y, span * tick / 10))
    out.append("</svg>")
    return "\n".join(out) + "\n", chosen


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--svg", required=True)
    parser.add_argument("--step", type=int, default=2)
    parser.add_argument("--step_range", default="phase:data")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    meta, events = load(args.trace)
    complete = complete_events(events)
    start, end = step_window(complete, args.step_range, args.step)
    title = args.title or "%s, step %d (%.0f us)" % (args.trace.split("/")[-1], args.step, end - start)
    picture, chosen = svg(complete, start, end, title)
    with open(args.svg, "w", encoding="utf-8") as f:
        f.write(picture)
    categories = collections.Counter(e.get("cat", "(none)") for e in events)
    print("Events in the trace: %d (%s); complete events: %d; `displayTimeUnit`: %s." % (
        len(events), ", ".join("%s %d" % kv for kv in categories.most_common()), len(complete),
        meta.get("displayTimeUnit", "(not set)")))
    print()
    print("The step drawn (%s number %d to the next): %d events over %.1f us. Its ops by time:" % (
        args.step_range, args.step, len(chosen), end - start))
    print()
    print("| event | category | calls | total us |")
    print("|---|---|---|---|")
    totals = collections.defaultdict(lambda: [0, 0.0, ""])
    for e in chosen:
        t = totals[e["name"]]
        t[0] += 1
        t[1] += e["dur"]
        t[2] = e.get("cat", "")
    for name, (calls, total, cat) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:15]:
        print("| %s | %s | %d | %.1f |" % (name, cat, calls, total))


if __name__ == "__main__":
    main()
