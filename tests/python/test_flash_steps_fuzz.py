"""A seeded fuzz of flash_steps' argument layer (forward_problem, backward_problem, decode_problem) on fake
tensors, without PyTorch, a GPU or the library: valid argument sets drawn at random, then one to three of
their arguments replaced by what a hostile caller passes (extreme integers, floats where integers go,
strings, bools, None, NaN, inf, 1e-50, 1e39, strides of 3 or 5 entries, misaligned and null data_ptrs).
Every call must either return a problem whose fields are the values given (nothing wrapped by ctypes) or
raise InvalidArgument with a sentence; any other exception fails the test. The counts are printed."""
import copy
import math
import random
import struct
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_flash_steps import REPO, FakeTensor, fs  # noqa: E402

SEED, DRAWS = 2121, 4000
BASE = 0x7F0000000000
INTS = [2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 32 + 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64, 2 ** 64 + 2, -1, -2 ** 63,
        -2 ** 63 - 1, 0, 1, 7, 16, 129]
OTHERS = [1.5, 64.0, 1.9, "7", "abc", "", True, False, None, math.nan, math.inf, -math.inf, 1e-50, 1e39, b"1",
          [1], (2,), object()]
HOSTILE = INTS + OTHERS
ADDRESSES = [0, BASE + 8, BASE + 4, BASE + 2, BASE + 1, -16, 2 ** 64, 2 ** 64 + 16, 1.5, "0x10", None, True]
SCALES = [None, 0.5, 1, 2, 0.0883883, 2.0 ** -149, 3.4028234663852886e+38, 1e-45, 1e-46, 3.5e38, 10 ** 400,
          -10 ** 400] + OTHERS
FLAGS = [True, False, 0, 1, 2, -1, "no", "", None, 1.0, 0.5, 2 ** 32 + 1]


def contiguous(shape):
    return tuple(math.prod(max(n, 1) for n in shape[i + 1:]) for i in range(len(shape)))


def tensor(shape, dtype="torch.float16", strides=None):
    return FakeTensor(shape, dtype, strides or contiguous(shape), address=BASE)


def float32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def strides_of(s) -> tuple:
    return (s.batch, s.row, s.head, s.dim)


