#!/usr/bin/env bash
# ctest: bench/unpack_debs.py unpacks a Debian package as `dpkg -x` does (the GPU session's kit
# on a machine without dpkg): files, folders and relative links land under the root, and a
# package whose link points outside the root is refused.
set -euo pipefail
command -v dpkg-deb > /dev/null || { echo "dpkg-deb not found: skipped"; exit 77; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pkg="$work/pkg"
mkdir -p "$pkg/DEBIAN" "$pkg/usr/include/kit" "$pkg/usr/lib/x86_64-linux-gnu"
printf 'Package: kit-test\nVersion: 1.0\nArchitecture: all\nMaintainer: cast\nDescription: test\n' > "$pkg/DEBIAN/control"
echo "#define KIT 1" > "$pkg/usr/include/kit/kit.h"
echo "library" > "$pkg/usr/lib/x86_64-linux-gnu/libkit.so.1.0"
ln -s libkit.so.1.0 "$pkg/usr/lib/x86_64-linux-gnu/libkit.so"
dpkg-deb --root-owner-group --build "$pkg" "$work/kit.deb" > /dev/null
python3 "$(dirname "$0")/../bench/unpack_debs.py" "$work/root" "$work/kit.deb"
grep -q "#define KIT 1" "$work/root/usr/include/kit/kit.h" || { echo "FAIL: header missing"; exit 1; }
[ "$(cat "$work/root/usr/lib/x86_64-linux-gnu/libkit.so")" = library ] || { echo "FAIL: link not followed"; exit 1; }
# a link that climbs out of the root is refused, and nothing is written outside it
rm -f "$pkg/usr/lib/x86_64-linux-gnu/libkit.so"
ln -s ../../../../../../../etc/passwd "$pkg/usr/lib/x86_64-linux-gnu/escape"
dpkg-deb --root-owner-group --build "$pkg" "$work/bad.deb" > /dev/null
if python3 "$(dirname "$0")/../bench/unpack_debs.py" "$work/bad_root" "$work/bad.deb" 2> "$work/err"; then
  echo "FAIL: a link leaving the root was unpacked"; exit 1
fi
grep -q "outside" "$work/err" || { echo "FAIL: unclear message: $(cat "$work/err")"; exit 1; }
echo "unpack_debs: ok"
