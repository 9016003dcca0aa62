"""bench/fs_results.py: what the result tools share (library path, newest file, ceilings, markers)."""
import json
import os
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "bench"))
sys.path.insert(0, str(HERE))

import fs_results  # noqa: E402
import synthetic  # noqa: E402

TEXT = """# project

<!-- results:begin -->
old table
<!-- results:end -->

kept as it is
"""
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


class Markers(unittest.TestCase):
    def test_replace_keeps_the_rest(self):
        new = fs_results.replace_between_markers(TEXT, "NEW\n", BEGIN, END)
        self.assertIn("<!-- results:begin -->\nNEW\n<!-- results:end -->", new)
        self.assertTrue(new.startswith("# project\n"))
        self.assertTrue(new.endswith("kept as it is\n"))
        self.assertEqual(fs_results.replace_between_markers(new, "NEW\n", BEGIN, END), new)
        self.assertEqual(fs_results.between_markers(new, BEGIN, END), "NEW\n")
        self.assertEqual(fs_results.between_markers(TEXT, BEGIN, END), "old table\n")

    def test_missing_markers(self):
        for text in ("# no markers\n", END + "\n" + BEGIN + "\n"):
            with self.assertRaises(fs_results.MarkerError) as e:
                fs_results.replace_between_markers(text, "x", BEGIN, END)
            self.assertIn(BEGIN, str(e.exception))
            self.assertIn(END, str(e.exception))

    def test_update_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "README.md"
            path.write_text(TEXT)
            self.assertTrue(fs_results.update_between_markers(path, "NEW\n", BEGIN, END))
            self.assertFalse(fs_results.update_between_markers(path, "NEW\n", BEGIN, END))
            self.assertIn("NEW", path.read_text())


class Files(unittest.TestCase):
    def test_newest_by_name(self):
        with tempfile.TemporaryDirectory() as d:
            self.assertIsNone(fs_results.newest(d, "x-*.json"))
            for name in ("x-20261130-000000.json", "x-20261201-000000.json", "x-20261129-235959.json"):
                (Path(d) / name).write_text("{}")
            self.assertEqual(fs_results.newest(d, "x-*.json").name, "x-20261201-000000.json")

    def test_library_path(self):
        saved = os.environ.pop("FLASH_STEPS_LIB", None)
        try:
            self.assertEqual(fs_results.library_path(), fs_results.REPO / "build" / "libflash_steps.so")
            os.environ["FLASH_STEPS_LIB"] = "/somewhere/lib.so"
            self.assertEqual(fs_results.library_path(), Path("/somewhere/lib.so"))
            self.assertEqual(fs_results.library_path("given.so"), Path("given.so"))
        finally:
            os.environ.pop("FLASH_STEPS_LIB", None)
            if saved is not None:
                os.environ["FLASH_STEPS_LIB"] = saved


class Ceilings(unittest.TestCase):
    def test_load(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "ceilings-20261130-110000.json"
            path.write_text(json.dumps(synthetic.ceilings_result()))
            c = fs_results.load_ceilings(path)
        self.assertEqual(c["values"]["mma_sync_f16"], {"value": 600.0, "unit": "TFLOP/s"})
        self.assertEqual(c["values"]["hbm_read"]["unit"], "TB/s")
        self.assertNotIn("wgmma_bf16", c["values"])
        self.assertEqual(c["left_out"], {"wgmma_bf16": "not measured in this invented file"})
        self.assertEqual(c["device"], "NVIDIA H200 (sm_90, 132 SMs)")

    def test_not_a_ceilings_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "ceilings-x.json"
            path.write_text(json.dumps({"rows": []}))
            with self.assertRaises(fs_results.CeilingsError):
                fs_results.load_ceilings(path)

    def test_same_gpu(self):
        self.assertTrue(fs_results.same_gpu("NVIDIA H200 (sm_90, 132 SMs)", "NVIDIA H200"))
        self.assertFalse(fs_results.same_gpu("NVIDIA A100 (sm_80, 108 SMs)", "NVIDIA H200"))
        self.assertTrue(fs_results.same_gpu("", "NVIDIA H200"))


if __name__ == "__main__":
    unittest.main()
