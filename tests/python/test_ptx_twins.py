"""bench/ptx_twins.py: pairing a new flag's false side with the old kernel, on invented PTX."""
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import ptx_twins  # noqa: E402

# Two kernels as ptx's mangled names spell them: k<bool> (old), k<bool, bool> (new) and plain f().
OLD_K, NEW_K = "_Z1kILb1EEvv", "_Z1kILb1ELb0EEvv"
NEW_K_ON, PLAIN = "_Z1kILb1ELb1EEvv", "_Z1fv"


def entry(name: str, body: str, block: int) -> str:
    return (f".visible .entry {name}(\n\t.param .u64 {name}_param_0\n)\n{{\n\t{body}\n"
            f"\t@%p1 bra \t$L__BB{block}_2;\n$L__BB{block}_2:\n\tret;\n}}\n")


class Twins(unittest.TestCase):
    def test_the_false_side_pairs_with_the_old_kernel(self):
        old = entry(OLD_K, "add.s32 %r1, %r2, 1;", 0) + entry(PLAIN, "mov.u32 %r1, 0;", 1)
        new = (entry(PLAIN, "mov.u32 %r1, 0;", 0) + entry(NEW_K, "add.s32 %r1, %r2, 1;", 1)
               + entry(NEW_K_ON, "add.s32 %r1, %r2, 2;", 2))
        same, differ, alone = ptx_twins.compare(old, new)
        self.assertEqual((sorted(same), differ, alone), (["f()", "void k<true, false>()"], [], []))

    def test_a_changed_instruction_is_found(self):
        old = entry(OLD_K, "add.s32 %r1, %r2, 1;", 0)
        new = entry(NEW_K, "add.s32 %r1, %r2, 3;", 0)
        self.assertEqual(ptx_twins.compare(old, new), ([], ["void k<true, false>()"], []))

    def test_a_kernel_without_twin_is_named(self):
        self.assertEqual(ptx_twins.compare(entry(PLAIN, "ret;", 0), entry(OLD_K, "ret;", 0)),
                         ([], [], ["void k<true>()"]))


if __name__ == "__main__":
    unittest.main()
