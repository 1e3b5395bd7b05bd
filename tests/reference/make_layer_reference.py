#!/usr/bin/env python3
"""Writes tests/data/layer_*.safetensors: inputs for `cast layer` plus the expected results,
computed here independently of the engine with numpy: every mechanism's forward pass written
from ATTENTION.md with plain loops, the gradients by central differences in float64.

Run from the repository root: python3 tests/reference/make_layer_reference.py (needs numpy).
"""
import json
import math
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
    if keep is not None:
        if not keep.any():
            return np.zeros_like(s)
        s = np.where(keep, s, -np.inf)
    e = np.exp(s - np.max(s, axis=-1, keepdims=True))
    if keep is not None:
        e = np.where(keep, e, 0.0)
    return e / np.sum(e, axis=-1, keepdims=True)


def laplace_rows(s):
    mu, sigma = math.sqrt(0.5), math.sqrt(1 / (4 * math.pi))
    u = np.vectorize(lambda x: 0.5 * math.erfc(-(x - mu) / (sigma * math.sqrt(2))))(s)
    return u / (u.sum(axis=-1, keepdims=True) + 1e-30)


def heads(t, H):  # (N, D) -> (H, N, d)
    N, D = t.shape
    return t.reshape(N, H, D // H).transpose(1, 0, 2)


def finish(o, p, mask_b):  # (H, N, d) -> (N, D) through wo, padding zeroed
    H, N, d = o.shape
    return (o.transpose(1, 0, 2).reshape(N, H * d) @ p["wo"]) * mask_b[:, None]


def full_layer(p, x, mask, H, **_):
    out = np.zeros_like(x)
    for b in range(x.shape[0]):
        q, k, v = (heads(x[b] @ p[w], H) for w in ("wq", "wk", "wv"))
        d = q.shape[-1]
        o = np.stack([softmax(q[h] @ k[h].T / np.sqrt(d), np.broadcast_to(mask[b] > 0, (q.shape[1], q.shape[1])))
                      @ v[h] for h in range(H)])
        out[b] = finish(o, p, mask[b])
    return out, {}


def select_members(a_g, real, C, K, satopk):
    """Cluster members, (C, K) with -1 in empty slots, by ATTENTION.md 2.4."""
    members = [[] for _ in range(C)]
    if not satopk:
        for c in range(C):
            members[c] = sorted(sorted(real, key=lambda i: (-a_g[i, c], i))[:K])
    else:
        order = sorted(real, key=lambda i: (-a_g[i].max(), i))
        for i in order:
            for c in sorted(range(C), key=lambda c: (-a_g[i, c], c)):
                if len(members[c]) < K:
                    members[c].append(i)
                    break
        members = [sorted(m) for m in members]
    table = np.full((C, K), -1, dtype=np.int32)
    for c in range(C):
        table[c, :len(members[c])] = members[c]
    return table


def cast_layer(p, x, mask, H, C, K, satopk=False, f="softmax", summaries=True, mix="affinity", shared=False):
    B, N, D = x.shape
    fn = softmax if f == "softmax" else laplace_rows
    out = np.zeros_like(x)
    clusters = np.full((B, H, C, K), -1, dtype=np.int32)
    for b in range(B):
        q, k, v = (heads(x[b] @ p[w], H) for w in ("wq", "wk", "wv"))
        d = q.shape[-1]
        g = 1 / (1 + np.exp(-(x[b] @ p["gate_w"] + p["gate_b"])))  # (N, H) or (N, 1)
        real = [i for i in range(N) if mask[b, i] > 0]
        if shared:  # one clustering from full-width Q, K
            qf, kf = x[b] @ p["wq"], x[b] @ p["wk"]
            a_q = fn(qf @ p["surrogates"].T / np.sqrt(D))
            a_k = fn(kf @ p["surrogates"].T / np.sqrt(D))
            a_g = g[:, :1] * a_q + (1 - g[:, :1]) * a_k
            shared_table = select_members(a_g, real, C, K, satopk)
        o = np.zeros((H, N, d))
        for h in range(H):
            if not shared:
                s = p["surrogates"][h]
                a_q = fn(q[h] @ s.T / np.sqrt(d))
                a_k = fn(k[h] @ s.T / np.sqrt(d))
                a_g = g[:, h:h + 1] * a_q + (1 - g[:, h:h + 1]) * a_k
                table = select_members(a_g, real, C, K, satopk)
            else:
                table = shared_table
            clusters[b, h] = table
            w = a_g if mix == "affinity" else a_q
            if summaries:
                pk = a_k * mask[b][:, None]
                pk = pk / (pk.sum(axis=0, keepdims=True) + 1e-30)
                r_inter = pk.T @ v[h]
            else:
                r_inter = np.zeros((C, d))
            intra = {}
            for c in range(C):
                members = [i for i in table[c] if i >= 0]
                if not members:
                    continue
                r = softmax(q[h][members] @ k[h][members].T / np.sqrt(d)) @ v[h][members]
                for pos, i in enumerate(members):
                    intra[(i, c)] = r[pos]
            for i in range(N):
                for c in range(C):
                    o[h, i] += w[i, c] * intra.get((i, c), r_inter[c])
        out[b] = finish(o, p, mask[b])
    return out, {"clusters": clusters}


def clustered_layer(p, x, mask, H, assignment, C, improved=False, topk=0):
    B, N, D = x.shape
    out = np.zeros_like(x)
    for b in range(B):
        q, k, v = (heads(x[b] @ p[w], H) for w in ("wq", "wk", "wv"))
        d = q.shape[-1]
        keep = mask[b] > 0
        o = np.zeros((H, N, d))
        for h in range(H):
            for j in range(C):
                members = [i for i in range(N) if assignment[b, h, i] == j]
                if not members:
                    continue
                centroid = q[h][members].mean(axis=0)
                a_c = softmax(centroid @ k[h].T / np.sqrt(d), keep)
                if not improved:
                    for i in members:
                        o[h, i] = a_c @ v[h]
                    continue
                order = sorted([l for l in range(N) if keep[l]], key=lambda l: (-a_c[l], l))[:topk]
                m_hat = a_c[order].sum()
                rest = a_c.copy()
                rest[order] = 0.0
                for i in members:
                    a_u = m_hat * softmax(q[h][i] @ k[h][order].T / np.sqrt(d))
                    o[h, i] = a_u @ v[h][order] + rest @ v[h]
        out[b] = finish(o, p, mask[b])
    return out, {}


def make_case(path, layer, B, N, D, H, extra_params, extra_inputs=None, **kw):
    x = RNG.normal(size=(B, N, D))
    mask = np.ones((B, N))
    mask[1, N - 2:] = 0.0
    dout = RNG.normal(size=(B, N, D))
    p = {w: RNG.normal(size=(D, D)) / np.sqrt(D) for w in ("wq", "wk", "wv", "wo")}
    p.update(extra_params)
    out, indices = layer(p, x, mask, H, **kw)

    def loss():
        return float(np.sum(layer(p, x, mask, H, **kw)[0] * dout))

    eps = 1e-6
    grads = {}
    for name, value in list(p.items()) + [("x", x)]:
        g = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            saved = value[idx]
            value[idx] = saved + eps
            plus = loss()
            value[idx] = saved - eps
            minus = loss()
            value[idx] = saved
            g[idx] = (plus - minus) / (2 * eps)
        grads[name] = g
    for name, table in indices.items():  # the finite differences moved no membership
        assert (layer(p, x, mask, H, **kw)[1][name] == table).all()
    tensors = {"x": x, "mask": mask, "dout": dout, "expected.out": out}
    tensors.update(p)
    tensors.update(extra_inputs or {})
    for name, g in grads.items():
        tensors["expected.grad." + name] = g
    for name, table in indices.items():
        tensors["expected." + name] = table
    write_safetensors(path, tensors)
    print("wrote", path)


def cast_params(H, C, D, shared):
    if shared:
        return {"surrogates": RNG.normal(size=(C, D)), "gate_w": RNG.normal(size=(D, 1)) / np.sqrt(D),
                "gate_b": RNG.normal(size=(1,))}
    return {"surrogates": RNG.normal(size=(H, C, D // H)), "gate_w": RNG.normal(size=(D, H)) / np.sqrt(D),
            "gate_b": RNG.normal(size=(H,))}


if __name__ == "__main__":
    B, N, D, H, C, K = 2, 7, 8, 2, 3, 3
    make_case("tests/data/layer_full.safetensors", full_layer, B, N, D, H, {})
    # CAST variants: (file suffix, options)
    cases = [
        ("cast", {}),
        ("cast_satopk_laplace", {"satopk": True, "f": "laplace"}),
        ("cast_nosummaries_query", {"summaries": False, "mix": "query"}),
        ("cast_shared", {"shared": True}),
        ("cast_shared_satopk", {"shared": True, "satopk": True, "f": "laplace", "mix": "query"}),
    ]
    for suffix, opts in cases:
        make_case(f"tests/data/layer_{suffix}.safetensors", cast_layer, B, N, D, H,
                  cast_params(H, C, D, opts.get("shared", False)), C=C, K=K, **opts)
    assignment = RNG.integers(0, C, size=(B, H, N)).astype(np.int32)
    assignment[1, :, N - 2:] = -1  # padded queries belong to no cluster
    make_case("tests/data/layer_clustered.safetensors", clustered_layer, B, N, D, H, {},
              {"assignment": assignment}, assignment=assignment, C=C)
    make_case("tests/data/layer_iclustered.safetensors", clustered_layer, B, N, D, H, {},
              {"assignment": assignment}, assignment=assignment, C=C, improved=True, topk=3)
