"""bench/ncu_table.py on a synthetic `ncu --csv --page raw` export: parsing, one column per kernel
(its last launch), units, and dropping the metrics ncu rejects."""
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))

import ncu_table  # noqa: E402

# The shape of ncu's raw CSV page: a header row, a units row, one row per profiled launch. Values
# are invented. The two launches of scores_kernel are the runner's check and its timed launch.
RAW = '''==PROF== Connected to process 1234
"ID","Process ID","Process Name","Kernel Name","gpu__time_duration.sum","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active","dram__bytes_read.sum","launch__registers_per_thread"
"","","","","nsecond","","%","Mbyte","register/thread"
"0","1234","flash-steps","scores_kernel","1,500,000","0","0","512.5","36"
"1","1234","flash-steps","softmax_kernel","300,000","0","0","1,024.00","32"
"2","1234","flash-steps","scores_kernel","1,400,000","7","0","512.5","36"
'''


class Parse(unittest.TestCase):
    def setUp(self):
        self.rows, self.units = ncu_table.parse_raw_csv(RAW)

    def test_rows_and_units(self):
        self.assertEqual(len(self.rows), 3)
        self.assertEqual(self.units["gpu__time_duration.sum"], "nsecond")
        self.assertEqual(ncu_table.number("1,500,000"), 1500000.0)
        self.assertEqual(ncu_table.number("n/a"), "n/a")

    def test_last_launch_of_each_kernel(self):
        last = ncu_table.last_launch_per_kernel(self.rows)
        self.assertEqual([k["Kernel Name"] for k in last], ["scores_kernel", "softmax_kernel"])  # launch order
        self.assertEqual(last[0]["ID"], "2")  # the timed launch, not the checked one

    def test_table(self):
        text = ncu_table.table(self.rows, self.units)
        lines = text.splitlines()
        self.assertIn("scores_kernel", lines[0])
        duration = next(ln for ln in lines if ln.startswith("duration"))
        self.assertIn("300.0 us", duration)
        self.assertIn("1.400 ms", duration)
        conflicts = next(ln for ln in lines if ln.startswith("shared load bank conflicts"))
        self.assertEqual(conflicts.split()[-2:], ["7", "0"])
        dram = next(ln for ln in lines if ln.startswith("DRAM bytes read"))
        self.assertIn("1.02 GB", dram)
        self.assertIn("512.50 MB", dram)
        self.assertIn("not collected:", lines[-1])

    def test_nothing_profiled(self):
        self.assertIn("no kernel was profiled", ncu_table.table([], {}))


class Metrics(unittest.TestCase):
    def test_the_list_has_the_counters_the_notes_cite(self):
        names = dict(ncu_table.METRICS)
        for m in ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                  "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
                  "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct",
                  "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                  "gpu__time_duration.sum"):
            self.assertIn(m, names)
        self.assertEqual(len(names), len(set(names)))

    def test_drop_unknown(self):
        names = ["gpu__time_duration.sum", "made_up__metric.sum", "sm__other.avg.pct_of_peak_sustained_active"]
        log = "==PROF== Connected\n==ERROR== Failed to find metric made_up__metric\n==WARNING== sm__other is fine\n"
        self.assertEqual(ncu_table.drop_unknown(names, log), ["gpu__time_duration.sum",
                                                              "sm__other.avg.pct_of_peak_sustained_active"])


if __name__ == "__main__":
    unittest.main()
