#!/usr/bin/env bash
# Builds the boot files of a minimal ARM Linux gateway for system QEMU (`-M virt`):
# Debian's kernel and a busybox initramfs whose init loads the kernel's modules for the devices
# it finds, brings up eth0, mounts the ext4 "SD card" (/dev/vda) at /sd and runs /sd/tern.
#
#   scripts/system-image.sh aarch64|armv7 OUTDIR
#
# Writes OUTDIR/vmlinuz, OUTDIR/initrd.img and OUTDIR/kernel-version (again only when the
# packages or this script changed). The Debian packages
# (the kernel: cloud-arm64 on aarch64, armmp on armhf; busybox-static of the same architecture)
# are fetched with `apt-get download` into $CARGO_TARGET_DIR/system/debs and kept there; with no
# network the newest cached ones are used. The SD card itself is made by the test harness
# (tests/src/system.rs) with mkfs.ext4 -d, which needs no root.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -eq 2 ] || { echo "usage: $0 aarch64|armv7 OUTDIR" >&2; exit 2; }
case "$1" in
  aarch64) debarch=arm64 kernel_meta=linux-image-cloud-arm64 triplet=aarch64-linux-gnu ;;
  armv7) debarch=armhf kernel_meta=linux-image-armmp triplet=arm-linux-gnueabihf ;;
  *) echo "unknown architecture '$1' (use aarch64 or armv7)" >&2; exit 2 ;;
esac
out=$2
cache="${CARGO_TARGET_DIR:-$PWD/target}/system/debs"
mkdir -p "$cache" "$out"

# The foreign architecture must be known to dpkg and apt before apt-get can fetch its packages.
ensure_arch() {
  if ! dpkg --print-foreign-architectures | grep -qx "$debarch"; then
    dpkg --add-architecture "$debarch"
    apt-get update -qq
  fi
}

# Fetches package NAME:debarch into the cache (once per version) and prints the .deb's path.
# The newest cached one stands in when apt cannot fetch (no network).
fetch() {
  local name=$1 version file
  version=$(apt-cache policy "$name:$debarch" 2>/dev/null | awk '/Candidate:/ { print $2 }')
  if [ -n "$version" ] && [ "$version" != "(none)" ]; then
    file=$(ls "$cache/${name}_"*"${version#*:}_$debarch.deb" 2>/dev/null | head -n1 || true)
    if [ -z "$file" ]; then
      (cd "$cache" && apt-get download -qq "$name:$debarch" 2>/dev/null) || true
      file=$(ls -t "$cache/${name}_"*"_$debarch.deb" 2>/dev/null | head -n1 || true)
    fi
  else
    file=$(ls -t "$cache/${name}_"*"_$debarch.deb" 2>/dev/null | head -n1 || true)
  fi
  [ -n "$file" ] || { echo "system-image: cannot fetch $name:$debarch" >&2; return 1; }
  echo "$file"
}

ensure_arch
# The metapackage names the current ABI's image package; the image itself is what we unpack.
kernel_pkg=$(apt-cache depends "$kernel_meta:$debarch" 2>/dev/null |
  awk '/Depends: linux-image-/ { sub(/:.*/, "", $2); print $2; exit }')
if [ -z "$kernel_pkg" ]; then
  kernel_pkg=$(ls -t "$cache"/linux-image-*_"$debarch".deb 2>/dev/null | head -n1 | xargs -r basename | cut -d_ -f1)
fi
[ -n "$kernel_pkg" ] || { echo "system-image: no kernel package for $debarch" >&2; exit 1; }
# On arm64 the image package is EFI-signed; its -unsigned twin carries the same kernel and
# modules without the signature QEMU does not need.
[ "$debarch" = arm64 ] && kernel_pkg="$kernel_pkg-unsigned"
kernel_deb=$(fetch "$kernel_pkg")
busybox_deb=$(fetch busybox-static)
# Built before from the same packages by the same script: nothing to do.
stamp="$(basename "$kernel_deb") $(basename "$busybox_deb") $(sha256sum "$0" | cut -d' ' -f1)"
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] && [ -f "$out/initrd.img" ]; then
  echo "system-image: $1 kernel $(cat "$out/kernel-version") (built before)"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dpkg-deb -x "$kernel_deb" "$work/kernel"
