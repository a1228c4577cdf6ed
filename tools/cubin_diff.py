"""Whether two builds' kernels are the same machine code, kernel by kernel, without a GPU:
for a restructuring that should not change what runs (an A/B whose rows move by the
power-capped H100's +-3 % noise proves little; identical instructions prove it).
    python3 tools/cubin_diff.py A.so|A.cubin B.so|B.cubin [--match SUBSTRING] [--all]
Reads every sm_90a cubin of a jaxgemm extension (its fatbins; zstd-compressed entries need
the `zstandard` package) or a cubin (tools: `nvcc -cubin`), and pairs kernels by name
and template arguments (parameter types may differ; c++filt demangles, else the mangled
name pairs). Each pair is `same` (every instruction word equal), `renamed` (the same opcode at
every position: only registers, constant offsets or branch targets differ), `reordered`
(the same opcodes scheduled otherwise) or `differs` (the code changed); then the kernels
only one build has. (Opcodes: a 16-byte Hopper instruction's first two bytes.)"""

import argparse
import collections
import re
import shutil
import struct
import subprocess

FATBIN_MAGIC = b"\x50\xed\x55\xba"
ELF_MAGIC = b"\x7fELF\x02\x01\x01"
EM_CUDA = 190  # e_machine of a cubin (a host .so is EM_X86_64)
COMPRESSED = 0x8000  # a fatbin entry's flag: its payload is compressed


def _fatbin_cubins(data: bytes):
    """The ELF payloads of every fatbin in data, compressed ones inflated."""
    for m in re.finditer(re.escape(FATBIN_MAGIC), data):
        o = m.start()
        _, version, header, size = struct.unpack_from("<IHHQ", data, o)
        if version != 1 or header != 16:
            continue
        p, end = o + header, o + header + size
        while p < end:
            kind, _, entry_header, payload_size = struct.unpack_from("<HHIQ", data, p)
            flags, = struct.unpack_from("<Q", data, p + 0x28)
            payload = data[p + entry_header:p + entry_header + payload_size]
            if kind == 2 and flags & COMPRESSED:
                import zstandard  # (CUDA 12.8+ compresses with zstd)

                packed, = struct.unpack_from("<Q", data, p + 0x10)
                plain, = struct.unpack_from("<Q", data, p + 0x48)
                payload = zstandard.ZstdDecompressor().decompress(payload[:packed], max_output_size=plain)
            if kind == 2 and payload.startswith(ELF_MAGIC):
                yield payload
            p += entry_header + payload_size


def _texts(elf: bytes):
    """(kernel name, its .text bytes) of one cubin."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shnum, shstrndx = struct.unpack_from("<HH", elf, 0x3C)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + 64 * i) for i in range(shnum)]
    names = sections[shstrndx][4]
    for name, _, _, _, offset, size, *_ in sections:
        title = elf[names + name:elf.index(b"\0", names + name)].decode()
        if title.startswith(".text."):
            yield title[len(".text."):], elf[offset:offset + size]


def _arch(elf: bytes) -> int:
    """A cubin's SM version (90 for sm_90 and sm_90a): its ELF flags' second byte."""
    flags, = struct.unpack_from("<I", elf, 0x30)
    return (flags >> 8) & 0xFF


def kernels(path: str) -> dict[str, bytes]:
    """Every kernel's code in a cubin or an extension: the newest SM's build of each (the
    longest there, not a stub that guards a Hopper-only kernel)."""
    data = open(path, "rb").read()
    cubin = data.startswith(ELF_MAGIC) and struct.unpack_from("<H", data, 0x12)[0] == EM_CUDA
    cubins = [data] if cubin else _fatbin_cubins(data)
    best = {}
    for elf in cubins:
        arch = _arch(elf)
        for name, text in _texts(elf):
            if (arch, len(text)) > best.get(name, (-1, -1))[:2]:
                best[name] = (arch, len(text), text)
    return {name: text for name, (_, _, text) in best.items()}


def by_template(code: dict[str, bytes]) -> dict[str, bytes]:
    """The kernels keyed by their demangled name without the parameter list (c++filt), so
    that a kernel whose parameter types changed (not its template arguments) still pairs."""
    names = list(code)
    demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return {d[: d.find(">(") + 1] if ">(" in d else d: code[n] for n, d in zip(names, demangled)}


def compare(a: bytes, b: bytes) -> str:
    """same; renamed (each instruction's opcode bytes equal, operands apart: other
    registers, constant offsets, branch targets); reordered (the same opcodes in another
    order: another schedule); differs."""
    if a == b:
        return "same"
    if len(a) != len(b):
        return "differs"
    ops_a = [a[i:i + 2] for i in range(0, len(a), 16)]
    ops_b = [b[i:i + 2] for i in range(0, len(b), 16)]
    if ops_a == ops_b:
        return "renamed"
    return "reordered" if sorted(ops_a) == sorted(ops_b) else "differs"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--match", default="", help="only kernels whose name contains this")
    parser.add_argument("--all", action="store_true", help="list every pair, not only those that differ")
    args = parser.parse_args()
    a, b = kernels(args.a), kernels(args.b)
    if shutil.which("c++filt"):
        a, b = by_template(a), by_template(b)
    common = sorted(k for k in set(a) & set(b) if args.match in k)
    verdicts = {k: compare(a[k], b[k]) for k in common}
    for k in common:
        if args.all or verdicts[k] != "same":
            print(f"{verdicts[k]:8s} {len(a[k]) // 16:6d} {len(b[k]) // 16:6d}  {k}")
    print(dict(collections.Counter(verdicts.values())), f"of {len(common)} kernels in both;",
          f"{len([k for k in a if args.match in k and k not in b])} only in A,",
          f"{len([k for k in b if args.match in k and k not in a])} only in B")


if __name__ == "__main__":
    main()
