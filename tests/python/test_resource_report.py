"""bench/resource_report.py on captured cuobjdump output (tests/python/data/): parsing, names,
occupancy, and the whole report through a stand-in cuobjdump that replays the captures."""
import contextlib
import io
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

    def test_launch_bounds(self):
        self.assertEqual(rr.parse_launch_bounds((DATA / "cuobjdump_elf_excerpt.txt").read_text()), {TILE: 128})

    def test_short_name(self):
        self.assertEqual(rr.short_name("void fs::(anonymous namespace)::scores_kernel<__half>(__half const*, float*, fs_problem)"),
                         "scores_kernel<__half>")
        self.assertEqual(rr.short_name("fs::(anonymous namespace)::softmax_kernel(float*, float*, fs_problem)"),
                         "softmax_kernel")
        self.assertEqual(rr.short_name("void fs::k<fs::Swizzled128Layout<64>, 128>(fs::P)"),
                         "k<fs::Swizzled128Layout<64>, 128>")
        self.assertEqual(rr.short_name(SCORES), SCORES)  # not demangled: left as it is


class Occupancy(unittest.TestCase):
    def test_registers_alone(self):
        self.assertEqual(rr.occupancy(90, 32, 0, None, None)["warps"], 64)
        # 36 registers: 1152 per warp, allocated as 1280; 16384 per sub-partition hold 12 warps: 48 of 64
        o = rr.occupancy(90, 36, 0, None, None)
        self.assertEqual(o["warps"], 48)
        self.assertIn("75 %", o["text"])
        self.assertIn("registers alone", o["text"])

    def test_with_block_size(self):
        # 253 registers -> 8192 per warp -> 2 warps per sub-partition, 8 per SM; 4-warp blocks: 2 blocks
        o = rr.occupancy(90, 253, 0, 128, None)
        self.assertEqual((o["blocks"], o["warps"], o["limit"]), (2, 8, "registers"))
        self.assertIn("dynamic shared memory unknown", o["text"])

    def test_shared_memory_limits(self):
        # 64 registers, 256 threads, 48 KiB static + 48 KiB dynamic (+1 KiB reserved): 2 blocks in 228 KiB
        o = rr.occupancy(90, 64, 48 * 1024, 256, 48 * 1024)
        self.assertEqual((o["blocks"], o["limit"]), (2, "shared memory"))
        self.assertNotIn("unknown", o["text"])

    def test_unknown_arch(self):
        self.assertIn("no limits", rr.occupancy(75, 32, 0, None, None)["text"])


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
  -elf) cat "{DATA}/cuobjdump_elf_excerpt.txt" ;;
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
            self.assertIn("| 18 | 2048 | 0 | 0 / 0 | 128 | ? |", tile)
            local = next(ln for ln in lines if "local_array_kernel" in ln)
            self.assertIn("| 32 | 0 | 256 | 29 / 16 |", local)
        notes = self.notes.read_text()
        self.assertTrue(notes.startswith("# notes\n<!-- resources:begin -->\n<!-- generated by"))
        self.assertTrue(notes.endswith("<!-- resources:end -->\nend\n"))

    def test_bad_step_argument(self):
        with contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(rr.main(["--cuobjdump", str(self.tool), "--step", "01_naive"]), 2)


if __name__ == "__main__":
    unittest.main()
