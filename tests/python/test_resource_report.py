"""bench/resource_report.py on captured cuobjdump output (tests/python/data/): parsing, names, the
occupancy merged from a synthetic `flash-steps resources --json` file, and the whole report through
a stand-in cuobjdump that replays the captures."""
import contextlib
import io
import json
import os
import stat
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
sys.path.insert(0, str(HERE.parent.parent / "bench"))

import resource_report as rr  # noqa: E402

TILE = "_ZN2fs41_GLOBAL__N__67b9043f_9_sample_cu_ac9eae7a11tile_kernelI6__halfLi128EEEvPKT_PS3_"
LOCAL = "_ZN2fs41_GLOBAL__N__67b9043f_9_sample_cu_ac9eae7a18local_array_kernelEPfi"
SCORES = "_ZN2fs40_GLOBAL__N__1598471d_8_naive_cu_2982f92713scores_kernelI6__halfEEvPKT_S5_Pf10fs_problem"


class Parsing(unittest.TestCase):
    def test_resource_usage(self):
        rows = rr.parse_resource_usage((DATA / "cuobjdump_resource_usage.txt").read_text())
        by = {r["kernel"]: r for r in rows}
        self.assertEqual(len(rows), 7)
        self.assertTrue(all(r["arch"] == 90 for r in rows))
        self.assertEqual((by[SCORES]["registers"], by[SCORES]["shared"], by[SCORES]["stack"]), (36, 0, 0))
        self.assertEqual((by[TILE]["registers"], by[TILE]["shared"]), (18, 3072))  # 2 KiB + 1 KiB reserved
        self.assertEqual((by[LOCAL]["registers"], by[LOCAL]["stack"]), (32, 256))

    def test_sass_local_loads_and_stores(self):
        local = rr.parse_sass_local((DATA / "cuobjdump_sass_excerpt.txt").read_text())
        self.assertEqual(local[(90, TILE)], {"ldl": 0, "stl": 0})
        self.assertEqual(local[(90, LOCAL)], {"ldl": 29, "stl": 16})

    def test_short_name(self):
        self.assertEqual(rr.short_name("void fs::(anonymous namespace)::scores_kernel<__half>(__half const*, float*, fs_problem)"),
                         "scores_kernel<__half>")
        self.assertEqual(rr.short_name("fs::(anonymous namespace)::softmax_kernel(float*, float*, fs_problem)"),
                         "softmax_kernel")
        self.assertEqual(rr.short_name("void fs::k<fs::Swizzled128Layout<64>, 128>(fs::P)"),
                         "k<fs::Swizzled128Layout<64>, 128>")
        self.assertEqual(rr.short_name(SCORES), SCORES)  # not demangled: left as it is


def runtime_result():
    """What `flash-steps resources --json` writes (invented values): 01_naive launches scores_kernel
    and the sample's tile_kernel, twice with the same configuration; 02 refuses; 03 lists no kernels;
    04 launches a kernel the objects do not have."""
    def kernel(mangled, threads, smem, blocks_per_sm, warps):
        return {"name": "void " + mangled, "mangled": mangled, "registers": 36, "static_smem": 0, "local_bytes": 0,
                "dynamic_smem": smem, "threads": threads, "blocks": 4096, "blocks_per_sm": blocks_per_sm,
                "warps_per_sm": warps, "max_warps_per_sm": 64, "occupancy": warps / 64}
    return {"tool": "flash-steps resources", "commit": "abc123def456", "date": "2026-11-30T12:00:00Z",
            "device": "NVIDIA H200 (sm_90, 132 SMs)", "compute_capability": 90,
            "problem": {"batch": 8, "seqlen_q": 2048, "seqlen_k": 2048, "heads_q": 16, "heads_kv": 16,
                        "head_dim": 128, "dtype": "fp16", "causal": False},
            "steps": [
                {"id": "01_naive", "dir": "01_naive", "status": "ok", "reason": "",
                 "kernels": [kernel(SCORES, 256, 0, 6, 48), kernel(TILE, 128, 49152, 4, 16),
                             kernel(TILE, 128, 49152, 4, 16)]},
                {"id": "02_online", "dir": "02_online", "status": "refused", "reason": "head_dim is 128; it needs 64.",
                 "kernels": []},
                {"id": "03_tiled", "dir": "03_tiled", "status": "ok", "reason": "", "kernels": []},
                {"id": "04_other", "dir": "04_other", "status": "ok", "reason": "",
                 "kernels": [kernel("_Z5otherv", 64, 0, 32, 64)]}]}


