"""Condense a run_torch_suite.py -v log to one 'test_name: status' line per test, then the totals.

The ranks' own output interleaves with unittest's status, so a test's status is the first 'ok',
'skipped ...', 'FAIL' or 'ERROR' that unittest printed after the test's name line and before the next
test's (at a line end); tests whose status cannot be recovered are listed as 'status not recovered'.

    python tests/torch_suite/condense.py raw.log > condensed.txt
"""
from __future__ import annotations

import re
import sys

NAME = re.compile(r"^(test_\w+) \(__main__\.\w+\.\w+\) \.\.\. ?(.*)$")
STATUS = re.compile(r"(?:^|\s)(ok|skipped '.*'|skipped \".*\"|FAIL|ERROR|expected failure)\s*$")


def condense(lines):
    out, name, status = [], None, None
    for line in lines:
        m = NAME.match(line)
        if m:
            if name:
                out.append(f"{name}: {status or 'status not recovered'}")
            name, status = m.group(1), None
            line = m.group(2)
        if name and status is None:
            s = STATUS.search(line)
            if s:
                status = s.group(1)
    if name:
        out.append(f"{name}: {status or 'status not recovered'}")
    return out


if __name__ == "__main__":
    text = open(sys.argv[1], errors="replace").read().splitlines()
    rows = condense(text)
    print("\n".join(rows))
    print()
    print("\n".join(ln for ln in text if ln.startswith(("Ran ", "OK", "FAILED"))))
