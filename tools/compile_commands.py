#!/usr/bin/env python3
"""Writes compile_commands.json at the repository root from Bazel's own action graph, for clangd (VS Code, Neovim,
Emacs, Helix, Zed) and CLion: completion, go-to-definition into LibTorch, errors as you type.

  bazel run //:compile_commands              # the usual way (also run by tools/setup.sh at its end)
  python3 tools/compile_commands.py          # the same, without building the runner first
  python3 tools/compile_commands.py --aquery_json=FILE --output_base=DIR --execution_root=DIR --out=FILE
                                             # from a saved `bazel aquery ... --output=jsonproto` (tests)

How: `bazel aquery 'mnemonic("CppCompile|Genrule", //...)' --output=jsonproto` (no build, no download) lists every
C++ compile action of every lesson, solution, check, demo, bench and common target, with gcc's full argument list:
the toolchain's flags, the copts, LibTorch's and doctest's include folders and defines. Those arguments are
relative to Bazel's execution root, which holds nothing until a build has run; so each entry's "directory" is the
repository root instead, and the paths are rewritten: `external/<repo>/...` -> `<output_base>/external/<repo>/...`
(Bazel's folders for @libtorch and @doctest, whose include/ holds links to the LibTorch the WORKSPACE found), and
`bazel-out/...` -> `<execution_root>/bazel-out/...`. An include folder that does not exist on disk (Bazel passes
one per repository and output tree, most of them empty stand-ins) is left out. Bazel's bookkeeping flags (-MD -MF,
-frandom-seed, -o, the redacted __DATE__ macros) are dropped. One entry per source file (a file compiled into two
targets, e.g. a lesson's given.cc in the learner's and the reference's library, has the same flags in both).

A source that Bazel compiles from a copy (lesson 6's fused_adamw_cuda.cu, which a genrule copies to *_grid.cc where
there is no nvcc) gets the copy's command, with `-x c++`; where nvcc compiles it instead, it gets the command of a
C++ file of its folder. Headers get no entry: clangd gives a header the command of the closest source file
(lesson1_amp/grad_scaler.h -> lesson1_amp/grad_scaler.cc); tools/clangd_check.py checks that this works.

The database follows the LibTorch the WORKSPACE finds through Bazel's @libtorch folder: after switching LibTorch
($LIBTORCH, a pip PyTorch), the headers clangd reads change with it as soon as Bazel has re-run the repository rule;
run this again for the defines and CUDA include folders that come with it (`bazel run //:compile_commands`).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

QUERY = 'mnemonic("CppCompile|Genrule", //...)'
INCLUDE_FLAGS = ("-iquote", "-isystem", "-I", "-idirafter", "-include")
DROP_WITH_VALUE = ("-MF", "-o")
DROP_PREFIXES = ("-frandom-seed=", "-D__DATE__=", "-D__TIMESTAMP__=", "-D__TIME__=")
DROP = ("-MD", "-c")
NOT_CXX = (".cu",)  # sources the compiler would not take as C++ by their name


def workspace_root():
    if os.environ.get("BUILD_WORKSPACE_DIRECTORY"):
        return os.environ["BUILD_WORKSPACE_DIRECTORY"]
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bazel(root, args, quiet):
    """Runs `bazel ARGS` in the workspace; returns stdout."""
    command = shlex.split(os.environ.get("BAZEL", "bazel")) + args  # e.g. BAZEL="bazel --output_base=DIR"
    result = subprocess.run(command, cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE if quiet else None, universal_newlines=True)
    if result.returncode != 0:
        if quiet and result.stderr:
            sys.stderr.write(result.stderr[-4000:])
        raise SystemExit("compile_commands: `%s` failed (exit %d)" % (" ".join(command), result.returncode))
    return result.stdout


def artifact_paths(graph):
    """id -> exec path, from aquery's artifacts and path fragments."""
    fragments = {f["id"]: f for f in graph.get("pathFragments", [])}
    cache = {}

    def fragment_path(fid):
        if fid not in cache:
            f = fragments[fid]
            parent = f.get("parentId")
            cache[fid] = fragment_path(parent) + "/" + f["label"] if parent else f["label"]
        return cache[fid]

    if fragments:
        return {a["id"]: fragment_path(a["pathFragmentId"]) for a in graph.get("artifacts", [])}
    return {a["id"]: a["execPath"] for a in graph.get("artifacts", [])}  # Bazel 2.x-3.x: execPath directly


def action_inputs(graph, action, paths):
    depsets = {d["id"]: d for d in graph.get("depSetOfFiles", [])}
    seen, stack, files = set(), list(action.get("inputDepSetIds", [])), []
    while stack:
        d = stack.pop()
        if d in seen:
            continue
        seen.add(d)
        files += [paths[i] for i in depsets[d].get("directArtifactIds", [])]
        stack += depsets[d].get("transitiveDepSetIds", [])
    return files


def is_source(path):
    return not path.startswith(("bazel-out/", "external/"))


