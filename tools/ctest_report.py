#!/usr/bin/env python3
"""Summarises one ctest pass for tools/test.sh: counts, test-seconds by label, the slowest tests.

  tools/ctest_report.py BUILD_DIR JUNIT_XML NAME [--counts FILE]

Reads ctest's JUnit file (--output-junit) and the labels from `ctest --show-only=json-v1`.
Prints the pass's lines and appends "NAME PASSED FAILED SKIPPED" to FILE (for the closing line).
A test that did not run (skipped by its exit code 77, or not run at all) is never a pass.
"""
import json
import subprocess
import sys
import xml.etree.ElementTree as ET


def main():
    build, junit, name = sys.argv[1:4]
    counts_file = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--counts" else None
    shown = json.loads(subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"],
                                      check=True, capture_output=True, text=True).stdout)
    labels = {}
    for t in shown.get("tests", []):
        for p in t.get("properties", []):
            if p.get("name") == "LABELS":
                labels[t["name"]] = p.get("value", [])
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    passed, failed, skipped = [], [], []
    seconds, total, times = {}, 0.0, []
    for case in cases:
        test, status = case.get("name"), case.get("status", "run")
        time = float(case.get("time", "0") or 0)
        if case.find("failure") is not None or case.find("error") is not None or status == "fail":
            failed.append(test)
        elif case.find("skipped") is not None or status in ("notrun", "disabled", "skipped"):
            skipped.append(test)
        else:
            passed.append(test)
        for label in labels.get(test) or ["(none)"]:
            seconds[label] = seconds.get(label, 0.0) + time
        total += time
        times.append((time, test))
    by_label = ", ".join(f"{k} {v:.0f}" for k, v in sorted(seconds.items(), key=lambda kv: -kv[1]))
    print(f"{name}: test-seconds by label (a test counts under each of its labels): {by_label}; "
          f"all {total:.0f}")
    times.sort(reverse=True)
    print(f"{name}: slowest: " + ", ".join(f"{n} {t:.0f}" for t, n in times[:10]))
    for test in skipped:
        print(f"{name}: SKIPPED {test}")
    for test in failed:
        print(f"{name}: FAILED {test}")
    if counts_file:
        with open(counts_file, "a") as f:
            f.write(f"{name} {len(passed)} {len(failed)} {len(skipped)}\n")


if __name__ == "__main__":
    main()
