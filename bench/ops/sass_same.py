#!/usr/bin/env python3
"""sass_same.py - whether a change left the library's kernels as they were,
without a GPU and without cuobjdump.

`dump OUT.json OBJ...` reads the device code nvcc embedded in each object
(or static library) - the .nv_fatbin section's cubins, which hold the SASS
uncompressed - and writes per kernel, by demangled name: its machine code
(the .text section's bytes, as a hash), its registers and stack, its
shared memory and its parameter bytes. `compare BEFORE.json AFTER.json
[--drop-args KERNEL=I,J ...] [--rename OLD=NEW ...]` matches the kernels by
name, the template arguments a change dropped (numbered from 0) taken out
of the names before it, and says which kernels
went, which came, and which kept their name but not their code. Equal
bytes are equal SASS instruction for instruction: a non-relocatable cubin
has its branches and calls resolved, so only the code can make them differ.
"""
import hashlib
import json
import re
import struct
import subprocess
import sys


def sections(elf):
    """(name, type, offset, size, link, info, entsize) of each section of an ELF64."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    raw = []
    for i in range(shnum):
        o = shoff + i * shentsize
        name, typ, _flags, _addr, off, size, link, info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", elf, o)
        raw.append((name, typ, off, size, link, info, entsize))
    strtab = raw[shstrndx]
    out = []
    for name, typ, off, size, link, info, entsize in raw:
        end = elf.index(b"\0", strtab[2] + name)
        out.append((elf[strtab[2] + name:end].decode(), typ, off, size, link, info, entsize))
    return out


def elf_size(elf, at):
    shoff, = struct.unpack_from("<Q", elf, at + 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, at + 0x3A)
    return shoff + shentsize * shnum


def cubins(obj):
    """The cubins in the .nv_fatbin sections of a host object (or in each
    member of an ar archive): every ELF the fatbin holds."""
    data = open(obj, "rb").read()
    hosts = []
    if data.startswith(b"!<arch>\n"):
        at = 8
        while at + 60 <= len(data):
            size = int(data[at + 48:at + 58].decode().strip())
            member = data[at + 60:at + 60 + size]
            if member.startswith(b"\x7fELF"):
                hosts.append(member)
            at += 60 + size + (size & 1)
    else:
        hosts.append(data)
    for host in hosts:
        for name, _t, off, size, *_ in sections(host):
            if name != ".nv_fatbin":
                continue
            fat = host[off:off + size]
            at = fat.find(b"\x7fELF")
            while at >= 0:
                end = at + elf_size(fat, at)
                yield fat[at:end]
                at = fat.find(b"\x7fELF", end)


def demangle(names):
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.split("\n")
    return dict(zip(names, out))


def info_attrs(blob):
    """(attribute, bytes) of a .nv.info section's entries."""
    at = 0
    while at + 2 <= len(blob):
        fmt, attr = blob[at], blob[at + 1]
        at += 2
        if fmt == 4:
            size, = struct.unpack_from("<H", blob, at)
            yield attr, blob[at + 2:at + 2 + size]
            at += 2 + size
        else:  # a value of 16 bits (none, a byte or a half word in it)
            yield attr, blob[at:at + 2]
            at += 2


# .nv.info attributes that name a symbol by its index in the symbol table,
# which moves when other kernels come or go: EIATTR_PARAM_CBANK's first word
SYMBOL_WORD = {0x0A}


def kernel_info(blob):
    """A kernel's .nv.info attributes (its parameters, launch bounds, exit
    offsets ...) as [attribute, hex], symbol indices left out."""
    out = []
    for attr, val in info_attrs(blob):
        if attr in SYMBOL_WORD and len(val) >= 4:
            val = val[4:]
        out.append([attr, val.hex()])
    return out


