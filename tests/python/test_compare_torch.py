"""bench/compare_torch.py without PyTorch or a GPU: the shapes of its three passes, the ratios, labels and
tables, the rules it takes from the library through the flash_steps package (FLOPs, tolerance, speed-ups,
the sweep), the measuring loop every pass shares, the backward's check, and FlashAttention-4 joining the
backends or not. The package's own tests: test_flash_steps.py; the shared core's: test_fs_results.py."""
import contextlib
import io
import json
import math
import sys
import tempfile
import types
import unittest
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "bench"))
sys.path.insert(0, str(HERE))

import compare_torch as ct  # noqa: E402
import fs_results  # noqa: E402
from test_fs_results import fa4_stub  # noqa: E402

REPO = fs_results.REPO
LIB = fs_results.library_path()  # $FLASH_STEPS_LIB (ctest sets it), else build/libflash_steps.so
needs_lib = unittest.skipUnless(LIB.exists(), "libflash_steps.so not built (set FLASH_STEPS_LIB)")


def printed(fn, *args, **kw) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args, **kw)
    return out.getvalue()


def measure(s, row, fn, checked):
    """One implementation alone: prepare, then timed."""
    plan = s.prepare(row, fn, checked)
    if plan:
        s.timed([(row, contextlib.nullcontext, plan)])


def sweep_of(cls, args=(), **attrs):
    """A sweep of the class with what its rules, tables and measure() use, without PyTorch."""
    s = object.__new__(cls)
    s.args, s.lib, s.head = ct.parse_args(list(args)), FakeLibrary(), {}
    s.timer, s.last, s.limit_ms = FakeTimer(2.0), {}, 100.0
    s.ref_err, s.ref_impl = None, ""
    for k, v in attrs.items():
        setattr(s, k, v)
    return s


class FakeLibrary:
    """fs_backward_bound's rule (test_flash_steps checks the library gives the same)."""

    def backward_bound(self, dtype, ref_err, max_abs_exact):
        return 2 * ref_err + {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}[dtype] * max_abs_exact


class FakeTimer:
    def __init__(self, ms):
        self.ms, self.calls = ms, 0

    def times(self, fn, n):
        self.calls += n
        return [self.ms] * n


RESULT = {"date": "d", "commit": "c", "environment": {"gpu": "H200"}}


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
        self.assertEqual(len(shapes), 5 * 2 * 2)  # DECODE_SHAPES x seqlen_q 1, 4 x fp16, bf16
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
        h = fs_results.hbm_ceiling(str(REPO / "bench" / "results" / "ceilings-20261130-212215.json"))
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
        ct.add_ratios(rows)
        self.assertAlmostEqual(rows[1]["x_cudnn"], 0.8)
        self.assertAlmostEqual(rows[2]["x_contiguous"], 0.25 / 0.3)
        self.assertNotIn("x_contiguous", rows[1])
        s = sweep_of(ct.DecodeSweep, ["--decode"])
        self.assertEqual([s.label(r) for r in rows], ["pt:cudnn", "10", "10 p64", "07g"])
        text = printed(s.table, dict(RESULT, rows=rows, hbm={"tbs": 4.64, "path": "c.json"}))
        self.assertIn("b8 sk32768 h32/8 sq1 d128 fp16", text)
        self.assertIn("GB/s of K+V read (median)", text)
        self.assertIn("3200", text)
        self.assertIn("69% 0.80x", text)
        self.assertIn("% of the HBM read ceiling (4.64 TB/s, c.json)", text)


@needs_lib
class Library(unittest.TestCase):
    def setUp(self):
        self.lib = ct.flash_steps.library(LIB)

    def test_steps_as_dicts(self):
        steps = ct.steps_of(self.lib)
        self.assertEqual(steps[0]["id"], "01_naive")
        self.assertEqual(set(steps[0]), {"id", "name", "lesson", "dir", "min_compute_capability", "passes"})
        self.assertTrue(all(s["passes"] for s in steps))  # every step runs one pass at least
        self.assertIn("forward", steps[0]["passes"])
        json.dumps(steps)  # they go into the results file

    def test_refusal_is_the_sentence(self):
        p = self.lib.problem(2, 512, 512, 16, 16, 12, "fp16", False)
        self.assertIn("head_dim is 12", ct.refusal(self.lib.check, "07g_flash_attention2", p))
        p = self.lib.decode_problem(2, 1, 4096, 32, 8, 128, "fp16", False, 64)
        self.assertIn("has no decoding entry", ct.refusal(self.lib.check, "01_naive", p))
        self.assertEqual(ct.refusal(lambda: None), "")

    def test_steps_of_each_pass(self):
        lib = self.lib
        for cls, ids in ((ct.Sweep, {"01_naive", "09d_tile_sizes", "10_decoding"}),
                         (ct.DecodeSweep, {"10_decoding"}), (ct.BackwardSweep, {"11_backward"})):
            steps = {s["id"] for s in ct.steps_of(lib) if any(p in s["passes"] for p in cls.passes)}
            self.assertTrue(ids <= steps, (cls.__name__, steps))
        self.assertNotIn("11_backward", {s["id"] for s in ct.steps_of(lib) if "forward" in s["passes"]})


