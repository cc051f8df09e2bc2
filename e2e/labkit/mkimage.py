#!/usr/bin/env python3
"""Make a single-layer OCI image archive (for `ctr images import`) from a root filesystem
directory, without a registry or a container engine.

usage: mkimage.py ROOTFS IMAGE_NAME OUT.tar '{"Entrypoint":[...],"Cmd":[...]}'
"""
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

rootfs, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}


def owned_by_root(ti):
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = "root"
    ti.mtime = 0
    return ti


def digest(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
    for e in sorted(os.listdir(rootfs)):
        t.add(os.path.join(rootfs, e), arcname=e, filter=owned_by_root)
layer = layer.getvalue()
# level 1: the launcher's layer (libvirt + QEMU) is ~200 MB; level 9 takes a minute
layer_gz = gzip.compress(layer, compresslevel=1, mtime=0)
config = {
    "architecture": "amd64",
    "os": "linux",
    "config": dict({"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}, **extra),
    "rootfs": {"type": "layers", "diff_ids": [digest(layer)]},
    "history": [{"created": "2026-01-01T00:00:00Z", "created_by": "roam e2e/labkit/mkimage.py"}],
}
config_b = json.dumps(config, sort_keys=True).encode()
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config_b), "size": len(config_b)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(layer_gz), "size": len(layer_gz)}],
}
manifest_b = json.dumps(manifest, sort_keys=True).encode()
index = {
    "schemaVersion": 2,
    "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digest(manifest_b),
        "size": len(manifest_b),
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]},
    }],
}


def add(t, path, data):
    ti = tarfile.TarInfo(path)
    ti.size = len(data)
    ti.mtime = 0
    t.addfile(ti, io.BytesIO(data))


with tarfile.open(out, "w") as t:
    add(t, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    for b in (config_b, layer_gz, manifest_b):
        add(t, "blobs/sha256/" + digest(b)[7:], b)
    add(t, "index.json", json.dumps(index).encode())
print(out, name, digest(manifest_b))
