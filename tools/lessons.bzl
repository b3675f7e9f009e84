"""The course manifest, in order: the ONE list of lessons and of every file each one is made of.

Bazel reads it (the docs site, //:tour, //:progress, the invariants tests, the formatter's list), and so do the
scripts outside Bazel (tools/manifest.py executes this file as Python: keep the part above the functions plain
Starlark that is also Python). //tools:course_check holds the lesson folders to it: a file in lessonN_*/ or
solutions/lessonN_*/ that no field names fails, and so does a named file that is missing.

Fields (file names are relative to the lesson's folder, `dir`):
  number, dir, title, learn, need   the course table (docs' main page, README)
  core       the core steps (numbers, 1..K): what an attendee does in one workshop slot of 60-120 minutes; the
             lesson's other steps are "going further" (their page headings say so). //tools:slot_check holds the
             core's page words and reference lines to the slot's limits; //:progress says "core done" when they pass
  tests      the learner check targets (tagged "exercise"); the same names in solutions/<dir>/
  learner    the files the learner edits (TODO(lessonN, step K)); solutions/<dir>/ has the answer of each
  headers    the API the learner implements (documented; the docs' API reference)
  checks     the doctest sources of `tests`
  given      code the lesson provides (not edited by the learner)
  extra      anything else in the folder (scripts, a sub-package), besides README.md, BUILD and demo.cc
  demo       the demo's sources besides demo.cc, one mode or part per file (lesson 7); compiled with it into
             `demo` and `my_demo` (absent: demo.cc alone)
  solution_extra   files of solutions/<dir>/ besides BUILD and the answers to `learner`
  bench      the bench case, a file of solutions/<dir>/ that registers itself with //bench (bench/registry.h)
  mutants    the mutants module, a file of solutions/<dir>/ (plausible mistakes in the reference solution that
             the checks must catch; tools/mutants/run.sh applies them)
  library, deps, header_deps, check_deps, test_size
             how the files build (tools/lesson_package.bzl writes both BUILD files from them): the name of the
             implementation library (the learner's and the reference's), its deps, the headers' deps, the checks'
             deps, and the checks' Bazel size ("small" when absent)
Every lesson folder also holds README.md (a Doxygen page with `{#lessonN}` and "## Step K" headings), BUILD (a
`sources` filegroup, a `demo` binary on the reference solution with flags --quick --device --csv_dir, the `tests`
targets) and demo.cc. Optionally docs/plots/lessonN.gp turns the demo's CSV files into the lesson's charts.
"""

