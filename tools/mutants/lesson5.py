"""Lesson 5's mutants (data parallel): plausible bugs in solutions/, one tuple each.

(name, file, old, new, what the bug is): `old` must occur exactly once in `file`; tools/mutants/mutants.py
turns each tuple into a patch at run time and tools/mutants/run.sh applies them one at a time.
"""

L5 = "solutions/lesson5_distributed/ddp.cc"

MUTANTS = [
]
