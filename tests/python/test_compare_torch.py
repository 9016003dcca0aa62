"""bench/compare_torch.py without PyTorch or a GPU: its ctypes mirror of common/flash_steps.h (layout
checked against a C compiler, and against the built library when there is one), the shapes, the
ratios, and the rules it takes from the library (FLOPs, tolerance, speed-ups, the sweep)."""
import ctypes
import math
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "bench"))

import compare_torch as ct  # noqa: E402
import fs_results  # noqa: E402


def find_library():
    """$FLASH_STEPS_LIB, else build/libflash_steps.so (the README's build directory)."""
    return fs_results.library_path()


class Layout(unittest.TestCase):
    @unittest.skipUnless(shutil.which("cc"), "no C compiler")
    def test_struct_matches_the_header(self):
        src = r"""
#include <stddef.h>
#include <stdio.h>
#include "flash_steps.h"
int main(void) {
  printf("%zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(fs_problem), sizeof(fs_strides),
         offsetof(fs_problem, dtype), offsetof(fs_problem, causal), offsetof(fs_problem, softmax_scale),
         offsetof(fs_problem, q), offsetof(fs_problem, k), offsetof(fs_problem, o));
  return 0;
}
"""
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "layout.c").write_text(src)
            exe = Path(d) / "layout"
            subprocess.run(["cc", "-I", str(REPO / "common"), str(Path(d) / "layout.c"), "-o", str(exe)], check=True)
            want = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
        P = ct.FsProblem
        got = [ctypes.sizeof(P), ctypes.sizeof(ct.FsStrides), P.dtype.offset, P.causal.offset,
               P.softmax_scale.offset, P.q.offset, P.k.offset, P.o.offset]
        self.assertEqual(got, want)


class DecodeLayout(unittest.TestCase):
    @unittest.skipUnless(shutil.which("cc"), "no C compiler")
    def test_decode_struct_matches_the_header(self):
        src = r"""
#include <stddef.h>
#include <stdio.h>
#include "flash_steps.h"
int main(void) {
  printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(fs_decode_problem), offsetof(fs_decode_problem, softmax_scale),
         offsetof(fs_decode_problem, num_splits), offsetof(fs_decode_problem, checked),
         offsetof(fs_decode_problem, page_size), offsetof(fs_decode_problem, block_table_stride),
         offsetof(fs_decode_problem, q), offsetof(fs_decode_problem, k), offsetof(fs_decode_problem, o));
  return 0;
}
"""
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "layout.c").write_text(src)
            exe = Path(d) / "layout"
            subprocess.run(["cc", "-I", str(REPO / "common"), str(Path(d) / "layout.c"), "-o", str(exe)], check=True)
            want = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
        P = ct.FsDecodeProblem
        got = [ctypes.sizeof(P), P.softmax_scale.offset, P.num_splits.offset, P.checked.offset, P.page_size.offset,
               P.block_table_stride.offset, P.q.offset, P.k.offset, P.o.offset]
        self.assertEqual(got, want)


