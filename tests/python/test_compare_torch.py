"""bench/compare_torch.py without PyTorch or a GPU: the shapes, the ratios, the rules it takes from the
library through the flash_steps package (FLOPs, tolerance, speed-ups, the sweep), the measuring loop
and the backward mode's check and table. The package's own tests: test_flash_steps.py."""
import contextlib
import io
import json
import math
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
        self.lib = ct.load_library(find_library())

    def test_steps_as_dicts(self):
        steps = ct.steps_of(self.lib)
        self.assertEqual(steps[0]["id"], "01_naive")
        self.assertEqual(set(steps[0]), {"id", "name", "lesson", "dir", "min_compute_capability", "decodes",
                                         "has_forward", "has_backward"})
        self.assertTrue(all(s["has_forward"] or s["has_backward"] for s in steps))  # a step runs one pass or both
        self.assertTrue(steps[0]["has_forward"])
        json.dumps(steps)  # they go into the results file

    def test_refusal_is_the_sentence(self):
        p = self.lib.problem(2, 512, 512, 16, 16, 12, "fp16", False)
        self.assertIn("head_dim is 12", ct.refusal(self.lib.check, "07g_flash_attention2", p))
        p = self.lib.decode_problem(2, 1, 4096, 32, 8, 128, "fp16", False, 64)
        self.assertIn("has no decoding entry", ct.refusal(self.lib.decode_check, "01_naive", p))
        self.assertEqual(ct.refusal(lambda: None), "")


class FakeTensor:
    """Just what problem_for_tensors reads of a torch tensor: shape, stride(), dtype and device."""

    def __init__(self, shape, dtype="torch.float16", strides=None):
        self.shape, self.dtype, self.device = tuple(shape), dtype, "cuda:0"
        self._strides = strides or tuple(int(math.prod(shape[i + 1:])) for i in range(len(shape)))

    def stride(self):
        return self._strides


