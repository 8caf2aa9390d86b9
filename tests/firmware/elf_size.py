#!/usr/bin/env python3
"""Flash and static RAM use of a 32-bit little-endian ELF, from its section headers.

Flash is every allocated section with contents (vector table, code, read-only data, and the
initial values of .data, which are copied from flash at boot). Static RAM is every allocated,
writable section (.data, .bss, .uninit). Prints `flash=N ram=N` and one line per section; needs
nothing but Python, so no binutils for ARM are required.
"""

import struct
import sys

SHF_WRITE, SHF_ALLOC = 0x1, 0x2
SHT_NOBITS = 8


def sections(path):
    with open(path, "rb") as elf:
        data = elf.read()
    if data[:4] != b"\x7fELF" or data[4] != 1 or data[5] != 1:
        raise SystemExit(f"{path}: not a 32-bit little-endian ELF")
    shoff, = struct.unpack_from("<I", data, 0x20)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x2E)
    headers = [struct.unpack_from("<IIIIIIIIII", data, shoff + i * shentsize) for i in range(shnum)]
    names_offset = headers[shstrndx][4]
    for name_index, kind, flags, _addr, _offset, size, *_ in headers:
        end = data.index(b"\0", names_offset + name_index)
        yield data[names_offset + name_index : end].decode(), kind, flags, size


def main():
    flash = ram = 0
    for name, kind, flags, size in sections(sys.argv[1]):
        if not flags & SHF_ALLOC or size == 0:
            continue
        in_flash = kind != SHT_NOBITS
        in_ram = bool(flags & SHF_WRITE)
        flash += size if in_flash else 0
        ram += size if in_ram else 0
        where = "+".join(w for w, on in (("flash", in_flash), ("ram", in_ram)) if on)
        print(f"  {name:<16} {size:>8}  {where}")
    print(f"flash={flash} ram={ram}")


if __name__ == "__main__":
    main()
