"""bench/ptx_twins.py: pairing a new flag's false side with the old kernel, on invented PTX."""
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import ptx_twins  # noqa: E402

# Two kernels as ptx's mangled names spell them: k<bool> (old), k<bool, bool> (new) and plain f().
OLD_K, NEW_K = "_Z1kILb1EEvv", "_Z1kILb1ELb0EEvv"
NEW_K_ON, PLAIN = "_Z1kILb1ELb1EEvv", "_Z1fv"


# With pointer parameters: k<true>(int*) (old), k<true, false>(int*, float*) and k<true, true>(int*, float*)
# (new, a trailing parameter that only the flag's true side reads), g() and g(float*).
OLD_KP, NEW_KP, NEW_KP_ON = "_Z1kILb1EEvPi", "_Z1kILb1ELb0EEvPiPf", "_Z1kILb1ELb1EEvPiPf"
OLD_G, NEW_G = "_Z1gv", "_Z1gPf"


def entry(name: str, body: str, block: int, params: int = 1) -> str:
    decls = ",\n".join(f"\t.param .u64 {name}_param_{i}" for i in range(params))
    header = f"{name}(\n{decls}\n)" if params else f"{name}()"  # as ptx writes a kernel without parameters
    return (f".visible .entry {header}\n{{\n\t{body}\n"
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

    def test_a_change_past_an_inline_asm_block_is_found(self):
        # ptx closes an inline asm block with a "}" in column 0, as it closes a kernel; the kernel runs on.
        asm = "// begin inline asm\n\t{\n.reg .pred p;\nselp.u32 %r3, 1, 0, p;\n}\n\t// end inline asm\n\t"
        old = entry(OLD_K, asm + "add.s32 %r1, %r2, 1;", 0) + entry(PLAIN, "ret;", 1)
        new = entry(NEW_K, asm + "add.s32 %r1, %r2, 3;", 0) + "\t// .globl\t_Z1fv\n" + entry(PLAIN, "ret;", 1)
        self.assertEqual(ptx_twins.compare(old, new), (["f()"], ["void k<true, false>()"], []))

    def test_an_unused_trailing_parameter_is_set_aside(self):
        body = "ld.param.u64 %rd1, [KERNEL_param_0];"
        old = entry(OLD_KP, body.replace("KERNEL", OLD_KP), 0)
        new = (entry(NEW_KP, body.replace("KERNEL", NEW_KP), 0, params=2)
               + entry(NEW_KP_ON, body.replace("KERNEL", NEW_KP_ON) + "\n\tld.param.u64 %rd2, [" + NEW_KP_ON
                       + "_param_1];", 1, params=2))
        aside = {}
        self.assertEqual(ptx_twins.compare(old, new, aside), (["void k<true, false>(int*, float*)"], [], []))
        self.assertEqual(aside, {"void k<true, false>(int*, float*)": 1})

    def test_a_trailing_parameter_that_is_read_is_a_difference(self):
        read = "ld.param.u64 %rd1, [" + NEW_KP + "_param_1];"
        aside = {}
        self.assertEqual(ptx_twins.compare(entry(OLD_KP, "ret;", 0), entry(NEW_KP, read, 0, params=2), aside),
                         ([], ["void k<true, false>(int*, float*)"], []))
        self.assertEqual(aside, {})

    def test_a_kernel_without_parameters_gains_one(self):
        aside = {}
        self.assertEqual(ptx_twins.compare(entry(OLD_G, "ret;", 0, params=0), entry(NEW_G, "ret;", 0), aside),
                         (["g(float*)"], [], []))
        self.assertEqual(aside, {"g(float*)": 1})

    def test_the_output_names_the_parameters_set_aside(self):
        import contextlib
        import io
        import tempfile
        body = "mov.u32 %r1, 0;"
        with tempfile.TemporaryDirectory() as d:
            old, new = Path(d, "old.ptx"), Path(d, "new.ptx")
            old.write_text(entry(OLD_KP, body, 0))
            new.write_text(entry(NEW_KP, body, 0, params=2))
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = ptx_twins.main([str(old), str(new)])
        self.assertEqual(rc, 0)
        self.assertIn("identical: void k<true, false>(int*, float*) (1 unused trailing parameter set aside)",
                      out.getvalue())


class Parents(unittest.TestCase):
    """--parents: step 13's features-off kernels and their twins (the compile itself is ctest's ptx_parents)."""

    def test_each_kernel_of_step_13_names_its_twin(self):
        fwd = ("void fs::step13::forward_pass::forward_kernel<__half, fs::step09::Traits<128, 176, 2, 2, 6>, false, "
               "false, false>(CUtensorMap_st, float*)")
        self.assertEqual(ptx_twins.parent_of(fwd),
                         "void fs::step09::warp_specialized_kernel<__half, fs::step09::Traits<128, 176, 2, 2, 6> >")
        bwd = ("void fs::step13::backward_pass::backward_kernel<__nv_bfloat16, 64, 128, false, false, false, "
               "false>(float)")
        self.assertEqual(ptx_twins.parent_of(bwd),
                         "void fs::step12::hopper_backward_kernel<__nv_bfloat16, 64, 128, 3, false>")

    def test_the_unit_holds_every_features_off_kernel_once(self):
        unit = ptx_twins.parents_unit()
        self.assertEqual(unit.count("forward_kernel<"), 12)
        self.assertEqual(unit.count("warp_specialized_kernel<"), 12)
        self.assertEqual(unit.count("backward_kernel<"), 16)  # 8 of step 13's and the 8 hopper_backward_kernel
        self.assertEqual(unit.count(", false, false, false>"), 20)

    def test_without_ptx_files_or_parents_it_refuses(self):
        import contextlib
        import io
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(ptx_twins.main([]), 2)
        self.assertIn("give OLD and NEW, or --parents NVCC", err.getvalue())


if __name__ == "__main__":
    unittest.main()