class Tensors(unittest.TestCase):
    def setUp(self):
        self.q = FakeTensor((2, 64, 8, 128))
        self.kv = FakeTensor((2, 96, 2, 128))

    def test_problem_from_tensors(self):
        p = ct.problem_for_tensors(self.q, self.kv, self.kv, self.q, True)
        self.assertEqual((p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim, p.causal),
                         (2, 64, 96, 8, 2, 128, 1))
        self.assertEqual((p.k.batch, p.k.row, p.k.head, p.k.dim), (96 * 2 * 128, 2 * 128, 128, 1))

    def test_dtype_mismatch_is_refused(self):
        bf = FakeTensor((2, 96, 2, 128), "torch.bfloat16")
        with self.assertRaises(ValueError) as e:
            ct.problem_for_tensors(self.q, bf, self.kv, self.q, False)
        self.assertIn("dtype mismatch: Q is torch.float16, K is torch.bfloat16", str(e.exception))
        f32 = FakeTensor((2, 64, 8, 128), "torch.float32")
        with self.assertRaises(ValueError) as e:
            ct.problem_for_tensors(f32, f32, f32, f32, False)
        self.assertIn("must be torch.float16 or torch.bfloat16", str(e.exception))

    def test_shapes_that_disagree_are_refused(self):
        with self.assertRaises(ValueError) as e:
            ct.problem_for_tensors(self.q, self.kv, FakeTensor((2, 95, 2, 128)), self.q, False)
        self.assertIn("V is (2, 95, 2, 128) but K is (2, 96, 2, 128)", str(e.exception))
        with self.assertRaises(ValueError) as e:
            ct.problem_for_tensors(FakeTensor((64, 8, 128)), self.kv, self.kv, self.q, False)
        self.assertIn("Q has 3 dimensions", str(e.exception))

    def test_non_contiguous_head_dim_is_refused(self):
        q = FakeTensor((2, 64, 8, 128), strides=(64 * 8 * 256, 8 * 256, 256, 2))
        with self.assertRaises(ValueError) as e:
            ct.problem_for_tensors(q, self.kv, self.kv, self.q, False)
        self.assertIn("Q's last dimension (head_dim) has stride 2; it must be 1", str(e.exception))


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

    def test_load_failure_is_a_message(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(ct.main(["--lib", "/nowhere/libflash_steps.so"]), 1)
            self.assertEqual(ct.main(["--backward", "--lib", "/nowhere/libflash_steps.so"]), 1)
        self.assertIn("/nowhere/libflash_steps.so does not exist", err.getvalue())

    def test_cudnn_version(self):
        self.assertEqual(ct.cudnn_version(91900), "9.19.0")
        self.assertEqual(ct.cudnn_version(None), "none")


@unittest.skipUnless(find_library().exists(), "libflash_steps.so not built (set FLASH_STEPS_LIB)")
class SharedRules(unittest.TestCase):
    """FLOPs, tolerance, speed-ups and the sweep come from the library (common/flash_steps.h)."""

    def setUp(self):
        self.lib = ct.load_library(find_library())

    def test_sweep_shapes(self):
        s = ct.sweep_shape(self.lib, 2048, 128, False, "fp16", self.lib.sweep_tokens())
        self.assertEqual((s["batch"], s["heads"]), (8, 16))
        self.assertEqual(ct.sweep_shape(self.lib, 512, 64, True, "bf16", 16384)["heads"], 32)
        with self.assertRaises(ValueError) as e:
            ct.sweep_shape(self.lib, 3000, 128, False, "fp16", 16384)
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
        s = ct.sweep_shape(self.lib, 2048, 128, False, "fp16", 16384)
        self.assertEqual(ct.shape_flops(self.lib, s), 4.0 * 8 * 16 * 2048 * 2048 * 128)
        self.assertEqual(ct.shape_flops(self.lib, dict(s, causal=True)), 2.0 * 8 * 16 * 2048 * 2048 * 128)
        self.assertEqual(ct.backward_shape_flops(self.lib, s), 2.5 * 4.0 * 8 * 16 * 2048 * 2048 * 128)

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


class FakeBoundLibrary:
    """fs_backward_bound's rule (test_flash_steps checks the library gives the same)."""

    def backward_bound(self, dtype, ref_err, max_abs_exact):
        return 2 * ref_err + {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}[dtype] * max_abs_exact


class FakeTimer:
    def __init__(self, ms):
        self.ms, self.calls = ms, 0

    def times(self, fn, n):
        self.calls += n
        return [self.ms] * n


class Backward(unittest.TestCase):
    """--backward without a GPU: its arguments, labels, the check by fs_backward_bound, the measuring of
    one row with a fake timer, and the loop and table with a fake sweep."""

    def sweep(self):
        s = object.__new__(ct.BackwardSweep)  # what judged() and measure() use, without PyTorch
        s.lib, s.args = FakeBoundLibrary(), ct.parse_args(["--backward"])
        s.timer, s.last, s.limit_ms = FakeTimer(2.0), {}, 100.0
        s.ref_err, s.ref_impl = None, ""
        return s

    def test_arguments(self):
        a = ct.parse_args(["--backward"])
        self.assertTrue(a.backward)
        self.assertEqual(a.backends, "flash,cudnn,efficient")
        self.assertEqual(a.forward_step, "")
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            ct.parse_args(["--backward", "--decode"])

    def test_labels(self):
        self.assertEqual([ct.backward_label(i) for i in ("torch_flash", "11_backward", "11_backward:det")],
                         ["pt:flash", "11", "11 det"])

    def test_check_by_the_bound(self):
        s = self.sweep()
        flash = {"dq": (0.01, 4.0), "dk": (0.02, 8.0), "dv": (0.005, 2.0), "nonfinite": 0}
        res = s.judged("fp16", flash, own_reference=True)  # the reference backend: its own errors, no bound
        self.assertTrue(res["pass"])
        self.assertEqual((res["dq_err"], res.get("dq_bound")), (0.01, None))
        s.ref_err, s.ref_impl = flash, "torch_flash"
        ours = {"dq": (0.02, 4.0), "dk": (0.05, 8.0), "dv": (0.0, 2.0), "nonfinite": 0}
        res = s.judged("fp16", ours, own_reference=False)
        self.assertAlmostEqual(res["dq_bound"], 2 * 0.01 + 2.0 ** -11 * 8.0)  # u times the largest of the three
        self.assertFalse(res["pass"])
        self.assertTrue(res["why"].startswith("check failed: dk error 0.05 over the bound 0.0439"), res["why"])
        self.assertIn("ref_err of torch_flash", res["why"])
        self.assertEqual(res["ref_impl"], "torch_flash")
        res = s.judged("fp16", dict(ours, dk=(0.0, 8.0), nonfinite=3), own_reference=False)
        self.assertEqual(res["why"].split(" (")[0], "check failed: 3 non-finite elements")
        self.assertTrue(s.judged("bf16", dict(ours, dk=(0.0, 8.0)), own_reference=False)["pass"])
        s.ref_err = None
        self.assertIn("no SDPA backend gave the reference error", s.judged("fp16", ours, False)["why"])

    def test_one_row_measured(self):
        s = self.sweep()
        s.ref_err, s.ref_impl = {"dq": (0.01, 4.0), "dk": (0.02, 8.0), "dv": (0.005, 2.0), "nonfinite": 0}, "torch_flash"
        row = {"impl": "11_backward", "flops": 5e12, "head_dim": 128, "causal": False, "dtype": "fp16"}
        s.measure(row, lambda: None, lambda: s.judged("fp16", {"dq": (0.0, 4.0), "dk": (0.1, 8.0), "dv": (0.0, 2.0),
                                                                "nonfinite": 0}, False))
        self.assertEqual((row["status"], row["ms"]), ("fail", 2.0))
        self.assertAlmostEqual(row["tflops"], 2500.0)
        self.assertTrue(row["reason"].startswith("check failed: dk error 0.1 over the bound"))

    class FakeBackwardSweep:
        def shape(self, si, shape):
            rows = [("torch_flash", "torch", False, 1.0), ("torch_cudnn", "torch", False, 0.8),
                    ("11_backward", "step", False, 1.25), ("11_backward:det", "step", True, 2.0)]
            out = [dict(shape, impl=i, kind=k, deterministic=d, status="ok", ms=ms, tflops=10.0 / ms, reason="")
                   for i, k, d, ms in rows]
            ct.add_ratios(out)
            return out

    def test_the_loop_files_and_table(self):
        shape = {"batch": 8, "seqlen": 2048, "heads": 16, "head_dim": 128, "causal": True, "dtype": "bf16"}
        result = {"date": "d", "commit": "c", "environment": {"gpu": "H200"}, "complete": False, "rows": []}
        out, err = io.StringIO(), io.StringIO()
        with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = ct.measure_shapes(result, [shape], self.FakeBackwardSweep(), Path(d) / "bw",
                                       ct.BACKWARD_CSV_FIELDS, heading=lambda s: f"{ct.describe(s)}  (",
                                       cell=lambda r: ct.backward_label(r["impl"]),
                                       table=lambda r: ct.print_table(r, labeler=ct.backward_label))
            csv_text = (Path(d) / "bw.csv").read_text()
        self.assertEqual(status, 0)
        self.assertTrue(result["complete"])
        self.assertEqual(csv_text.splitlines()[0].split(",")[:6], ["date", "commit", "gpu", "impl", "kind",
                                                                  "deterministic"])
        self.assertIn("11_backward:det,step,True", csv_text)
        by = {r["impl"]: r for r in result["rows"]}
        self.assertAlmostEqual(by["11_backward"]["x_flash"], 0.8)
        self.assertAlmostEqual(by["11_backward:det"]["x_cudnn"], 0.4)
        table = out.getvalue().splitlines()
        head = next(line for line in table if line.startswith("shape"))
        self.assertEqual(head.split()[1:], ["pt:flash", "pt:cudnn", "11", "11", "det"])
        self.assertIn("b8 h16 n2048 d128 bf16 causal", out.getvalue())
        self.assertIn("8.0", out.getvalue())

    @unittest.skipUnless(find_library().exists(), "libflash_steps.so not built (set FLASH_STEPS_LIB)")
    def test_shapes(self):
        lib = ct.load_library(find_library())
        a = ct.parse_args(["--backward"])
        shapes = ct.backward_shapes(a, lib)
        self.assertEqual(a.seqlens, [1024, 2048, 4096, 8192, 16384])  # issue 15: N 1k-16k
        self.assertEqual(len(shapes), 5 * 2 * 2 * 2)
        a = ct.parse_args(["--backward", "--seqlens", "512", "--head-dims", "64", "--causal", "on", "--dtypes", "fp16"])
        self.assertEqual([(s["seqlen"], s["heads"], s["causal"]) for s in ct.backward_shapes(a, lib)],
                         [(512, 32, True)])
        self.assertEqual(len(ct.backward_shapes(ct.parse_args(["--backward", "--quick"]), lib)), 3 * 2)


if __name__ == "__main__":
    unittest.main()
