"""bench/plot.py on synthetic result files: the ladder table's arithmetic, the markers, determinism.
Needs only python3; the plotting test is skipped where matplotlib is missing."""
import contextlib
import importlib
import io
import json
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "bench"))
sys.path.insert(0, str(HERE))

import fs_results  # noqa: E402
import plot  # noqa: E402
import synthetic  # noqa: E402

README = """# project

## Results

<!-- results:begin -->
old table
<!-- results:end -->

## After
kept as it is
"""


def has_matplotlib():
    try:
        importlib.import_module("matplotlib")
        return True
    except ImportError:
        return False


def run_main(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = plot.main(args)
    return rc, out.getvalue(), err.getvalue()


class LadderColumns(unittest.TestCase):
    def setUp(self):
        compare = synthetic.compare_result()
        # step 01 timed at the ladder shape too, so that "x step 01" has a value
        ladder_rows = [r for r in compare["rows"] if plot.shape_of(r) == plot.shape_of(compare["ladder"])]
        for r in ladder_rows:
            if r["impl"] == "01_naive":
                ms = r["flops"] / 2e12 * 1e3
                r.update(status="ok", reason="", ms=ms, tflops=2.0)
        synthetic.add_speedups([r for r in ladder_rows if r["kind"] == "step"])
        self.compare = compare
        self.ladder = plot.ladder_from_compare(compare)

    def test_rows_follow_the_registry_and_keep_untimed_steps(self):
        self.assertEqual([s["id"] for s in self.ladder["steps"]], ["01_naive", "02_tiled", "03_online", "04_refuser"])
        self.assertEqual(sorted(self.ladder["backends"]), ["torch_cudnn", "torch_efficient", "torch_flash", "torch_math"])
        self.assertEqual(self.ladder["flops"], 4.0 * 8 * 16 * 2048 * 2048 * 128)

    def test_ratios(self):
        cols = {c["id"]: c for c in plot.ladder_columns(self.ladder)}
        # speeds 2, 20, 100 TFLOP/s; flash 300, cuDNN 500: ratios of times are ratios of speeds
        self.assertIsNone(cols["01_naive"]["x_prev"])
        self.assertAlmostEqual(cols["01_naive"]["x_01"], 1.0)
        self.assertAlmostEqual(cols["02_tiled"]["x_prev"], 10.0)
        self.assertAlmostEqual(cols["03_online"]["x_prev"], 5.0)
        self.assertAlmostEqual(cols["03_online"]["x_01"], 50.0)
        self.assertAlmostEqual(cols["03_online"]["pct_flash"], 100 * 100 / 300)
        self.assertAlmostEqual(cols["03_online"]["pct_cudnn"], 20.0)
        self.assertNotIn("ms", cols["04_refuser"])
        self.assertEqual(cols["04_refuser"]["status"], "refused")

    def test_speedups_are_read_from_the_file_not_computed(self):
        for s in self.ladder["steps"]:
            if s["id"] == "03_online":
                s["x_prev"] = 7.25  # whatever the file says
            if s["id"] == "02_tiled":
                del s["x_prev"], s["x_step01"]  # an older file without them
        cols = {c["id"]: c for c in plot.ladder_columns(self.ladder)}
        self.assertEqual(cols["03_online"]["x_prev"], 7.25)
        self.assertIsNone(cols["02_tiled"]["x_prev"])
        text = plot.ladder_table(self.ladder, self.compare, "x.json")
        self.assertIn("| `03_online` | 2.749 | 100.0 | 7.25× |", text)
        self.assertIn("| `02_tiled` | 13.744 | 20.0 | – | – |", text)

    def test_table_lines(self):
        text = plot.ladder_table(self.ladder, self.compare, "bench/results/x.json")
        self.assertIn("| step | ms | TFLOP/s | × previous | × step 01 | % of PyTorch flash | % of cuDNN |\n", text)
        self.assertIn("| `02_tiled` | 13.744 | 20.0 | 10.00× | 10.0× | 7 % | 4 % |", text)
        self.assertIn("| `03_online` | 2.749 | 100.0 | 5.00× | 50.0× | 33 % | 20 % |", text)
        self.assertIn("| PyTorch SDPA flash | 0.916 | 300.0 | | | 100 % | 60 % |", text)
        self.assertIn("`04_refuser` (refused: head_dim is 128; this step needs 64)", text)
        self.assertIn("275 GFLOP", text)
        self.assertIn("NVIDIA H200", text)
        self.assertIn("2026-11-30 12:00 UTC, commit `abc123def456`", text)
        self.assertIn("every timed step passed", text)
        self.assertNotIn("ceiling", text.lower())
        self.assertNotIn("results:begin", text)  # the markers stay in the README, not in the content

    def test_ceiling_columns(self):
        # each step against the unit it computes on only: here 07_tiled on mma.sync, 09_online on wgmma,
        # 01_naive on the CUDA cores (neither column), the backends neither
        for s in self.ladder["steps"]:
            s["id"] = {"02_tiled": "07_tiled", "03_online": "09_online"}.get(s["id"], s["id"])
        ceilings = dict(fs_results.load_ceilings(self.write_ceilings()), source="bench/results/ceilings-x.json")
        text = plot.ladder_table(self.ladder, self.compare, "x.json", ceilings=ceilings)
        self.assertIn("| % of cuDNN | % of mma.sync fp16 | % of wgmma fp16 |", text)
        self.assertIn("| `07_tiled` | 13.744 | 20.0 | 10.00× | 10.0× | 7 % | 4 % | 3 % | – |", text)
        self.assertIn("| `09_online` | 2.749 | 100.0 | 5.00× | 50.0× | 33 % | 20 % | – | 11 % |", text)
        self.assertIn("| `01_naive` | 137.439 | 2.0 | – | 1.0× | 1 % | 0 % | – | – |", text)
        self.assertIn("| PyTorch SDPA cuDNN | 0.550 | 500.0 | | | 167 % | 100 % | – | – |", text)
        self.assertIn("Ceilings (mma.sync fp16 600 TFLOP/s, wgmma fp16 900 TFLOP/s): measured on this GPU", text)
        self.assertIn("`bench/results/ceilings-x.json`", text)

    def test_fa4_column_and_row(self):
        compare = synthetic.compare_result(fa4=True)
        ladder = plot.ladder_from_compare(compare)
        self.assertEqual(ladder["backends"]["fa4"]["kind"], "fa4")
        text = plot.ladder_table(ladder, compare, "x.json")
        self.assertIn("| % of PyTorch flash | % of cuDNN | % of FA4 |\n", text)
        self.assertIn("| `03_online` | 2.749 | 100.0 | 5.00× | – | 33 % | 20 % | 22 % |", text)
        self.assertIn("| FA4 4.0.0b36 | 0.611 | 450.0 | | | 150 % | 90 % | 100 % |", text)
        self.assertIn("FA4 4.0.0b36), 2026-11-30", text)  # its version beside the others
        self.assertIn("PyTorch SDPA and FlashAttention-4 timed in the same process", text)
        self.assertNotIn("% of FA4", plot.ladder_table(self.ladder, self.compare, "x.json"))  # none without it

    def write_ceilings(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        path = Path(tmp.name) / "ceilings-20261130-110000.json"
        path.write_text(json.dumps(synthetic.ceilings_result()))
        return path

    def test_failed_check_is_marked(self):
        for s in self.ladder["steps"]:
            if s["id"] == "02_tiled":
                s["status"] = "fail"
        text = plot.ladder_table(self.ladder, self.compare, "x.json")
        self.assertIn("| `02_tiled` ✗ |", text)
        self.assertIn("**failed** for `02_tiled`", text)

    def test_deterministic(self):
        a = plot.ladder_table(self.ladder, self.compare, "x.json", images=("a.png",))
        b = plot.ladder_table(plot.ladder_from_compare(json.loads(json.dumps(self.compare))), self.compare, "x.json",
                              images=("a.png",))
        self.assertEqual(a, b)


class ComputeUnits(unittest.TestCase):
    def test_every_step_on_its_unit(self):
        units = {i: plot.compute_unit(i) for i in (
            "01_naive", "02_online_softmax", "03_smem_tiling", "04_pad", "04_swizzle", "05_cp_async",
            "06_ldmatrix_mma", "07a_rows32", "07g_flash_attention2", "08_tma_wgmma", "09a_producer_consumer",
            "09d_tile_sizes", "10_decoding", "11_backward", "12c_bulk_dq", "13a_softcap", "13c_varlen", "cublas")}
        self.assertEqual(units, {
            "01_naive": "fma_f32", "02_online_softmax": "fma_f32", "03_smem_tiling": "fma_f32", "04_pad": "fma_f32",
            "04_swizzle": "fma_f32", "05_cp_async": "fma_f32", "06_ldmatrix_mma": "mma_sync",
            "07a_rows32": "mma_sync", "07g_flash_attention2": "mma_sync", "08_tma_wgmma": "wgmma",
            "09a_producer_consumer": "wgmma", "09d_tile_sizes": "wgmma", "10_decoding": "mma_sync",
            "11_backward": "mma_sync", "12c_bulk_dq": "wgmma", "13a_softcap": "wgmma", "13c_varlen": "wgmma",
            "cublas": None})

    def test_label_heights(self):
        gap = 0.1
        ys = [0.5, 1.3, 1.42, 1.44, 1.45, 2.5, 2.52, 2.53, 2.6, 2.7, 2.76, 2.77, 2.77]
        placed = plot.label_heights(ys, gap)
        self.assertEqual(len(placed), len(ys))
        self.assertTrue(all(b - a >= gap - 1e-9 for a, b in zip(placed, placed[1:])))  # no two overlap
        self.assertEqual(placed[0], 0.5)  # a label with room stays at its point
        self.assertLess(max(abs(p - y) for p, y in zip(placed, ys)), 0.7)  # and none strays far
        self.assertAlmostEqual(sum(placed[5:]) / 8, sum(ys[5:]) / 8)  # a run centred on its points
        self.assertEqual(plot.label_heights([1.0, 3.0], gap), [1.0, 3.0])
        under = plot.label_heights(ys, gap, top=2.8)  # the top labels pushed down under the title
        self.assertAlmostEqual(max(under), 2.8)
        self.assertTrue(all(b - a >= gap - 1e-9 for a, b in zip(under, under[1:])))
        self.assertEqual(under[:5], placed[:5])  # labels the push does not reach stay where they were


class Roofline(unittest.TestCase):
    def setUp(self):
        LadderColumns.setUp(self)  # the same ladder, step 01 timed too

    def ceilings(self, **extra):
        data = synthetic.ceilings_result()
        data["ceilings"] += [{"id": cid, "value": v, "unit": "TFLOP/s", "available": True} for cid, v in extra.items()]
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        path = Path(tmp.name) / "ceilings-20261130-110000.json"
        path.write_text(json.dumps(data))
        return dict(fs_results.load_ceilings(path), source="bench/results/ceilings-x.json")

    def test_byte_model(self):
        shape = self.ladder["shape"]  # b8 h16 n2048 d128 fp16
        qkvo = 4 * 8 * 2048 * 16 * 128 * 2
        self.assertEqual(plot.minimum_bytes(shape, "02_tiled"), qkvo)
        self.assertEqual(plot.minimum_bytes(shape, "01_naive"), qkvo + 6 * 8 * 16 * 2048 * 2048 * 4)
        self.assertEqual(plot.minimum_bytes(dict(shape, heads_kv=4), "02_tiled"), qkvo // 2 + qkvo // 8)

    def test_rows_use_the_unit_of_each_step(self):
        rows = {r["id"]: r for r in plot.roofline_rows(self.ladder, self.ceilings(fma_f32=60.0))}
        self.assertEqual(sorted(rows), ["01_naive", "02_tiled", "03_online"])  # the refuser is not timed
        r = rows["02_tiled"]
        self.assertAlmostEqual(r["intensity"], self.ladder["flops"] / (4 * 8 * 2048 * 16 * 128 * 2))
        self.assertAlmostEqual(r["memory_roof"], r["intensity"] * 4.5)
        self.assertEqual(r["compute"], ("fp32 FMA", 60.0))
        self.assertEqual(r["bound"], "compute")
        self.assertAlmostEqual(r["pct_roof"], 100 * 20.0 / 60.0)
        one = rows["01_naive"]
        self.assertLess(one["intensity"], 25)
        self.assertAlmostEqual(one["pct_roof"], 100 * 2.0 / min(60.0, one["intensity"] * 4.5))

    def test_wgmma_steps_have_their_ceiling(self):
        for s in self.ladder["steps"]:
            s["id"] = {"02_tiled": "09a_producer_consumer", "03_online": "07g_flash_attention2"}.get(s["id"], s["id"])
        rows = {r["id"]: r for r in plot.roofline_rows(self.ladder, self.ceilings(fma_f32=60.0))}
        self.assertEqual(rows["09a_producer_consumer"]["compute"], ("wgmma fp16", 900.0))
        self.assertAlmostEqual(rows["09a_producer_consumer"]["pct_roof"], 100 * 20.0 / 900.0)
        self.assertEqual(rows["07g_flash_attention2"]["compute"], ("mma.sync fp16", 600.0))

    def test_table_and_its_absence(self):
        text = plot.ladder_table(self.ladder, self.compare, "x.json", ceilings=self.ceilings(fma_f32=60.0))
        self.assertIn("Roofline (`bench/results/roofline.png`)", text)
        self.assertIn("| `02_tiled` | 0.268 | 1024 | 4608 | fp32 FMA 60.0 | 33.3 % |", text)
        data = synthetic.ceilings_result()
        data["ceilings"] = [c for c in data["ceilings"] if c["id"] != "hbm_read"]
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        path = Path(tmp.name) / "ceilings-20261130-110000.json"
        path.write_text(json.dumps(data))
        no_hbm = dict(fs_results.load_ceilings(path), source="x")
        self.assertEqual(plot.roofline_rows(self.ladder, no_hbm), [])
        self.assertNotIn("Roofline", plot.ladder_table(self.ladder, self.compare, "x.json", ceilings=no_hbm))


class RunnerFallback(unittest.TestCase):
    def test_runner_only(self):
        ladder = plot.ladder_from_runner(synthetic.runner_result())
        self.assertEqual([s["id"] for s in ladder["steps"]], ["01_naive", "02_tiled", "03_online", "04_refuser"])
        text = plot.ladder_table(ladder, synthetic.runner_result(), "runner.json")
        self.assertIn("| `02_tiled` | 13.744 | 20.0 | 10.00× | 10.0× | – | – |", text)
        self.assertNotIn("cublas", text)


class CommandLine(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = Path(self.tmp.name)
        self.results = d / "results"
        self.results.mkdir()
        (self.results / "compare_torch-20261130-120000.json").write_text(json.dumps(synthetic.compare_result()))
        (self.results / "runner-20261130-115900.json").write_text(json.dumps(synthetic.runner_result()))
        self.readme = d / "README.md"
        self.readme.write_text(README)

    def tearDown(self):
        self.tmp.cleanup()

    def test_readme_rewritten_twice_the_same(self):
        args = ["--results", str(self.results), "--readme", str(self.readme), "--no-plots"]
        rc, out, _ = run_main(args)
        self.assertEqual(rc, 0)
        first = self.readme.read_text()
        self.assertIn("| `03_online` | 2.749 | 100.0 |", first)
        self.assertNotIn("old table", first)
        self.assertTrue(first.endswith("kept as it is\n"))
        self.assertIn("compare_torch-20261130-120000.json", first)
        rc, _, err = run_main(args)
        self.assertEqual(rc, 0)
        self.assertEqual(self.readme.read_text(), first)
        self.assertIn("already up to date", err)

    def test_without_ceilings_it_says_so_and_adds_no_column(self):
        rc, out, err = run_main(["--results", str(self.results), "--table-only"])
        self.assertEqual(rc, 0)
        self.assertIn("no ceilings-*.json in", err)
        self.assertNotIn("% of mma.sync", out)

    def test_newest_ceilings_file_of_this_gpu(self):
        (self.results / "ceilings-20261129-000000.json").write_text(
            json.dumps(synthetic.ceilings_result(device="NVIDIA A100 (sm_80, 108 SMs)")))
        (self.results / "ceilings-20261130-110000.json").write_text(json.dumps(synthetic.ceilings_result()))
        rc, out, err = run_main(["--results", str(self.results), "--table-only"])
        self.assertEqual(rc, 0)
        self.assertIn("% of mma.sync fp16 | % of wgmma fp16 |", out)
        self.assertIn("ceilings-20261130-110000.json", out)
        self.assertIn("has no wgmma_bf16 ceiling: not measured in this invented file", err)

    def test_ceilings_of_another_gpu_are_left_out(self):
        other = self.results / "ceilings-20261130-110000.json"
        other.write_text(json.dumps(synthetic.ceilings_result(device="NVIDIA A100 (sm_80, 108 SMs)")))
        rc, out, err = run_main(["--results", str(self.results), "--table-only"])
        self.assertEqual(rc, 0)
        self.assertIn("was measured on NVIDIA A100", err)
        self.assertNotIn("% of mma.sync", out)
        rc, _, err = run_main(["--results", str(self.results), "--table-only", "--ceilings", str(other)])
        self.assertEqual(rc, 1)  # asked for by name: an error, not a silent omission
        self.assertIn("--ceilings", err)

    def test_table_only_changes_nothing(self):
        rc, out, _ = run_main(["--results", str(self.results), "--readme", str(self.readme), "--table-only"])
        self.assertEqual(rc, 0)
        self.assertIn("| step | ms |", out)
        self.assertEqual(self.readme.read_text(), README)

    def test_readme_without_markers_is_an_error_naming_them(self):
        self.readme.write_text("# nothing here\n")
        rc, _, err = run_main(["--results", str(self.results), "--readme", str(self.readme), "--no-plots"])
        self.assertEqual(rc, 1)
        self.assertIn("<!-- results:begin -->", err)
        self.assertIn("<!-- results:end -->", err)
        self.assertEqual(self.readme.read_text(), "# nothing here\n")

    def test_no_results(self):
        empty = Path(self.tmp.name) / "empty"
        empty.mkdir()
        rc, _, err = run_main(["--results", str(empty), "--readme", str(self.readme)])
        self.assertEqual(rc, 1)
        self.assertIn("no compare_torch", err)

    @unittest.skipUnless(has_matplotlib(), "matplotlib is not installed")
    def test_plots(self):
        out_dir = Path(self.tmp.name) / "png"
        rc, out, _ = run_main(["--results", str(self.results), "--readme", str(self.readme), "--out-dir", str(out_dir)])
        self.assertEqual(rc, 0)
        for name in ("sweep.png", "ladder.png"):
            data = (out_dir / name).read_bytes()
            self.assertTrue(data.startswith(b"\x89PNG"), name)
        self.assertIn("](png/ladder.png)", self.readme.read_text())
        self.assertFalse((out_dir / "roofline.png").exists())  # no ceilings file: no roofline

    @unittest.skipUnless(has_matplotlib(), "matplotlib is not installed")
    def test_plots_with_fa4(self):  # its series in the sweep, its line in the ladder
        compare = Path(self.tmp.name) / "compare_torch-20261130-130000.json"
        compare.write_text(json.dumps(synthetic.compare_result(fa4=True)))
        out_dir = Path(self.tmp.name) / "png"
        rc, out, _ = run_main(["--compare", str(compare), "--results", str(self.results), "--readme",
                               str(self.readme), "--out-dir", str(out_dir)])
        self.assertEqual(rc, 0)
        self.assertIn("| FA4 4.0.0b36 |", out)
        for name in ("sweep.png", "ladder.png"):
            self.assertTrue((out_dir / name).read_bytes().startswith(b"\x89PNG"), name)

    @unittest.skipUnless(has_matplotlib(), "matplotlib is not installed")
    def test_roofline_plot(self):
        data = synthetic.ceilings_result()
        data["ceilings"].append({"id": "fma_f32", "value": 60.0, "unit": "TFLOP/s", "available": True})
        (self.results / "ceilings-20261130-110000.json").write_text(json.dumps(data))
        out_dir = Path(self.tmp.name) / "png"
        rc, out, _ = run_main(["--results", str(self.results), "--readme", str(self.readme), "--out-dir", str(out_dir)])
        self.assertEqual(rc, 0)
        self.assertTrue((out_dir / "roofline.png").read_bytes().startswith(b"\x89PNG"))
        text = self.readme.read_text()
        self.assertLess(text.index("](png/ladder.png)"), text.index("](png/roofline.png)"))
        self.assertLess(text.index("](png/roofline.png)"), text.index("](png/sweep.png)"))


if __name__ == "__main__":
    unittest.main()


class PreviousNote(unittest.TestCase):
    """The sentence under the table saying what "× previous" divides, where a step number has two rows."""

    def test_names_the_faster_of_two_rows(self):
        cols = [{"id": "03_smem_tiling", "ms": 12.7}, {"id": "04_pad", "ms": 9.5}, {"id": "04_swizzle", "ms": 10.1},
                {"id": "05_cp_async", "ms": 9.6}, {"id": "06_ldmatrix_mma"}]  # 06 not timed: left out
        self.assertEqual(plot.previous_note(cols),
                         "× previous: the time of the fastest row of the step number before, over this row's "
                         "(`fs_speedups`); `05_cp_async` against `04_pad`, the faster of `04_pad` and `04_swizzle`.")

    def test_one_row_a_number_names_nothing(self):
        cols = [{"id": "07a_rows32", "ms": 0.9}, {"id": "07b_work_order", "ms": 0.8}, {"id": "PyTorch", "ms": 0.7}]
        self.assertEqual(plot.previous_note(cols), "× previous: the time of the fastest row of the step number "
                         "before, over this row's (`fs_speedups`).")
