#!/usr/bin/env python3
"""The test runner behind `make test`.

For each build directory given, it runs every C test program in BUILD/tests
(counting their PASS/FAIL/SKIP lines) and the Python suite in tests/py with
SPARK_BIN=BUILD/spark (counted from pytest's JUnit XML). A sanitizer report
anywhere fails the program that printed it. The last line is the total:
"N passed, N failed, N skipped".
"""
import argparse
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


def sanitizer_env():
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:exitcode=86"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=86"
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def run_c_tests(build, counts, only):
    for prog in sorted((ROOT / build / "tests").glob("test_*")):
        if only and only not in prog.name:
            continue
        if not os.access(prog, os.X_OK) or prog.suffix == ".d":
            continue
        proc = subprocess.run([str(prog)], cwd=ROOT, env=sanitizer_env(),
                              capture_output=True, text=True, timeout=1200)
        out = proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        seen = 0
        for line in lines:
            for word, key in (("PASS ", "passed"), ("FAIL ", "failed"), ("SKIP ", "skipped")):
                if line.startswith(word):
                    counts[key] += 1
                    seen += 1
                    tag = f"[{build}] {prog.name}: {line}"
                    if key != "passed":
                        print(tag)
        bad_sanitizer = any(m in out for m in SANITIZER_MARKS)
        if proc.returncode != 0 or bad_sanitizer or seen == 0:
            counts["failed"] += 1
            print(f"[{build}] {prog.name}: FAIL (exit {proc.returncode})")
            print(out[-4000:])
        else:
            print(f"[{build}] {prog.name}: ok ({seen} checks)")


def run_py_tests(build, counts, only):
    xml = ROOT / build / "pytest.xml"
    env = sanitizer_env()
    env["SPARK_BIN"] = str(ROOT / build / "spark")
    env["SPARK_BUILD"] = str(ROOT / build)
    env["PYTHONPATH"] = str(ROOT / "tools") + os.pathsep + str(ROOT / "tests" / "py")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs",
           f"--junitxml={xml}", str(ROOT / "tests" / "py")]
    if only:
        cmd += ["-k", only]
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    if not xml.exists():
        counts["failed"] += 1
        print(f"[{build}] pytest produced no report (exit {proc.returncode})")
        return
    root = ET.parse(xml).getroot()
    for suite in root.iter("testsuite"):
        total = int(suite.get("tests", 0))
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped = int(suite.get("skipped", 0))
        counts["passed"] += total - failed - skipped
        counts["failed"] += failed
        counts["skipped"] += skipped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="append", required=True)
    ap.add_argument("-k", dest="only", default=None, help="only tests whose name has this")
    ap.add_argument("--no-py", action="store_true")
    args = ap.parse_args()
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for build in args.build:
        print(f"== {build}: C tests")
        run_c_tests(build, counts, args.only)
        if not args.no_py:
            print(f"== {build}: Python tests")
            run_py_tests(build, counts, args.only)
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
