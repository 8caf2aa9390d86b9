#!/usr/bin/env bash
# Builds tern's Debian packages from the release binaries the other suites already build, and
# checks them.
#
#   scripts/package.sh [arm64|armhf|amd64]...     (default: all three)
#
# Binaries: arm64 and armhf from scripts/cross.sh ($CARGO_TARGET_DIR/cross/<triple>/release/tern,
# built through it when missing), amd64 from a host `cargo build --release -p tern`. Plain
# `dpkg-deb --root-owner-group --build` of a staged tree: no cargo tool to install, and it
# packages binaries built elsewhere (cargo-deb wants to run the build itself).
#
# Each package: /usr/bin/tern, /etc/tern/tern.toml (a conffile: the Raspberry Pi 3 config for
# armhf, the Pi 4 config for arm64 and amd64), the hardened systemd unit in
# /usr/lib/systemd/system/tern.service, sysusers.d and adduser for the `tern` system user,
# /var/lib/tern, copyright, changelog and docs. Checks: `dpkg-deb --info` and `--contents`
# (printed), the expected paths, conffiles and ELF machine, `sh -n` of the maintainer scripts,
# `systemd-analyze verify` of the unit and `lintian --fail-on error`. Prints each package's size.
# Output: $CARGO_TARGET_DIR/deb/tern_<version>_<arch>.deb (target/deb by default).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target_dir="${CARGO_TARGET_DIR:-$root/target}"
out="$target_dir/deb"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(arm64 armhf amd64)

for tool in dpkg-deb lintian systemd-analyze readelf; do
  command -v "$tool" >/dev/null || { scripts/ensure-deps.sh; break; }
done

binary_of() {
  case "$1" in
    arm64) echo "$target_dir/cross/aarch64-unknown-linux-gnu/release/tern" ;;
    armhf) echo "$target_dir/cross/armv7-unknown-linux-gnueabihf/release/tern" ;;
    amd64) echo "$target_dir/release/tern" ;;
    *) echo "unknown architecture '$1' (use arm64, armhf or amd64)" >&2; exit 2 ;;
  esac
}

# The ELF machine readelf prints for each architecture (lintian checks the same).
machine_of() {
  case "$1" in
    arm64) echo AArch64 ;;
    armhf) echo ARM ;;
    amd64) echo "X86-64" ;;
  esac
}

board_of() {
  case "$1" in
    armhf) echo raspberry-pi-3 ;;
    *) echo raspberry-pi-4 ;;
  esac
}

build_binary() {
  case "$1" in
    arm64) scripts/cross.sh aarch64 ;;
    armhf) scripts/cross.sh armv7 ;;
    amd64) cargo build --release --locked -p tern ;;
  esac
}

# The highest GLIBC_x.y symbol version the binary needs: the libc6 dependency.
glibc_needed() {
  readelf -W --version-info "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' |
    sort -t. -k1,1n -k2,2n -k3,3n | tail -1
}

stage() {
  local arch=$1 binary=$2 pkg=$3 board
  board=$(board_of "$arch")
  rm -rf "$pkg" && mkdir -p "$pkg/DEBIAN"
  install -D -m 0755 "$binary" "$pkg/usr/bin/tern"
  install -D -m 0644 "boards/$board/tern.toml" "$pkg/etc/tern/tern.toml"
  # The board's unit with the packaged paths; everything else (hardening, state directory) as is.
  install -d "$pkg/usr/lib/systemd/system"
  sed -e 's#/usr/local/bin/tern#/usr/bin/tern#g' \
    -e 's#^Documentation=.*#Documentation=file:///usr/share/doc/tern/README.md.gz#' \
    -e 's#^\# Install: .*#\# Installed by the tern package (scripts/package.sh).#' \
    "boards/$board/tern.service" >"$pkg/usr/lib/systemd/system/tern.service"
  install -D -m 0644 packaging/sysusers.conf "$pkg/usr/lib/sysusers.d/tern.conf"
  install -d -m 0755 "$pkg/var/lib/tern"
  local doc="$pkg/usr/share/doc/tern"
  install -d "$doc"
  install -m 0644 packaging/copyright "$doc/copyright"
  gzip -9n -c packaging/changelog >"$doc/changelog.gz"
  for file in README.md docs/operations.md docs/configuration.md docs/mqtt-security.md \
    tern.example.toml; do
    gzip -9n -c "$file" >"$doc/$(basename "$file").gz"
  done
  for script in postinst prerm postrm; do
    install -m 0755 "packaging/$script" "$pkg/DEBIAN/$script"
  done
  echo /etc/tern/tern.toml >"$pkg/DEBIAN/conffiles"
  local size libc
  size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
  libc=$(glibc_needed "$binary")
  sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" -e "s/@LIBC@/$libc/" \
    packaging/control >"$pkg/DEBIAN/control"
  (cd "$pkg" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | sort -z | xargs -0 md5sum) \
    >"$pkg/DEBIAN/md5sums"
}

