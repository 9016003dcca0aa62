"""bench/varlen_bench.py without PyTorch or a GPU: the lengths (seeded, within bounds), the offsets and the mean,
the sequences checked, the command line (--help without PyTorch), the problem of a packed batch without tensors,
its FLOPs against a brute-force count over every (row, key) pair (with the library), the ratios and table,
the timing loop and the backward's judgement on stand-ins, and FlashAttention-4's varlen function found or not."""
import contextlib
import io
import os
import subprocess
import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "bench"))
sys.path.insert(0, str(HERE))

import fs_results  # noqa: E402
import varlen_bench as vb  # noqa: E402
from test_fs_results import fa4_stub  # noqa: E402

LIB = fs_results.library_path()  # $FLASH_STEPS_LIB (ctest sets it), else build/libflash_steps.so
needs_lib = unittest.skipUnless(LIB.exists(), "libflash_steps.so not built (set FLASH_STEPS_LIB)")
SCRIPT = HERE.parent.parent / "bench" / "varlen_bench.py"


def parse_fails(argv) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), unittest.TestCase().assertRaises(SystemExit):
        vb.parse_args(argv)
    return err.getvalue()


class Lengths(unittest.TestCase):
    def test_seeded_and_within_bounds(self):
        a = vb.draw_lengths(64, 128, 8192, 0)
        self.assertEqual(a, vb.draw_lengths(64, 128, 8192, 0))  # the same seed, the same lengths
        self.assertNotEqual(a, vb.draw_lengths(64, 128, 8192, 1))
        self.assertEqual(len(a), 64)
        self.assertTrue(all(128 <= n <= 8192 and isinstance(n, int) for n in a))
        self.assertEqual(a[:4], [7045, 3283, 6337, 7420])  # random.Random(0).randint: stable across Python 3 versions
        many = vb.draw_lengths(4000, 3, 7, 5)
        self.assertEqual(set(many), {3, 4, 5, 6, 7})  # both ends drawn
        self.assertEqual(vb.draw_lengths(3, 9, 9, 2), [9, 9, 9])

    def test_offsets_and_mean(self):
        self.assertEqual(vb.offsets([3, 0, 5]), [0, 3, 3, 8])
        self.assertEqual(vb.offsets([]), [0])
        self.assertEqual(vb.mean_length([1, 2]), 2)  # 1.5: halves up
        self.assertEqual(vb.mean_length([1, 2, 2]), 2)  # 1.67
        self.assertEqual(vb.mean_length([128, 8192]), 4160)
        self.assertEqual(vb.mean_length([2, 3, 3, 3]), 3)  # 2.75

    def test_checked_sequences(self):
        lengths = [50, 10, 90, 30, 70, 20]
        self.assertEqual(vb.checked_sequences(lengths, 4), [0, 1, 2, 5])  # first, last, shortest, longest
        self.assertEqual(vb.checked_sequences(lengths, 2), [0, 5])
        self.assertEqual(vb.checked_sequences(lengths, 0), [])
        self.assertEqual(vb.checked_sequences(lengths, 99), list(range(6)))
        self.assertEqual(len(vb.checked_sequences(vb.draw_lengths(64, 128, 8192, 0), 6)), 6)
        self.assertEqual(vb.checked_sequences([5], 4), [0])


