#!/usr/bin/env python3
"""tools/compile_commands.py on a made-up `bazel aquery --output=jsonproto` answer (Bazel 4's shape).

  python3 tools/compile_commands_test.py tools/compile_commands.py
"""
import json
import os
import subprocess
import sys
import tempfile


def graph():
    """Three compile actions (one source twice, one genrule copy of a .cu) and the genrule that copies it."""
    fragments, artifacts = [], []

    def artifact(path):
        parent = None
        for label in path.split("/"):
            found = [f for f in fragments if f["label"] == label and f.get("parentId") == parent]
            if found:
                parent = found[0]["id"]
            else:
                fragment = {"id": len(fragments) + 1, "label": label}
                if parent:
                    fragment["parentId"] = parent
                fragments.append(fragment)
                parent = fragment["id"]
        artifacts.append({"id": len(artifacts) + 1, "pathFragmentId": parent})
        return artifacts[-1]["id"]

    def compile_args(source, obj):
        return ["/usr/bin/gcc", "-U_FORTIFY_SOURCE", "-MD", "-MF", obj[:-1] + "d", "-frandom-seed=" + obj,
                "-DWORKSHOP_HAS_CUDA=0", "-iquote", ".", "-iquote", "bazel-out/k8-fastbuild/bin",
                "-iquote", "external/libtorch", "-isystem", "external/libtorch/include",
                "-isystem", "external/gone/include", "-fno-canonical-system-headers", "-D__DATE__=\"redacted\"",
                "-c", source, "-o", obj]

    copy_out = artifact("bazel-out/k8-fastbuild/bin/pkg/lib_grid.cc")
    cu = artifact("pkg/kernel.cu")
    setup = artifact("external/bazel_tools/tools/genrule/genrule-setup.sh")
    actions = [
        {"mnemonic": "CppCompile", "targetId": 1, "arguments": compile_args("pkg/a.cc", "bazel-out/x/a.pic.o")},
        {"mnemonic": "CppCompile", "targetId": 2, "arguments": compile_args("pkg/a.cc", "bazel-out/y/a.pic.o")},
        {"mnemonic": "CppCompile", "targetId": 3,
         "arguments": compile_args("bazel-out/k8-fastbuild/bin/pkg/lib_grid.cc", "bazel-out/z/lib_grid.pic.o")},
        {"mnemonic": "Genrule", "targetId": 3, "inputDepSetIds": [1], "outputIds": [copy_out],
         "arguments": ["/bin/bash", "-c", "cp pkg/kernel.cu bazel-out/k8-fastbuild/bin/pkg/lib_grid.cc"]},
    ]
    return {"actions": actions, "artifacts": artifacts, "pathFragments": fragments,
            "depSetOfFiles": [{"id": 1, "directArtifactIds": [cu, setup]}]}


def main():
    generator = sys.argv[1]
    failures = []

    def expect(condition, what):
        print("%s %s" % ("ok  " if condition else "FAIL", what))
        if not condition:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        root, output_base = os.path.join(tmp, "ws"), os.path.join(tmp, "ob")
        execution_root = os.path.join(output_base, "execroot", "ws")
        for folder in [os.path.join(root, "pkg"), os.path.join(output_base, "external", "libtorch", "include"),
                       execution_root]:
            os.makedirs(folder)
        for name in ["a.cc", "kernel.cu", "other.cu"]:
            open(os.path.join(root, "pkg", name), "w").close()
        aquery = os.path.join(tmp, "aquery.json")
        with open(aquery, "w") as f:
            json.dump(graph(), f)
        out = os.path.join(tmp, "compile_commands.json")
        env = dict(os.environ, BUILD_WORKSPACE_DIRECTORY=root)
        subprocess.run([sys.executable, generator, "--aquery_json=" + aquery, "--output_base=" + output_base,
                        "--execution_root=" + execution_root, "--out=" + out], env=env, check=True)
        with open(out) as f:
            database = json.load(f)
        by_file = {os.path.relpath(e["file"], root): e for e in database}
        expect(sorted(by_file) == ["pkg/a.cc", "pkg/kernel.cu", "pkg/other.cu"],
               "one entry per source file, the copied .cu under its own name, the other .cu from a neighbour: %s"
               % sorted(by_file))
        expect(all(e["directory"] == root for e in database), "every entry's directory is the workspace root")
        a = by_file["pkg/a.cc"]["arguments"]
        expect(a[-2:] == ["-c", "pkg/a.cc"], "the source last, after -c: %s" % a[-2:])
        expect("-isystem" in a and a[a.index("-isystem") + 1] == os.path.join(output_base, "external/libtorch/include"),
               "external/ paths point into the output base")
        expect(os.path.join(output_base, "external/libtorch") in a, "an existing external folder is kept")
        expect(not any("gone" in x or "bazel-out" in x for x in a), "folders that do not exist are left out: %s" % a)
        expect(not any(x in ("-MD", "-MF", "-o") or x.startswith(("-frandom-seed", "-D__DATE__")) for x in a),
               "Bazel's bookkeeping flags are dropped")
        expect(["-iquote", "."] == a[a.index("-iquote"):a.index("-iquote") + 2], "the workspace stays '.'")
        cu = by_file["pkg/kernel.cu"]["arguments"]
        expect(cu[-4:] == ["-x", "c++", "-c", "pkg/kernel.cu"], "the .cu read as C++: %s" % cu[-4:])
        other = by_file["pkg/other.cu"]["arguments"]
        expect(other[-4:] == ["-x", "c++", "-c", "pkg/other.cu"], "a .cu without an action: %s" % other[-4:])
    if failures:
        sys.exit("%d failed" % len(failures))
    print("all passed")


if __name__ == "__main__":
    main()