def copied_sources(graph, paths):
    """Generated C++ file -> the one source file a genrule made it from (lesson 6's `cp x.cu x_grid.cc`)."""
    copies = {}
    for action in graph.get("actions", []):
        if action.get("mnemonic") != "Genrule":
            continue
        sources = [p for p in action_inputs(graph, action, paths) if is_source(p)]
        outputs = [paths[i] for i in action.get("outputIds", [])]
        if len(sources) == 1 and len(outputs) == 1 and outputs[0].endswith((".cc", ".cpp")):
            copies[outputs[0]] = sources[0]
    return copies


def rewrite_path(path, output_base, execution_root):
    """An exec-root-relative path as a path that exists without the execution root (or None when it does not)."""
    if path.startswith("external/"):
        absolute = os.path.join(output_base, path)
    elif path == "bazel-out" or path.startswith("bazel-out/"):
        absolute = os.path.join(execution_root, path)
    else:
        return path  # the workspace itself ("." and its folders): relative to the entry's directory
    return absolute if os.path.exists(absolute) else None


def clean_arguments(args, source, output_base, execution_root, root):
    """gcc's arguments for one compile action, for an editor: paths rewritten, bookkeeping dropped, -c SOURCE last."""
    out, dropped = [args[0]], []
    i = 1
    while i < len(args):
        a = args[i]
        if a in DROP_WITH_VALUE:
            i += 2
            continue
        if a in DROP or a.startswith(DROP_PREFIXES):
            i += 2 if a == "-c" else 1
            continue
        if a in INCLUDE_FLAGS and i + 1 < len(args):
            value = args[i + 1]
            rewritten = rewrite_path(value, output_base, execution_root)
            if rewritten is not None and not os.path.isabs(rewritten) and \
                    not os.path.exists(os.path.join(root, rewritten)):
                rewritten = None
            if rewritten is None:
                dropped.append(value)
            else:
                out += [a, rewritten]
            i += 2
            continue
        out.append(a)
        i += 1
    if source.endswith(NOT_CXX):
        out += ["-x", "c++"]
    return out + ["-c", source], dropped


def compile_source(args):
    """The file after -c (Bazel puts exactly one)."""
    return args[args.index("-c") + 1]


def build_database(graph, output_base, execution_root, root):
    paths = artifact_paths(graph)
    copies = copied_sources(graph, paths)
    entries, dropped = {}, set()
    for action in graph.get("actions", []):
        if action.get("mnemonic") != "CppCompile":
            continue
        args = action["arguments"]
        source = compile_source(args)
        source = copies.get(source, source)
        if not is_source(source) or source in entries:
            continue  # a generated file we cannot map back; a file already seen in another target
        arguments, gone = clean_arguments(args, source, output_base, execution_root, root)
        dropped.update(gone)
        entries[source] = arguments
    # A .cu that nvcc compiles (a CUDA LibTorch with nvcc) has no C++ action: take a C++ file of its folder.
    for source in tracked_sources(root):
        if source.endswith(NOT_CXX) and source not in entries:
            folder = os.path.dirname(source)
            neighbours = sorted(s for s in entries if os.path.dirname(s) == folder and not s.endswith(NOT_CXX))
            if neighbours:
                args = entries[neighbours[0]][:-2]
                entries[source] = args + ["-x", "c++", "-c", source]
    database = [{"directory": root, "file": os.path.join(root, s), "arguments": a}
                for s, a in sorted(entries.items())]
    return database, sorted(dropped)


def tracked_sources(root):
    """The .cu files of the workspace (git's list where there is git; a walk otherwise)."""
    try:
        if os.path.exists(os.path.join(root, ".git")):
            return subprocess.run(["git", "ls-files", "*.cu"], cwd=root, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, universal_newlines=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith((".", "bazel-"))]
        found += [os.path.relpath(os.path.join(folder, f), root) for f in files if f.endswith(".cu")]
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="where to write (default: compile_commands.json at the repository root)")
    parser.add_argument("--aquery_json", help="a saved aquery --output=jsonproto (instead of running Bazel)")
    parser.add_argument("--output_base", help="with --aquery_json: Bazel's output base")
    parser.add_argument("--execution_root", help="with --aquery_json: Bazel's execution root")
    parser.add_argument("--quiet", action="store_true", help="Bazel's progress output only on failure")
    options = parser.parse_args()
    root = workspace_root()
    out = options.out or os.path.join(root, "compile_commands.json")
    start = time.time()
    if options.aquery_json:
        with open(options.aquery_json, encoding="utf-8") as f:
            graph = json.load(f)
        output_base, execution_root = options.output_base, options.execution_root
    else:
        info = dict(line.split(": ", 1) for line in
                    bazel(root, ["info", "output_base", "execution_root"], options.quiet).splitlines()
                    if ": " in line)
        output_base, execution_root = info["output_base"], info["execution_root"]
        graph = json.loads(bazel(root, ["aquery", QUERY, "--output=jsonproto"], options.quiet))
    database, dropped = build_database(graph, output_base, execution_root, root)
    if not database:
        raise SystemExit("compile_commands: Bazel listed no C++ compile action")
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(database, f, indent=1)
        f.write("\n")
    os.replace(tmp, out)
    print("compile_commands: %d files -> %s (%.0f s; %d include folders that do not exist left out)"
          % (len(database), out, time.time() - start, len(dropped)))


if __name__ == "__main__":
    main()
