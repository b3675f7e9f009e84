#!/usr/bin/env python3
"""Runs lesson 5's (or lesson 7's) demo on shaped links (netns_run.sh) in the recorded settings and writes the
results page.

    sudo python3 lesson5_distributed/netns/record.py --demo .bazel/bin/lesson5_distributed/demo \\
        --out docs/results/bench/lesson5_netns_cpu.md
    sudo python3 lesson5_distributed/netns/record.py --lesson 7 --demo .bazel/bin/lesson7_fsdp/demo \\
        --out docs/results/bench/lesson7_netns_cpu.md
    python3 lesson5_distributed/netns/record.py --logs DIR --out FILE   # rewrite the page from earlier logs

Every run's output goes to DIR/runK.log (a temporary folder unless --logs is given); the page holds, per run,
the command, the date, the load before and after, the napkin inputs, the table of measured vs napkin step times
and each round's ranking, and on top a verdict counted from those tables (rows within 1.5x, runs whose ranking
held in every round). Lesson 7: the DDP-style, ZeRO-1, fully sharded and prefetched steps beside their napkin
figures, each row's bytes kept and peak bytes per rank and its CPU floor, and the verdict on prefetch the demo
prints (within 1.5x of max(compute, communication), with the CPU floor's clause where it rules the goal out),
counted over the runs.
Needs root (namespaces); build the demo first (`bazel build //lesson5_distributed:demo`, or lesson 7's).
"""
import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# (ranks, Gbit/s per rank, simulated ms per collective, rounds, demo flags): the quick model, then the default one.
RUNS = [
    (2, "1", "0.5", 5, ["--quick", "--steps=20"]),
    (4, "1", "0.5", 5, ["--quick", "--steps=20"]),
    (2, "2.5", "0.1", 5, ["--quick", "--steps=20"]),
    (4, "2.5", "0.1", 5, ["--quick", "--steps=20"]),
    (2, "1", "0.5", 3, ["--steps=10"]),
    (4, "1", "0.5", 3, ["--steps=10"]),
    (2, "2.5", "0.1", 3, ["--steps=10"]),
    (4, "2.5", "0.1", 3, ["--steps=10"]),
]
# Lesson 7: (ranks, Gbit/s per rank, simulated ms per collective, rounds, demo flags).
RUNS7 = [
    (2, "1", "0", 5, ["--steps=10"]),
    (4, "1", "0", 3, ["--steps=10"]),
]
GOAL = 1.5
# lesson -> (the demo's target, the same run through Bazel, as the page names them)
DEMOS = {
    5: ("//lesson5_distributed:demo",
        "one of them through Bazel: `OMP_NUM_THREADS=1 bazel run //lesson5_distributed/netns:run -- --world_size=N "
        "--gbit=G --delay_ms=D --rounds=R -- [--quick] --steps=S`"),
    7: ("//lesson7_fsdp:demo",
        "one of them through Bazel: `OMP_NUM_THREADS=1 bazel run //lesson5_distributed/netns:run -- --demo "
        "$PWD/.bazel/bin/lesson7_fsdp/demo --world_size=N --gbit=G --delay_ms=0 --rounds=R -- --steps=S`"),
}


def command_of(run, demo):
    n, gbit, delay, rounds, flags = run
    return ("OMP_NUM_THREADS=1 lesson5_distributed/netns/netns_run.sh --demo %s --world_size %d --gbit %s "
            "--delay_ms %s --rounds %d -- %s" % (demo, n, gbit, delay, rounds, " ".join(flags)))


def stamp():
    """'2026-12-03 17:12:07 uptime: ... load average: a, b, c', as the log's start and end lines hold it."""
    uptime = subprocess.run(["uptime"], stdout=subprocess.PIPE, universal_newlines=True).stdout.strip()
    return "%s uptime: %s" % (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), uptime)


def record(run, demo, path):
    n, gbit, delay, rounds, flags = run
    start = stamp()
    cmd = [os.path.join(HERE, "netns_run.sh"), "--demo", demo, "--world_size", str(n), "--gbit", gbit,
           "--delay_ms", delay, "--rounds", str(rounds), "--"] + flags
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=900)
    with open(path, "w") as f:
        f.write("== start %s\n" % start)
        f.write("== command: %s\n" % command_of(run, demo))
        f.write(proc.stdout)
        f.write("== exit %d\n== end %s\n" % (proc.returncode, stamp()))
    return proc.returncode