class DecodeArguments(unittest.TestCase):
    def test_shapes(self):
        self.assertEqual(ct.parse_decode_shape("8x32768x32x8"), (8, 32768, 32, 8))
        for bad in ("8x32768x32", "8x0x32x8", "axbxcxd", "8x32768x32x5"):
            with self.assertRaises(ValueError):
                ct.parse_decode_shape(bad)
        a = ct.parse_args(["--decode"])
        self.assertEqual(a.backends, "flash,cudnn")
        self.assertEqual(a.page_sizes, [16, 64, 256])
        shapes = ct.decode_shapes(a)
        self.assertEqual(len(shapes), 5 * 2 * 2)  # the shapes x seqlen_q 1, 4 x fp16, bf16
        self.assertEqual(ct.decode_describe(shapes[0]), "b1 sk131072 h32/8 sq1 d128 fp16")
        self.assertFalse(any(s["causal"] for s in shapes))
        a = ct.parse_args(["--decode", "--decode-causal", "--decode-shapes", "2x100x4x1", "--dtypes", "bf16",
                           "--decode-seqlens-q", "4", "--page-sizes"])
        shapes = ct.decode_shapes(a)
        self.assertEqual(len(shapes), 1)
        self.assertTrue(shapes[0]["causal"])
        self.assertEqual(a.page_sizes, [])
        self.assertEqual(ct.parse_args([]).backends, ",".join(ct.TORCH_BACKENDS))

    def test_hbm_ceiling_of_the_h200(self):
        h = ct.hbm_ceiling(str(REPO / "bench" / "results" / "ceilings-20261130-212215.json"))
        self.assertAlmostEqual(h["tbs"], 4.64364)

    def test_ratios_labels_and_table(self):
        shape = {"batch": 8, "seqlen_q": 1, "seqlen_k": 32768, "heads_q": 32, "heads_kv": 8, "head_dim": 128,
                 "dtype": "fp16", "causal": False}
        rows = [dict(shape, impl="torch_cudnn", kind="torch", entry="sdpa", page_size=0, status="ok", ms=0.2, gbs=4000),
                dict(shape, impl="10_decoding", kind="step", entry="decode", page_size=0, status="ok", ms=0.25,
                     gbs=3200, hbm_pct=69),
                dict(shape, impl="10_decoding", kind="step", entry="decode", page_size=64, status="ok", ms=0.3,
                     gbs=2667, hbm_pct=57),
                dict(shape, impl="07g_flash_attention2", kind="step", entry="forward", page_size=0, status="refused")]
        ct.add_decode_ratios(rows)
        self.assertAlmostEqual(rows[1]["x_cudnn"], 0.8)
        self.assertAlmostEqual(rows[2]["x_contiguous"], 0.25 / 0.3)
        self.assertNotIn("x_contiguous", rows[1])
        self.assertEqual([ct.decode_label(r) for r in rows], ["pt:cudnn", "10", "10 p64", "07g"])
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            ct.print_decode_table({"rows": rows, "environment": {"gpu": "H200"}, "commit": "x", "date": "d",
                                   "hbm": {"tbs": 4.64, "path": "c.json"}})
        text = out.getvalue()
        self.assertIn("b8 sk32768 h32/8 sq1 d128 fp16", text)
        self.assertIn("3200", text)
        self.assertIn("69% 0.80x", text)


@unittest.skipUnless(find_library().exists(), "libflash_steps.so not built (set FLASH_STEPS_LIB)")
class Library(unittest.TestCase):
    def setUp(self):
        self.lib = ct.FlashSteps(find_library())

    def test_registry(self):
        steps = self.lib.steps()
        self.assertGreaterEqual(len(steps), 1)
        self.assertEqual(steps[0]["id"], "01_naive")
        self.assertTrue(all(s["lesson"] for s in steps))
        self.assertEqual(steps[0]["dir"], "01_naive")
        self.assertTrue(all(s["forward"] or s["backward"] for s in steps))  # a step runs one pass or both
        self.assertTrue(steps[0]["forward"])

    def test_problem_init_and_strides(self):
        p = self.lib.problem(2, 512, 512, 16, 16, 128, "bf16", True)
        self.assertEqual((p.batch, p.seqlen_q, p.heads_q, p.head_dim, p.dtype, p.causal), (2, 512, 16, 128, 1, 1))
        self.assertAlmostEqual(p.softmax_scale, 128 ** -0.5, places=6)
        self.assertEqual((p.q.batch, p.q.row, p.q.head, p.q.dim), (512 * 16 * 128, 16 * 128, 128, 1))
        p = self.lib.problem(2, 512, 512, 16, 16, 128, "fp16", False, {"o": (1, 2, 3, 1)})
        self.assertEqual((p.o.batch, p.o.row, p.o.head, p.o.dim), (1, 2, 3, 1))
        self.assertIn("multiple of 8", self.lib.check("01_naive", p))  # the library read our struct

    def test_decode_problem(self):
        p = self.lib.decode_problem(2, 1, 4096, 32, 8, 128, "fp16", False, 64)
        self.assertEqual((p.page_size, p.num_pages, p.max_pages_per_seq, p.block_table_stride), (64, 128, 64, 64))
        self.assertEqual((p.k.batch, p.k.row, p.k.head, p.k.dim), (64 * 8 * 128, 8 * 128, 128, 1))
        self.assertEqual(self.lib.decode_kv_bytes(p), 2.0 * 2 * 4096 * 8 * 128 * 2)
        self.assertIn("page_size is 24", self.lib.decode_check("10_decoding", self.lib.decode_problem(
            2, 1, 4096, 32, 8, 128, "fp16", False, 24)))
        self.assertIn("has no decoding entry", self.lib.decode_check("01_naive", p))
        decoding = [s["id"] for s in self.lib.steps() if s["decodes"]]
        self.assertEqual(decoding, ["10_decoding"])
        run = self.lib.decode_runner("10_decoding", p, 0, 0, 0, 0, 0, 0, 0, 0)
        with self.assertRaises(RuntimeError) as e:
            run()
        self.assertIn("Q is a null pointer", str(e.exception))

    def test_refusals_are_sentences(self):
        p = self.lib.problem(2, 512, 512, 16, 16, 128, "fp16", False)
        self.assertIn("no step has id", self.lib.check("99_nothing", p))
        run = self.lib.runner("01_naive", p, 0, 0, 0, 0, 0, 0)
        with self.assertRaises(RuntimeError) as e:
            run()
        self.assertIn("null", str(e.exception))