LESSONS = [
    struct(
        number = 1,
        dir = "lesson1_amp",
        title = "Mixed precision",
        core = [1, 2, 3, 4, 5, 6, 7],
        learn = "autocast, float16 vs bfloat16, a gradient scaler, the AMP training step",
        need = "CPU; a GPU shows the speed-up",
        tests = [
            "autocast_test",
            "grad_scaler_step3_test",
            "grad_scaler_step4_test",
            "grad_scaler_step5_test",
            "grad_scaler_step6_test",
            "grad_scaler_step7_test",
        ],
        learner = ["autocast.cc", "grad_scaler.cc"],
        headers = ["autocast.h", "grad_scaler.h"],
        checks = [
            "autocast_test.cc",
            "grad_scaler_step3_test.cc",
            "grad_scaler_step4_test.cc",
            "grad_scaler_step5_test.cc",
            "grad_scaler_step6_test.cc",
            "grad_scaler_step7_test.cc",
            "grad_scaler_test_helpers.h",
        ],
        given = ["grad_scaler_given.cc", "underflow_model.h"],
        extra = [],
        solution_extra = [],
        bench = "bench_case.cc",
        mutants = "mutants.py",
        library = "amp",
        deps = ["//common/compat:compat"],
        header_deps = [],
        check_deps = ["//tests:check_helpers"],
    ),
    struct(
        number = 2,
        dir = "lesson2_accumulation",
        title = "Gradient accumulation",
        core = [1, 2, 3, 4],
        learn = "large effective batches from small ones; correct loss normalisation; a micro-batch for a memory budget",
        need = "CPU; GPU optional",
        tests = [
            "accumulation_step1_test",
            "accumulation_step2_test",
            "accumulation_step3_test",
            "accumulation_step4_test",
        ],
        learner = ["accumulation.cc"],
        headers = ["accumulation.h"],
        checks = [
            "accumulation_step1_test.cc",
            "accumulation_step2_test.cc",
            "accumulation_step3_test.cc",
            "accumulation_step4_test.cc",
            "accumulation_test_helpers.h",
        ],
        given = [],
        extra = [],
        solution_extra = [],
        bench = "bench_case.cc",
        mutants = "mutants.py",
        library = "accumulation",
        deps = [
            "//common:memory_meter",
            "//solutions/lesson1_amp:amp",
        ],
        header_deps = ["//lesson1_amp:headers"],
        check_deps = [
            "//common:memory_meter",
            "//tests:check_helpers",
        ],
    ),
    struct(
        number = 3,
        dir = "lesson3_profiling",
        title = "Profiling",
        core = [1, 2, 3, 4],
        learn = "honest timing, named phases, an op table, finding the bottleneck",
        need = "CPU; GPU optional",
        tests = ["stopwatch_test", "phases_test", "profiler_test", "bottleneck_test"],
        learner = ["stopwatch.cc", "phases.cc", "profiler.cc", "bottleneck.cc"],
        headers = ["stopwatch.h", "phases.h", "profiler.h", "bottleneck.h"],
        checks = ["stopwatch_test.cc", "phases_test.cc", "profiler_test.cc", "bottleneck_test.cc"],
        given = ["stopwatch_given.cc", "phases_given.cc", "profiler_given.cc", "bottleneck_given.cc"],
        extra = [],
        solution_extra = [],
        bench = "bench_case.cc",
        mutants = "mutants.py",
        library = "prof",
        deps = [
            "//common:device",
            "//common/compat:compat_profiler",
        ],
        header_deps = [],
        check_deps = ["//common:memory_meter"],
    ),
    struct(
        number = 4,
        dir = "lesson4_memory",
        title = "Memory",
        core = [1, 2, 3, 4],
        learn = "where the bytes go, activation checkpointing, a memory planner",
        need = "CPU; GPU optional",
        tests = ["breakdown_test", "checkpoint_test", "planner_test"],
        learner = ["breakdown.cc", "checkpoint.cc", "checkpoint_sequential.cc", "planner.cc"],
        headers = ["breakdown.h", "checkpoint.h", "planner.h"],
        checks = ["breakdown_test.cc", "checkpoint_test.cc", "planner_test.cc"],
        given = ["given.cc", "workload.h"],
        extra = [],
        solution_extra = [],
        bench = "bench_case.cc",
        mutants = "mutants.py",
        library = "memory",
        deps = [
            "//common:device",
            "//common:memory_meter",
            "//common/compat:compat",
            "//solutions/lesson1_amp:amp",
        ],
        header_deps = ["//lesson1_amp:headers"],
        check_deps = [
            "//common:memory_meter",
            "//tests:check_helpers",
        ],
    ),
    struct(
        number = 5,
        dir = "lesson5_distributed",
        title = "Data parallel",
        core = [1, 2, 3],
        learn = "all-reduce on c10d (Gloo/NCCL), buckets, overlap with backward, no_sync, ZeRO-1 sharded state",
        need = "CPU (ranks on loopback); several GPUs for NCCL",
        tests = ["ddp_step1_test", "ddp_step2_test", "ddp_step3_test", "ddp_step4_test", "ddp_step5_test"],
        learner = ["ddp.cc"],
        headers = ["comm.h", "ddp.h"],
        checks = [
            "ddp_step1_test.cc",
            "ddp_step2_test.cc",
            "ddp_step3_test.cc",
            "ddp_step4_test.cc",
            "ddp_step5_test.cc",
            "ddp_test_helpers.h",
        ],
        given = ["comm.cc", "given.cc", "demo_ranks.h", "process_ranks.h"],
        extra = ["netns/BUILD", "netns/cleanup_test.sh", "netns/netns_run.sh", "netns/record.py"],
        solution_extra = ["process_fault_test.sh", "quick_buckets_test.sh"],
        bench = "bench_case.cc",
        mutants = "mutants.py",
        library = "ddp",
        deps = [
            "//common/compat:compat_distributed",
            "//solutions/lesson1_amp:amp",
            "//solutions/lesson2_accumulation:accumulation",
        ],
        header_deps = [
            "//common:device",
            "//common:memory_meter",
            "//lesson1_amp:headers",
            "//lesson2_accumulation:headers",
        ],
        check_deps = [
            "//common:memory_meter",
            "//tests:check_helpers",
            "//tests:rank_checks",
        ],
        test_size = "medium",
    ),
    struct(
        number = 6,
        dir = "lesson6_fusion",
        title = "Fused kernels",
        core = [1, 2, 3],
        learn = "napkin math of a memory-bound step, a fused AdamW with at::parallel_for and Vectorized, TORCH_LIBRARY operators, the scaler's fused unscale, grid-stride CUDA kernels",
        need = "CPU for every step (step 6's kernels on a simulated grid); a GPU and nvcc to run them for real",
        tests = [
            "fused_adamw_step1_test",
            "fused_adamw_step2_test",
            "fused_adamw_step3_test",
            "fused_adamw_step4_test",
            "fused_adamw_step5_test",
            "fused_adamw_step6_test",
        ],
        learner = ["fused_adamw.cc", "fused_adamw_cuda.cu"],
        headers = ["fused_adamw.h", "grid.h", "kernel_api.h"],
        checks = [
            "fused_adamw_step1_test.cc",
            "fused_adamw_step2_test.cc",
            "fused_adamw_step3_test.cc",
            "fused_adamw_step4_test.cc",
            "fused_adamw_step5_test.cc",
            "fused_adamw_step6_test.cc",
            "fused_adamw_test_helpers.h",
        ],
        given = ["given.cc", "given_cuda.cc", "kernel_copts.bzl"],
        extra = [],
        demo = ["demo_parts.h", "demo_pages.cc"],
        solution_extra = [],
        bench = "bench_case.cc",
        mutants = "mutants.py",
        library = "fusion",
        deps = [],
        header_deps = [],
        check_deps = [
            "//common:memory_meter",
            "//solutions/lesson1_amp:amp",
            "//tests:check_helpers",
        ],
    ),
    struct(
        number = 7,
        dir = "lesson7_fsdp",
        title = "Fully sharded data parallel",
        core = [1, 2, 3],
        learn = "ring reduce-scatter and all-gather on send/recv, flat padded shards, gather on demand (ZeRO-3 / FSDP), bfloat16 gathers beside float32 shards, checkpoints that reshard to another world size",
        need = "CPU (ranks on loopback)",
        tests = ["fsdp_step1_test", "fsdp_step2_test", "fsdp_step3_test", "fsdp_step4_test", "fsdp_step5_test", "fsdp_step6_test", "fsdp_step7_test"],
        learner = ["fsdp.cc", "what_fits.cc"],
        headers = ["fsdp.h", "what_fits.h"],
        checks = [
            "fsdp_step1_test.cc",
            "fsdp_step2_test.cc",
            "fsdp_step3_test.cc",
            "fsdp_step4_test.cc",
            "fsdp_step5_test.cc",
            "fsdp_step6_test.cc",
            "fsdp_step7_test.cc",
            "fsdp_test_helpers.h",
            "fsdp_test_problem.h",
        ],
        given = ["fsdp_given.cc"],
        extra = [],
        demo = ["demo_parts.h", "demo_step.cc", "demo_ranks.cc", "demo_processes.cc", "demo_what_fits.cc"],
        solution_extra = ["process_test.sh", "cpu_probe.cc"],
        bench = "bench_case.cc",
        mutants = "mutants.py",
        library = "fsdp",
        deps = [
            "//solutions/lesson4_memory:memory",
            "//solutions/lesson5_distributed:ddp",
        ],
        header_deps = [
            "//lesson4_memory:headers",
            "//lesson5_distributed:headers",
        ],
        check_deps = [
            "//common:memory_meter",
            "//tests:rank_checks",
        ],
        test_size = "medium",
    ),
]

