#!/usr/bin/env python3
"""Fetch a Debian suite's OVN and Open vSwitch with the shared libraries they link, and
unpack them into ROOT, runnable on this (older) Debian: every ELF program is given the
unpacked dynamic loader and library path (patchelf), so it never mixes the suite's glibc
with the host's.

usage: ovn-fetch.py SUITE ROOT

Each .deb is checked against the SHA256 the suite's Packages index gives. Prints one line
per step. ROOT/.done names the versions once everything is in place; a ROOT with it is kept
as it is (remove ROOT for the suite's current packages).
"""

import hashlib
import lzma
import os
import shutil
import subprocess
import sys
import urllib.request

MIRROR = os.environ.get("ROAM_DEBIAN_MIRROR", "http://deb.debian.org/debian")
WANTED = ["ovn-central", "ovn-host", "ovn-common", "openvswitch-switch", "openvswitch-common"]
# Depends that are programs the lab does not run (the packages' init scripts and python
# helpers use them), or the host's own: not followed.
SKIP = {
    "python3", "python3:any", "lsb-release", "kmod", "module-init-tools", "netbase",
    "procps", "uuid-runtime", "openssl", "debconf", "debconf-2.0", "adduser", "init-system-helpers",
}


def say(msg):
    print(f"ovn: {msg}", flush=True)


def get(url):
    with urllib.request.urlopen(url, timeout=120) as r:
        return r.read()


def packages(suite):
    """The suite's amd64 Packages index: name -> its fields."""
    raw = lzma.decompress(get(f"{MIRROR}/dists/{suite}/main/binary-amd64/Packages.xz"))
    out = {}
    for para in raw.decode("utf-8", "replace").split("\n\n"):
        fields, key = {}, None
        for line in para.splitlines():
            if line.startswith(" ") and key:
                fields[key] += "\n" + line
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields:
            out[fields["Package"]] = fields
    return out


def providers(index):
    """Virtual package name -> a real package providing it."""
    out = {}
    for name, f in index.items():
        for p in f.get("Provides", "").split(","):
            p = p.strip().split(" ")[0]
            if p:
                out.setdefault(p, name)
    return out


def closure(index):
    provided = providers(index)
    todo, seen = list(WANTED), []
    while todo:
        name = todo.pop(0)
        if name in seen or name in SKIP:
            continue
        if name not in index:
            name = provided.get(name, name)
            if name not in index:
                raise SystemExit(f"ovn: {name} is in no package of the suite")
            if name in seen:
                continue
        seen.append(name)
        for dep in index[name].get("Depends", "").split(","):
            first = dep.split("|")[0].strip().split(" ")[0]
            if first and first not in SKIP:
                todo.append(first)
    return seen


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def main():
    suite, root = sys.argv[1], os.path.abspath(sys.argv[2])
    done = os.path.join(root, ".done")
    if os.path.exists(done):
        # once fetched, kept: the lab runs offline and the same OVN until the cache is cleared
        say(f"{suite}'s OVN in {root}: {open(done).read().split()[0]}")
        return
    say(f"reading {suite}'s package index from {MIRROR}")
    index = packages(suite)
    names = closure(index)
    versions = " ".join(f"{n}={index[n]['Version']}" for n in names)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "debs"))
    for i, n in enumerate(names, 1):
        f = index[n]
        say(f"[{i}/{len(names)}] {n} {f['Version']}")
        data = get(f"{MIRROR}/{f['Filename']}")
        if hashlib.sha256(data).hexdigest() != f["SHA256"]:
            raise SystemExit(f"ovn: {n}: the download does not match the index's SHA256; try again")
        deb = os.path.join(root, "debs", os.path.basename(f["Filename"]))
        with open(deb, "wb") as out:
            out.write(data)
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
    loader = next(
        (p for p in ("usr/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2",
                     "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
         if os.path.exists(os.path.join(root, p))),
        None,
    )
    if loader is None:
        raise SystemExit("ovn: the suite's libc6 has no ld-linux-x86-64.so.2 where expected")
    loader = os.path.realpath(os.path.join(root, loader))
    libs = ":".join(os.path.join(root, d) for d in ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu"))
    # ROOT/bin: the programs, for the front of PATH (ovs-vswitchd is where the package's
    # alternatives would link /usr/sbin/ovs-vswitchd from)
    os.makedirs(os.path.join(root, "bin"))
    patched = 0
    for d in ("usr/bin", "usr/sbin", "usr/lib/openvswitch-switch"):
        full = os.path.join(root, d)
        for name in sorted(os.listdir(full)) if os.path.isdir(full) else []:
            p = os.path.join(full, name)
            if os.path.islink(p) or not os.access(p, os.X_OK) or os.path.isdir(p):
                continue
            if is_elf(p):
                # DT_RPATH, not RUNPATH: it also serves the libraries' own dependencies
                subprocess.run(["patchelf", "--set-interpreter", loader, "--force-rpath",
                                "--set-rpath", libs, p], check=True)
                patched += 1
            os.symlink(p, os.path.join(root, "bin", name))
    say(f"{patched} programs now load {suite}'s libraries; PATH={root}/bin:$PATH runs them")
    with open(done, "w") as out:
        out.write(versions + "\n")


if __name__ == "__main__":
    main()
