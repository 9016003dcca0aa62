"""bench/step_changes.py on invented step directories: pairing files by name, counting lines, the
table, and --write / --check on a notes file. The lessons come from the library only in the test
that needs it (skipped when libflash_steps.so is not built)."""
import contextlib
import io
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "bench"))

import fs_results  # noqa: E402
import step_changes as sc  # noqa: E402

NOTES = """# Notes

<!-- step-changes:begin -->
<!-- step-changes:end -->

kept
"""


def write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))


class Counting(unittest.TestCase):
    def test_count_changes(self):
        self.assertEqual(sc.count_changes(["a", "b", "c"], ["a", "b", "c"]), (0, 0))
        self.assertEqual(sc.count_changes(["a", "b", "c"], ["a", "B", "c", "d"]), (2, 1))
        self.assertEqual(sc.count_changes([], ["x", "y"]), (2, 0))
        self.assertEqual(sc.count_changes(["x", "y"], []), (0, 2))


class Table(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.steps = Path(self.tmp.name) / "steps"
        common = ["// traits", "constexpr int HEAD_DIM = 128;", "constexpr int BLOCK_Q = 64;"]
        write(self.steps / "01_first" / "traits.h", common)
        write(self.steps / "01_first" / "kernel.cuh", ["// kernel", "load", "compute", "store"])
        write(self.steps / "01_first" / "step.cu", ["// step", "plan", "launch"])
        write(self.steps / "02_second" / "traits.h", common[:2] + ["constexpr int BLOCK_Q = 128;"])
        write(self.steps / "02_second" / "kernel.cuh", ["// kernel", "load", "prefetch", "compute", "store"])
        write(self.steps / "02_second" / "step.cu", ["// step", "plan", "launch"])
        write(self.steps / "02_second" / "extra.h", ["one", "two"])
        write(self.steps / "03_third" / "traits.h", common[:2] + ["constexpr int BLOCK_Q = 128;"])
        (self.steps / "CMakeLists.txt").write_text("not a step\n")
        (self.steps / "notes").mkdir()  # not a step directory: no number
        self.lessons = {"02_second": [("02_second", "prefetch | overlap")],
                        "03_third": [("03a_third", "first idea"), ("03b_third", "second idea")]}

    def tearDown(self):
        self.tmp.cleanup()

    def test_step_dirs(self):
        self.assertEqual([d.name for d in sc.step_dirs(self.steps)], ["01_first", "02_second", "03_third"])

    def test_compare_dirs(self):
        files = sc.compare_dirs(self.steps / "01_first", self.steps / "02_second")
        self.assertEqual(files, [{"name": "extra.h", "added": 2, "removed": 0, "status": "new"},
                                 {"name": "kernel.cuh", "added": 1, "removed": 0, "status": "changed"},
                                 {"name": "traits.h", "added": 1, "removed": 1, "status": "changed"}])
        files = sc.compare_dirs(self.steps / "02_second", self.steps / "03_third")
        self.assertEqual([(f["name"], f["status"]) for f in files],
                         [("extra.h", "removed"), ("kernel.cuh", "removed"), ("step.cu", "removed")])

    def test_table(self):
        text = sc.table(self.steps, self.lessons)
        self.assertIn("| `01_first` → `02_second` | `extra.h` (new) +2 −0, `kernel.cuh` +1 −0, `traits.h` +1 −1 "
                      "| +4 −1 | `02_second`: prefetch \\| overlap |", text)
        self.assertIn("| +0 −10 | `03a_third`: first idea<br>`03b_third`: second idea |", text)
        self.assertEqual(text, sc.table(self.steps, self.lessons))  # the same bytes every time

    def test_write_then_check(self):
        notes = Path(self.tmp.name) / "README.md"
        notes.write_text(NOTES)
        text = sc.table(self.steps, self.lessons)
        self.assertNotEqual(fs_results.between_markers(notes.read_text(), sc.BEGIN, sc.END), text)
        fs_results.update_between_markers(notes, text, sc.BEGIN, sc.END)
        self.assertEqual(fs_results.between_markers(notes.read_text(), sc.BEGIN, sc.END), text)
        self.assertTrue(notes.read_text().endswith("<!-- step-changes:end -->\n\nkept\n"))


@unittest.skipUnless(fs_results.library_path().exists(), "libflash_steps.so not built (set FLASH_STEPS_LIB)")
class WithTheLibrary(unittest.TestCase):
    def test_lessons_by_dir(self):
        lessons = sc.lessons_by_dir(fs_results.library_path())
        self.assertEqual(lessons["01_naive"][0][0], "01_naive")
        self.assertTrue(all(lesson for steps in lessons.values() for _, lesson in steps))

    def test_check_and_write_through_main(self):
        with tempfile.TemporaryDirectory() as d:
            steps = Path(d) / "steps"
            write(steps / "01_naive" / "a.cu", ["x"])
            write(steps / "02_next" / "a.cu", ["y"])
            notes = Path(d) / "README.md"
            notes.write_text(NOTES)
            args = ["--lib", str(fs_results.library_path()), "--steps", str(steps), "--notes", str(notes)]
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                self.assertEqual(sc.main(args + ["--check"]), 1)
                self.assertIn("is stale; run `python3 bench/step_changes.py --write`", err.getvalue())
                self.assertIn("+| `01_naive` → `02_next` | `a.cu` +1 −1 | +1 −1 |", err.getvalue())
                self.assertEqual(sc.main(args + ["--write"]), 0)
                self.assertEqual(sc.main(args + ["--check"]), 0)
            notes.write_text("# no markers\n")
            with contextlib.redirect_stderr(io.StringIO()) as err2:
                self.assertEqual(sc.main(args + ["--check"]), 2)
            self.assertIn(sc.BEGIN, err2.getvalue())


if __name__ == "__main__":
    unittest.main()


class Base(unittest.TestCase):
    """A step is compared with the step its kernel.cuh says it extends, else with the one before."""

    def test_the_named_base_else_the_one_before(self):
        with tempfile.TemporaryDirectory() as tmp:
            steps = Path(tmp)
            write(steps / "01_a" / "kernel.cuh", ["// Step 01"])
            write(steps / "02_b" / "kernel.cuh", ["// Step 02", "// Extends step 01 (a)."])
            write(steps / "03_c" / "kernel.cuh", ["// Step 03", "//", "// Extends step 01 (a), not 02."])
            write(steps / "04_d" / "step.cu", ["// no kernel.cuh"])
            dirs = sc.step_dirs(steps)
            self.assertEqual([sc.base_of(d, dirs).name for d in dirs[1:]], ["01_a", "01_a", "03_c"])
            self.assertIn("| `01_a` → `03_c` |", sc.table(steps, {}))