class FakeTensor:
    """Just what problem_for_tensors reads of a torch tensor: shape, stride() and dtype."""

    def __init__(self, shape, dtype="torch.float16", strides=None):
        self.shape, self.dtype = tuple(shape), dtype
        self._strides = strides or tuple(int(math.prod(shape[i + 1:])) for i in range(len(shape)))

    def stride(self):
        return self._strides


@unittest.skipUnless(find_library().exists(), "libflash_steps.so not built (set FLASH_STEPS_LIB)")
class Tensors(unittest.TestCase):
    def setUp(self):
        self.lib = ct.FlashSteps(find_library())
        self.q = FakeTensor((2, 64, 8, 128))
        self.kv = FakeTensor((2, 96, 2, 128))

    def test_problem_from_tensors(self):
        p = self.lib.problem_for_tensors(self.q, self.kv, self.kv, self.q, True)
        self.assertEqual((p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim, p.causal),
                         (2, 64, 96, 8, 2, 128, 1))
        self.assertEqual((p.k.batch, p.k.row, p.k.head, p.k.dim), (96 * 2 * 128, 2 * 128, 128, 1))

    def test_dtype_mismatch_is_refused(self):
        bf = FakeTensor((2, 96, 2, 128), "torch.bfloat16")
        with self.assertRaises(ValueError) as e:
            self.lib.problem_for_tensors(self.q, bf, self.kv, self.q, False)
        self.assertIn("dtype mismatch: Q is torch.float16, K is torch.bfloat16", str(e.exception))
        f32 = FakeTensor((2, 64, 8, 128), "torch.float32")
        with self.assertRaises(ValueError) as e:
            self.lib.problem_for_tensors(f32, f32, f32, f32, False)
        self.assertIn("must be torch.float16 or torch.bfloat16", str(e.exception))

    def test_shapes_that_disagree_are_refused(self):
        with self.assertRaises(ValueError) as e:
            self.lib.problem_for_tensors(self.q, self.kv, FakeTensor((2, 95, 2, 128)), self.q, False)
        self.assertIn("V is (2, 95, 2, 128) but K is (2, 96, 2, 128)", str(e.exception))
        with self.assertRaises(ValueError) as e:
            self.lib.problem_for_tensors(FakeTensor((64, 8, 128)), self.kv, self.kv, self.q, False)
        self.assertIn("Q has 3 dimensions", str(e.exception))

    def test_non_contiguous_head_dim_is_refused_by_the_library(self):
        q = FakeTensor((2, 64, 8, 128), strides=(64 * 8 * 256, 8 * 256, 256, 2))
        p = self.lib.problem_for_tensors(q, self.kv, self.kv, self.q, False)
        self.assertIn("Q's head_dim stride is 2; the last dimension must be contiguous", self.lib.check("01_naive", p))