# What every package must hold; fails naming the first missing path.
check_contents() {
  local deb=$1 arch=$2 listing
  listing=$(dpkg-deb --contents "$deb")
  for path in ./usr/bin/tern ./etc/tern/tern.toml ./usr/lib/systemd/system/tern.service \
    ./usr/lib/sysusers.d/tern.conf ./var/lib/tern/ ./usr/share/doc/tern/copyright \
    ./usr/share/doc/tern/changelog.gz ./usr/share/doc/tern/README.md.gz; do
    grep -q " $path\$" <<<"$listing" || { echo "package: $deb lacks $path" >&2; return 1; }
  done
  grep -q ' root/root .* ./usr/bin/tern$' <<<"$listing" || { echo "package: /usr/bin/tern not root-owned" >&2; return 1; }
  [ "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xOf - ./conffiles)" = /etc/tern/tern.toml ] ||
    { echo "package: conffiles is not /etc/tern/tern.toml" >&2; return 1; }
  local dir machine
  dir=$(mktemp -d)
  dpkg-deb --extract "$deb" "$dir"
  machine=$(readelf -h "$dir/usr/bin/tern" | sed -n 's/^ *Machine: *//p')
  grep -q "$(machine_of "$arch")" <<<"$machine" || { echo "package: $arch holds a $machine binary" >&2; rm -rf "$dir"; return 1; }
  grep -q '^ExecStart=/usr/bin/tern serve --config /etc/tern/tern.toml$' \
    "$dir/usr/lib/systemd/system/tern.service" || { echo "package: unit's ExecStart" >&2; rm -rf "$dir"; return 1; }
  grep -q '^Type=notify$' "$dir/usr/lib/systemd/system/tern.service" &&
    grep -q '^WatchdogSec=' "$dir/usr/lib/systemd/system/tern.service" ||
    { echo "package: the unit is not Type=notify with WatchdogSec=" >&2; rm -rf "$dir"; return 1; }
  # systemd-analyze resolves ExecStart= on this machine: point it at the packaged binary.
  sed "s#/usr/bin/tern#$dir/usr/bin/tern#" "$dir/usr/lib/systemd/system/tern.service" >"$dir/tern.service"
  # It exits 0 after "ignoring" a line it cannot parse, so any remark counts as a failure.
  local verify=0 remarks
  remarks=$(systemd-analyze verify --man=no "$dir/tern.service" 2>&1) || verify=$?
  rm -rf "$dir"
  [ "$verify" -eq 0 ] && [ -z "$remarks" ] ||
    { echo "package: systemd-analyze verify: $remarks" >&2; return 1; }
}

check_scripts() {
  for script in packaging/postinst packaging/prerm packaging/postrm; do
    sh -n "$script" || { echo "package: $script does not parse" >&2; return 1; }
  done
}

mkdir -p "$out"
check_scripts
failed=0
for arch in "${arches[@]}"; do
  echo "===== package $arch"
  binary=$(binary_of "$arch")
  [ -x "$binary" ] || build_binary "$arch"
  pkg="$out/stage-$arch"
  stage "$arch" "$binary" "$pkg"
  deb="$out/tern_${version}_${arch}.deb"
  dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
  rm -rf "$pkg"
  dpkg-deb --info "$deb"
  dpkg-deb --contents "$deb"
  if check_contents "$deb" "$arch" &&
    lintian --fail-on error "$deb"; then
    printf 'package: %-6s %8d bytes  %s\n' "$arch" "$(stat -c %s "$deb")" "$deb"
  else
    echo "package: $arch FAILED"
    failed=$((failed + 1))
  fi
done
[ "$failed" -eq 0 ]
