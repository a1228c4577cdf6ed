"""Report on the hot loop of SIMT (FFMA) kernels in a SASS listing, without a GPU.

    cuobjdump -sass lib.so > all.sass       # or a cubin; cuobjdump needs nvdisasm on PATH
    python tools/sass_hot_loop.py all.sass 'SimtPolicyILi128ELi128ELi16ELi0ELi3ELi8EEEffLb1ELb0ELb1E' [...]

For every function whose name matches a regex, the hot loop is the backward branch's body
with the densest FFMAs (at least 256). Printed per loop:
- its instruction mix;
- "rotated": FFMAs whose destination is not their accumulator source (ptxas renaming
  accumulators costs registers, and it then sinks the fragment loads);
- how many instructions lie between each LDS and the first use of what it loaded;
- register-bank conflicts under the model that fits our kernels and cuBLAS's SGEMM on the
  H200 (ffi_src/gemm/simt_outer_product.cuh; docs/kernels.md, section 4): two banks (even /
  odd register number), one read per bank per cycle, and an operand reuse cache of one
  register per operand slot and bank, filled by `.reuse` and consumed by the next read of
  that register in that slot.
"""
import argparse
import collections
import re

INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);")
REGISTER = re.compile(r"\b(R\d+|RZ)(\.reuse)?")


def functions(path: str, pattern: str) -> dict[str, list[tuple[int, str]]]:
    found, name = {}, None
    with open(path) as listing:
        for line in listing:
            header = re.search(r"Function : (\S+)", line)
            if header:
                name = header.group(1) if re.search(pattern, header.group(1)) else None
                if name:
                    found[name] = []
                continue
            m = INSTRUCTION.match(line)
            if m and name:
                found[name].append((int(m.group(1), 16), m.group(2).strip()))
    return found


def unpredicated(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text)


def opcode(text: str) -> str:
    return unpredicated(text).split()[0]


def hot_loop(code: list[tuple[int, str]]) -> list[str]:
    best, best_density = [], 0.0
    for address, text in code:
        target = re.search(r"BRA\s+(?:\S+,\s*)?(0x[0-9a-f]+)", text)
        if not target or int(target.group(1), 16) >= address:
            continue
        body = [t for a, t in code if int(target.group(1), 16) <= a <= address]
        ffma = sum(opcode(t) == "FFMA" for t in body)
        if ffma >= 256 and ffma / len(body) > best_density:
            best, best_density = body, ffma / len(body)
    return best


def bank_conflicts(body: list[str]) -> tuple[int, int]:
    """(conflicting FFMAs, source registers read from the file) under the model above."""
    cache = [{}, {}, {}]  # per operand slot: bank -> cached register
    conflicts = reads = 0
    for text in body:
        if opcode(text) != "FFMA":
            continue
        banks = []
        for slot, (reg, reuse) in enumerate(REGISTER.findall(text)[1:4]):
            if reg == "RZ":
                continue
            bank = int(reg[1:]) % 2
            if cache[slot].get(bank) != reg:
                banks.append(bank)
            if reuse:
                cache[slot][bank] = reg
            elif cache[slot].get(bank) == reg:
                del cache[slot][bank]
        reads += len(banks)
        conflicts += len(banks) > len(set(banks))
    return conflicts, reads


def load_to_use(body: list[str]) -> list[int]:
    distances = []
    for i, text in enumerate(body):
        m = re.match(r"LDS\S*\s+R(\d+)", unpredicated(text))
        if not m:
            continue
        width = 4 if ".128" in text else 2 if ".64" in text else 1
        loaded = {f"R{int(m.group(1)) + j}" for j in range(width)}
        for d, later in enumerate(body[i + 1:], 1):
            sources = [r for r, _ in REGISTER.findall(later.split(None, 1)[-1])][1:]
            if loaded & set(sources):
                distances.append(d)
                break
    return sorted(distances)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sass")
    parser.add_argument("patterns", nargs="+", help="regexes on the (mangled) function name")
    args = parser.parse_args()
    for pattern in args.patterns:
        for name, code in functions(args.sass, pattern).items():
            body = hot_loop(code)
            if not body:
                print(f"== {name}: no FFMA loop")
                continue
            mix = collections.Counter(opcode(t) for t in body)
            ffma = mix["FFMA"]
            operands = [[r for r, _ in REGISTER.findall(t)] for t in body if opcode(t) == "FFMA"]
            rotated = sum(regs[0] != regs[3] for regs in operands)
            reuse = sum(t.count(".reuse") for t in body if opcode(t) == "FFMA")
            conflicts, reads = bank_conflicts(body)
            distances = load_to_use(body)
            print(f"== {name}")
            print(f"  {len(body)} instructions, {ffma} FFMA ({ffma / len(body):.1%}); " +
                  ", ".join(f"{k} {v}" for k, v in mix.most_common(8) if k != "FFMA"))
            print(f"  per FFMA: bank conflicts {conflicts / ffma:.3f}, register-file reads {reads / ffma:.2f}, "
                  f".reuse flags {reuse / ffma:.2f}; rotated accumulators {rotated}")
            if distances:
                print(f"  LDS -> first use, instructions: min {distances[0]}, median {distances[len(distances) // 2]}")


if __name__ == "__main__":
    main()
