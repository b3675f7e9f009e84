"""A rule that runs Doxygen over the given sources and produces the HTML site as a directory."""

def _doxygen_site_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    inputs = " ".join(ctx.attr.inputs)
    images = " ".join([f.dirname for f in ctx.files.images])
    ctx.actions.run_shell(
        outputs = [out],
        inputs = ctx.files.srcs + ctx.files.images + [ctx.file.doxyfile],
        command = """
set -e
export DOXYGEN_OUT="$(mktemp -d)"
export DOXYGEN_INPUT="{inputs}"
export DOXYGEN_IMAGES="{images}"
if ! doxygen {doxyfile} > "$DOXYGEN_OUT/log.txt" 2>&1; then
  cat "$DOXYGEN_OUT/log.txt" >&2
  echo "doxygen failed (warnings are errors)" >&2
  exit 1
fi
cp -r "$DOXYGEN_OUT/html/." {out}/
rm -rf "$DOXYGEN_OUT"
""".format(inputs = inputs, images = images, doxyfile = ctx.file.doxyfile.path, out = out.path),
        mnemonic = "Doxygen",
        progress_message = "Building the docs site with Doxygen",
        use_default_shell_env = True,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

doxygen_site = rule(
    implementation = _doxygen_site_impl,
    attrs = {
        "doxyfile": attr.label(allow_single_file = True, mandatory = True),
        "inputs": attr.string_list(doc = "files and folders (workspace-relative) Doxygen reads as INPUT"),
        "srcs": attr.label_list(allow_files = True, doc = "every file Doxygen reads, snippets included"),
        "images": attr.label_list(allow_files = True),
    },
)