class Arguments(unittest.TestCase):
    def test_defaults(self):
        a = vb.parse_args([])
        self.assertEqual((a.sequences, a.min_len, a.max_len, a.seed), (64, 128, 8192, 0))
        self.assertEqual((a.dtype, a.head_dims, a.causal, a.passes, a.step), ("fp16", [128, 64], "both",
                                                                             ("fwd", "bwd"), "13c_varlen"))
        self.assertEqual((a.window, a.softcap, a.iters, a.no_fa4), (None, 0.0, 20, False))
        self.assertEqual([vb.heads_of(a, d) for d in (128, 64, 256)], [(16, 16), (32, 32), (8, 8)])
        self.assertEqual(vb.heads_of(vb.parse_args(["--heads", "32", "--kv-heads", "8"]), 64), (32, 8))
        self.assertEqual(vb.heads_of(vb.parse_args(["--kv-heads", "4"]), 128), (16, 4))

    def test_window_passes_softcap(self):
        self.assertEqual(vb.parse_args(["--window", "1024,0"]).window, (1024, 0))
        self.assertEqual(vb.parse_args(["--window=-1,32"]).window, (-1, 32))
        self.assertEqual(vb.parse_args(["--passes", "bwd"]).passes, ("bwd",))
        self.assertEqual(vb.parse_args(["--passes", "bwd,fwd,bwd"]).passes, ("bwd", "fwd"))
        self.assertEqual(vb.parse_args(["--softcap", "30"]).softcap, 30.0)
        self.assertIn("--window expects L,R", parse_fails(["--window", "3"]))
        self.assertIn("got '-2,0'", parse_fails(["--window=-2,0"]))
        self.assertIn("--passes expects fwd, bwd or fwd,bwd", parse_fails(["--passes", "fwd,dq"]))

    def test_refusals(self):
        self.assertIn("1 <= min <= max", parse_fails(["--min-len", "900", "--max-len", "100"]))
        self.assertIn("1 <= min <= max", parse_fails(["--min-len", "0"]))
        self.assertIn("--sequences must be at least 1", parse_fails(["--sequences", "0"]))
        self.assertIn("fewer than 2^31 rows", parse_fails(["--sequences", "300000", "--max-len", "8192"]))
        self.assertIn("multiples of 8", parse_fails(["--head-dims", "100"]))
        self.assertIn("not a multiple of --kv-heads 3", parse_fails(["--kv-heads", "3"]))
        self.assertIn("--softcap must be finite", parse_fails(["--softcap", "-1"]))
        self.assertIn("--softcap must be finite", parse_fails(["--softcap", "inf"]))

    def test_help_without_torch(self):
        env = dict(os.environ, PYTHONPATH="")
        code = (f"import runpy, sys\nsys.argv = [{str(SCRIPT)!r}, '--help']\n"
                f"try:\n    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
                "except SystemExit as e:\n    assert e.code in (0, None), e.code\n"
                "assert 'torch' not in sys.modules, 'torch imported by --help'\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                             cwd=str(SCRIPT.parent), timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("--sequences", out.stdout)
        self.assertIn("13c_varlen", out.stdout)
        self.assertIn("The table's two ratios", out.stdout)
        self.assertNotIn("MISS", out.stdout)


class Problem(unittest.TestCase):
    def test_the_packed_batch_without_tensors(self):
        lengths = [7, 0, 300, 64]
        p = vb.stand_in_problem(lengths, 8, 2, 64, "bf16", True, (16, 0), 5.0)
        self.assertEqual((p.batch, p.seqlen_q, p.seqlen_k, p.total_q, p.total_k), (4, 300, 300, 371, 371))
        self.assertEqual((p.heads_q, p.heads_kv, p.head_dim, p.causal), (8, 2, 64, 1))
        self.assertEqual((p.window, p.window_left, p.window_right, p.softcap), (1, 16, 0, 5.0))
        self.assertEqual((p.q.batch, p.q.row, p.k.row), (0, 8 * 64, 2 * 64))  # packed: batch stride 0
        self.assertTrue(p.cu_seqlens_q and p.cu_seqlens_k)
        self.assertEqual(vb.stand_in_problem([5], 4, 4, 128, "fp16", False).window, 0)


def brute_pairs(lq: int, lk: int, causal: bool, window) -> float:
    """The pairs fs_problem_flops counts, by the definition: every (row, key) pair fs_results.visible lets attend,
    but causal without a window, which FlashAttention's convention counts as Sq*Sk/2."""
    if causal and window is None:
        return lq * lk / 2
    return sum(fs_results.visible(i, j, lq, lk, causal, window) for i in range(lq) for j in range(lk))


@needs_lib
class Flops(unittest.TestCase):
    def setUp(self):
        self.lib = vb.flash_steps.library(LIB)

    def test_varlen_flops_against_brute_force(self):
        for lengths in ([1, 5, 17, 64, 3], [0, 9, 0, 33], [40]):
            for causal in (False, True):
                for window in (None, (2, 0), (0, 3), (-1, 4), (3, -1), (0, 0), (100, 100)):
                    want = sum(4 * 6 * 16 * brute_pairs(n, n, causal, window) for n in lengths)
                    got = vb.varlen_flops(self.lib, lengths, 6, 3, 16, "fp16", causal, window)
                    self.assertAlmostEqual(got, want, delta=1e-9 * max(want, 1), msg=(lengths, causal, window))

    def test_dense_flops_is_the_same_rule(self):
        for causal in (False, True):
            for window in (None, (4, 0), (3, 5)):
                want = 3 * 4 * 2 * 8 * brute_pairs(21, 21, causal, window)
                self.assertAlmostEqual(vb.dense_flops(self.lib, 3, 21, 2, 2, 8, "fp16", causal, window), want)
                self.assertAlmostEqual(vb.varlen_flops(self.lib, [21] * 3, 2, 2, 8, "fp16", causal, window), want)

    def test_default_batch(self):
        lengths = vb.draw_lengths(64, 128, 8192, 0)
        got = vb.varlen_flops(self.lib, lengths, 16, 16, 128, "fp16", False)
        self.assertEqual(got, 4 * 16 * 128 * sum(n * n for n in lengths))
        self.assertEqual(vb.varlen_flops(self.lib, lengths, 16, 16, 128, "fp16", True), got / 2)


def row(ps, impl, layout, ms, flops=1e12, status="ok", **kw):
    r = {"direction": ps, "impl": impl, "layout": layout, "head_dim": 128, "heads_q": 16, "heads_kv": 16, "causal": False,
         "window_left": None, "window_right": None, "softcap": 0.0, "dtype": "fp16", "status": status, "reason": "",
         "flops": flops}
    if ms:
        r.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
    r.update(kw)
    return r


RESULT = {"date": "2026-12-07T00:00:00Z", "commit": "abc", "environment": {"gpu": "H200", "fa4": "4.0.0b36"},
          "step": "13c_varlen", "passes": ["fwd", "bwd"], "sequences": 64, "min_len": 128, "max_len": 8192,
          "total_tokens": 295274, "mean_len": 4614, "notes": []}


class Table(unittest.TestCase):
    def rows(self):
        rows = [row("fwd", "fa4", "varlen", 2.0), row("fwd", "fa4", "dense", 1.9, flops=1.1e12),
                row("fwd", "ours", "varlen", 1.8), row("fwd", "ours", "dense", 1.5, flops=1.1e12),
                row("bwd", "fa4", "varlen", 5.0, flops=2.5e12), row("bwd", "ours", "varlen", 6.0, flops=2.5e12,
                                                                    status="fail", reason="check failed: dq"),
                row("bwd", "ours", "dense", None, status="refused", reason="13c_varlen: no")]
        for ps in ("fwd", "bwd"):
            vb.add_ratios([r for r in rows if r["direction"] == ps])
        return rows

    def test_ratios(self):
        r = {(x["direction"], x["impl"], x["layout"]): x for x in self.rows()}
        ours = r[("fwd", "ours", "varlen")]
        self.assertAlmostEqual(ours["x_dense"], (1e12 / 1.8) / (1.1e12 / 1.5))
        self.assertAlmostEqual(ours["x_fa4"], 2.0 / 1.8)  # the same FLOPs: FA4's ms over ours
        self.assertAlmostEqual(r[("fwd", "ours", "dense")]["x_fa4"], 1.9 / 1.5)
        self.assertAlmostEqual(r[("fwd", "fa4", "varlen")]["x_dense"], (1e12 / 2.0) / (1.1e12 / 1.9))
        self.assertNotIn("x_fa4", r[("fwd", "fa4", "varlen")])
        self.assertNotIn("x_dense", r[("bwd", "ours", "varlen")])  # its dense row was refused
        self.assertAlmostEqual(r[("bwd", "ours", "varlen")]["x_fa4"], 5.0 / 6.0)  # a failed check is still timed

    def test_table(self):
        text = vb.table(dict(RESULT, rows=self.rows()))
        self.assertIn("forward: TFLOP/s (median, real pairs), step 13c_varlen, H200", text)
        self.assertIn("fa4 = FA4 4.0.0b36", text)
        fwd = next(line for line in text.splitlines() if line.startswith("d128"))
        self.assertEqual(fwd.split(), ["d128", "h16/16", "fp16", "555.6", "733.3", "0.76x", "500.0", "1.11x",
                                       "578.9"])
        bwd = [line for line in text.splitlines() if line.startswith("d128")][1]
        self.assertEqual(bwd.split(), ["d128", "h16/16", "fp16", "416.7!", "refused", "-", "500.0", "0.83x", "-"])
        self.assertIn("bwd ours varlen d128 h16/16 fp16: fail: check failed: dq", text)
        self.assertIn("bwd ours dense d128 h16/16 fp16: refused: 13c_varlen: no", text)

    def test_describe(self):
        self.assertEqual(vb.describe(row("fwd", "ours", "varlen", 1.0, causal=True, window_left=1024, window_right=0,
                                         softcap=30.0)), "d128 h16/16 fp16 causal window 1024,0 softcap 30")


class FakeTimer:
    def __init__(self):
        self.calls = []

    def times(self, fn, n):
        self.calls.append((fn, n))
        return [fn()] * n


class FakeLibrary:
    def backward_bound(self, dtype, ref_err, max_abs_exact):  # fs_backward_bound's rule
        return 2 * ref_err + {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}[dtype] * max_abs_exact


def bench(**args):
    b = object.__new__(vb.Bench)
    b.args = vb.parse_args([])
    for k, v in args.items():
        setattr(b.args, k, v)
    b.timer, b.lib = FakeTimer(), FakeLibrary()
    return b


class Timing(unittest.TestCase):
    def test_interleaved_rounds_and_median(self):
        b = bench(iters=6, warmup=2)
        a, c = row("fwd", "fa4", "varlen", None, status=""), row("fwd", "ours", "varlen", None, status="")

        def broken():
            raise RuntimeError("launch failed\nmore")

        def fa(): return 2.0  # noqa: E704

        def ours(): return 1.0  # noqa: E704
        e = row("fwd", "ours", "dense", None, status="")
        b.timed([(a, fa, True, ""), (c, ours, False, "check failed: x"), (e, broken, True, "")])
        self.assertEqual((a["status"], a["ms"], a["iters"], a["tflops"]), ("ok", 2.0, 6, 500.0))
        self.assertEqual((c["status"], c["ms"], c["reason"]), ("fail", 1.0, "check failed: x"))
        self.assertEqual((e["status"], e["reason"]), ("error", "launch failed"))
        self.assertEqual([n for fn, n in b.timer.calls if fn is fa], [2, 2, 2, 1, 1])  # warm-up, then 6 in 4 rounds
        order = [fn.__name__ for fn, _ in b.timer.calls if fn is not broken]
        self.assertEqual(order, ["fa", "fa", "ours", "ours", "ours", "fa", "fa", "ours", "ours", "fa"])


class Judged(unittest.TestCase):
    def test_bound_per_sequence(self):
        b = bench()
        errors = {0: {"dq": (1e-3, 1.0), "dk": (2e-3, 2.0), "dv": (1e-4, 1.0), "nonfinite": 0},
                  5: {"dq": (3e-3, 1.0), "dk": (1e-3, 1.0), "dv": (1e-4, 1.0), "nonfinite": 0}}
        ref = {0: {"dq": (1e-3, 1.0), "dk": (1e-3, 2.0), "dv": (1e-4, 1.0)},
               5: {"dq": (1e-3, 1.0), "dk": (1e-3, 1.0), "dv": (1e-4, 1.0)}}
        res = b.judged(errors, ref, "fa4", 0)
        self.assertEqual((res["dq_err"], res["dk_err"], res["ref_impl"]), (3e-3, 2e-3, "fa4"))
        self.assertAlmostEqual(res["dq_ratio"], 3e-3 / (2e-3 + 2.0 ** -11))  # sequence 5's bound: its max|exact| 1
        self.assertFalse(res["pass"])
        self.assertIn("dq error", res["why"])
        self.assertTrue(b.judged({0: errors[0]}, {0: ref[0]}, "fa4", 0)["pass"])
        self.assertFalse(b.judged({0: errors[0]}, {0: ref[0]}, "fa4", 3)["pass"])  # NaN or inf in the gradients

    def test_without_a_reference_error(self):
        b = bench()
        errors = {0: {"dq": (1.0, 1.0), "dk": (1.0, 1.0), "dv": (1.0, 1.0), "nonfinite": 0}}
        res = b.judged(errors, None, "torch_flash", 0)
        self.assertTrue(res["pass"])
        self.assertIn("not judged", res["reason"])
        self.assertNotIn("reason", b.judged(errors, None, "", 0, own_reference=True))


class FlashAttention4(unittest.TestCase):
    def test_absent(self):
        with fa4_stub(None):
            notes = []
            self.assertIsNone(vb.fa4_varlen_function(notes, True))
            self.assertEqual(notes, [fs_results.FA4_MISSING])

    def test_left_out(self):
        notes = []
        self.assertIsNone(vb.fa4_varlen_function(notes, False))
        self.assertIn("--no-fa4", notes[0])

    def test_present(self):
        with fa4_stub("4.0.0b36"):
            notes = []
            self.assertIsNone(vb.fa4_varlen_function(notes, True))  # the stub has no flash_attn_varlen_func
            self.assertEqual(notes, ["FlashAttention-4 4.0.0b36 has no flash_attn_varlen_func: no fa4 columns"])
            sys.modules["flash_attn.cute"].flash_attn_varlen_func = f = object()
            notes = []
            self.assertIs(vb.fa4_varlen_function(notes, True), f)
            self.assertEqual(notes, [])


if __name__ == "__main__":
    unittest.main()
