#!/usr/bin/env python3
"""Unpacks Debian packages (.deb) into a folder, as `dpkg -x` would, with Python alone.

bench/gpu_session.sh uses it on a GPU machine without network, where dpkg may be missing: the
kit of bench/gpu_kit.sh becomes a prefix (ROOT/usr/include, ROOT/usr/lib/...) to build against.
Members that would land outside ROOT (absolute paths, '..', links pointing out) are refused.

    python3 bench/unpack_debs.py ROOT PACKAGE.deb ...
"""
import io
import os
import sys
import tarfile


def ar_members(path):
    """(name, bytes) of each member of an ar archive (a .deb is one)."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise SystemExit(f"unpack_debs: {path}: not a Debian package (no ar header)")
        while True:
            header = f.read(60)
            if len(header) < 60:
                return
            name = header[:16].decode("ascii", "replace").strip().rstrip("/")
            size = int(header[48:58].decode("ascii").strip())
            data = f.read(size)
            if len(data) != size:
                raise SystemExit(f"unpack_debs: {path}: member {name} is truncated")
            if size % 2:
                f.read(1)
            yield name, data


def safe_members(tar, root):
    for m in tar.getmembers():
        target = os.path.realpath(os.path.join(root, m.name))
        if not (target == root or target.startswith(root + os.sep)):
            raise SystemExit(f"unpack_debs: member {m.name} would land outside {root}")
        if m.issym() or m.islnk():
            if os.path.isabs(m.linkname):  # re-rooted: /usr/lib/x -> ROOT/usr/lib/x
                m.linkname = os.path.relpath(os.path.join(root, m.linkname.lstrip("/")), os.path.dirname(target))
            base = os.path.dirname(target) if m.issym() else root
            points_to = os.path.normpath(os.path.join(base, m.linkname))
            if not (points_to == root or points_to.startswith(root + os.sep)):
                raise SystemExit(f"unpack_debs: link {m.name} -> {m.linkname} points outside {root}")
        yield m


def unpack(deb, root):
    for name, data in ar_members(deb):
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
                tar.extractall(root, members=list(safe_members(tar, root)))
            return
    raise SystemExit(f"unpack_debs: {deb}: no data.tar member")


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    root = os.path.realpath(sys.argv[1])
    os.makedirs(root, exist_ok=True)
    for deb in sys.argv[2:]:
        unpack(deb, root)
    print(f"unpack_debs: {len(sys.argv) - 2} packages into {root}")


if __name__ == "__main__":
    main()
