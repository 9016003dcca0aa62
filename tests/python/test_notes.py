"""The notes' shape (notes/README.md, "How a note is built"): every step's note is a core lesson of at
most three pages, with its picture, then an appendix; it ends with References and a Next link; its
exercises have solutions; every link resolves (files and #anchors) and every results file it names is
in bench/results/. No GPU, no build needed."""
import re
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
NOTES = REPO / "notes"
RESULTS = REPO / "bench" / "results"

CORE_MAX_LINES = 180   # three pages of about 60 lines
CORE_MAX_CHARS = 12000  # and of about 4,000 characters as rendered (link targets left out), however wide the lines
LINK_TARGET = re.compile(r"\]\([^)]*\)")
APPENDIX = re.compile(r"^## Appendix\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
RESULT_NAME = re.compile(r"bench/results/([A-Za-z0-9_.\-*]+)")
# words of the project's bookkeeping, not of the lesson ("issue" as a GPU verb is fine): a tracker's
# number is followed by punctuation ("issue 20 (", "issue 11's", "issues 10-12)", "issue 21;"), the GPU
# verb's by what is issued ("issues 2 instructions", "issues 0.8 % more", "issue 2 × 64 × …")
TRACKER = (r"\bmoonshots?\b|\brequirements?\b|\bissue\s*#\d+|\(issues? \d+|"
           r"\bissues? #?\d+(?=['’),;:]|\s*\(|[-–]\d|$)|"
           r"\bissues? (says?|asks?|text)\b|\bgoals?\b")
# and, in the notes, its scorekeeping: targets (not cmake's --target or PTX's .target), what was met or missed
BOOKKEEPING = re.compile(TRACKER + r"|(?<![-.])\btargets?\b|\*\*(met|missed)\b", re.IGNORECASE)
HTML_ANCHOR = re.compile(r'<a (?:id|name)="([^"]+)"')


def step_notes():
    return sorted(p for p in NOTES.glob("[0-9][0-9]_*.md"))


def pages():
    """Every page of notes/: the step notes, the index and the solutions."""
    return step_notes() + [NOTES / "README.md"] + sorted((NOTES / "solutions").glob("*.md"))


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        out.update(HTML_ANCHOR.findall(line))
        if not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def prose(path):
    """The note without its fenced code blocks."""
    out, in_code = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if not in_code:
            out.append(line)
    return out


class Slug(unittest.TestCase):
    def test_github_rules(self):
        self.assertEqual(slug(" Fix 1 — padding (`04_pad`, `Padded16Layout`)"), "fix-1--padding-04_pad-padded16layout")
        self.assertEqual(slug(" O += P·V"), "o--pv")
        self.assertEqual(slug(" Reading path"), "reading-path")


class Shape(unittest.TestCase):
    def test_there_is_one_note_per_step(self):
        self.assertEqual([p.name[:2] for p in step_notes()], [f"{i:02d}" for i in range(1, 14)])

    def test_core_then_appendix(self):
        for note in step_notes():
            with self.subTest(note=note.name):
                lines = note.read_text().splitlines()
                starts = [i for i, l in enumerate(lines) if APPENDIX.match(l)]
                self.assertTrue(starts, "no '## Appendix' heading")
                self.assertLessEqual(starts[0], CORE_MAX_LINES,
                                     f"the core is {starts[0]} lines; at most {CORE_MAX_LINES}")
                core = "\n".join(lines[:starts[0]])
                shown = len(LINK_TARGET.sub("]", core))
                self.assertLessEqual(shown, CORE_MAX_CHARS, f"the core shows {shown} characters; at most {CORE_MAX_CHARS}")
                self.assertRegex(core, r"\]\(figures/[^)]+\.png\)", "the core has no picture")
                self.assertRegex(core, r"bench/results/", "the core names no measured file")

    def test_references_and_next(self):
        for note in step_notes():
            with self.subTest(note=note.name):
                lines = [l for l in note.read_text().splitlines() if l.strip()]
                self.assertTrue(any(l.startswith("## References") for l in lines), "no References")
                self.assertRegex(lines[-1], r"^(Next: \[|This is the last step)", "the note does not end with a Next link")

    def test_exercises_have_solutions(self):
        for note in step_notes():
            with self.subTest(note=note.name):
                text = note.read_text()
                if re.search(r"^## Exercises?\b", text, re.MULTILINE):
                    sol = f"solutions/{note.name[:2]}.md"
                    self.assertTrue((NOTES / sol).is_file(), f"{sol} is missing")
                    self.assertIn(f"]({sol})", text)

    def test_every_figure_is_shown_and_listed(self):
        # each picture in notes/figures/ is in a note and in notes/README.md's table of figures
        readme = (NOTES / "README.md").read_text()
        shown = "\n".join(note.read_text() for note in step_notes())
        for png in sorted((NOTES / "figures").glob("*.png")):
            with self.subTest(figure=png.name):
                self.assertIn(f"](figures/{png.name})", shown)
                self.assertIn(f"| [`{png.name}`](figures/{png.name}) |", readme)

    def test_the_bookkeeping_words(self):
        for line in ("The goals: 0.90x", "**Met**: the first", "**Missed**: FA4", "the target was 1.00x",
                     "a moonshot", "(issue 22)", "the requirement"):
            self.assertIsNotNone(BOOKKEEPING.search(line), line)
        for line in ("cmake --build build --target resource_report", "the PTX's .target sm_90a", "a metric",
                     "the warp issues an mma", "goalkeeper"):
            self.assertIsNone(BOOKKEEPING.search(line), line)

    def test_no_bookkeeping_words(self):
        for note in pages():
            with self.subTest(note=note.name):
                for n, line in enumerate(prose(note), 1):
                    self.assertIsNone(BOOKKEEPING.search(line), f"line {n}: {line}")


class Links(unittest.TestCase):
    def test_links_resolve(self):
        for page in pages():
            for target in LINK.findall("\n".join(prose(page))):
                if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
                    continue
                with self.subTest(page=page.name, link=target):
                    file, _, anchor = target.partition("#")
                    dest = (page.parent / file).resolve() if file else page
                    self.assertTrue(dest.exists(), f"{dest} does not exist")
                    if anchor and dest.suffix == ".md":
                        self.assertIn(anchor, anchors(dest))

    def test_results_files_exist(self):
        names = {p.name for p in RESULTS.iterdir()}
        for page in pages() + [REPO / "README.md"]:
            for name in RESULT_NAME.findall(page.read_text()):
                name = name.rstrip(".")
                with self.subTest(page=page.name, file=name):
                    if name.endswith(("-", "*")) or "*" in name:
                        prefix = name.split("*")[0]
                        self.assertTrue(any(n.startswith(prefix) for n in names), f"no file {name}")
                    elif name:
                        self.assertIn(name, names)


class ProjectPages(unittest.TestCase):
    """The pages beside the notes and the help of every bench and test script: no tracker numbers, goals
    or pass marks either (there "target" is cmake's or a training target's, so it is not looked for)."""
    WORDS = re.compile(TRACKER, re.IGNORECASE)
    MARK = re.compile(r"\bMISS\b")

    def pages(self):
        yield from (REPO / name for name in ("README.md", "bench/README.md", "tests/README.md", "python/README.md")
                    if (REPO / name).is_file())
        yield from sorted((REPO / "bench" / "results").rglob("README.md"))
        yield from sorted((REPO / "bench").glob("*.py"))
        yield from sorted((REPO / "bench").glob("*.sh"))
        yield from sorted((REPO / "tests").glob("*.sh"))

    def test_no_bookkeeping(self):
        for page in self.pages():
            for number, line in enumerate(page.read_text().splitlines(), 1):
                with self.subTest(page=str(page.relative_to(REPO)), line=number):
                    self.assertIsNone(self.WORDS.search(line), line)
                    self.assertIsNone(self.MARK.search(line), line)

    def test_the_rule_sees_them(self):
        for line in ("after the size pass of issue 20", "issue 11's tests", "(issues 10-12)", "issue #21",
                     "goals: varlen/dense >= 0.90", "0.76x MISS"):
            self.assertTrue(self.WORDS.search(line) or self.MARK.search(line), line)
        for line in ("a miss in L2", "the warp issues 2 instructions", "cmake --target flash-steps",
                     "07g issues 0.8 % more", "the warpgroups issue 2 × 64 × 128"):
            self.assertFalse(self.WORDS.search(line) or self.MARK.search(line), line)


if __name__ == "__main__":
    unittest.main()