class Runtime(unittest.TestCase):
    def setUp(self):
        usage = rr.parse_resource_usage((DATA / "cuobjdump_resource_usage.txt").read_text())
        self.rows = [dict(u, step="01_naive", ldl=0, stl=0, name=u["kernel"]) for u in usage]

    def test_merge(self):
        notes = rr.merge_runtime(self.rows, runtime_result())
        by = {r["kernel"]: r for r in self.rows}
        self.assertEqual([x["blocks_per_sm"] for x in by[SCORES]["launches"]], [6])
        self.assertEqual(len(by[TILE]["launches"]), 1)  # the same launch twice counts once
        self.assertEqual(by[LOCAL]["launches"], [])     # not launched at this problem
        self.assertEqual(notes, ["`02_online` refused: head_dim is 128; it needs 64",
                                 "`03_tiled` lists no kernels (Plan::kernels is empty), so its occupancy is not known",
                                 "`04_other` launches `_Z5otherv`, which is not in the object files given"])

    def test_table_with_runtime(self):
        runtime = runtime_result()
        notes = rr.merge_runtime(self.rows, runtime)
        text = rr.markdown(self.rows, [], "cuobjdump 13.0", runtime, notes)
        self.assertIn("| threads / block | dynamic smem (B) | blocks / SM | occupancy |", text)
        tile = next(ln for ln in text.splitlines() if TILE in ln)
        self.assertTrue(tile.endswith("| 128 | 49152 | 4 | 25 % (16 of 64 warps) |"), tile)
        local = next(ln for ln in text.splitlines() if LOCAL in ln)
        self.assertTrue(local.endswith("| – | – | – | – |"), local)
        self.assertIn("batch 8, seqlen 2048, 16 heads, head_dim 128, fp16 on NVIDIA H200 (sm_90, 132 SMs)", text)
        self.assertIn("Note: `04_other` launches", text)
        self.assertNotIn("unknown", text)

    def test_table_without_runtime_says_how_once(self):
        text = rr.markdown(self.rows, [], "cuobjdump 13.0")
        self.assertNotIn("occupancy |", text)
        self.assertEqual(text.count("run `flash-steps resources` on a GPU"), 1)
        self.assertNotIn("unknown", text)


class WholeReport(unittest.TestCase):
    """main() through a stand-in cuobjdump that prints the captured outputs."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = Path(self.tmp.name)
        self.tool = d / "cuobjdump"
        self.tool.write_text(f"""#!/bin/sh
case "$1" in
  --dump-resource-usage) cat "{DATA}/cuobjdump_resource_usage.txt" ;;
  -sass) cat "{DATA}/cuobjdump_sass_excerpt.txt" ;;
  --version) echo "Cuda compilation tools, release 13.0, V13.0.88" ;;
  *) exit 1 ;;
esac
""")
        self.tool.chmod(self.tool.stat().st_mode | stat.S_IEXEC)
        self.notes = d / "notes.md"
        self.notes.write_text("# notes\n<!-- resources:begin -->\nold\n<!-- resources:end -->\nend\n")
        self.out = d / "report.md"

    def tearDown(self):
        self.tmp.cleanup()

    @unittest.skipIf(os.name != "posix", "needs a shell for the stand-in cuobjdump")
    def test_report(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = rr.main(["--cuobjdump", str(self.tool), "--step", "01_naive=a.o", "--out", str(self.out),
                          "--notes", str(self.notes)])
        self.assertEqual(rc, 0, err.getvalue())
        text = self.out.read_text()
        self.assertIn("cuobjdump 13.0", text)
        self.assertIn("| registers / thread | static smem (B) | stack (B) |", text)
        lines = [ln for ln in text.splitlines() if ln.startswith("| `01_naive`")]
        self.assertEqual(len(lines), 7)
        if any("tile_kernel" in ln for ln in lines):  # demangled (c++filt present)
            tile = next(ln for ln in lines if "tile_kernel<__half, 128>" in ln)
            self.assertTrue(tile.endswith("| 18 | 2048 | 0 | 0 / 0 |"), tile)
            local = next(ln for ln in lines if "local_array_kernel" in ln)
            self.assertIn("| 32 | 0 | 256 | 29 / 16 |", local)
        notes = self.notes.read_text()
        self.assertTrue(notes.startswith("# notes\n<!-- resources:begin -->\n<!-- generated by"))
        self.assertTrue(notes.endswith("<!-- resources:end -->\nend\n"))

    @unittest.skipIf(os.name != "posix", "needs a shell for the stand-in cuobjdump")
    def test_report_with_runtime(self):
        runtime = Path(self.tmp.name) / "resources.json"
        runtime.write_text(json.dumps(runtime_result()))
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = rr.main(["--cuobjdump", str(self.tool), "--step", "01_naive=a.o", "--out", str(self.out),
                          "--runtime", str(runtime)])
        self.assertEqual(rc, 0, err.getvalue())
        text = self.out.read_text()
        self.assertIn("| blocks / SM | occupancy |", text)
        self.assertIn("| 256 | 0 | 6 | 75 % (48 of 64 warps) |", text)

    def test_runtime_file_of_another_tool_is_refused(self):
        other = Path(self.tmp.name) / "other.json"
        other.write_text(json.dumps({"tool": "flash-steps", "rows": []}))
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = rr.main(["--cuobjdump", str(self.tool), "--step", "01_naive=a.o", "--runtime", str(other)])
        self.assertEqual(rc, 1)
        self.assertIn("not the output of `flash-steps resources --json`", err.getvalue())

    def test_bad_step_argument(self):
        with contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(rr.main(["--cuobjdump", str(self.tool), "--step", "01_naive"]), 2)


if __name__ == "__main__":
    unittest.main()
