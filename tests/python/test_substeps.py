"""bench/substeps.py: the pruning of `if constexpr (Tr::has(kIdea))` on invented code, and the views in
notes/substeps/ against the steps (the ctest entry `substeps` runs --check too)."""
import re
import sys
import unittest
from unittest import mock
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "bench"))

import substeps  # noqa: E402

SOURCE = """void f() {
  if constexpr (Tr::has(kA)) {
    a();
    if (x) {
      b();
    }
  } else {
    c();
  }
  if constexpr (Tr::has(kB)) d();
  int t = Tr::has(kB) ? 1 : 2;
  if (!Tr::has(kA) || g(h(1))) {
    e();
  }
}
"""


class Prune(unittest.TestCase):
    def test_an_idea_on_keeps_its_branch(self):
        self.assertEqual(substeps.prune(SOURCE, {"kA": True, "kB": True}, {}),
                         "void f() {\n  a();\n  if (x) {\n    b();\n  }\n  d();\n  int t = 1;\n"
                         "  if (g(h(1))) {\n    e();\n  }\n}\n")

    def test_an_idea_off_keeps_the_else_or_nothing(self):
        self.assertEqual(substeps.prune(SOURCE, {"kA": False, "kB": False}, {}),
                         "void f() {\n  c();\n  int t = 2;\n  e();\n}\n")  # `if (true) {...}` unwrapped too

    def test_preprocessor_lines_stay_at_column_0(self):
        src = ("  if constexpr (Tr::has(kA)) {\n#pragma unroll\n    for (;;)\n#pragma unroll\n      for (;;) x();\n"
               "  }\n")
        self.assertEqual(substeps.prune(src, {"kA": True}, {}),
                         "#pragma unroll\n  for (;;)\n#pragma unroll\n    for (;;) x();\n")

    def test_folds(self):
        folds = {r"under\(Tr::IDEAS\)": lambda on: "yes" if on["kA"] else "no"}
        self.assertEqual(substeps.prune("x = under(Tr::IDEAS);", {"kA": True}, folds), "x = yes;")

    def test_the_folds_that_matched_are_named(self):
        folds = {r"under\(Tr::IDEAS\)": lambda on: "yes", r"absent": lambda on: "no"}
        matched = set()
        substeps.prune("x = under(Tr::IDEAS);", {"kA": True}, folds, matched)
        self.assertEqual(matched, {r"under\(Tr::IDEAS\)"})

    def test_a_fold_to_a_constant_prunes_its_branch(self):
        folds = {r"Tr::N == 2": lambda on: "Tr::N == 2" if on["kA"] else "true"}
        src = "if constexpr (Tr::N == 2) {\n  two();\n} else {\n  one();\n}\n"
        self.assertEqual(substeps.prune(src, {"kA": False}, folds), "two();\n")
        self.assertEqual(substeps.prune(src, {"kA": True}, folds), src)

    def test_comments_keep_the_idea_named(self):
        src = "// Tr::has(kA) marks it\nint t = Tr::has(kA) ? 1 : 2;\n"
        self.assertEqual(substeps.prune(src, {"kA": False}, {}), "// Tr::has(kA) marks it\nint t = 2;\n")

    def test_the_header_lists_only_the_ideas_a_view_has(self):
        src = ("// ideas:\n//   07a kA     first idea,\n//              continued\n//   07b kB     second idea,\n"
               "//              continued\n//\n// after the list\n")
        self.assertEqual(substeps.prune(src, {"kA": True, "kB": False}, {}),
                         "// ideas:\n//   07a kA     first idea,\n//              continued\n//\n// after the list\n")
        self.assertEqual(substeps.prune(src, {"kA": True, "kB": True}, {}), src)

    def test_a_from_tag_keeps_its_comment_once_its_sub_step_is_on(self):
        src = ("  // what every view says\n  // From 07b: what 07b brings,\n  // said on two lines.\n  x();\n"
               "  y();  // From 07b: a note after code\n")
        on = {"kA": True, "07a": True, "kB": False, "07b": False}
        self.assertEqual(substeps.prune(src, on, {}), "  // what every view says\n  x();\n  y();\n")
        self.assertEqual(substeps.prune(src, {**on, "kB": True, "07b": True}, {}), src)

    def test_a_tagged_block_ends_at_a_blank_comment_or_a_deeper_line(self):
        # A diagram in a comment: a tagged line drops alone; the lines indented further, and a blank `//`, stay.
        src = ("// One turn:\n//\n//     wait\n// From 07b: bar.sync\n//     compute\n"
               "// From 07b: a sentence that goes on\n// on a second line.\n//\n// Then this.\nint x;\n")
        on = {"07a": True, "07b": False}
        self.assertEqual(substeps.prune(src, on, {}),
                         "// One turn:\n//\n//     wait\n//     compute\n//\n// Then this.\nint x;\n")
        self.assertEqual(substeps.prune(src, {"07a": True, "07b": True}, {}), src)

    def test_a_before_tag_keeps_its_words_until_its_sub_step(self):
        src = ("// Before 07b: the grid is 2-D.\n// From 07b: the grid is 1-D.\nint g;\n"
               "// Before 07b: dV's products first.\nint h;  // Before 07b: exp2f, not ex2\n")
        on = {"07a": True, "07b": False}
        # The words stay without the tag; a sentence's first word is capitalized, a name is not.
        self.assertEqual(substeps.prune(src, on, {}),
                         "// The grid is 2-D.\nint g;\n// dV's products first.\nint h;  // exp2f, not ex2\n")
        self.assertEqual(substeps.prune(src, {"07a": True, "07b": True}, {}),
                         "// From 07b: the grid is 1-D.\nint g;\nint h;\n")

    def test_another_steps_tag_stays_and_an_unknown_sub_step_is_an_error(self):
        src = "// From 09f: the persistent schedule.\nint x;\n"
        self.assertEqual(substeps.prune(src, {"13a": True, "13b": False}, {}), src)
        with self.assertRaisesRegex(ValueError, "tagged 13d, which is no sub-step"):
            substeps.prune("// From 13d: nothing.\n", {"13a": True, "13b": False}, {})

    def test_no_two_blank_lines_are_left(self):
        src = "a();\n\nif constexpr (Tr::has(kB)) {\n  b();\n}\n\nc();\n"
        self.assertEqual(substeps.prune(src, {"kB": False}, {}), "a();\n\nc();\n")


