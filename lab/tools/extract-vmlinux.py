#!/usr/bin/env python3
"""Write the uncompressed ELF kernel found inside a bzImage.

Usage: extract-vmlinux.py BZIMAGE VMLINUX

Debian's amd64 kernels are built with CONFIG_KERNEL_XZ: the bzImage carries the kernel as one xz
stream after the real-mode setup code. QEMU boots the extracted ELF directly through its PVH entry
point, which saves the in-guest decompression (several seconds under TCG).
"""
import lzma
import sys

XZ_MAGIC = b"\xfd7zXZ\x00"


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f:
        image = f.read()
    start = image.find(XZ_MAGIC)
    while start >= 0:
        try:
            elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(image[start:])
        except lzma.LZMAError:
            elf = b""
        if elf[:4] == b"\x7fELF":
            with open(dst, "wb") as f:
                f.write(elf)
            print(f"extract-vmlinux: {len(elf)} bytes from offset {start} of {src}")
            return 0
        start = image.find(XZ_MAGIC, start + 1)
    print(f"extract-vmlinux: no xz-compressed ELF in {src}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