class Arguments(unittest.TestCase):
    def test_quick_and_default_args(self):
        a = ct.parse_args(["--quick"])
        self.assertTrue(a.quick)
        self.assertLessEqual(a.max_launch_ms, 50)
        a = ct.parse_args([])
        self.assertEqual((a.seqlens, a.head_dims, a.dtypes, a.tokens), (None, None, None, None))  # the library's
        self.assertEqual(a.ladder_seqlen, 2048)
        self.assertEqual(ct.parse_args(["--seqlens", "4096", "1024"]).seqlens, [4096, 1024])

    def test_ratios(self):
        rows = [{"impl": "torch_flash", "kind": "torch", "ms": 1.0}, {"impl": "torch_cudnn", "kind": "torch", "ms": 0.5},
                {"impl": "07", "kind": "step", "ms": 0.8}, {"impl": "01", "kind": "step", "status": "skipped"}]
        ct.add_ratios(rows)
        self.assertAlmostEqual(rows[2]["x_flash"], 1.25)
        self.assertAlmostEqual(rows[2]["x_cudnn"], 0.625)
        self.assertNotIn("x_flash", rows[3])

    def test_cudnn_version(self):
        self.assertEqual(ct.cudnn_version(91900), "9.19.0")
        self.assertEqual(ct.cudnn_version(None), "none")


@unittest.skipUnless(find_library().exists(), "libflash_steps.so not built (set FLASH_STEPS_LIB)")
class SharedRules(unittest.TestCase):
    """FLOPs, tolerance, speed-ups and the sweep come from the library (common/flash_steps.h)."""

    def setUp(self):
        self.lib = ct.FlashSteps(find_library())

    def test_sweep_shapes(self):
        s = self.lib.sweep_shape(2048, 128, False, "fp16", self.lib.sweep_tokens())
        self.assertEqual((s["batch"], s["heads"]), (8, 16))
        self.assertEqual(self.lib.sweep_shape(512, 64, True, "bf16", 16384)["heads"], 32)
        with self.assertRaises(ValueError) as e:
            self.lib.sweep_shape(3000, 128, False, "fp16", 16384)
        self.assertIn("seqlen is 3000", str(e.exception))

    def test_default_and_quick_sweeps(self):
        a = ct.parse_args([])
        shapes, ladder = ct.plan_shapes(a, self.lib)
        self.assertEqual(a.seqlens, [512, 1024, 2048, 4096, 8192, 16384])
        self.assertEqual((a.head_dims, a.dtypes, a.tokens), ([128, 64], ["fp16", "bf16"], 16384))
        self.assertEqual(len(shapes), 6 * 2 * 2 * 2)
        self.assertEqual((ladder["batch"], ladder["seqlen"], ladder["heads"]), (8, 2048, 16))
        a = ct.parse_args(["--quick"])
        shapes, _ = ct.plan_shapes(a, self.lib)
        self.assertEqual((a.seqlens, a.head_dims, a.dtypes), ([1024, 2048, 4096], [128], ["fp16"]))
        self.assertEqual(len(shapes), 3 * 2)
        with self.assertRaises(ValueError):
            ct.plan_shapes(ct.parse_args(["--seqlens", "3000"]), self.lib)

    def test_sweep_order_groups_then_seqlen_ascending(self):
        shapes = ct.sweep_shapes(self.lib, [4096, 512], [128, 64], [False, True], ["fp16"], 16384)
        self.assertEqual(len(shapes), 8)
        self.assertEqual([s["seqlen"] for s in shapes[:2]], [512, 4096])
        self.assertEqual(len({ct.shape_key(s) for s in shapes}), 8)

    def test_flops(self):
        s = self.lib.sweep_shape(2048, 128, False, "fp16", 16384)
        self.assertEqual(self.lib.shape_flops(s), 4.0 * 8 * 16 * 2048 * 2048 * 128)
        self.assertEqual(self.lib.shape_flops(dict(s, causal=True)), 2.0 * 8 * 16 * 2048 * 2048 * 128)

    def test_tolerance(self):
        atol, rtol, lse_tol = self.lib.tolerance("bf16", 2.0)
        self.assertEqual((atol, rtol, lse_tol), (2 * 2.0 ** -7, 2.0 ** -7, 1e-4))
        with self.assertRaises(ValueError):
            self.lib.tolerance("fp16", float("nan"))

    def test_speedups_of_a_shape(self):
        rows = [{"impl": "torch_flash", "kind": "torch", "status": "ok", "ms": 1.0},
                {"impl": "01_naive", "kind": "step", "status": "ok", "ms": 40.0},
                {"impl": "03_tiled", "kind": "step", "status": "ok", "ms": 10.0},
                {"impl": "04_pad", "kind": "step", "status": "ok", "ms": 5.0},
                {"impl": "04_swizzle", "kind": "step", "status": "fail", "ms": 8.0},
                {"impl": "05_async", "kind": "step", "status": "ok", "ms": 4.0},
                {"impl": "06_mma", "kind": "step", "status": "skipped"}]
        ct.add_speedups(self.lib, rows)
        by = {r["impl"]: r for r in rows}
        self.assertNotIn("x_prev", by["torch_flash"])
        self.assertNotIn("x_prev", by["01_naive"])
        self.assertEqual(by["01_naive"]["x_step01"], 1.0)
        self.assertEqual(by["04_pad"]["x_prev"], 2.0)        # against 03
        self.assertEqual(by["04_swizzle"]["x_prev"], 1.25)   # against 03 too (timed, though its check failed)
        self.assertEqual(by["05_async"]["x_prev"], 1.25)     # against the faster 04
        self.assertEqual(by["05_async"]["x_step01"], 10.0)
        self.assertNotIn("x_step01", by["06_mma"])