class FakeTensor:
    """Just what problem_for_tensors reads of a torch tensor: shape, stride(), dtype, device and data_ptr()."""

    def __init__(self, shape, dtype="torch.float16", strides=None):
        self.shape, self.dtype, self.device = tuple(shape), dtype, "cuda:0"
        self._strides = strides or tuple(int(math.prod(shape[i + 1:])) for i in range(len(shape)))

    def stride(self):
        return self._strides

    def data_ptr(self):
        return 1 << 40


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
        self.assertIn("Q's shape is (64, 8, 128); it must have one entry per dimension", str(e.exception))

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
        self.assertTrue(a.default_backends)  # fa4 may join them
        self.assertFalse(ct.parse_args(["--backends", "flash"]).default_backends)
        self.assertEqual(ct.parse_args(["--seqlens", "4096", "1024"]).seqlens, [4096, 1024])

    def test_softcap(self):
        self.assertEqual(ct.parse_args([]).softcap, 0.0)
        a = ct.parse_args(["--softcap", "30", "--backward"])
        self.assertEqual((a.softcap, a.backends, a.default_backends), (30.0, "", True))  # fa4 alone, where it imports
        self.assertEqual(ct.parse_args(["--softcap", "30", "--backends", "fa4"]).backends, "fa4")
        for bad in (["--backends", "flash"], ["--decode"], ["--training"]):
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
                ct.parse_args(["--softcap", "30", *bad])
        self.assertEqual(ct.problem_for_tensors(FakeTensor((2, 64, 8, 128)), FakeTensor((2, 96, 2, 128)),
                                                FakeTensor((2, 96, 2, 128)), FakeTensor((2, 64, 8, 128)), False,
                                                15.0).softcap, 15.0)

    def test_window(self):
        self.assertIsNone(ct.parse_args([]).window)
        for argv, want in ((["--window", "128,0"], (128, 0)), (["--window=-1,32", "--backward"], (-1, 32)),
                           (["--window", "0,0", "--training"], (0, 0)), (["--window", " 64, 64"], (64, 64))):
            a = ct.parse_args(argv)
            self.assertEqual((a.window, a.backends, a.default_backends), (want, "", True), argv)  # fa4 alone
        self.assertEqual(ct.parse_args(["--window", "4,4", "--backends", "fa4"]).backends, "fa4")
        self.assertEqual(ct.parse_args(["--window", "4,4", "--softcap", "30"]).backends, "")
        for bad, why in ((["--window", "3"], "--window expects L,R: two integers from -1 to 2147483647 (-1: "
                                             "unbounded on that side), got '3'"),
                         (["--window", "1,2,3"], "got '1,2,3'"), (["--window", "a,b"], "got 'a,b'"),
                         (["--window=-2,0"], "got '-2,0'"), (["--window", "1.5,0"], "got '1.5,0'"),
                         (["--window", "0,2147483648"], "got '0,2147483648'"),
                         (["--window", "4,4", "--decode"],
                          "--window: the forward sweep, --backward and --training only"),
                         (["--window", "4,4", "--backends", "flash"],
                          "PyTorch SDPA has no sliding window; --backends may be fa4 only")):
            err = io.StringIO()
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(err):
                ct.parse_args(bad)
            self.assertIn(why, err.getvalue(), bad)
        q, kv = FakeTensor((2, 64, 8, 128)), FakeTensor((2, 96, 2, 128))
        p = ct.problem_for_tensors(q, kv, kv, q, True, window=(-1, 16))
        self.assertEqual((p.window, p.window_left, p.window_right, p.causal), (1, -1, 16, 1))
        # the window goes with the shape, as causal does: rows record it, describe shows it
        shape = {"batch": 8, "seqlen": 2048, "heads": 16, "head_dim": 128, "causal": True, "dtype": "fp16"}
        self.assertIs(ct.with_window(shape, None), shape)
        windowed = ct.with_window(shape, (512, 0))
        self.assertEqual((windowed["window_left"], windowed["window_right"], ct.window_of(windowed)),
                         (512, 0, (512, 0)))
        self.assertIsNone(ct.window_of(shape))
        self.assertEqual(ct.Sweep.key(windowed), ct.Sweep.key(shape))
        self.assertEqual(fs_results.describe(windowed), "b8 h16 n2048 d128 fp16 causal window 512,0")
        self.assertEqual(fs_results.describe(shape), "b8 h16 n2048 d128 fp16 causal")
        s = sweep_of(ct.Sweep, ["--window", "512,0"])
        self.assertEqual(s.features(windowed), {"softcap": 0.0, "window": (512, 0)})
        for cls in (ct.Sweep, ct.BackwardSweep, ct.TrainingSweep):
            at = cls.csv_fields.index("causal") + 1
            self.assertEqual(cls.csv_fields[at:at + 2], ["window_left", "window_right"])
        self.assertNotIn("window_left", ct.DecodeSweep.csv_fields)

    def test_the_references_window_mask(self):
        # the reference masks by fs_results.visible, on a column of rows against a row of keys: by hand here
        # (bottom-right: d = seqlen_k - seqlen_q), then for every pair against the definition's two inequalities
        self.assertEqual(fs_results.key_band(4, 6, False, (1, 0)), (1, 2))
        self.assertEqual(fs_results.key_band(4, 6, True, (-1, 5)), (float("-inf"), 2))  # causal: right bound 0
        self.assertEqual(fs_results.key_band(6, 4, False, None), (float("-inf"), float("inf")))
        grid = [[int(fs_results.visible(i, j, 4, 6, False, (1, 0))) for j in range(6)] for i in range(4)]
        self.assertEqual(grid, [[0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]])
        grid = [[int(fs_results.visible(i, j, 5, 3, True, (0, 7))) for j in range(3)] for i in range(5)]
        self.assertEqual(grid, [[0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])  # rows 0, 1: no key
        grid = [[int(fs_results.visible(i, j, 3, 5, False, (-1, 1))) for j in range(5)] for i in range(3)]
        self.assertEqual(grid, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
        for sq, sk in ((7, 7), (5, 9), (9, 5)):
            for causal in (False, True):
                for window in (None, (0, 0), (2, 1), (-1, 3), (3, -1), (-1, -1), (20, 20)):
                    d, (left, right) = sk - sq, window or (-1, -1)
                    right = 0 if causal else right
                    for i in range(sq):
                        for j in range(sk):
                            want = (left < 0 or j >= i + d - left) and (right < 0 or j <= i + d + right)
                            self.assertEqual(bool(fs_results.visible(i, j, sq, sk, causal, window)), want)
        try:
            import numpy
        except ImportError:
            return
        i, j = numpy.arange(2, 5)[:, None], numpy.arange(6)[None, :]  # as reference() builds it (rows r0 ... r1)
        mask = fs_results.visible(i, j, 5, 6, True, (2, 0))
        self.assertEqual(mask.tolist(), [[bool(fs_results.visible(r, c, 5, 6, True, (2, 0))) for c in range(6)]
                                         for r in range(2, 5)])

    def test_backends_known(self):
        ct.check_backends(["flash", "cudnn", "efficient", "math", "fa4"])
        with self.assertRaises(ValueError) as e:
            ct.check_backends(["flash", "fa3"])
        self.assertIn("unknown fa3", str(e.exception))

    def test_ratios(self):
        rows = [{"impl": "torch_flash", "kind": "torch", "ms": 1.0}, {"impl": "torch_cudnn", "kind": "torch", "ms": 0.5},
                {"impl": "fa4", "kind": "fa4", "ms": 0.4},
                {"impl": "07", "kind": "step", "ms": 0.8}, {"impl": "01", "kind": "step", "status": "skipped"}]
        ct.add_ratios(rows)
        self.assertAlmostEqual(rows[3]["x_flash"], 1.25)
        self.assertAlmostEqual(rows[3]["x_cudnn"], 0.625)
        self.assertAlmostEqual(rows[3]["x_fa4"], 0.5)
        self.assertAlmostEqual(rows[2]["x_flash"], 2.5)
        self.assertNotIn("x_flash", rows[4])

    def test_labels(self):
        rows = [{"impl": "torch_flash", "kind": "torch"}, {"impl": "fa4", "kind": "fa4"},
                {"impl": "07g_flash_attention2", "kind": "step"},
                {"impl": "11_backward:det", "kind": "step", "deterministic": True}]
        self.assertEqual([sweep_of(ct.Sweep).label(r) for r in rows], ["pt:flash", "fa4", "07g_flash_", "11_backwar det"])
        s = sweep_of(ct.BackwardSweep, ["--backward"])
        self.assertEqual([s.label(r) for r in rows], ["pt:flash", "fa4", "07g", "11 det"])

    def test_load_failure_is_a_message(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(ct.main(["--lib", "/nowhere/libflash_steps.so"]), 1)
            self.assertEqual(ct.main(["--backward", "--lib", "/nowhere/libflash_steps.so"]), 1)
            self.assertEqual(ct.main(["--decode", "--lib", "/nowhere/libflash_steps.so"]), 1)
        self.assertIn("/nowhere/libflash_steps.so does not exist", err.getvalue())

    def test_each_pass_names_its_files(self):
        self.assertEqual([c.name for c in ct.SWEEPS.values()],
                         ["compare_torch", "compare_torch-decode", "compare_torch_backward", "compare_torch_training"])
        self.assertEqual([c.mode for c in ct.SWEEPS.values()], [None, "decode", "backward", "training"])
        for cls in ct.SWEEPS.values():  # what every results file's CSV has, and the FA4 ratio
            self.assertEqual(cls.csv_fields[:5], ["date", "commit", "gpu", "impl", "kind"])
            self.assertIn("x_fa4", cls.csv_fields)
            self.assertIn("reason", cls.csv_fields)


class FlashAttention4(unittest.TestCase):
    """fa4 joins the default backends of the sweep and of --backward when flash_attn.cute imports (a stub
    module here), and is left out with a note when it does not."""

    def test_absent(self):
        with fa4_stub(None):
            notes = []
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                self.assertEqual(ct.with_fa4(["flash", "cudnn"], True, notes), ["flash", "cudnn"])
                self.assertEqual(ct.with_fa4(["flash", "fa4"], False, notes), ["flash"])  # asked for: left out
            self.assertEqual(notes, [fs_results.FA4_MISSING] * 2)
            self.assertIn("FlashAttention-4 not installed (pip install flash-attn-4): no fa4 column", err.getvalue())
            self.assertEqual(ct.with_fa4(["flash"], False, notes), ["flash"])  # not asked for: not looked for

    def test_present(self):
        with fa4_stub("4.0.0b36"):
            notes = []
            self.assertEqual(ct.with_fa4(["flash", "cudnn"], True, notes), ["flash", "cudnn", "fa4"])
            self.assertEqual(ct.with_fa4(["fa4"], False, notes), ["fa4"])
            self.assertEqual(ct.with_fa4(["flash"], False, notes), ["flash"])  # --backends given without it
            self.assertEqual(notes, [])

    def test_its_column_is_labelled_with_its_version(self):
        shape = {"batch": 8, "seqlen": 2048, "heads": 16, "head_dim": 128, "causal": False, "dtype": "fp16"}
        rows = [dict(shape, impl="torch_flash", kind="torch", status="ok", ms=1.0, tflops=300.0),
                dict(shape, impl="fa4", kind="fa4", status="ok", ms=0.5, tflops=600.0),
                dict(shape, impl="09d_tile_sizes", kind="step", status="ok", ms=0.6, tflops=500.0)]
        text = printed(sweep_of(ct.Sweep).table, dict(RESULT, environment={"gpu": "H200", "fa4": "4.0.0b36"},
                                                      rows=rows))
        self.assertIn("fa4 = FA4 4.0.0b36", text)
        head = next(line for line in text.splitlines() if line.startswith("shape"))
        self.assertEqual(head.split()[1:], ["pt:flash", "fa4", "09d_tile_s"])
        self.assertIn("600.0", text)

    def test_an_fa4_error_is_its_cell_not_the_run(self):
        class Sweep(MeasureShapes.FakeSweep):
            def shape(self, si, shape):
                return [{"impl": "fa4", "kind": "fa4", "status": "error", "reason": "AssertionError: head_dim"},
                        {"impl": "x", "kind": "step", "status": "ok"}]
        with tempfile.TemporaryDirectory() as d:
            _, status, _ = run_sweep(["a"], Sweep(), d)
        self.assertEqual(status, 0)


@needs_lib
class SharedRules(unittest.TestCase):
    """FLOPs, tolerance, speed-ups and the sweep come from the library (common/flash_steps.h)."""

    def setUp(self):
        self.lib = ct.flash_steps.library(LIB)

    def test_sweep_shapes(self):
        s = ct.sweep_shape(self.lib, 2048, 128, False, "fp16", self.lib.sweep_tokens())
        self.assertEqual((s["batch"], s["heads"]), (8, 16))
        self.assertEqual(ct.sweep_shape(self.lib, 512, 64, True, "bf16", 16384)["heads"], 32)
        with self.assertRaises(ValueError) as e:
            ct.sweep_shape(self.lib, 3000, 128, False, "fp16", 16384)
        self.assertIn("seqlen is 3000", str(e.exception))

    def test_default_and_quick_sweeps(self):
        a = ct.parse_args([])
        shapes, head = ct.Sweep.plan(a, self.lib)
        ladder = head["ladder"]
        self.assertEqual(a.seqlens, [512, 1024, 2048, 4096, 8192, 16384])
        self.assertEqual((a.head_dims, a.dtypes, a.tokens), ([128, 64], ["fp16", "bf16"], 16384))
        self.assertEqual(len(shapes), 6 * 2 * 2 * 2)
        self.assertEqual((ladder["batch"], ladder["seqlen"], ladder["heads"]), (8, 2048, 16))
        self.assertEqual(head["timing"], {"ladder_max_launch_ms": 5000})
        a = ct.parse_args(["--quick"])
        shapes, _ = ct.Sweep.plan(a, self.lib)
        self.assertEqual((a.seqlens, a.head_dims, a.dtypes), ([1024, 2048, 4096], [128], ["fp16"]))
        self.assertEqual(len(shapes), 3 * 2)
        with self.assertRaises(ValueError):
            ct.Sweep.plan(ct.parse_args(["--seqlens", "3000"]), self.lib)

    def test_sweep_order_groups_then_seqlen_ascending(self):
        a = ct.parse_args(["--seqlens", "4096", "512", "--head-dims", "128", "64", "--dtypes", "fp16"])
        shapes = ct.sweep_shapes(a, self.lib)
        self.assertEqual(len(shapes), 8)
        self.assertEqual([s["seqlen"] for s in shapes[:2]], [512, 4096])
        self.assertEqual([(s["head_dim"], s["causal"]) for s in shapes[::2]], [(128, False), (128, True), (64, False),
                                                                               (64, True)])
        self.assertEqual(len({ct.Sweep.key(s) for s in shapes}), 8)

    def test_flops(self):
        s = ct.sweep_shape(self.lib, 2048, 128, False, "fp16", 16384)
        self.assertEqual(ct.shape_flops(self.lib, s), 4.0 * 8 * 16 * 2048 * 2048 * 128)
        self.assertEqual(ct.shape_flops(self.lib, dict(s, causal=True)), 2.0 * 8 * 16 * 2048 * 2048 * 128)
        self.assertEqual(ct.shape_flops(self.lib, s, backward=True), 2.5 * 4.0 * 8 * 16 * 2048 * 2048 * 128)
        # a window's FLOPs are its visible pairs', which the library counts: row i sees min(i, 512) + 1 keys
        w = ct.with_window(dict(s, causal=True), (512, 0))
        pairs = sum(min(i, 512) + 1 for i in range(2048))
        self.assertEqual(ct.shape_flops(self.lib, w), 4.0 * 8 * 16 * 128 * pairs)
        self.assertEqual(ct.shape_flops(self.lib, w, backward=True), 2.5 * 4.0 * 8 * 16 * 128 * pairs)

    def test_decode_plan(self):
        a = ct.parse_args(["--decode", "--ceilings", str(REPO / "bench" / "results" / "ceilings-20261130-212215.json")])
        shapes, head = ct.DecodeSweep.plan(a, self.lib)
        self.assertEqual(len(shapes), 20)
        self.assertAlmostEqual(head["hbm"]["tbs"], 4.64364)
        self.assertEqual(head["page_sizes"], [16, 64, 256])
        s = sweep_of(ct.DecodeSweep, ["--decode"], lib=self.lib)
        self.assertEqual(s.lib.decode_kv_bytes(s.problem(shapes[1])), 2 * 8 * 32768 * 8 * 128 * 2)
        self.assertIn("b8 sk32768 h32/8 sq1 d128 fp16  (1.07 GB of K+V", s.heading(shapes[1]))

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

    def test_shapes_of_the_backward(self):
        lib = self.lib
        a = ct.parse_args(["--backward"])
        shapes, _ = ct.BackwardSweep.plan(a, lib)
        self.assertEqual(a.seqlens, [1024, 2048, 4096, 8192, 16384])  # issue 15: N 1k-16k
        self.assertEqual(len(shapes), 5 * 2 * 2 * 2)
        a = ct.parse_args(["--backward", "--seqlens", "512", "--head-dims", "64", "--causal", "on", "--dtypes", "fp16"])
        self.assertEqual([(s["seqlen"], s["heads"], s["causal"]) for s in ct.BackwardSweep.plan(a, lib)[0]],
                         [(512, 32, True)])
        self.assertEqual(len(ct.BackwardSweep.plan(ct.parse_args(["--backward", "--quick"]), lib)[0]), 3 * 2)

    def test_shapes_of_a_training_step(self):
        # train_gpt.py's attention first (its defaults: batch 32 x 512 tokens, 512 / 64 = 8 heads of 64, causal,
        # bf16), then B*N = 16384 at head_dim 128 from N 1k.
        a = ct.parse_args(["--training"])
        self.assertEqual((a.backends, a.training), ("flash,cudnn", True))
        shapes, head = ct.TrainingSweep.plan(a, self.lib)
        import train_gpt as tg  # bench/ is on the path, as compare_torch's
        c = tg.config_of(tg.parse_args([]))
        self.assertEqual(shapes[0], {"batch": c["batch"], "seqlen": c["seqlen"], "heads": c["heads"],
                                     "head_dim": c["head_dim"], "causal": True, "dtype": "bf16"})
        self.assertEqual(shapes[0], {"batch": 32, "seqlen": 512, "heads": 8, "head_dim": 64, "causal": True,
                                     "dtype": "bf16"})
        self.assertEqual(head["train_gpt_shape"], shapes[0])
        self.assertEqual(len(shapes), 1 + 5 * 2 * 2)
        self.assertEqual({s["head_dim"] for s in shapes[1:]}, {128})
        self.assertEqual({s["batch"] * s["seqlen"] for s in shapes[1:]}, {16384})
        a = ct.parse_args(["--training", "--no-train-gpt-shape", "--seqlens", "2048", "--causal", "on", "--dtypes",
                           "bf16"])
        self.assertEqual([(s["seqlen"], s["head_dim"]) for s in ct.TrainingSweep.plan(a, self.lib)[0]], [(2048, 128)])
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            ct.parse_args(["--training", "--backward"])
        s = sweep_of(ct.TrainingSweep, ["--training"])
        self.assertEqual([f for f, _ in s.step_impls([{"id": "12b_async_wgmma"}])],
                         [{"impl": "12b_async_wgmma", "kind": "step", "deterministic": False}])


def run_sweep(shapes, sweep, d):
    result = dict(RESULT, tool="compare_torch", complete=False, rows=[])
    with contextlib.redirect_stderr(io.StringIO()):
        status = ct.measure_shapes(result, shapes, sweep, Path(d) / "out")
    return result, status, sweep.tables


class MeasureShapes(unittest.TestCase):
    """The loop every pass shares: rows appended, files written even when a shape fails, exit status."""

    class FakeSweep:
        csv_fields = ["impl", "status"]

        def __init__(self, fail_at=None):
            self.fail_at, self.tables = fail_at, []

        def shape(self, si, shape):
            if si == self.fail_at:
                raise RuntimeError("interrupted")
            return [{"impl": "x", "kind": "step", "status": "ok" if shape != "bad" else "fail"}]

        def heading(self, shape):
            return f"{shape}  ("

        def cell(self, r):
            return r["status"]

        def table(self, result):
            self.tables.append(result)

        def after_shape(self):
            pass

    def test_every_shape_measured_and_written(self):
        with tempfile.TemporaryDirectory() as d:
            result, status, tables = run_sweep(["a", "b"], self.FakeSweep(), d)
            self.assertEqual(status, 0)
            self.assertTrue(result["complete"])
            self.assertEqual(len(result["rows"]), 2)
            self.assertEqual(tables, [result])
            self.assertTrue((Path(d) / "out.json").exists() and (Path(d) / "out.csv").exists())
            _, status, _ = run_sweep(["a", "bad"], self.FakeSweep(), d)
            self.assertEqual(status, 1)

    def test_an_interrupted_run_still_writes_what_it_measured(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(RuntimeError):
                run_sweep(["a", "b", "c"], self.FakeSweep(fail_at=1), d)
            written = json.loads((Path(d) / "out.json").read_text())
            self.assertFalse(written["complete"])
            self.assertEqual(len(written["rows"]), 1)


class Measure(unittest.TestCase):
    """The measure/skip logic of every pass, with a fake timer."""

    row = {"impl": "09d", "flops": 5e12, "head_dim": 128, "causal": False, "dtype": "fp16"}
    ok = {"pass": True, "mismatches": 0, "nonfinite": 0}

    def test_timed(self):
        s = sweep_of(ct.Sweep)
        row = dict(self.row)
        measure(s, row, lambda: None, lambda: dict(self.ok))
        self.assertEqual((row["status"], row["ms"], row["iters"]), ("ok", 2.0, 20))
        self.assertAlmostEqual(row["tflops"], 2500.0)
        self.assertEqual(s.timer.calls, 1 + 2 + 20)  # probe, warm-up, timed

    def test_skipped_by_the_limit_and_by_scaling(self):
        s = sweep_of(ct.Sweep, timer=FakeTimer(150.0))
        row = dict(self.row)
        measure(s, row, lambda: None, lambda: dict(self.ok))
        self.assertEqual(row["status"], "skipped")
        self.assertIn("one launch took 150 ms, over the limit of 100 ms", row["reason"])
        bigger = dict(self.row, flops=1e13)  # twice the work: about 300 ms, not launched
        measure(s, bigger, lambda: None, lambda: self.fail("checked"))
        self.assertIn("a launch would take about 300 ms (scaled by FLOPs", bigger["reason"])
        other = dict(self.row, impl="10", kv_bytes=1e9, page_size=64)
        d = sweep_of(ct.DecodeSweep, ["--decode"], timer=FakeTimer(0.25), head={"hbm": {"tbs": 4.0}})
        measure(d, other, lambda: None, lambda: dict(self.ok))
        self.assertAlmostEqual(other["gbs"], 4000.0)
        self.assertAlmostEqual(other["hbm_pct"], 100.0)

    def test_a_shapes_implementations_are_timed_interleaved(self):
        class Recorder(FakeTimer):  # which implementation each batch of launches was
            def __init__(self):
                super().__init__(2.0)
                self.order = []

            def times(self, fn, n):
                self.order += [fn.__name__] * n
                return super().times(fn, n)

        def a():
            pass

        def b():
            pass

        s = sweep_of(ct.Sweep, ["--iters", "8", "--min-iters", "8", "--warmup", "0"], timer=Recorder())
        rows = [dict(self.row, impl="a"), dict(self.row, impl="b")]
        ready = [(r, contextlib.nullcontext, s.prepare(r, fn, lambda: dict(self.ok))) for r, fn in zip(rows, (a, b))]
        s.timer.order.clear()  # the probes
        s.timed(ready)
        # Four rounds of two launches each: in order, reversed, in order, reversed.
        self.assertEqual("".join(s.timer.order), "aabbbbaaaabbbbaa")
        self.assertEqual([(r["status"], r["iters"]) for r in rows], [("ok", 8), ("ok", 8)])
        # An implementation that raises mid-way is that row's error; the others are still timed.
        def c():
            raise RuntimeError("lost the device")

        class Calling(FakeTimer):  # launches fn, as the real timer does
            def times(self, fn, n):
                for _ in range(n):
                    fn()
                return super().times(fn, n)

        s.timer = Calling(2.0)
        row_c = dict(self.row, impl="c", kind="step")
        plan_c = (c, 8, 0, (True, ""))
        row_a = dict(self.row, impl="a")
        s.prepare(row_a, a, lambda: dict(self.ok))
        s.last.setdefault(("c", None), {})
        s.timed([(row_c, contextlib.nullcontext, plan_c), (row_a, contextlib.nullcontext, (a, 8, 0, (True, "")))])
        self.assertEqual((row_c["status"], row_c["reason"]), ("error", "lost the device"))
        self.assertEqual((row_a["status"], row_a["iters"]), ("ok", 8))

    def test_a_failed_check_is_timed_and_says_why(self):
        s = sweep_of(ct.Sweep)
        row = dict(self.row)
        measure(s, row, lambda: None, lambda: {"pass": False, "why": "check failed: 3 elements"})
        self.assertEqual((row["status"], row["reason"]), ("fail", "check failed: 3 elements"))
        self.assertNotIn("why", row)


class Backward(unittest.TestCase):
    """--backward without a GPU: its arguments, the check by fs_backward_bound, the measuring of one row with
    a fake timer, and the loop and table with a fake sweep."""

    def test_arguments(self):
        a = ct.parse_args(["--backward"])
        self.assertTrue(a.backward)
        self.assertEqual(a.backends, "flash,cudnn,efficient")
        self.assertEqual(a.forward_step, "")
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            ct.parse_args(["--backward", "--decode"])

    def test_check_by_the_bound(self):
        s = sweep_of(ct.BackwardSweep, ["--backward"])
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
        s = sweep_of(ct.BackwardSweep, ["--backward"])
        s.ref_err, s.ref_impl = {"dq": (0.01, 4.0), "dk": (0.02, 8.0), "dv": (0.005, 2.0), "nonfinite": 0}, "torch_flash"
        row = {"impl": "11_backward", "flops": 5e12, "head_dim": 128, "causal": False, "dtype": "fp16"}
        measure(s, row, lambda: None, lambda: s.judged("fp16", {"dq": (0.0, 4.0), "dk": (0.1, 8.0), "dv": (0.0, 2.0),
                                                                "nonfinite": 0}, False))
        self.assertEqual((row["status"], row["ms"]), ("fail", 2.0))
        self.assertAlmostEqual(row["tflops"], 2500.0)
        self.assertTrue(row["reason"].startswith("check failed: dk error 0.1 over the bound"))

    class FakeBackwardSweep(ct.BackwardSweep):
        def shape(self, si, shape):
            rows = [("torch_flash", "torch", False, 1.0), ("torch_cudnn", "torch", False, 0.8),
                    ("fa4", "fa4", False, 0.5),
                    ("11_backward", "step", False, 1.25), ("11_backward:det", "step", True, 2.0)]
            out = [dict(shape, impl=i, kind=k, deterministic=d, status="ok", ms=ms, tflops=10.0 / ms, reason="")
                   for i, k, d, ms in rows]
            self.finish(out)
            return out

        def heading(self, shape):
            return f"{self.describe(shape)}  ("

        def after_shape(self):
            pass

    def test_the_loop_files_and_table(self):
        shape = {"batch": 8, "seqlen": 2048, "heads": 16, "head_dim": 128, "causal": True, "dtype": "bf16"}
        result = dict(RESULT, tool="compare_torch", complete=False, rows=[])
        out = io.StringIO()
        with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(io.StringIO()):
            status = ct.measure_shapes(result, [shape], sweep_of(self.FakeBackwardSweep, ["--backward"]),
                                       Path(d) / "bw")
            csv_text = (Path(d) / "bw.csv").read_text()
        self.assertEqual(status, 0)
        self.assertTrue(result["complete"])
        self.assertEqual(csv_text.splitlines()[0].split(",")[:6], ["date", "commit", "gpu", "impl", "kind",
                                                                  "deterministic"])
        self.assertIn("11_backward:det,step,True", csv_text)
        self.assertIn("fa4,fa4,False", csv_text)
        by = {r["impl"]: r for r in result["rows"]}
        self.assertAlmostEqual(by["11_backward"]["x_flash"], 0.8)
        self.assertAlmostEqual(by["11_backward:det"]["x_cudnn"], 0.4)
        self.assertAlmostEqual(by["11_backward"]["x_fa4"], 0.4)
        table = out.getvalue().splitlines()
        head = next(line for line in table if line.startswith("shape"))
        self.assertEqual(head.split()[1:], ["pt:flash", "pt:cudnn", "fa4", "11", "11", "det"])
        self.assertIn("b8 h16 n2048 d128 bf16 causal", out.getvalue())
        self.assertIn("8.0", out.getvalue())


class Backends(unittest.TestCase):
    """fs_results.Backend as the passes call it: the layout each backend reads and how it is called (a
    fake torch and an FA4 stub record the calls)."""

    def fake_torch(self, calls):
        def sdpa(q, k, v, scale=None, **kw):
            calls.append(("sdpa", q, k, v, scale, kw))
            return "o"
        return types.SimpleNamespace(nn=types.SimpleNamespace(functional=types.SimpleNamespace(
            scaled_dot_product_attention=sdpa)))

    def test_sdpa_reads_views_and_fa4_the_tensors(self):
        calls = []
        with fa4_stub("4.0.0b36", calls):
            sdpa, fa4 = fs_results.Backend(self.fake_torch(calls), "cudnn"), fs_results.Backend(None, "fa4")
            q, kv = FakeTensor((2, 64, 8, 128)), FakeTensor((2, 64, 2, 128))
            self.assertEqual((sdpa.impl, sdpa.kind, fa4.impl, fa4.kind), ("torch_cudnn", "torch", "fa4", "fa4"))
            self.assertIs(fa4.view(q), q)
            self.assertIsInstance(fa4.context(), contextlib.nullcontext)
            self.assertEqual(fa4(q, kv, kv, True, 0.125), "out")  # flash_attn_func's (out, lse): out
            self.assertEqual(calls[-1], ("fa4", q, kv, kv, {"softmax_scale": 0.125, "causal": True}))
            fa4(q, kv, kv, False, 0.125, window=(-1, 32))  # FA4 says None where FlashAttention-2 says -1
            self.assertEqual(calls[-1][4], {"softmax_scale": 0.125, "causal": False, "window_size": (None, 32)})
            fa4(q, kv, kv, True, None, softcap=30.0, window=(512, 0))
            self.assertEqual(calls[-1][4], {"softmax_scale": None, "causal": True, "softcap": 30.0,
                                            "window_size": (512, 0)})
            bhnd = types.SimpleNamespace(shape=(2, 8, 64, 128))
            self.assertEqual(sdpa(bhnd, bhnd, bhnd, True, 0.125), "o")
            self.assertEqual(calls[-1][4:], (0.125, {"is_causal": True}))
            kv_bhnd = types.SimpleNamespace(shape=(2, 2, 64, 128))
            sdpa(bhnd, kv_bhnd, kv_bhnd, False, None)  # GQA: SDPA is told so
            self.assertEqual(calls[-1][5], {"enable_gqa": True, "is_causal": False})
            n = len(calls)
            with self.assertRaises(ValueError) as e:
                sdpa(bhnd, bhnd, bhnd, True, 0.125, window=(128, 0))
            self.assertIn("PyTorch SDPA has no sliding window", str(e.exception))
            self.assertEqual(len(calls), n)  # refused before SDPA is called
        with self.assertRaises(ValueError):
            fs_results.Backend(None, "fa3")


# ---- the loop of every pass on a stand-in for PyTorch -----------------------------------------------

class T:
    """A stand-in for a torch tensor: its shape, strides, dtype and device (what flash_steps' checks read),
    and the operations the passes call, which keep or change the shape as torch's would."""

    def __init__(self, *shape, dtype="torch.float16", strides=None):
        self.shape, self.dtype, self.device = tuple(shape), dtype, "cuda:0"
        self._strides = strides or tuple(int(math.prod(shape[i + 1:])) for i in range(len(shape)))
        self.filled = []

    def stride(self):
        return self._strides

    def data_ptr(self):
        return 4096

    def transpose(self, a, b):
        shape, strides = list(self.shape), list(self._strides)
        shape[a], shape[b], strides[a], strides[b] = shape[b], shape[a], strides[b], strides[a]
        return T(*shape, dtype=self.dtype, strides=tuple(strides))

    def __getitem__(self, index):  # t[0:1]: batch 0
        return T(1, *self.shape[1:], dtype=self.dtype)

    def index_select(self, dim, index):
        return T(*(index.shape[0] if i == dim else n for i, n in enumerate(self.shape)), dtype=self.dtype)

    def to(self, x):
        return T(*self.shape, dtype=x) if str(x).startswith("torch.") else self

    def view(self, *shape):
        return self if len(shape) == 1 and str(shape[0]).startswith("torch.") else T(*shape, dtype=self.dtype)

    def fill_(self, value):
        self.filled.append(value)
        return self

    def new_zeros(self, *shape):
        return T(*shape, dtype=self.dtype)

    def __setitem__(self, index, value):
        pass

    def __mul__(self, x):
        return self

    __add__ = __mul__
    abs = detach = requires_grad_ = clone = copy_ = long = reshape = lambda self, *a: self
    new_empty = new_zeros

    def max(self):
        return 1.0


def fake_torch(calls):
    """What the passes call of torch, recording SDPA's calls; the modules to put in sys.modules."""
    def empty(*shape, dtype="torch.float32", device=None):
        return T(*(shape[0] if isinstance(shape[0], tuple) else shape), dtype=dtype)

    def sdpa(q, k, v, scale=None, **kw):
        calls.append(("sdpa", q.shape, k.shape, kw))
        return T(*q.shape, dtype=q.dtype)
    cuda = types.SimpleNamespace(synchronize=lambda: None, mem_get_info=lambda: (2 ** 40, 2 ** 40),
                                 current_stream=lambda: types.SimpleNamespace(cuda_stream=0), empty_cache=lambda: None)
    torch = types.SimpleNamespace(
        float16="torch.float16", bfloat16="torch.bfloat16", float32="torch.float32", uint8="torch.uint8",
        int32="torch.int32", int16="torch.int16", cuda=cuda, empty=empty, equal=lambda a, b: True,
        Generator=lambda device=None: types.SimpleNamespace(manual_seed=lambda seed: None),
        randn=lambda *shape, device=None, dtype=None, generator=None: T(*shape, dtype=dtype),
        randperm=lambda n, generator=None: T(n, dtype="torch.int64"),
        tensor=lambda values, device=None: T(len(values), dtype="torch.int64"),
        empty_like=lambda x: T(*x.shape, dtype=x.dtype, strides=x.stride()),
        autograd=types.SimpleNamespace(grad=lambda o, inputs, d_o, retain_graph: tuple(T(*x.shape) for x in inputs)),
        nn=types.SimpleNamespace(functional=types.SimpleNamespace(scaled_dot_product_attention=sdpa)))
    attention = types.SimpleNamespace(SDPBackend=types.SimpleNamespace(**{v: v for v in fs_results.SDPA_BACKENDS.values()}),
                                      sdpa_kernel=lambda backends: contextlib.nullcontext())
    bias = types.SimpleNamespace(causal_lower_right=lambda sq, sk: ("lower right", sq, sk))
    return torch, {"torch": torch, "torch.nn": torch.nn, "torch.nn.attention": attention,
                   "torch.nn.attention.bias": bias}


class FakeLaunches:
    """The library for what needs no GPU (problems, FLOPs, bytes, speed-ups, bounds), and a record of our
    launches instead of them: the check refuses the steps in `refuse`, every run takes its pass's pointers."""

    def __init__(self, refuse=()):
        self.real, self.refuse, self.launches, self.checked = ct.flash_steps.library(LIB), refuse, [], []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def check(self, step_id, p):
        self.checked.append((step_id, p))
        if step_id in self.refuse:
            raise ct.flash_steps.InvalidArgument(1, "fs_check", f"{step_id} refuses this problem")

    def workspace_size(self, step_id, p):
        return 256

    def tolerance(self, dtype, max_abs_v):
        return 1e-3, 1e-3, 1e-4

    def runner(self, step_id, p, *pointers, workspace=0, workspace_bytes=0, stream=0):
        ps = ct.flash_steps.pass_of(p)
        assert len(pointers) == len(ps.pointers), (step_id, ps.name, len(pointers))
        self.launches.append((step_id, ps.name, pointers, workspace_bytes))
        return lambda: None


@needs_lib
class EveryPassOnAStandIn(unittest.TestCase):
    """Sweep, DecodeSweep and BackwardSweep through their whole loop (tensors, backends, our launches, the
    checks, measure, the files and tables) on stand-ins for PyTorch, FA4, the timer and the reference."""

    def run_pass(self, cls, argv, shape, steps, backends, head, refuse=()):
        calls, fa4_calls = [], []
        torch, modules = fake_torch(calls)
        lib = self.lib = FakeLaunches(refuse)
        self.reference_kwargs, self.forward_kwargs = [], []  # what fs_results.reference, flash_steps.forward were given
        timer = types.SimpleNamespace(times=lambda fn, n: [fn() or 0.5 for _ in range(n)])
        ok = {"pass": True, "max_abs_err": 0.0, "mismatches": 0, "nonfinite": 0}
        errors = {"dq": (1e-3, 1.0), "dk": (1e-3, 1.0), "dv": (1e-3, 1.0), "nonfinite": 0}
        with fa4_stub("4.0.0b36", fa4_calls, out=lambda q: T(*q.shape, dtype=q.dtype)), \
                mock.patch.dict(sys.modules, modules), tempfile.TemporaryDirectory() as d, \
                mock.patch.object(fs_results, "Timer", lambda *a: timer), \
                mock.patch.object(fs_results, "reference", lambda *a, **k: self.reference_kwargs.append(k) or {}), \
                mock.patch.object(fs_results, "compare", lambda *a, **k: dict(ok)), \
                mock.patch.object(fs_results, "gradient_errors", lambda *a, **k: dict(errors)), \
                mock.patch.object(ct.flash_steps, "forward", lambda q, *a, **k: self.forward_kwargs.append(k) or (
                    T(*q.shape), T(q.shape[0], q.shape[2], q.shape[1], dtype="torch.float32"))), \
                mock.patch.object(ct.flash_steps, "default_step", lambda p: "09d_tile_sizes"), \
                contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
            sweep = cls(torch, lib, ct.parse_args(argv), steps, backends, {"l2_bytes": 0}, head)
            result = dict(RESULT, tool="compare_torch", complete=False, rows=[])
            status = ct.measure_shapes(result, [shape], sweep, Path(d) / "run")
            header = (Path(d) / "run.csv").read_text().splitlines()[0].split(",")
        self.assertEqual(header, cls.csv_fields)
        return status, {sweep.label(r): r for r in result["rows"]}, lib.launches, calls, fa4_calls, out.getvalue()

    def test_forward(self):
        shape = {"batch": 2, "seqlen": 256, "heads": 4, "head_dim": 64, "causal": True, "dtype": "fp16"}
        steps = [{"id": "07g_flash_attention2", "passes": ("forward",)}, {"id": "09d_tile_sizes", "passes": ("forward",)}]
        status, rows, launches, calls, fa4_calls, out = self.run_pass(
            ct.Sweep, ["--math-max-gib", "1e-9"], shape, steps, ["flash", "cudnn", "math", "fa4"], {"ladder": shape},
            refuse={"09d_tile_sizes"})
        self.assertEqual(status, 0)
        self.assertEqual({k: r["status"] for k, r in rows.items()}, {
            "pt:flash": "ok", "pt:cudnn": "ok", "pt:math": "skipped", "fa4": "ok", "07g_flash_": "ok",
            "09d_tile_s": "refused"})
        self.assertIn("the math backend needs about", rows["pt:math"]["reason"])
        self.assertEqual(rows["09d_tile_s"]["reason"], "09d_tile_sizes refuses this problem")
        self.assertEqual([(sid, name, len(p)) for sid, name, p, _ in launches], [("07g_flash_attention2", "forward", 5)])
        self.assertEqual(calls[0][1:], ((2, 4, 256, 64), (2, 4, 256, 64), {"is_causal": True}))  # SDPA: (B, H, N, d)
        self.assertEqual(fa4_calls[0][1].shape, (2, 256, 4, 64))  # FA4: (B, N, H, d), as ours
        self.assertEqual(fa4_calls[0][4], {"softmax_scale": 0.125, "causal": True})
        self.assertAlmostEqual(rows["07g_flash_"]["tflops"], shape_flops_of(shape) / 0.5e-3 / 1e12)
        self.assertAlmostEqual(rows["fa4"]["x_flash"], 1.0)
        self.assertEqual(rows["07g_flash_"]["iters"], 20)
        self.assertIn("fa4 = FA4", out)

    def test_a_window_reaches_every_implementation(self):
        # --window: the shapes carry it (run() puts it there), our problems, FA4, the reference and the FLOPs take it
        window, steps = (64, 0), [{"id": "07g_flash_attention2", "passes": ("forward",)}]
        shape = ct.with_window({"batch": 2, "seqlen": 256, "heads": 4, "head_dim": 64, "causal": True,
                                "dtype": "fp16"}, window)
        status, rows, launches, _, fa4_calls, out = self.run_pass(ct.Sweep, ["--window", "64,0"], shape, steps,
                                                                  ["fa4"], {"ladder": shape})
        self.assertEqual(status, 0)
        self.assertEqual({k: (r["status"], r["window_left"], r["window_right"]) for k, r in rows.items()},
                         {"fa4": ("ok", 64, 0), "07g_flash_": ("ok", 64, 0)})
        self.assertEqual(fa4_calls[0][4], {"softmax_scale": 0.125, "causal": True, "window_size": (64, 0)})
        self.assertEqual(self.reference_kwargs, [{"softcap": 0.0, "window": window}])
        (sid, p), = self.lib.checked
        self.assertEqual((sid, p.window, p.window_left, p.window_right), ("07g_flash_attention2", 1, 64, 0))
        pairs = sum(min(i, 64) + 1 for i in range(256))
        self.assertEqual(rows["fa4"]["flops"], 4.0 * 2 * 4 * 64 * pairs)
        self.assertIn("b2 h4 n256 d64 fp16 causal window 64,0", out)
        steps = [{"id": "11_backward", "passes": ("backward",)}]
        status, rows, launches, _, fa4_calls, _ = self.run_pass(ct.BackwardSweep, ["--backward", "--window", "64,0"],
                                                                shape, steps, ["fa4"], {})
        self.assertEqual(status, 0)
        self.assertEqual(fa4_calls[0][4]["window_size"], (64, 0))
        self.assertEqual(self.forward_kwargs[0]["window"], window)  # our forward, whose O and LSE the backward reads
        self.assertEqual(self.reference_kwargs, [{"d_o": self.reference_kwargs[0]["d_o"], "softcap": 0.0,
                                                  "window": window}])
        self.assertEqual({(sid, p.attention.window_left) for sid, p in self.lib.checked}, {("11_backward", 64)})
        self.assertEqual(rows["11"]["flops"], 2.5 * 4.0 * 2 * 4 * 64 * pairs)

    def test_decode(self):
        shape = {"batch": 2, "seqlen_q": 4, "seqlen_k": 300, "heads_q": 8, "heads_kv": 2, "head_dim": 128,
                 "dtype": "bf16", "causal": True}
        steps = [{"id": "07g_flash_attention2", "passes": ("forward",)},
                 {"id": "10_decoding", "passes": ("forward", "decode")}]
        status, rows, launches, calls, _, out = self.run_pass(
            ct.DecodeSweep, ["--decode", "--page-sizes", "16", "64"], shape, steps, ["flash", "cudnn"],
            {"hbm": {"tbs": 4.0}})
        self.assertEqual(status, 0)
        self.assertEqual(list(rows), ["pt:flash", "pt:cudnn", "07g", "10", "10 p16", "10 p64"])
        self.assertTrue(all(r["status"] == "ok" for r in rows.values()), rows)
        self.assertEqual([(name, len(p), p[3] != 0) for _, name, p, _ in launches],
                         [("forward", 5, True), ("decode", 7, False), ("decode", 7, True), ("decode", 7, True)])
        self.assertEqual(calls[0][3]["enable_gqa"], True)
        self.assertEqual(calls[0][3]["attn_mask"], ("lower right", 4, 300))  # bottom-right causal
        self.assertEqual((rows["10 p64"]["entry"], rows["10 p64"]["page_size"]), ("decode", 64))
        self.assertAlmostEqual(rows["10 p64"]["x_contiguous"], 1.0)
        self.assertEqual(rows["10"]["kv_bytes"], 2 * 2 * 300 * 2 * 128 * 2)
        self.assertAlmostEqual(rows["10"]["hbm_pct"], 100 * rows["10"]["gbs"] / 4000)
        self.assertIn("% of the HBM read ceiling", out)

    def test_backward(self):
        shape = {"batch": 2, "seqlen": 256, "heads": 4, "head_dim": 64, "causal": False, "dtype": "fp16"}
        steps = [{"id": "11_backward", "passes": ("backward",)}]
        status, rows, launches, _, fa4_calls, out = self.run_pass(
            ct.BackwardSweep, ["--backward"], shape, steps, ["flash", "fa4"], {})
        self.assertEqual(status, 0)
        self.assertEqual(list(rows), ["pt:flash", "fa4", "11", "11 det"])
        self.assertTrue(all(r["status"] == "ok" for r in rows.values()), rows)
        self.assertEqual(rows["pt:flash"]["ref_impl"], "")  # the reference backend
        self.assertEqual(rows["fa4"]["ref_impl"], "torch_flash")  # FA4 judged by the bound, as our steps
        self.assertAlmostEqual(rows["fa4"]["dq_bound"], 2 * 1e-3 + 2.0 ** -11)
        self.assertTrue(rows["11 det"]["repeatable"])
        self.assertEqual(rows["11"]["forward_step"], "09d_tile_sizes")
        self.assertEqual([(name, len(p)) for _, name, p, _ in launches], [("backward", 9)] * 2)
        self.assertEqual(fa4_calls[0][1].shape, (2, 256, 4, 64))


def shape_flops_of(s):
    return 4.0 * s["batch"] * s["heads"] * s["seqlen"] ** 2 * s["head_dim"] / (2 if s["causal"] else 1)


if __name__ == "__main__":
    unittest.main()