def table_lines(text, name, stops):
    """The rows of the demo's table `name`: the lines after its title, header and rule, up to a blank line or
    one that starts with one of `stops`."""
    out = []
    for line in text.split(name, 1)[1].splitlines()[3:]:
        if not line.strip() or line.startswith(stops):
            break
        out.append(line)
    return out


def parse_head(text, model):
    """What every log holds: the exit, the dates and loads, the command, the link, the napkin inputs, and the
    model (the line that starts with `model`)."""
    out = {"exit": int(re.search(r"^== exit (-?\d+)", text, re.M).group(1))}
    m = re.search(r"^== start (\S+ \d+:\d+)\S* uptime: .*load average: (.*)$", text, re.M)
    out["date"], out["load_before"] = m.group(1), m.group(2).replace(",", "")
    out["load_after"] = re.search(r"^== end .*load average: (.*)$", text, re.M).group(1).replace(",", "")
    out["command"] = re.search(r"^== command: (.*)$", text, re.M).group(1)
    out["link"] = re.search(r"^netns_run: ready: .*?; (.*)$", text, re.M).group(1)
    out["napkin"] = re.search(r"^Napkin math: (.*)$", text, re.M).group(1)
    out["model"] = re.search(r"^(%s .*)$" % model, text, re.M).group(1)
    return out


def parse(path):
    text = open(path).read()
    out = parse_head(text, "MLP")
    rows = []
    for line in table_lines(text, "lesson5_network", ("round ",)):
        m = re.match(r"^(.+?)\s{2,}(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(.*)$",
                     line)
        rows.append({"variant": m.group(1), "ranks": int(m.group(2)), "calls": m.group(3), "step": m.group(4),
                     "napkin": m.group(5), "ratio": float(m.group(6)), "parts": m.group(7, 8, 9),
                     "rounds": m.group(10).strip()})
    out["rows"] = rows
    out["rankings"] = re.findall(r"^round \d+ \(fastest first\): (.*)$", text, re.M)
    out["same"] = re.search(r"^ranking the same in every round: (\S+)", text, re.M).group(1) == "yes"
    return out


def header_lines(results, lesson):
    """The page's first lines: dates, device, LibTorch, kernel and link, how the page was written."""
    torch = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libtorch-dev"], stdout=subprocess.PIPE,
                           universal_newlines=True).stdout.strip() or "unknown"
    cpu = re.search(r"^Lesson %d .* on (.+)$" % lesson, open(results[0]["path"]).read(), re.M).group(1)
    cpu = cpu.split(") on ")[-1]
    target, run = DEMOS[lesson]
    return [
        "Date: %s .. %s UTC (the first run's and the last run's start)  " % (results[0]["date"], results[-1]["date"]),
        "Device: %s  " % cpu,
        "LibTorch: %s (Debian's libtorch-dev), Gloo; OMP_NUM_THREADS=1 (one thread per rank)  " % torch,
        "Kernel: %s; %s  " % (platform.release(), results[0]["link"]),
        "Commands: below, per run, after `bazel build %s`, as root, all written by "
        "`python3 lesson5_distributed/netns/record.py%s --demo .bazel/bin/%s --out <this file>`; %s  " % (
            target, "" if lesson == 5 else " --lesson %d" % lesson, target[2:].replace(":", "/"), run),
    ]


def run_lines(res):
    """One run's heading: ranks, link, date, loads, exit, command, napkin inputs."""
    n = res["rows"][0]["ranks"]
    m = re.search(r"--gbit (\S+) --delay_ms (\S+)", res["command"])
    return [
        "**N = %d, %s Gbit/s per rank, %s ms simulated per collective.** Date: %s UTC. Load (1, 5, 15 min) "
        "before: %s; after: %s. Exit: %d.  " % (n, m.group(1), m.group(2), res["date"], res["load_before"],
                                                res["load_after"], res["exit"]),
        "Command: `%s`  " % res["command"],
        "Napkin inputs: %s" % res["napkin"],
        "",
    ]


def per_run(results, head, body):
    """Per run, under a heading per model: its heading lines, the table's `head` and `body(res)`."""
    lines = []
    model = None
    for res in results:
        if res["model"] != model:
            model = res["model"]
            lines += ["<b>%s</b>" % model, ""]
        lines += run_lines(res) + head + body(res)
    return lines


