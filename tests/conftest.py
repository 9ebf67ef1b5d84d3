"""Top-level test hooks: the skips inside sub-suites (pytest files run under mpiexec, torch's backend suite)
are listed in a "sub-suite skips" section of the run's summary, with their reasons, so a sub-suite that is
green only because its tests skipped is seen."""
from __future__ import annotations

import pytest

import mpirun


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    # what the test recorded (mpirun.record_sub_suite) goes on its reports as a user property
    # (serialised with the report, so it also reaches the summary from xdist workers and junit XML)
    while mpirun._pending:
        item.user_properties.append((mpirun.SUB_SUITE_PROPERTY, mpirun._pending.pop(0)))


def pytest_terminal_summary(terminalreporter):
    found = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            for name, value in getattr(rep, "user_properties", None) or ():
                if name == mpirun.SUB_SUITE_PROPERTY:
                    found[(rep.nodeid, value["suite"])] = value
    if not found:
        return
    with_skips = {k: v for k, v in found.items() if v["skipped"]}
    tr = terminalreporter
    total = sum(v["skipped"] for v in with_skips.values())
    tr.write_sep("=", f"sub-suite skips: {total} in {len(with_skips)} of {len(found)} sub-suites" if total
                 else f"sub-suite skips: none in {len(found)} sub-suite{'s' if len(found) > 1 else ''}")
    for (nodeid, suite), v in sorted(with_skips.items()):
        tr.write_line(f"{nodeid} [{suite}]: {v['passed']} passed, {v['skipped']} skipped")
        for n, where, reason in v["skips"]:
            tr.write_line(f"  SKIPPED [{n}] {where + ': ' if where else ''}{reason}")
