"""python3 -m ringd.torch.export --ckpt-dir DIR [--job J] [--step S]
       --out model.pt

Writes a checkpoint of a ringd.torch.elastic.State as a file plain
torch.load reads without ringd: {"model": state_dict, "optimizer":
optimizer.state_dict(), "extras": {...}, "epoch"/"sampler": ...,
"step": S}. The checkpoint's state is decoded and checked by `ringctl dump`
(zstd frames and per-shard xxh64, from the replica where the primary is
bad, as the daemon's restore does); the region's own header and layout
name every tensor. Without --step, the newest complete checkpoint.
ringctl is looked for in --ringctl, $RINGCTL, beside libringd.so, in
../bin from it, then on PATH.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

from ringd.torch import elastic


def find_ringctl(given):
    import ringd
    lib_dir = os.path.dirname(os.path.abspath(ringd.lib_path))
    for path in (given, os.environ.get("RINGCTL"),
                 os.path.join(lib_dir, "ringctl"),
                 os.path.join(lib_dir, "..", "bin", "ringctl"),
                 shutil.which("ringctl")):
        if path and os.access(path, os.X_OK):
            return path
    raise SystemExit("ringd.torch.export: ringctl not found (--ringctl)")


def newest_step(root):
    steps = [int(d[5:]) for d in os.listdir(root) if d.startswith("step-")
             and os.path.exists(os.path.join(root, d, "MANIFEST.json"))]
    if not steps:
        raise SystemExit("ringd.torch.export: no complete checkpoint in %s"
                         % root)
    return max(steps)


def parse(raw):
    """The region's tensors by name, and its JSON part."""
    magic, ver, llen, cap, mlen, doff, total, _ = elastic._HDR.unpack_from(
        raw, 0)
    if magic != elastic.MAGIC or ver != elastic.VERSION:
        raise SystemExit("ringd.torch.export: not a ringd.torch state "
                         "(magic %r): the checkpoint holds a raw region" %
                         magic)
    if total > len(raw):
        raise SystemExit("ringd.torch.export: state of %d bytes, header "
                         "says %d" % (len(raw), total))
    hs = elastic._HDR.size
    layout = json.loads(bytes(raw[hs:hs + llen]))
    meta_off = elastic._align(hs + llen)
    meta = json.loads(bytes(raw[meta_off:meta_off + mlen])) if mlen else {}
    buf = bytearray(raw[doff:total])
    tensors = {}
    for e in layout:
        dt = getattr(torch, e["dtype"])
        n = 1
        for s in e["shape"]:
            n *= s
        if e["nbytes"] == 0:
            t = torch.empty(e["shape"], dtype=dt)
        else:
            t = torch.frombuffer(buf, dtype=dt, count=n,
                                 offset=e["offset"]).view(e["shape"])
        tensors[e["name"]] = t.clone()
    return tensors, meta


def to_state_dicts(tensors, meta):
    model, opt_state, extras = {}, {}, {}
    for name, t in tensors.items():
        kind, _, rest = name.partition("/")
        if kind == "model":
            model[rest] = t
        elif kind == "optim":
            i, _, key = rest.partition("/")
            opt_state.setdefault(int(i), {})[key] = t
        elif kind == "extra":
            extras[rest] = t
    out = {"model": model, "extras": extras}
    if "param_groups" in meta:
        out["optimizer"] = {"state": opt_state,
                            "param_groups": meta["param_groups"]}
    extras.update(meta.get("plain", {}))
    if "sampler" in meta:
        out["sampler"] = meta["sampler"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m ringd.torch.export")
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--job", default="standalone")
    ap.add_argument("--step", type=int)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ringctl")
    o = ap.parse_args(argv)
    root = os.path.join(o.ckpt_dir, o.job)
    step = o.step if o.step is not None else newest_step(root)
    ringctl = find_ringctl(o.ringctl)
    with tempfile.TemporaryDirectory() as tmp:
        raw_path = os.path.join(tmp, "state")
        cmd = [ringctl, "--ckpt-dir", o.ckpt_dir, "--job", o.job, "dump",
               str(step), raw_path]
        r = subprocess.run(cmd, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise SystemExit("ringd.torch.export: %s failed: %s" %
                             (" ".join(cmd), r.stdout.strip()))
        with open(raw_path, "rb") as f:
            raw = f.read()
    tensors, meta = parse(raw)
    doff, total = elastic._HDR.unpack_from(raw, 0)[5:7]
    digest = hashlib.blake2b(raw[doff:total], digest_size=8).hexdigest()
    out = to_state_dicts(tensors, meta)
    out["step"] = step
    torch.save(out, o.out)
    # digest: as State.digest() of the trainer whose state this is.
    print("step %d: %d tensors (%d model) digest %s to %s" %
          (step, len(tensors), len(out["model"]), digest, o.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