class Views(unittest.TestCase):
    def test_every_sub_step_has_its_view(self):
        views = substeps.views()
        self.assertEqual(sorted(views)[:2], ["07a_rows32", "07b_work_order"])
        self.assertEqual(len([v for v in views if v.startswith("07")]), 7)
        self.assertEqual(len([v for v in views if v.startswith("09")]), 6)
        self.assertEqual([v for v in views if v.startswith("13")], ["13a_softcap", "13b_window", "13c_varlen"])
        for sid, text in views.items():
            code = text.split("\n", 4)[-1].split("#pragma once", 1)[-1]
            if sid.startswith("13"):  # its kernel runs step 09's 09e and 09f traits: their has() stays
                code = code.replace("Tr::has(kPersistent)", "")
                self.assertEqual("WINDOW" in code, sid >= "13b", sid)  # 13a's view is the kernel with WINDOW false
            self.assertNotIn("Tr::has(", code, sid)  # all pruned

    def test_step_07_folds_the_vote_before_07e_and_exp2__before_07f(self):
        views = substeps.views()
        for sid in ("07a_rows32", "07d_smem_epilogue", "07e_rescale_skip", "07f_fast_exp2"):
            code = views[sid].split("#pragma once", 1)[-1]
            self.assertEqual("max_grew" in code, sid >= "07e", sid)
            self.assertEqual("exp2_" in code, sid >= "07f", sid)
            self.assertEqual("exp2f(fmaf(" in code, sid < "07f", sid)

    def test_no_view_speaks_of_a_later_sub_step(self):
        views = substeps.views()
        for step in substeps.STEPS:
            ideas = substeps.ideas_of(substeps.REPO / "steps" / step)
            for _, value, sid in ideas:
                code = views[sid].split("#pragma once", 1)[-1]
                for name, later, later_sid in ideas:
                    if later > value:
                        self.assertIsNone(re.search(rf"\b{name}\b|\b{later_sid[:3]}\b", code),
                                          f"{sid} names {later_sid}")

    def test_a_fold_that_matches_no_sub_step_is_an_error(self):
        with mock.patch.dict(substeps.STEPS["07_flash_attention2"], {r"text no kernel has": lambda on: ""}):
            with self.assertRaisesRegex(ValueError, "no sub-step of 07_flash_attention2 matches"):
                substeps.views()

    def test_the_committed_views_are_current(self):
        for sid, text in substeps.views().items():
            path = substeps.OUT / f"{sid}.cuh"
            self.assertTrue(path.exists() and path.read_text() == text,
                            f"{path} is stale: python3 bench/substeps.py --write")


if __name__ == "__main__":
    unittest.main()
