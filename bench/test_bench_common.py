#!/usr/bin/env python3
"""test_bench_common.py - bench_common.rerun_with_switch, on small scripts
of its own (no GPU): the switch reaches the second process with its value,
the arguments come in order with the output file last, what that process
wrote comes back; a library that says it ignores the switch gives None,
and a run that fails raises.
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_common  # noqa: E402

# What the second process runs: its argv[1] names what to do.
SCRIPT = '''
import json, os, sys
what = sys.argv[1]
if what == "write":
    with open(sys.argv[-1], "w") as f:
        json.dump({"switch": os.environ.get("WEFT_TEST_SWITCH"), "args": sys.argv[1:-1]}, f)
elif what == "ignored":
    sys.stderr.write("weft: WEFT_TEST_SWITCH is read by benchmark builds only: ignored\\n")
    with open(sys.argv[-1], "w") as f:
        json.dump([1.0], f)
else:
    sys.exit(3)
'''


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "second.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        got = bench_common.rerun_with_switch(script, "WEFT_TEST_SWITCH", "1",
                                             ["write", "--lib", "x.so", "--rates"])
        want = {"switch": "1", "args": ["write", "--lib", "x.so", "--rates"]}
        if got != want:
            failures.append("written: %r, wanted %r" % (got, want))
        got = bench_common.rerun_with_switch(script, "WEFT_TEST_SWITCH", "0", ["ignored"])
        if got is not None:
            failures.append("a library that ignores the switch gave %r, not None" % (got,))
        try:
            bench_common.rerun_with_switch(script, "WEFT_TEST_SWITCH", "0", ["fail"])
            failures.append("a failed run raised nothing")
        except RuntimeError as e:
            if "WEFT_TEST_SWITCH=0" not in str(e):
                failures.append("the failure names no switch: %s" % e)
    for f in failures:
        print("test_bench_common: " + f, file=sys.stderr)
    if failures:
        sys.exit(1)
    print("test_bench_common: rerun_with_switch passes its switch, arguments and output")


if __name__ == "__main__":
    main()