def kernels(cubin):
    """{mangled name: what decides its behaviour and speed} of one cubin."""
    secs = sections(cubin)
    symtab = next(s for s in secs if s[1] == 2)
    strtab = secs[symtab[4]]
    syms = []
    for i in range(symtab[3] // 24):
        name, _info, _other, _shndx, _value, _size = struct.unpack_from(
            "<IBBHQQ", cubin, symtab[2] + i * 24)
        end = cubin.index(b"\0", strtab[2] + name)
        syms.append(cubin[strtab[2] + name:end].decode())
    out = {}
    by_name = {s[0]: s for s in secs}
    for name, _t, off, size, *_ in secs:
        if not name.startswith(".text."):
            continue
        k = name[len(".text."):]
        info = by_name.get(".nv.info." + k)
        shared = by_name.get(".nv.shared." + k)
        const0 = by_name.get(".nv.constant0." + k)
        out[k] = {
            "text": hashlib.sha256(cubin[off:off + size]).hexdigest(),
            "bytes": size,
            "info": kernel_info(cubin[info[2]:info[2] + info[3]]) if info else [],
            "shared": shared[3] if shared else 0,
            "params": const0[3] if const0 else 0,
        }
    # the registers, stack and frame a kernel takes: in .nv.info, by symbol
    for name, _t, off, size, *_ in secs:
        if name != ".nv.info":
            continue
        for attr, val in info_attrs(cubin[off:off + size]):
            if len(val) == 8 and attr in (0x2F, 0x23, 0x12, 0x11):
                sym, v = struct.unpack("<II", val)
                if syms[sym] in out:
                    key = {0x2F: "regs", 0x23: "max_stack", 0x12: "min_stack", 0x11: "frame"}[attr]
                    out[syms[sym]][key] = v
    return out


def dump(path, objs):
    found = {}
    for obj in objs:
        for cubin in cubins(obj):
            arch = struct.unpack_from("<I", cubin, 0x30)[0] & 0xFF
            for k, v in kernels(cubin).items():
                v["arch"] = arch
                found[k] = v
    names = demangle(sorted(found))
    out = {names[k]: v for k, v in found.items()}
    json.dump(out, open(path, "w"), indent=0, sort_keys=True)
    print(f"{len(out)} kernels in {len(objs)} objects -> {path}")


def split_args(s):
    """The top-level template arguments of the first <...> in s."""
    depth, cur, args, start = 0, "", [], None
    for i, c in enumerate(s):
        if c == "<":
            depth += 1
            if depth == 1:
                start = i
                continue
        elif c == ">":
            depth -= 1
            if depth == 0:
                args.append(cur.strip())
                return s[:start], args, s[i + 1:]
        if depth == 1 and c == ",":
            args.append(cur.strip())
            cur = ""
        elif depth >= 1:
            cur += c
    return s, None, ""


def normalize(name, drops, renames):
    for old, new in renames:
        name = name.replace(old, new)
    for kernel, positions in drops.items():
        if re.search(r"\b" + re.escape(kernel) + "<", name):
            head, args, tail = split_args(name[name.index(kernel + "<"):])
            if args is None:
                continue
            kept = [a for i, a in enumerate(args) if i not in positions]
            prefix = name[:name.index(kernel + "<")]
            name = prefix + head + "<" + ", ".join(kept) + ">" + tail
    return name


def compare(before, after, drops, renames):
    b = json.load(open(before))
    a = json.load(open(after))
    bn = {}
    for k, v in b.items():
        bn.setdefault(normalize(k, drops, renames), []).append((k, v))
    an = {}
    for k, v in a.items():  # the template arguments dropped are the before names'
        an.setdefault(normalize(k, {}, renames), []).append((k, v))
    gone = sorted(set(bn) - set(an))
    came = sorted(set(an) - set(bn))
    changed = []
    for k in sorted(set(bn) & set(an)):
        if len(bn[k]) != 1 or len(an[k]) != 1:
            changed.append(k + " (several kernels under one name)")
            continue
        vb, va = bn[k][0][1], an[k][0][1]
        diff = [f for f in sorted(set(vb) | set(va)) if vb.get(f) != va.get(f)]
        if diff:
            changed.append(k + " (" + ", ".join(diff) + ")")
    print(f"before {len(b)} kernels, after {len(a)}: {len(set(bn) & set(an))} kept, "
          f"{len(gone)} gone, {len(came)} new, {len(changed)} kept but not the same")
    for title, names in (("gone", gone), ("new", came), ("not the same", changed)):
        for k in names:
            print(f"{title}: {k}")
    return 1 if came or changed else 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "dump":
        dump(argv[2], argv[3:])
        return 0
    if len(argv) >= 4 and argv[1] == "compare":
        drops, renames = {}, []
        rest = argv[4:]
        while rest:
            opt, val = rest[0], rest[1]
            rest = rest[2:]
            if opt == "--drop-args":  # kernel=2,5,6: its template arguments so numbered, from 0
                kernel, pos = val.split("=")
                drops[kernel] = {int(x) for x in pos.split(",")}
            elif opt == "--rename":
                old, new = val.split("=", 1)
                renames.append((old, new))
        return compare(argv[2], argv[3], drops, renames)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
