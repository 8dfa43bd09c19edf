"""The count a Python test worker keeps, in the form tests/test_torch.sh reads: check(ok, what)
counts a case and prints a failure naming this rank (HOOP_RANK, which hooprun sets); finish()
prints "LABEL: N cases, F failed" and gives the exit status."""

import os


class Tally:
    def __init__(self, label):
        self.label, self.cases, self.failed = label, 0, 0

    def check(self, ok, what):
        self.cases += 1
        if not ok:
            self.failed += 1
            print("%s rank %s: FAIL %s" % (self.label, os.environ.get("HOOP_RANK", "?"), what),
                  flush=True)
        return ok

    def finish(self):
        print("%s: %d cases, %d failed" % (self.label, self.cases, self.failed), flush=True)
        return 1 if self.failed else 0
