"""What the maintainer checks' Python tests (tools/*_test.py) share: each expectation checked and printed as it
goes, the failed ones kept, one closing line with the tally and the exit status from it; and the edit by which a
test plants a defect in a copied file.

    from expectations import Expectations, replace_once
    checks = Expectations()
    checks.expect(found == wanted, "the report names the lesson")
    replace_once(path, "old text", "planted defect")   # AssertionError if "old text" is not there
    checks.finish()                                     # exits 1 if an expectation failed, else 0
"""
import sys


class Expectations:
    """Counts expectations. `quiet=True` prints only the failed ones (for tests with hundreds of them)."""

    def __init__(self, quiet=False):
        self.quiet = quiet
        self.count = 0
        self.failures = []

    def expect(self, condition, what):
        """Records `what` as held or failed and returns whether it held."""
        self.count += 1
        if not condition:
            self.failures.append(what)
            print("FAILED: " + what)
        elif not self.quiet:
            print("ok: " + what)
        return bool(condition)

    def finish(self):
        """Prints the tally and exits: 1 if any expectation failed (or none was checked: a test that checks
        nothing is a defect), else 0."""
        if self.count == 0:
            print("no expectation was checked")
            sys.exit(1)
        if self.failures:
            print("%d of %d expectations failed" % (len(self.failures), self.count))
            sys.exit(1)
        print("all %d expectations hold" % self.count)
        sys.exit(0)


def replace_once(path, old, new):
    """Replaces the first `old` in the file at `path` with `new`; `old` must be there (else the planted defect
    no longer matches the file it plants into, and the test must be updated, not pass vacuously)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert old in text, "%s: %r not found (the test's planted defect needs updating)" % (path, old)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new, 1))
