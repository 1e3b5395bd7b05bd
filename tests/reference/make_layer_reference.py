#!/usr/bin/env python3
"""Writes tests/data/layer_*.safetensors: inputs for `cast layer` plus the expected results,
computed here independently of the engine with numpy: the forward pass written from
ATTENTION.md with plain loops, the gradients by central differences in float64.

Run from the repository root: python3 tests/reference/make_layer_reference.py (needs numpy).
"""
import json
import struct

import numpy as np

RNG = np.random.default_rng(20261121)


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        dtype = {np.float64: "F64", np.float32: "F32", np.int32: "I32"}[a.dtype.type]
        raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def softmax(s, keep=None):
    s = np.where(keep, s, -np.inf) if keep is not None else s
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - m)
    if keep is not None:
        e = np.where(keep, e, 0.0)
    return e / np.sum(e, axis=-1, keepdims=True)


def heads(t, H):  # (N, D) -> (H, N, d)
    N, D = t.shape
    return t.reshape(N, H, D // H).transpose(1, 0, 2)


def full_layer(p, x, mask, H):
    out = np.zeros_like(x)
    for b in range(x.shape[0]):
        q, k, v = (heads(x[b] @ p[w], H) for w in ("wq", "wk", "wv"))
        d = q.shape[-1]
        o = np.stack([softmax(q[h] @ k[h].T / np.sqrt(d), mask[b][None, :] > 0) @ v[h] for h in range(H)])
        out[b] = (o.transpose(1, 0, 2).reshape(x.shape[1], -1) @ p["wo"]) * mask[b][:, None]
    return out, None


def cast_layer(p, x, mask, H, C, K):
    """CAST, per-head, Top-K clustering, f = softmax, summaries on, W = A_g."""
    B, N, D = x.shape
    out = np.zeros_like(x)
    clusters = np.full((B, H, C, K), -1, dtype=np.int32)
    for b in range(B):
        q, k, v = (heads(x[b] @ p[w], H) for w in ("wq", "wk", "wv"))
        d = q.shape[-1]
        g = 1 / (1 + np.exp(-(x[b] @ p["gate_w"] + p["gate_b"])))  # (N, H)
        real = [i for i in range(N) if mask[b, i] > 0]
        o = np.zeros((H, N, d))
        for h in range(H):
            s = p["surrogates"][h]  # (C, d)
            a_q = softmax(q[h] @ s.T / np.sqrt(d))
            a_k = softmax(k[h] @ s.T / np.sqrt(d))
            a_g = g[:, h:h + 1] * a_q + (1 - g[:, h:h + 1]) * a_k
            pk = a_k * mask[b][:, None]
            pk = pk / pk.sum(axis=0, keepdims=True)
            r_inter = pk.T @ v[h]  # (C, d)
            in_cluster = {}
            for c in range(C):
                order = sorted(real, key=lambda i: (-a_g[i, c], i))[:K]
                members = sorted(order)
                clusters[b, h, c, :len(members)] = members
                qm, km, vm = q[h][members], k[h][members], v[h][members]
                r_intra = softmax(qm @ km.T / np.sqrt(d)) @ vm
                for pos, i in enumerate(members):
                    in_cluster[(i, c)] = r_intra[pos]
            for i in range(N):
                for c in range(C):
                    o[h, i] += a_g[i, c] * in_cluster.get((i, c), r_inter[c])
        out[b] = (o.transpose(1, 0, 2).reshape(N, D) @ p["wo"]) * mask[b][:, None]
    return out, clusters


def make_case(path, layer, B, N, D, H, extra_params, **kw):
    x = RNG.normal(size=(B, N, D))
    mask = np.ones((B, N))
    mask[1, N - 2:] = 0.0
    dout = RNG.normal(size=(B, N, D))
    p = {w: RNG.normal(size=(D, D)) / np.sqrt(D) for w in ("wq", "wk", "wv", "wo")}
    p.update(extra_params)
    out, clusters = layer(p, x, mask, H, **kw)

    def loss(pp, xx):
        return float(np.sum(layer(pp, xx, mask, H, **kw)[0] * dout))

    eps = 1e-6
    grads = {}
    for name, value in list(p.items()) + [("x", x)]:
        g = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            saved = value[idx]
            value[idx] = saved + eps
            plus = loss(p, x)
            value[idx] = saved - eps
            minus = loss(p, x)
            value[idx] = saved
            g[idx] = (plus - minus) / (2 * eps)
        grads[name] = g
    _, clusters_after = layer(p, x, mask, H, **kw)
    assert clusters is None or (clusters == clusters_after).all()
    tensors = {"x": x, "mask": mask, "dout": dout, "expected.out": out}
    tensors.update(p)
    for name, g in grads.items():
        tensors["expected.grad." + name] = g
    if clusters is not None:
        tensors["expected.clusters"] = clusters
    write_safetensors(path, tensors)


if __name__ == "__main__":
    make_case("tests/data/layer_full.safetensors", full_layer, 2, 7, 8, 2, {})
    H, C, D = 2, 3, 8
    make_case("tests/data/layer_cast.safetensors", cast_layer, 2, 7, D, H,
              {"surrogates": RNG.normal(size=(H, C, D // H)), "gate_w": RNG.normal(size=(D, H)) / np.sqrt(D),
               "gate_b": RNG.normal(size=(H,))}, C=C, K=3)
    print("wrote tests/data/layer_full.safetensors, tests/data/layer_cast.safetensors")
