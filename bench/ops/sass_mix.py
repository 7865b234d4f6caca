#!/usr/bin/env python3
"""The instruction mix of kernels, from their SASS.

    cuobjdump -sass build-release/bench/ops/libweft_ops_bench.so > ops.sass
    bench/ops/sass_mix.py ops.sass 'norm_held_kernel<__nv_bfloat16, 8' 'true'

prints, for each kernel whose demangled name contains every given string,
how many instructions its code holds and how many of each opcode (NOPs left
out), most first. These are the instructions in the kernel, not those it
executes: a loop counts once, a path never taken counts in full. So it
compares two forms of one kernel (a variant against the library's), and
says where a kernel's instructions go, not how many an element it issues
(Nsight Compute's instruction statistics say that).

cuobjdump is only on a machine with the CUDA toolkit's binary utilities;
the script itself needs Python and c++filt.
"""
import collections
import re
import subprocess
import sys

# "        /*0a30*/   @!P0 LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;"
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*)")


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout
    return out.split("\n")[:len(names)]


def kernels(sass):
    """(mangled name, its lines) for each function of a cuobjdump -sass listing."""
    parts = re.split(r"\n\s*Function : ", sass)
    for part in parts[1:]:
        name, _, body = part.partition("\n")
        yield name.strip(), body


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    with open(argv[1], encoding="utf-8", errors="replace") as f:
        found = list(kernels(f.read()))
    names = demangle([name for name, _ in found])
    shown = 0
    for (_, body), name in zip(found, names):
        if not all(want in name for want in argv[2:]):
            continue
        mix = collections.Counter(m.group(1) for m in map(INSTRUCTION.match, body.split("\n"))
                                  if m and m.group(1) != "NOP")
        print(name)
        print("  %d instructions: %s" % (sum(mix.values()),
                                         " ".join("%s %d" % kv for kv in mix.most_common())))
        shown += 1
    if not shown:
        print("sass_mix: no kernel in %s has all of %s" % (argv[1], argv[2:]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