def page(results):
    rows = [r for res in results for r in res["rows"]]
    within = sum(1 for r in rows if 1 / GOAL <= r["ratio"] <= GOAL)
    stable = sum(1 for res in results if res["same"])
    misses = ["%s with %d ranks %.2fx" % (r["variant"], r["ranks"], r["ratio"]) for r in rows
              if not 1 / GOAL <= r["ratio"] <= GOAL]
    lines = header_lines(results, 5) + [
        "",
        "**Verdict of this run.** %d of %d variant rows are within %.1fx of their napkin figure (goal: all); the "
        "ranking was the same in every round in %d of %d runs (goal: all).%s" % (
            within, len(rows), GOAL, stable, len(results),
            " Outside: " + "; ".join(misses) + "." if misses else ""),
        "",
        "Lesson 5's demo with every rank in its own Linux network namespace (veth links to a bridge in a hub "
        "namespace), made and removed by `lesson5_distributed/netns/netns_run.sh` (see \\ref lesson5_netns \"Lesson 5 "
        "in depth\"). **Bandwidth: kernel-shaped** (tbf on each rank's egress). **Latency: simulated** by "
        "`dist::Comm` (one delay per collective) where the kernel has no netem. **Compute: measured** in every "
        "round with no communication. **A call's own cost: measured** in every round, per kind of call, from "
        "bursts of 16 small all-reduces and 16 small broadcasts back to back (Gloo, the kernel and waking the "
        "peers' threads, less the wire time). Napkin (`l5demo::napkin` in demo_ranks.h) = forward + backward + "
        "optimizer (ZeRO-1: 1/N of it) + ring all-reduce wire bytes / rate + broadcast tree steps x bytes / rate "
        "+ calls x (simulated delay + the call's own cost); with overlap the all-reduces hide under backward and "
        "their own costs overlap one another (one counted). Times are medians of the timed steps per round; the "
        "step column is the median of the rounds' medians. Goal: measured / napkin within 1.5x (0.67 .. 1.5), "
        "the same ranking in every round.",
        "",
    ]
    def body(res):
        out = []
        for r in res["rows"]:
            ok = 1 / GOAL <= r["ratio"] <= GOAL
            out.append("| %s | %s | %s | %s | %.2f | %s | %s | %s |" % (
                r["variant"], r["calls"], r["step"], r["napkin"], r["ratio"], "yes" if ok else "**no**",
                " / ".join(r["parts"]), r["rounds"]))
        out.append("")
        for i, ranking in enumerate(res["rankings"]):
            out.append("- round %d (fastest first): %s" % (i + 1, ranking))
        return out + ["- ranking the same in every round: %s" % ("yes" if res["same"] else "NO"), ""]

    head = ["| variant | calls / step | step ms (median of rounds) | napkin ms | measured / napkin | within 1.5x | "
            "napkin: compute / wire / calls ms | round medians ms |", "|---|---|---|---|---|---|---|---|"]
    return "\n".join(lines + per_run(results, head, body))


def parse7(path):
    """Lesson 7's log: the header, the napkin inputs, the lesson7_network table, prefetch's saving, the verdict (with
    the CPU floor's clause when the demo printed one), the peaks of the busiest rank."""
    text = open(path).read()
    out = parse_head(text, "Model")
    rows = []
    for line in table_lines(text, "lesson7_network", ("Prefetch", "wrote ")):
        m = re.match(r"^(.+?)\s{2,}(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                     r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(.*)$", line)
        rows.append({"variant": m.group(1), "ranks": int(m.group(2)), "kept": m.group(3), "peak": m.group(4),
                     "sent": m.group(5), "calls": m.group(6), "step": m.group(7), "napkin": m.group(8),
                     "ratio": float(m.group(9)), "compute": m.group(10), "comm": m.group(11),
                     "cpu_floor": m.group(12), "rounds": m.group(13).strip()})
    out["rows"] = rows
    out["saves"] = re.search(r"^(Prefetch saves .*)$", text, re.M).group(1)
    m = re.search(r"^Verdict: (with prefetch the step is ([\d.]+)x .* within 1\.5x: (met|NOT MET)(; .*)?)$", text,
                  re.M)
    out["verdict"], out["met"] = m.group(1), m.group(3) == "met"
    out["peaks"] = re.search(r"^(Peak bytes / rank, the most of any rank: .*)$", text, re.M).group(1)
    return out


