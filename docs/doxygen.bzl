"""The docs site's build steps: run the demos, generate pages and plots from their CSV, run Doxygen."""

def _demo_csv_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    commands = ["set -e", "mkdir -p %s" % out.path]
    tools = []
    for demo in ctx.attr.demos:
        run = demo[DefaultInfo].files_to_run
        tools.append(run)
        log = "%s/%s.log" % (out.path, demo.label.package)
        commands.append(
            "if ! {exe} {args} --csv_dir={out} > {log} 2>&1; then cat {log} >&2; echo '{label} failed' >&2; exit 1; fi"
                .format(exe = run.executable.path, args = " ".join(ctx.attr.args), out = out.path, log = log,
                        label = demo.label),
        )
    ctx.actions.run_shell(
        outputs = [out],
        tools = tools,
        command = "\n".join(commands),
        mnemonic = "DemoCsv",
        progress_message = "Running the lessons' demos (%s) for the docs' plots" % " ".join(ctx.attr.args),
        use_default_shell_env = True,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

demo_csv = rule(
    implementation = _demo_csv_impl,
    doc = "Runs each demo with `args --csv_dir=<this folder>`; the folder holds their CSV files and logs.",
    attrs = {
        "demos": attr.label_list(cfg = "target", mandatory = True),
        "args": attr.string_list(default = ["--quick", "--device=cpu"]),
    },
)

def _site_pages_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    args = ctx.actions.args()
    args.add(ctx.file.generator)
    args.add("--lessons", ctx.file.lessons)
    args.add("--csv", ctx.file.csv.path)
    args.add("--mainpage", ctx.file.mainpage)
    args.add("--plots", ctx.file.plots_common.dirname)
    args.add("--readme", ctx.file.readme)
    args.add("--maintainers", ctx.file.maintainers)
    for f in ctx.files.pages:
        args.add("--page", f)
    for f in ctx.files.recorded:
        args.add("--recorded", f)
    for f in ctx.files.bench:
        args.add("--bench", f)
    for f in ctx.files.images:
        args.add("--image", f)
    args.add("--out", out.path)
    ctx.actions.run_shell(
        outputs = [out],
        inputs = ctx.files.srcs + ctx.files.plots + ctx.files.recorded + ctx.files.bench + ctx.files.images +
                 ctx.files.pages +
                 [ctx.file.generator, ctx.file.lessons, ctx.file.csv, ctx.file.mainpage, ctx.file.plots_common,
                  ctx.file.readme, ctx.file.maintainers],
        command = "python3 \"$@\"",
        arguments = [args],
        mnemonic = "SitePages",
        progress_message = "Generating the docs' pages and plots",
        use_default_shell_env = True,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

site_pages = rule(
    implementation = _site_pages_impl,
    doc = "Runs docs/gen_pages.py: lesson pages with cross-links, main page, results page, plots (gnuplot).",
    attrs = {
        "generator": attr.label(allow_single_file = True, mandatory = True),
        "lessons": attr.label(allow_single_file = True, mandatory = True),
        "csv": attr.label(allow_single_file = True, mandatory = True, doc = "a demo_csv folder"),
        "mainpage": attr.label(allow_single_file = True, mandatory = True),
        "readme": attr.label(allow_single_file = True, mandatory = True, doc = "the repository's README.md"),
        "maintainers": attr.label(allow_single_file = True, mandatory = True, doc = "docs/maintainers.md"),
        "pages": attr.label_list(allow_files = [".md"], doc = "pages of their own (docs/pages/*.md)"),
        "plots_common": attr.label(allow_single_file = True, mandatory = True, doc = "docs/plots/common.gp"),
        "plots": attr.label_list(allow_files = [".gp"]),
        "recorded": attr.label_list(allow_files = [".csv"], doc = "recorded GPU runs (docs/results/*.csv)"),
        "bench": attr.label_list(allow_files = [".md"], doc = "recorded //bench tables (docs/results/bench/*.md)"),
        "images": attr.label_list(
            allow_files = [".svg", ".png"],
            doc = "committed pictures of recorded runs (docs/results/*.svg), for a page's \\image html",
        ),
        "srcs": attr.label_list(allow_files = True, doc = "lesson READMEs, checks, demos, solutions"),
    },
)

def _doxygen_site_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    pages = ctx.file.pages.path
    headers = [f.path for f in ctx.files.srcs if f.extension == "h"]
    inputs = " ".join(ctx.attr.inputs + headers)
    ctx.actions.run_shell(
        outputs = [out],
        inputs = ctx.files.srcs + [ctx.file.doxyfile, ctx.file.pages],
        command = """
set -e
export DOXYGEN_OUT="$(mktemp -d)"
# The generated pages, copied to one flat folder with a name per page (lesson1_amp/README.md becomes
# lesson1_amp.md): Doxygen names a file's HTML page after its path when two inputs share a name, and the path
# of the generated pages is Bazel's output tree, which no page name or title should show.
export DOXYGEN_PAGES="$DOXYGEN_OUT/pages"
mkdir -p "$DOXYGEN_PAGES"
(cd {pages} && find . -name '*.md') | while read -r page; do
  flat=$(printf '%s' "${{page#./}}" | sed -e 's|/README\\.md$|.md|' -e 's|/|_|g')
  cp "{pages}/$page" "$DOXYGEN_PAGES/$flat"
done
export DOXYGEN_INPUT="$DOXYGEN_PAGES {inputs}"
export DOXYGEN_IMAGES="{pages}/images"
export DOXYGEN_MAINPAGE="$DOXYGEN_PAGES/mainpage.md"
# The theme: doxygen-awesome-css (Debian package, installed by tools/setup.sh) with its dark-mode toggle and
# copy buttons on code fragments, which need two scripts in the page header. Without the package the site
# falls back to Doxygen's own look (and //docs:site_test says so).
theme=/usr/share/doxygen-awesome-css
export DOXYGEN_HEADER="" DOXYGEN_THEME_CSS="" DOXYGEN_THEME_JS=""
if [ -f "$theme/doxygen-awesome.css" ]; then
  export DOXYGEN_THEME_CSS="$theme/doxygen-awesome.css"
  export DOXYGEN_THEME_JS="$theme/doxygen-awesome-darkmode-toggle.js $theme/doxygen-awesome-fragment-copy-button.js"
  doxygen -w html "$DOXYGEN_OUT/header.html" "$DOXYGEN_OUT/footer.html" "$DOXYGEN_OUT/unused.css" {doxyfile} \
    > "$DOXYGEN_OUT/header_log.txt" 2>&1 || {{ cat "$DOXYGEN_OUT/header_log.txt" >&2; exit 1; }}
  scripts='<script type="text/javascript" src="$relpath^doxygen-awesome-darkmode-toggle.js"></script>'
  scripts="$scripts"'<script type="text/javascript" src="$relpath^doxygen-awesome-fragment-copy-button.js"></script>'
  scripts="$scripts"'<script type="text/javascript">DoxygenAwesomeDarkModeToggle.init(); DoxygenAwesomeFragmentCopyButton.init();</script>'
  sed -i "s|</head>|$scripts</head>|" "$DOXYGEN_OUT/header.html"
  export DOXYGEN_HEADER="$DOXYGEN_OUT/header.html"
else
  echo "note: $theme is missing (Debian package doxygen-awesome-css, see tools/setup.sh): plain Doxygen theme" >&2
fi
if ! doxygen {doxyfile} > "$DOXYGEN_OUT/log.txt" 2>&1; then
  cat "$DOXYGEN_OUT/log.txt" >&2
  echo "doxygen failed (warnings are errors)" >&2
  exit 1
fi
if [ -s "$DOXYGEN_OUT/log.txt" ]; then
  cat "$DOXYGEN_OUT/log.txt" >&2
  echo "doxygen printed the messages above; the site must build without any" >&2
  exit 1
fi
cp -r "$DOXYGEN_OUT/html/." {out}/
rm -rf "$DOXYGEN_OUT"
""".format(inputs = inputs, pages = pages, doxyfile = ctx.file.doxyfile.path, out = out.path),
        mnemonic = "Doxygen",
        progress_message = "Building the docs site with Doxygen",
        use_default_shell_env = True,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

doxygen_site = rule(
    implementation = _doxygen_site_impl,
    attrs = {
        "doxyfile": attr.label(allow_single_file = True, mandatory = True),
        "pages": attr.label(allow_single_file = True, mandatory = True, doc = "a site_pages folder"),
        "inputs": attr.string_list(doc = "more files (workspace-relative) Doxygen reads as INPUT"),
        "srcs": attr.label_list(allow_files = True, doc = "every file Doxygen reads; headers become INPUT"),
    },
)