class Draw:
    """One argument set of a pass: the problem function's arguments by name, drawn valid."""
    TENSORS = {"forward": ("q", "k", "v", "o", "lse"), "backward": ("q", "k", "v", "o", "lse", "d_o", "dq", "dk", "dv"),
               "decode": ("q", "k_cache", "v_cache", "o", "cache_seqlens", "block_table", "lse")}
    SCALARS = {"forward": ("causal", "scale"), "backward": ("causal", "scale", "deterministic"),
               "decode": ("causal", "scale", "max_seqlen_k", "num_splits", "checked")}

    def __init__(self, rng: random.Random, kind: str):
        self.kind = kind
        b, hkv, d = rng.choice([1, 2, 3]), rng.choice([1, 2, 4]), rng.choice([64, 128])
        hq = hkv * rng.choice([1, 2, 4])
        sq = rng.choice([1, 4]) if kind == "decode" else rng.choice([0, 1, 64, 100])
        sk = rng.choice([0, 1, 96, 256])
        dtype = rng.choice(["torch.float16", "torch.bfloat16"])
        bhsd = rng.random() < 0.3  # a (batch, heads, seqlen, head_dim) tensor seen transposed

        def view(n, h):
            return tensor((b, n, h, d), dtype, (h * n * d, d, n * d, 1) if bhsd else None)
        a = {"q": view(sq, hq), "causal": rng.choice([True, False]), "scale": rng.choice([None, 0.125, 1])}
        a["o"] = view(sq, hq) if kind == "backward" or rng.random() < 0.7 else None  # None: allocated
        a["lse"] = tensor((b, hq, sq), "torch.float32") if kind == "backward" or rng.random() < 0.5 else None
        if kind in ("forward", "backward"):
            a["k"], a["v"] = view(sk, hkv), view(sk, hkv)
        if kind == "backward":
            a["d_o"], a["deterministic"] = view(sq, hq), rng.choice([True, False])
            for g, like in (("dq", a["q"]), ("dk", a["k"]), ("dv", a["v"])):
                a[g] = tensor(like.shape, dtype, like.stride()) if rng.random() < 0.7 else None
        if kind == "decode":
            if rng.random() < 0.5:  # paged
                page = rng.choice([16, 64])
                pages = max(1, -(-sk // page))
                a["k_cache"] = a["v_cache"] = tensor((b * pages + rng.choice([0, 5]), page, hkv, d), dtype)
                a["block_table"] = tensor((b, pages), "torch.int32", (pages + rng.choice([0, 8]), 1))
            else:
                a["k_cache"] = a["v_cache"] = tensor((b, sk + rng.choice([0, 32]), hkv, d), dtype)
                a["block_table"] = None
            a["cache_seqlens"] = tensor((b,), "torch.int32") if rng.random() < 0.5 else None
            a["max_seqlen_k"] = rng.choice([None, sk])
            a["num_splits"], a["checked"] = rng.choice([0, 1, 3, 128]), rng.choice([True, False, 0, 1])
        self.args = a

    def spoil(self, rng: random.Random) -> None:
        """Replace one argument, or one part of a tensor argument, by a hostile value."""
        a = self.args
        if rng.random() < 0.35:
            name = rng.choice(self.SCALARS[self.kind])
            pool = {"causal": FLAGS, "deterministic": FLAGS, "checked": FLAGS, "scale": SCALES}.get(name, HOSTILE)
            a[name] = rng.choice(pool)
            return
        name = rng.choice(self.TENSORS[self.kind])
        t = a[name]
        what = rng.choice(["shape", "stride", "stride entries", "address", "address", "object", "dtype"])
        if what == "object" or not isinstance(t, FakeTensor) or not isinstance(t._strides, tuple):
            a[name] = rng.choice([None, 5, "tensor", tensor((2, 64, 8)), tensor((1, 1, 1, 8, 8))])
            return
        t = a[name] = copy.copy(t)
        if what == "shape":
            shape = list(t.shape)
            shape[rng.randrange(len(shape))] = rng.choice(HOSTILE)
            t.shape = tuple(shape)
        elif what == "stride":
            t._strides = rng.choice([t._strides + (1,), t._strides[:-1], (), 5, None, "1234"])
        elif what == "stride entries":
            strides = list(t._strides)
            strides[rng.randrange(len(strides))] = rng.choice(HOSTILE)
            t._strides = tuple(strides)
        elif what == "address":
            t.address = rng.choice(ADDRESSES)
        else:
            t.dtype = rng.choice(["torch.float32", "torch.int32", "torch.float16", None])

    def call(self):
        a = self.args
        if self.kind == "forward":
            return fs.forward_problem("fuzz", a["q"], a["k"], a["v"], a["o"], a["causal"], a["scale"], a["lse"])
        if self.kind == "backward":
            return fs.backward_problem("fuzz", *(a[n] for n in self.TENSORS["backward"]), a["causal"], a["scale"],
                                       a["deterministic"])
        return fs.decode_problem("fuzz", *(a[n] for n in ("q", "k_cache", "v_cache", "o", "cache_seqlens",
                                                          "block_table", "causal", "scale", "max_seqlen_k",
                                                          "num_splits", "checked", "lse")))

    def expected(self) -> dict:
        """The fields an accepted call must give: the values passed, as Python has them."""
        a = self.args
        q, k = a["q"], a["k_cache" if self.kind == "decode" else "k"]
        v = a["v_cache" if self.kind == "decode" else "v"]
        b, sq, hq, d = q.shape
        scale = 1 / math.sqrt(d) if a["scale"] is None else a["scale"]
        want = {"batch": b, "seqlen_q": sq, "heads_q": hq, "heads_kv": k.shape[2], "head_dim": d,
                "causal": int(a["causal"]), "softmax_scale": float32(float(scale)), "q": q.stride(), "k": k.stride(),
                "v": v.stride(), "o": a["o"].stride() if a["o"] is not None else contiguous(q.shape)}
        if self.kind == "forward" or self.kind == "backward":
            want["seqlen_k"] = k.shape[1]
        if self.kind == "backward":
            want["deterministic"] = int(a["deterministic"])
            for g, like in (("d_o", q), ("dq", q), ("dk", k), ("dv", v)):
                want[g] = a[g].stride() if a[g] is not None else contiguous(like.shape)
        if self.kind == "decode":
            table = a["block_table"]
            paged = {"page_size": k.shape[1], "num_pages": k.shape[0], "max_pages_per_seq": table.shape[1],
                     "block_table_stride": table.stride()[0]} if table is not None else dict.fromkeys(
                         ("page_size", "num_pages", "max_pages_per_seq", "block_table_stride"), 0)
            capacity = k.shape[1] * (table.shape[1] if table is not None else 1)
            want.update(paged, seqlen_k=capacity if a["max_seqlen_k"] is None else a["max_seqlen_k"],
                        num_splits=a["num_splits"], checked=int(a["checked"]))
        return want


def fields(p) -> dict:
    got = {}
    for struct_ in (p, getattr(p, "attention", None)):
        for name, _ in (struct_._fields_ if struct_ is not None else ()):
            value = getattr(struct_, name)
            if name != "attention":
                got[name] = strides_of(value) if isinstance(value, fs.FsStrides) else value
    return got


class Fuzz(unittest.TestCase):
    def test_every_call_is_refused_or_gives_the_values_given(self):
        rng = random.Random(SEED)
        counts = {"drawn": 0, "refused": 0, "accepted": 0}
        for i in range(DRAWS):
            draw = Draw(rng, rng.choice(["forward", "backward", "decode"]))
            spoiled = rng.choice([0, 1, 1, 2, 3])
            for _ in range(spoiled):
                draw.spoil(rng)
            counts["drawn"] += 1
            try:
                p = draw.call()
            except fs.InvalidArgument as e:
                counts["refused"] += 1
                self.assertTrue(e.message, f"draw {i}: an empty refusal")
                self.assertTrue(spoiled, f"draw {i} ({draw.kind}, {draw.args}), valid, refused: {e.message}")
                continue
            except Exception as e:  # noqa: BLE001 (the point: nothing but InvalidArgument)
                self.fail(f"draw {i} ({draw.kind}, {draw.args}): {type(e).__name__}: {e}")
            counts["accepted"] += 1
            got, want = fields(p), draw.expected()
            self.assertEqual({n: got[n] for n in want}, want, f"draw {i} ({draw.kind}, {draw.args})")
        line = (f"fuzz: {counts['drawn']} Python argument sets drawn (seed {SEED}): {counts['refused']} refused with "
                f"InvalidArgument and a sentence, {counts['accepted']} accepted with every field as given")
        print("\n" + line)
        self.assertTrue(line in (REPO / "tests" / "README.md").read_text(), f"tests/README.md must quote: {line}")
        self.assertEqual(counts["drawn"], counts["refused"] + counts["accepted"])
        self.assertGreater(min(counts["refused"], counts["accepted"]), DRAWS // 10)  # both sides exercised


if __name__ == "__main__":
    unittest.main()
