#!/usr/bin/env python3
"""Flags the SIMD kernels' loops that LLVM compiled badly, from the binary alone.

    python3 benches/profiles/loop_scan.py target/release/routeburn

For every function of `routeburn_model` compiled for AVX2 or AVX-512 (`::avx2`,
`::avx512`, `_avx2`, `_avx512`), it disassembles the function (objdump) and looks at each
loop (a backward jump, up to 600 instructions) that has vector multiply-adds in it:

- "stack": a vector register stored to and loaded from the same stack slot inside the
  loop, the sign of a sum kept in memory (its chain then waits on a store and a load
  every term);
- "call": a call inside a loop of up to 200 instructions, around which every vector register is stored and
  reloaded (a closure LLVM did not inline, say).

It reads no samples, so it needs no CPU of the kind: the AVX-512 kernels can be checked
on a machine without AVX-512. A flagged loop is a place to look, not a proof (a
spill outside the hot path costs nothing); a kernel's hot loops come from `perf annotate`.
Prints one line per flagged loop, and nothing for a clean binary.
"""

import bisect
import re
import subprocess
import sys

KERNEL = re.compile(r"routeburn_model::.*(::avx512|::avx2|_avx512|_avx2)$")
INSTRUCTION = re.compile(r"\s*([0-9a-f]+):\s+(.*)")
JUMP = re.compile(r"j\w+\s+([0-9a-f]+)")
STACK = re.compile(r"(-?0x[0-9a-f]+)?\(%rsp\)")
LONGEST_LOOP = 600
# Calls in longer loops are a row's or a block's own (a softmax per row, say), not a term's.
LONGEST_CALLING_LOOP = 200


def kernels(binary):
    """(start, end, name) of every SIMD kernel in `binary`."""
    listing = subprocess.run(
        ["nm", "-S", "-C", binary], capture_output=True, text=True, check=True
    ).stdout
    for line in listing.splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) == 4 and KERNEL.search(parts[3]):
            start, size = int(parts[0], 16), int(parts[1], 16)
            yield start, start + size, parts[3]


def instructions(binary, start, end):
    """[(address, text)] of the code in `start..end`."""
    text = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn",
         f"--start-address={start:#x}", f"--stop-address={end:#x}", binary],
        capture_output=True, text=True, check=True,
    ).stdout
    found = []
    for line in text.splitlines():
        m = INSTRUCTION.match(line)
        if m:
            found.append((int(m.group(1), 16), m.group(2)))
    return found


def stack_chains(body, register):
    """Stack slots a `register` vector is both stored to and loaded from in `body`."""
    stored, loaded = set(), set()
    for _, text in body:
        m = STACK.search(text)
        if not m or register not in text:
            continue
        slot = m.group(1) or "0"
        is_store = text.startswith("vmov") and text.rstrip().endswith("(%rsp)")
        (stored if is_store else loaded).add(slot)
    return sorted(stored & loaded)


def flagged_loops(code, register):
    """(first, last, instructions, multiply-adds, stack slots, calls) per flagged loop."""
    addresses = [a for a, _ in code]
    seen = set()
    for i, (address, text) in enumerate(code):
        m = JUMP.match(text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if not addresses[0] <= target < address or (target, address) in seen:
            continue
        body = code[bisect.bisect_left(addresses, target):i + 1]
        if len(body) > LONGEST_LOOP:
            continue
        fmas = sum(1 for _, t in body if "vfmadd" in t and register in t)
        if not fmas:
            continue
        slots = stack_chains(body, register)
        calls = [t.split("<")[-1].rstrip(">")[:70] for _, t in body if t.startswith("call")]
        if len(body) > LONGEST_CALLING_LOOP:
            calls = []
        if slots or calls:
            seen.add((target, address))
            yield target, address, len(body), fmas, slots, calls


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: loop_scan.py BINARY")
    binary = sys.argv[1]
    for start, end, name in kernels(binary):
        register = "zmm" if "512" in name else "ymm"
        for first, last, length, fmas, slots, calls in flagged_loops(
            instructions(binary, start, end), register
        ):
            what = []
            if slots:
                what.append(f"stack {len(slots)} slot(s)")
            if calls:
                what.append(f"call {calls[0]}")
            print(f"{name}  {first:#x}..{last:#x}  {length} instructions, "
                  f"{fmas} {register} multiply-adds: {'; '.join(what)}")


if __name__ == "__main__":
    main()
