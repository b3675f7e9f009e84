"""Lesson 3's mutants (profiling): plausible bugs in solutions/, one tuple each.

(name, file, old, new, what the bug is): `old` must occur exactly once in `file`; tools/mutants/mutants.py
turns each tuple into a patch at run time and tools/mutants/run.sh applies them one at a time.
"""

L3B = "solutions/lesson3_profiling/bottleneck.cc"
L3P = "solutions/lesson3_profiling/profiler.cc"
L3R = "solutions/lesson3_profiling/phases.cc"
L3S = "solutions/lesson3_profiling/stopwatch.cc"

MUTANTS = [
    # ---- lesson 3 -----------------------------------------------------------------------------------
    ("l3_median_upper", L3S,
     "return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);",
     "return values[n / 2];",
     "median of an even count takes the upper middle value"),
    ("l3_measure_no_warmup", L3S,
     "  for (int i = 0; i < warmup; ++i) work();\n", "",
     "measure() skips the warm-up runs"),
    ("l3_stopwatch_start_no_sync", L3S,
     "  workshop::synchronize(device_);\n  running_ = true;",
     "  running_ = true;",
     "the stopwatch does not wait for queued device work before starting"),
    ("l3_measure_min_is_first", L3S,
     "  m.min_ms = *std::min_element(m.samples_ms.begin(), m.samples_ms.end());",
     "  m.min_ms = m.samples_ms.front();",
     "measure() reports the first sample as the minimum"),
    ("l3_attribute_no_self_subtract", L3P,
     "      parent.self_us -= event.total_us();  // the child's time is not the parent's own\n", "",
     "self time includes the children's time"),
    ("l3_attribute_pop_on_start", L3P,
     "while (!stack.empty() && events[stack.back()].end_us < event.end_us) stack.pop_back();",
     "while (!stack.empty() && events[stack.back()].end_us < event.start_us) stack.pop_back();",
     "an event is attributed to an earlier sibling that ended before it ended"),
    ("l3_attribute_phase_not_inherited", L3P,
     "      event.phase = parent.phase;\n", "",
     "nested ops do not inherit their parent's phase"),
    ("l3_table_ascending", L3P,
     "if (a.total_us != b.total_us) return a.total_us > b.total_us;",
     "if (a.total_us != b.total_us) return a.total_us < b.total_us;",
     "the table is sorted by ascending total time"),
    ("l3_table_self_is_total", L3P,
     "    row.self_us += event.self_us;",
     "    row.self_us += event.total_us();",
     "the table's self column adds total times"),
    ("l3_json_no_backslash_escape", L3P,
     "      case '\\\\':\n        out += \"\\\\\\\\\";\n        break;\n", "",
     "the trace does not escape backslashes in names"),
    ("l3_stop_keeps_recording_flag", L3P,
     "  recording_ = false;\n  std::vector<Event> events = stop_recording();",
     "  std::vector<Event> events = stop_recording();\n  recording_ = events.empty();",
     "stop() leaves the profiler marked as recording after an empty profile"),
    ("l3_range_not_recorded", L3R,
     "    record->before(name_);\n", "",
     "ScopedRange never starts its record (the range has no name and no start)"),
    ("l3_diagnose_sync_strict", L3B,
     "    if (calls >= 1.0) {", "    if (calls > 1.0) {",
     "a sync once per step is not reported"),
    ("l3_fast_step_item_sync", L3B,
     "    loss_sum_.add_(loss.detach());  // stays on the device; mean_loss() reads it once, after the loop",
     "    loss_sum_.add_(loss.detach().item<double>());",
     "the fixed step still reads the loss with .item() every step"),
    ("l3_median_unsorted", L3S,
     "  std::sort(values.begin(), values.end());\n", "",
     "median() forgets to sort"),
    ("l3_prepare_global_std", L3B,
     "  const auto std = all.std(0);", "  const auto std = all.std();",
     "the fixed loop normalises by one global std instead of per feature"),
]
