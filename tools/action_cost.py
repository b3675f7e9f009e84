#!/usr/bin/env python3
"""CPU seconds of the build actions a learner's edit reruns (tools/loop_bench.sh --cpu calls it).

    python3 tools/action_cost.py //lesson4_memory:all lesson4_memory/planner.cc [--repeat=3] [-- BAZEL FLAGS]

Asks `bazel aquery` for the compile and link actions of the target pattern, keeps the ones that an edit of the
source file reruns (its compile, then every link whose inputs come from that compile, directly or through another
link), and runs each one's own command line again in Bazel's execution root, outside the sandbox and writing
into a scratch folder, under getrusage: user+sys CPU seconds and wall seconds per action. The compile and the
links downstream of it form the critical path of the loop before the tests run, and their CPU seconds are
what the loop costs on a quiet machine, whatever the machine's load while measuring (a busy machine still
inflates them somewhat: shared caches and cores). Prints one line per action and a last line
`total_cpu_s=... compile_cpu_s=... link_cpu_s=...`. Builds the pattern first, so that the execution root
holds the other inputs.
"""
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time


def bazel(args, extra):
    cmd = [os.environ.get("BAZEL", "bazel")] + args[:1] + extra + args[1:]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def run_timed(argv, cwd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"action_cost: this command failed (exit {proc.returncode}): {' '.join(argv)[:300]}")
    return cpu, wall


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    repeat = 3
    positional = []
    for a in argv:
        if a.startswith("--repeat="):
            repeat = int(a.split("=", 1)[1])
        else:
            positional.append(a)
    if len(positional) != 2:
        raise SystemExit(__doc__)
    pattern, source = positional

    # The execution root holds only the packages of the last build: build the pattern (up to date: quick).
    subprocess.run([os.environ.get("BAZEL", "bazel"), "build"] + extra + [pattern], capture_output=True)
    query = f'mnemonic("CppCompile|CppLink|SolibSymlink", deps({pattern}))'
    graph = json.loads(bazel(["aquery", query, "--output=jsonproto"], extra) or "{}")
    execroot = bazel(["info", "execution_root"], extra).strip()

    # Bazel 4 names artifacts by execPath; later versions by a tree of path fragments.
    fragments = {f["id"]: f for f in graph.get("pathFragments", [])}

    def path_of(artifact):
        if "execPath" in artifact:
            return artifact["execPath"]
        parts, fid = [], artifact["pathFragmentId"]
        while fid:
            parts.append(fragments[fid]["label"])
            fid = fragments[fid].get("parentId")
        return "/".join(reversed(parts))

    paths = {a["id"]: path_of(a) for a in graph.get("artifacts", [])}
    depsets = {d["id"]: d for d in graph.get("depSetOfFiles", [])}

    def files_of(depset_ids):
        out, todo, seen = set(), list(depset_ids), set()
        while todo:
            d = todo.pop()
            if d in seen:
                continue
            seen.add(d)
            out.update(paths[a] for a in depsets[d].get("directArtifactIds", []))
            todo.extend(depsets[d].get("transitiveDepSetIds", []))
        return out

    actions = []
    for a in graph.get("actions", []):
        actions.append({
            "mnemonic": a["mnemonic"],
            "arguments": a.get("arguments", []),
            "inputs": files_of(a.get("inputDepSetIds", [])),
            "outputs": {paths[o] for o in a.get("outputIds", [])},
        })

    # What an edit of `source` reruns: its compiles, then whatever consumes their outputs (to a fixed point).
    dirty = {source}
    chosen = []
    changed = True
    while changed:
        changed = False
        for a in actions:
            if a in chosen:
                continue
            if a["mnemonic"] == "CppCompile" and source not in a["inputs"]:
                continue  # a compile reruns only for its own source (headers are not edited)
            if a["inputs"] & dirty:
                chosen.append(a)
                dirty |= a["outputs"]
                changed = True
    if not any(a["mnemonic"] == "CppCompile" for a in chosen):
        raise SystemExit(f"action_cost: no compile action of {pattern} reads {source}")

    scratch = tempfile.mkdtemp(prefix="action_cost.")
    try:
        totals = {"CppCompile": 0.0, "CppLink": 0.0, "SolibSymlink": 0.0}
        for a in chosen:
            if not a["arguments"]:
                continue  # a symlink (SolibSymlink): nothing to run
            # Outputs go to the scratch folder, so Bazel's own outputs stay as Bazel left them.
            args = []
            for arg in a["arguments"]:
                if arg.startswith("@") and arg.endswith(".params"):
                    continue  # Bazel 4's aquery lists the params file's contents and the file as well
                for out in sorted(a["outputs"], key=len, reverse=True):
                    if out in arg:
                        arg = arg.replace(out, os.path.join(scratch, out))
                        os.makedirs(os.path.dirname(os.path.join(scratch, out)), exist_ok=True)
                args.append(arg)
            best_cpu, best_wall = None, None
            for _ in range(repeat):
                cpu, wall = run_timed(args, execroot)
                best_cpu = cpu if best_cpu is None else min(best_cpu, cpu)
                best_wall = wall if best_wall is None else min(best_wall, wall)
            totals[a["mnemonic"]] += best_cpu
            target = sorted(o for o in a["outputs"] if not o.endswith((".d", ".params")))[0]
            print(f"{a['mnemonic']:10s} cpu_s={best_cpu:.2f} wall_s={best_wall:.2f} {target}")
        print(f"total_cpu_s={totals['CppCompile'] + totals['CppLink']:.2f} "
              f"compile_cpu_s={totals['CppCompile']:.2f} link_cpu_s={totals['CppLink']:.2f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