def page7(results):
    met = sum(1 for res in results if res["met"])
    ratios = ["N = %d: %s" % (res["rows"][0]["ranks"], res["verdict"]) for res in results]
    lines = header_lines(results, 7) + [
        "",
        "**Verdict of this run.** With prefetch the fully sharded step is within %.1fx of max(compute, "
        "communication) in %d of %d runs (goal: all). %s." % (GOAL, met, len(results), "; ".join(ratios)),
        "",
        "Lesson 7's demo (`--world_size N`: its ranks as processes, lesson 5's launcher `process_ranks.h`) with "
        "every rank in its own Linux network namespace (veth links to a bridge in a hub namespace), made and "
        "removed by `lesson5_distributed/netns/netns_run.sh`. **Bandwidth: kernel-shaped** (tbf on each rank's "
        "egress). **Latency: none added** (`--delay_ms 0`). **Compute: measured** in every round with no "
        "communication, every rank busy at once (replicated layers: forward, backward, Adam). **Bytes: counted** "
        "by the communicator on rank 0 (the sharded steps: every byte sent point-to-point plus the agreement "
        "records; DDP-style: Gloo's all-reduce payload as a ring's 2 (N - 1) / N; ZeRO-1, lesson 5's "
        "`ddp::ZeroOptimizer`: that all-reduce plus one broadcast per parameter from the rank that owns its Adam "
        "state, (N - 1) / N of the broadcasts' bytes). **Memory: counted** by lesson 4's meter in each rank "
        "process: bytes kept between steps (parameters, gradients, Adam's moments) and rank 0's peak during a "
        "timed step (every tensor byte the row allocated, activations and gathered layers included). Napkin: "
        "compute = forward + backward + Adam (DDP-style), forward + backward + Adam / N (ZeRO-1) or 2 x forward "
        "(the backward recomputes each layer) + backward + Adam / N (sharded); communication = bytes sent per "
        "step / the link's rate (ZeRO-1's broadcasts counted once per step of Gloo's binomial tree, ceil(log2 "
        "N)); DDP-style, ZeRO-1 and no prefetch: the sum, prefetch: the larger of the two. **CPU floor: "
        "measured**: every rank's CPU time per timed step (getrusage, user + system, Gloo's threads included), "
        "summed over the ranks, / the hardware threads: no schedule finishes a step faster on that machine. Step "
        "times are rank 0's medians of the timed steps per round; the step column is the median of the rounds' "
        "medians.",
        "",
    ]
    def body(res):
        rows = ["| %s | %s | %s | %s | %s | %s | %s | %.2f | %s / %s | %s | %s |" % (
            r["variant"], r["kept"], r["peak"], r["sent"], r["calls"], r["step"], r["napkin"], r["ratio"],
            r["compute"], r["comm"], r["cpu_floor"], r["rounds"]) for r in res["rows"]]
        return rows + ["", "- %s" % res["saves"], "- Verdict: %s" % res["verdict"], "- %s" % res["peaks"], ""]

    head = ["| training | bytes kept / rank | peak bytes / rank | MiB sent / rank / step | calls / step | "
            "step ms (median of rounds) | napkin ms | measured / napkin | napkin: compute / communication ms | "
            "CPU floor ms | round medians ms |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    return "\n".join(lines + per_run(results, head, body))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lesson", type=int, choices=sorted(DEMOS), default=5, help="whose demo: 5 (default) or 7")
    ap.add_argument("--demo", help="the built demo, from the root (default: the lesson's under .bazel/bin)")
    ap.add_argument("--logs", help="folder of runK.log files: reuse them if all are there, else write them there")
    ap.add_argument("--out", required=True, help="the results page to write")
    args = ap.parse_args()
    demo = args.demo or ".bazel/bin/" + DEMOS[args.lesson][0][2:].replace(":", "/")
    runs, parse_log, write_page = (RUNS, parse, page) if args.lesson == 5 else (RUNS7, parse7, page7)
    logs = args.logs or tempfile.mkdtemp(prefix="l%dnetns-" % args.lesson)
    paths = [os.path.join(logs, "run%d.log" % (i + 1)) for i in range(len(runs))]
    if not all(os.path.exists(p) for p in paths):
        if os.geteuid() != 0:
            sys.exit("record.py: the runs need root (network namespaces)")
        os.makedirs(logs, exist_ok=True)
        for run, path in zip(runs, paths):
            print("record.py: %s" % command_of(run, demo), flush=True)
            record(run, demo, path)
    results = []
    for path in paths:
        res = parse_log(path)
        res["path"] = path
        results.append(res)
    with open(args.out, "w") as f:
        f.write(write_page(results))
    print("record.py: wrote %s (logs in %s)" % (args.out, logs))


if __name__ == "__main__":
    main()
