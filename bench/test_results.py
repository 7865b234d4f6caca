#!/usr/bin/env python3
"""test_results.py - results.py catches a record that drifted from its rows.

On copies of the committed rows and record: the copies pass the check; a
figure edited in the record, a row whose target's verdict disagrees with
its value, a row without a commit, a row with a key no reader knows, and a
line that is not JSON each make the check fail, naming the fault.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "results.py")


def check(rows, record):
    run = subprocess.run([sys.executable, SCRIPT, "check", "--rows", rows, "--record", record],
                         capture_output=True, text=True)
    return run.returncode, run.stdout + run.stderr


def main():
    with open(os.path.join(HERE, "results.jsonl"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    with open(os.path.join(HERE, "RESULTS.md"), encoding="utf-8") as f:
        record = f.read()
    tmp = tempfile.mkdtemp()
    rows_path, record_path = os.path.join(tmp, "rows.jsonl"), os.path.join(tmp, "RESULTS.md")

    def write(rows_lines, text):
        with open(rows_path, "w", encoding="utf-8") as f:
            f.write("\n".join(rows_lines) + "\n")
        with open(record_path, "w", encoding="utf-8") as f:
            f.write(text)

    failures = []
    write(lines, record)
    rc, out = check(rows_path, record_path)
    if rc != 0:
        failures.append("the committed rows and record fail the check:\n" + out)

    # the record edited by hand: a figure of the first table changed
    first = next(l for l in record.splitlines() if l.startswith("| ") and " ns " in l)
    write(lines, record.replace(first, first.replace(" ns ", " us ", 1), 1))
    cases = [("a hand-edited record", "is not what its rows generate")]
    rc, out = check(rows_path, record_path)
    if rc == 0 or cases[0][1] not in out:
        failures.append("%s passed the check: %s" % cases[0])

    def bad_row(change, what, says):
        row = json.loads(next(l for l in lines if '"targets"' in l))
        change(row)
        write(lines + [json.dumps(row, ensure_ascii=False)], record)
        rc, out = check(rows_path, record_path)
        if rc == 0 or says not in out:
            failures.append("%s passed the check (want %r): %s" % (what, says, out))

    def flip(row):
        row["targets"][0]["met"] = not row["targets"][0]["met"]

    bad_row(flip, "a target whose verdict disagrees with its value", "says otherwise")
    bad_row(lambda r: r.pop("commit"), "a row without a commit", "no commit")
    bad_row(lambda r: r.update(colour="red"), "a row with an unknown key", "unknown key")
    bad_row(lambda r: r.update(date="yesterday"), "a row with a free-form date", "is not YYYY")
    write(lines + ["{not json"], record)
    rc, out = check(rows_path, record_path)
    if rc == 0 or "not JSON" not in out:
        failures.append("a line that is not JSON passed the check: " + out)

    for f in failures:
        print("test_results: " + f, file=sys.stderr)
    if not failures:
        print("test_results: the record matches its rows; 6 kinds of drift caught")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
