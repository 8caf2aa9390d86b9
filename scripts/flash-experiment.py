#!/usr/bin/env python3
"""Quick flash-write experiment behind the log's padding / preallocation / commit-window choices.

Run as root: makes a 512 MiB ext4 image, loop-mounts it, and for each variant appends commits of a
given payload size with one fdatasync each, reading the loop device's sectors-written counter
before and after. Prints device bytes per payload byte (write amplification) and fdatasync latency.
Variants: plain append; tail padded to 4 KiB; fallocate'd file; recycled (already written) file.
Results are recorded in docs/log-format.md ("Measured choices").
"""
import os, subprocess, sys, tempfile, time

COMMITS = 1500
SIZES = [512, 2048, 6144, 16384, 65536]
SEGMENT = 64 << 20


def sectors(dev):
    with open(f"/sys/block/{dev}/stat") as f:
        return int(f.read().split()[6])


def run_variant(mnt, dev, payload, pad, prealloc, recycle):
    path = os.path.join(mnt, "seg.log")
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    if prealloc:
        os.posix_fallocate(fd, 0, SEGMENT)
    if recycle:
        chunk = b"\xa5" * (1 << 20)
        for i in range(SEGMENT // len(chunk)):
            os.write(fd, chunk)
    os.fsync(fd)
    dfd = os.open(mnt, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    os.sync()
    time.sleep(0.2)
    before = sectors(dev)
    pos = 0
    data = b"x" * payload
    lat = []
    for _ in range(COMMITS):
        os.pwrite(fd, data, pos)
        pos += payload
        if pad:
            pos = (pos + 4095) // 4096 * 4096
        t = time.perf_counter()
        os.fdatasync(fd)
        lat.append(time.perf_counter() - t)
    os.sync()
    time.sleep(0.2)
    device = (sectors(dev) - before) * 512
    os.close(fd)
    os.unlink(path)
    lat.sort()
    return device / (payload * COMMITS), lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3


def main():
    work = tempfile.mkdtemp(prefix="tern-flash-")
    img, mnt = os.path.join(work, "img"), os.path.join(work, "mnt")
    os.mkdir(mnt)
    subprocess.run(["truncate", "-s", "512M", img], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", img], check=True)
    loop = subprocess.run(["losetup", "-f", "--show", img], check=True, capture_output=True, text=True).stdout.strip()
    dev = os.path.basename(loop)
    try:
        subprocess.run(["mount", "-o", "noatime", loop, mnt], check=True)
        print("payload_per_commit variant write_amplification fdatasync_p50_ms fdatasync_p99_ms")
        for size in SIZES:
            for name, pad, pre, rec in [
                ("append", False, False, False),
                ("append+pad4k", True, False, False),
                ("fallocate", False, True, False),
                ("fallocate+pad4k", True, True, False),
                ("recycled", False, False, True),
                ("recycled+pad4k", True, False, True),
            ]:
                wa, p50, p99 = run_variant(mnt, dev, size, pad, pre, rec)
                print(f"{size} {name} {wa:.2f} {p50:.3f} {p99:.3f}", flush=True)
    finally:
        subprocess.run(["umount", mnt])
        subprocess.run(["losetup", "-d", loop])
        os.unlink(img)


if __name__ == "__main__":
    sys.exit(main())
