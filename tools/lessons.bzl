"""The course, in order: the ONE list that the docs site (//docs:site), //:tour and //:progress read.

Adding a lesson: add its entry here, with its learner checks in `tests`. Its folder must then
have README.md (a Doxygen page with `{#lessonN}` and "## Step K" headings), a `sources` filegroup, a `demo`
binary (on the reference solution, flags --quick --device --csv_dir) and the test targets named in `tests`.
Optionally docs/plots/lessonN.gp turns the demo's CSV files into the lesson's charts.
"""

LESSONS = [
    struct(
        number = 1,
        dir = "lesson1_amp",
        title = "Mixed precision",
        learn = "autocast, float16 vs bfloat16, a gradient scaler, the AMP training step",
        need = "CPU; a GPU shows the speed-up",
        tests = ["autocast_test", "grad_scaler_test"],
    ),
    struct(
        number = 2,
        dir = "lesson2_accumulation",
        title = "Gradient accumulation",
        learn = "large effective batches from small ones; correct loss normalisation; a micro-batch for a memory budget",
        need = "CPU; GPU optional",
        tests = ["accumulation_test"],
    ),
    struct(
        number = 3,
        dir = "lesson3_profiling",
        title = "Profiling",
        learn = "honest timing, named phases, an op table, finding the bottleneck",
        need = "CPU; GPU optional",
        tests = ["stopwatch_test", "phases_test", "profiler_test", "bottleneck_test"],
    ),
    struct(
        number = 4,
        dir = "lesson4_memory",
        title = "Memory",
        learn = "where the bytes go, activation checkpointing, a memory planner",
        need = "CPU; GPU optional",
        tests = ["breakdown_test", "checkpoint_test", "planner_test"],
    ),
    struct(
        number = 5,
        dir = "lesson5_distributed",
        title = "Data parallel",
        learn = "all-reduce on c10d (Gloo/NCCL), buckets, overlap with backward, no_sync, ZeRO-1 sharded state",
        need = "CPU (ranks on loopback); several GPUs for NCCL",
        tests = ["ddp_test"],
    ),
    struct(
        number = 6,
        dir = "lesson6_fusion",
        title = "Fused kernels",
        learn = "napkin math of a memory-bound step, a fused AdamW with at::parallel_for and Vectorized, TORCH_LIBRARY operators, the scaler's fused unscale, grid-stride CUDA kernels",
        need = "CPU for steps 1-5; a GPU and nvcc for step 6's kernels",
        tests = ["fused_adamw_test"],
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
