"""A pytest plugin that writes the legacy pytest-json-ctrf 0.3.x report shape.

Our own re-implementation of the documented behaviour (docs/rewards.md, "Legacy"), used
to generate legacy-shape reports in tests without installing the old plugin; a test
checks it against a real 0.3.7 report (legacy_pytest_json_ctrf_0.3.7.json).

    python -m pytest -p legacy_ctrf_emitter --legacy-ctrf report.json tests/
"""

from __future__ import annotations

import json
import time

STICKY = ("skipped", "failed")


def pytest_addoption(parser):
    parser.addoption("--legacy-ctrf", action="store", default=None,
                     help="write a legacy (pytest-json-ctrf 0.3.x) CTRF report here")


class _Item:
    def __init__(self, report):
        self.name = report.nodeid.split("[")[0]
        self.status = "pending"
        self.raw_status = None
        self.duration = 0.0  # float milliseconds, summed over setup/call/teardown
        self.start = 0.0  # float epoch seconds
        self.stop = 0.0
        self.file_path = report.location[0]

    def update(self, report):
        if self.status not in STICKY:
            if report.skipped:
                self.status = "skipped"
            elif report.failed:
                self.status = "failed"
                self.raw_status = f"{report.when}_{report.outcome}"
            elif report.passed:
                self.status = "passed"
            else:
                self.status = "other"
        self.duration += 1000.0 * report.duration
        if report.when == "setup" and not self.start:
            self.start = report.start
        if report.when == "teardown" and not self.stop:
            self.stop = report.stop


class LegacyReport:
    def __init__(self, path):
        self.path = path
        self.items: dict[str, _Item] = {}
        self.start = int(time.time() * 1000)

    def pytest_runtest_logreport(self, report):
        item = self.items.setdefault(report.nodeid, _Item(report))
        item.update(report)

    def pytest_sessionfinish(self, session):
        collapsed: dict[str, tuple[_Item, int]] = {}
        for item in self.items.values():
            if item.name in collapsed:
                first, retries = collapsed[item.name]
                if first.status in ("pending", "passed"):  # a non-passed case wins
                    first.status, first.raw_status = item.status, item.raw_status
                collapsed[item.name] = (first, retries + 1)
            else:
                collapsed[item.name] = (item, 0)
        tests = []
        for item, retries in collapsed.values():
            entry = {"name": item.name, "status": item.status, "raw_status": item.raw_status,
                     "duration": item.duration, "start": item.start, "stop": item.stop,
                     "retries": None if retries == 1 else retries,  # 0.3.x drops retries == 1
                     "file_path": item.file_path}
            tests.append({k: v for k, v in entry.items() if v not in (None, "", [])})
        stop = int(time.time() * 1000)
        summary = {"tests": len(tests),
                   **{k: sum(t["status"] == k for t in tests)
                      for k in ("passed", "failed", "skipped", "pending")},
                   "other": 0, "start": self.start, "stop": stop}
        report = {"results": {"tool": {"name": "pytest"}, "summary": summary,
                              "environment": {"buildName": "legacy emitter"}, "tests": tests}}
        with open(self.path, "w") as f:
            json.dump(report, f, indent=4)


def pytest_configure(config):
    path = config.getoption("--legacy-ctrf")
    if path:
        config.pluginmanager.register(LegacyReport(path), "legacy_ctrf_report")
