"""bench/window_table.py: on the stored 2026-12-06 files, every table row it prints is in note 13 (so the
note's figures are the files'); the fixed-cost model on invented numbers. No GPU needed."""
import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "bench"))

import window_table as wt  # noqa: E402

NOTE = REPO / "notes" / "13_features.md"


class StoredRun(unittest.TestCase):
    def setUp(self):
        if not wt.SWEEP.is_dir():
            self.skipTest(f"{wt.SWEEP} is not there")
        self.out = wt.report(wt.SWEEP, [wt.RESULTS / f for f in wt.COMPARE])

    def test_every_table_row_is_in_the_note(self):
        note = NOTE.read_text()
        rows = [line for line in self.out.splitlines() if line.startswith("| ") and "---" not in line]
        self.assertGreaterEqual(len(rows), 4 + 13 + 2)  # the core table, FA4's, the model's, less headers
        for row in rows:
            with self.subTest(row=row):
                self.assertIn(row, note)

    def test_the_stored_output_is_current(self):
        self.assertEqual((wt.SWEEP / "window_table.txt").read_text().rstrip("\n"), self.out)

    def test_the_features_off_count(self):
        self.assertIn("both: 0.947–1.073, 20 of 24 within 2 %", self.out)


class Model(unittest.TestCase):
    def test_the_fixed_cost_is_recovered(self):
        # Invented: 64 query tiles of 128 rows at seqlen 8192; causal 32.5 visits per query tile, the
        # band 8, the wider band 20; every score visible; each query tile costs 4 visits more.
        explain = ("      128  causal               2080 (64)      100.0 %\n"
                   "      128  causal (1024, 0)      512 (64)      100.0 %\n"
                   "      128  causal (4096, 0)     1280 (64)      100.0 %\n")
        x = 4.0
        tflops = {"causal": 32.5 / (x + 32.5), "(1024, 0)": 8 / (x + 8), "(4096, 0)": 20 / (x + 20)}
        s = {("forward", 128, 8192, b): {wt.STEP: t} for b, t in tflops.items()}
        row = wt.model_table(explain, s, n=8192)[2]
        cells = [c.strip() for c in row.strip("|").split("|")]
        self.assertEqual(cells[1], "32.5 · 8.0 · 20.0")
        self.assertEqual(cells[4], "4.0")
        predicted, measured = cells[5].split(" · ")
        self.assertEqual(predicted, measured)


if __name__ == "__main__":
    unittest.main()