dpkg-deb -x "$busybox_deb" "$work/busybox"
version=$(ls "$work/kernel/lib/modules")
modules="$work/kernel/lib/modules/$version"
depmod -b "$work/kernel" "$version"

root="$work/root"
mkdir -p "$root"/{bin,dev,proc,sys,sd,tmp,lib,etc}
cp "$work/busybox/bin/busybox" "$root/bin/busybox"

# The modules for the virt machine's devices and the SD card's file system, with everything
# they depend on according to the kernel's own modules.dep. What is built in on one kernel is a
# module on the other (virtio is built into armmp, a module in cloud-arm64; ext4 the other way
# round), so the list names candidates and takes those that exist.
wanted='virtio virtio_ring virtio_mmio virtio_pci virtio_blk virtio_net ext4 crc32c_generic libcrc32c'
declare -A take=()
add_module() {
  local path=$1 dep
  [ -n "${take[$path]:-}" ] && return
  take[$path]=1
  for dep in $(awk -v m="$path:" '$1 == m { $1 = ""; print }' "$modules/modules.dep"); do
    add_module "$dep"
  done
}
for name in $wanted; do
  path=$(awk -F: -v n="$name" '{ f = $1; sub(/.*\//, "", f); sub(/\.ko.*$/, "", f); if (f == n) { print $1; exit } }' "$modules/modules.dep")
  [ -n "$path" ] && add_module "$path"
done
mkdir -p "$root/lib/modules/$version"
cp "$modules"/modules.order "$modules"/modules.builtin "$modules"/modules.builtin.modinfo "$root/lib/modules/$version/"
for path in "${!take[@]}"; do
  mkdir -p "$root/lib/modules/$version/$(dirname "$path")"
  cp "$modules/$path" "$root/lib/modules/$version/$path"
done
# modules.dep and modules.alias for exactly the modules in the initramfs.
depmod -b "$root" "$version"

# The C library the cross-built (glibc) tern links against, from the cross toolchain's sysroot.
sysroot="/usr/$triplet/lib"
for lib in ld-linux-aarch64.so.1 ld-linux-armhf.so.3 libc.so.6 libm.so.6 libgcc_s.so.1; do
  [ -e "$sysroot/$lib" ] && cp -L "$sysroot/$lib" "$root/lib/"
done

cat >"$root/init" <<'EOF'
#!/bin/busybox sh
# tern system-test gateway: load drivers, bring up the network, mount the SD card, run tern.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# The kernel loads file systems and crypto it asks for (ext4, crc32c) through modprobe.
echo /bin/modprobe >/proc/sys/kernel/modprobe
echo "tern-guest: init at $(cut -d' ' -f1 /proc/uptime) s"
# Coldplug, the way udev does it: load a module for every device's modalias until no new
# devices appear (virtio_mmio's devices only exist once it is loaded). No fixed order: each
# kernel's modules.dep and modules.alias say what loads what.
previous=
while :; do
  current=$(cat /sys/bus/*/devices/*/modalias 2>/dev/null | sort -u)
  [ "$current" = "$previous" ] && break
  for alias in $current; do modprobe -q "$alias" 2>/dev/null; done
  previous=$current
done
n=0
while [ ! -b /dev/vda ] && [ $n -lt 100 ]; do usleep 50000; n=$((n + 1)); done
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0
ip link set eth0 up
ip route add default via 10.0.2.2
if ! mount -t ext4 -o rw /dev/vda /sd; then
  echo "tern-guest: cannot mount the SD card"; lsmod; poweroff -f
fi
echo "tern-guest: SD card mounted at $(cut -d' ' -f1 /proc/uptime) s"
cd /sd
./tern serve --config /sd/tern.toml &
tern=$!
# The host's commands arrive on the console: "stop" ends tern with SIGTERM and shuts down cleanly.
while read -r command; do
  case "$command" in
    stop) kill -TERM "$tern"; break ;;
  esac
done
wait "$tern"
echo "tern-guest: tern exited with $?"
cd /
sync
umount /sd && echo "tern-guest: SD card unmounted"
poweroff -f
EOF
chmod 755 "$root/init"

(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -1 >"$out/initrd.img"
cp "$work/kernel/boot/vmlinuz-$version" "$out/vmlinuz"
echo "$version" >"$out/kernel-version"
echo "$stamp" >"$out/stamp"
echo "system-image: $1 kernel $version, initramfs $(stat -c %s "$out/initrd.img") bytes, modules: ${!take[*]}"