def lesson_labels(suffix, prefix = ""):
    """`//<prefix><dir>:<suffix>` for every lesson, e.g. lesson_labels("demo")."""
    return ["//%s%s:%s" % (prefix, lesson.dir, suffix) for lesson in LESSONS]

def lesson_test_labels():
    """The learner checks of every lesson (tagged "exercise" in the lessons' BUILD files)."""
    return ["//%s:%s" % (lesson.dir, test) for lesson in LESSONS for test in lesson.tests]

# The JSON is written by hand: Starlark's `json` module exists only from Bazel 4 on, and `struct.to_json()` is gone
# from Bazel 7. The self-contained Bazel 2.1.0 that tools/gpu_check.sh takes to a GPU machine has no `json`.
def _json_string(text):
    for plain, escaped in [("\\", "\\\\"), ("\"", "\\\""), ("\n", "\\n"), ("\t", "\\t")]:
        text = text.replace(plain, escaped)
    return '"%s"' % text

def _json_scalar(value):
    if type(value) == type(""):
        return _json_string(value)
    if type(value) == type(True):
        return "true" if value else "false"
    if type(value) == type(0):
        return str(value)
    fail("lessons.bzl: the JSON writer takes strings, ints, bools and lists of them, not %s" % type(value))

def lessons_to_json(lessons):
    """The lessons as a JSON array of objects (Starlark has no recursion: a field is a scalar or a list of them)."""
    objects = []
    for lesson in lessons:
        # Older Bazels list a struct's methods (to_json, to_proto) in dir(): keep the data fields only.
        lines = []
        for field in [f for f in dir(lesson) if f not in ("to_json", "to_proto")]:
            value = getattr(lesson, field)
            if type(value) == type([]):
                text = "[" + ", ".join([_json_scalar(v) for v in value]) + "]"
            else:
                text = _json_scalar(value)
            lines.append("    %s: %s" % (_json_string(field), text))
        objects.append("  {\n" + ",\n".join(lines) + "\n  }")
    return "[\n" + ",\n".join(objects) + "\n]\n"

def _lessons_json_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".json")
    ctx.actions.write(out, lessons_to_json(LESSONS))
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

lessons_json = rule(
    implementation = _lessons_json_impl,
    doc = "Writes LESSONS as <name>.json for the scripts (docs generator, tour, progress).",
)