if __name__ == "__main__":
    unittest.main()


class MeasureShapes(unittest.TestCase):
    """The loop both sweeps share: rows appended, files written even when a shape fails, exit status."""

    class FakeSweep:
        def __init__(self, fail_at=None):
            self.fail_at = fail_at

        def shape(self, si, shape):
            if si == self.fail_at:
                raise RuntimeError("interrupted")
            return [{"impl": "x", "status": "ok" if shape != "bad" else "fail"}]

    def run_sweep(self, shapes, sweep, d):
        result = {"date": "d", "commit": "c", "environment": {"gpu": "g"}, "complete": False, "rows": []}
        tables = []
        status = ct.measure_shapes(result, shapes, sweep, Path(d) / "out", ["impl", "status"],
                                   heading=lambda s: f"{s}  (", cell=lambda r: r["status"], table=tables.append)
        return result, status, tables

    def test_every_shape_measured_and_written(self):
        with tempfile.TemporaryDirectory() as d:
            result, status, tables = self.run_sweep(["a", "b"], self.FakeSweep(), d)
            self.assertEqual(status, 0)
            self.assertTrue(result["complete"])
            self.assertEqual(len(result["rows"]), 2)
            self.assertEqual(tables, [result])
            self.assertTrue((Path(d) / "out.json").exists() and (Path(d) / "out.csv").exists())
            _, status, _ = self.run_sweep(["a", "bad"], self.FakeSweep(), d)
            self.assertEqual(status, 1)

    def test_an_interrupted_run_still_writes_what_it_measured(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(RuntimeError):
                self.run_sweep(["a", "b", "c"], self.FakeSweep(fail_at=1), d)
            import json
            written = json.loads((Path(d) / "out.json").read_text())
            self.assertFalse(written["complete"])
            self.assertEqual(len(written["rows"]), 1)
