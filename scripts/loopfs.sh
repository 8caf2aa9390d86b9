# Sourced by the flash experiment scripts: a 1 GiB ext4 image, loop-mounted at "$WORK/mnt" with
# noatime, removed on exit. Sets TERN_BENCH (absolute path of tern-bench, argument 1 or the debug
# build), WORK, LOOP and DEV, and defines `sectors`, the loop device's sectors-written counter
# (field 7 of /sys/block/DEV/stat), which the experiments turn into device bytes.
TERN_BENCH=$(readlink -f "${1:-target/debug/tern-bench}")
WORK=$(mktemp -d)
trap 'umount "$WORK/mnt" 2>/dev/null || true; [ -n "${LOOP:-}" ] && losetup -d "$LOOP"; rm -rf "$WORK"' EXIT
truncate -s 1G "$WORK/img"
mkfs.ext4 -q -F "$WORK/img"
LOOP=$(losetup -f --show "$WORK/img")
DEV=$(basename "$LOOP")
mkdir "$WORK/mnt"
mount -o noatime "$LOOP" "$WORK/mnt"
sectors() { awk '{print $7}' "/sys/block/$DEV/stat"; }
