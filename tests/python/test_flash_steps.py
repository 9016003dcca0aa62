"""The flash_steps package (python/flash_steps) without PyTorch or a GPU: importing it, finding and
loading the library, the registry, refusals through the ctypes layer raised with the library's
sentence, the structs against a C compiler and against the library, and the Python-side argument
checks on fake tensors (objects with shape, stride(), dtype and device, as a torch tensor has)."""
import _ctypes
import ctypes
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import types
import unittest
from unittest import mock
from fractions import Fraction
from pathlib import Path

try:
    import numpy  # numpy scalars are numbers too, when numpy is there
except ImportError:
    numpy = None

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))

import flash_steps as fs  # noqa: E402
import fs_results  # noqa: E402

LIB = fs_results.library_path()  # $FLASH_STEPS_LIB (ctest sets it), else build/libflash_steps.so
needs_library = unittest.skipUnless(LIB.exists(), "libflash_steps.so not built (set FLASH_STEPS_LIB)")


def run_python(code: str, pythonpath: Path, env_lib: str | None = None, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FLASH_STEPS_LIB"}
    if env_lib is not None:
        env["FLASH_STEPS_LIB"] = env_lib
    env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, cwd=cwd)


class Import(unittest.TestCase):
    def test_import_needs_no_torch(self):
        # torch made unimportable: the package imports, lists its API, refuses bad arguments, and says
        # so only when a tensor function is called with good ones (here fake tensors).
        code = ("import sys; sys.modules['torch'] = None\n"
                "import flash_steps\n"
                "assert callable(flash_steps.attention) and callable(flash_steps.steps)\n"
                "class T:\n    shape, dtype, device = (1, 1, 1, 8), 'torch.float16', 'cuda:0'\n"
                "    stride, data_ptr = lambda self: (8, 8, 8, 1), lambda self: 256\n"
                "try:\n    flash_steps.forward(None, None, None)\nexcept flash_steps.InvalidArgument as e:\n"
                "    print(e.message)\n"
                "try:\n    flash_steps.forward(T(), T(), T())\nexcept ImportError:\n    print('no torch')\n")
        out = run_python(code, REPO / "python")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.splitlines(), ["Q is None; it must be a tensor (with shape, stride(), dtype, "
                                                   "device and data_ptr())", "no torch"])


class Discovery(unittest.TestCase):
    """The order: FLASH_STEPS_LIB, else build/ of the repository, else the other build*/ directories."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.repo = Path(self.tmp.name)
        shutil.copytree(REPO / "python" / "flash_steps", self.repo / "python" / "flash_steps",
                        ignore=shutil.ignore_patterns("__pycache__"))

    def tearDown(self):
        self.tmp.cleanup()

    def library(self, env_lib=None, cwd=None):
        return run_python("import flash_steps\nprint(flash_steps.library().path)", self.repo / "python", env_lib, cwd)

    def test_missing_library_says_where_it_looked_and_how_to_build(self):
        out = self.library()
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("LibraryNotFound", out.stderr)
        self.assertIn(f"none of {self.repo / 'build' / 'libflash_steps.so'} exists", out.stderr)
        self.assertIn("cmake -B build -G Ninja && cmake --build build", out.stderr)
        out = self.library("/nowhere/libflash_steps.so")
        self.assertIn("FLASH_STEPS_LIB is /nowhere/libflash_steps.so, which does not exist", out.stderr)

    def test_a_path_given_that_does_not_exist(self):
        with self.assertRaises(fs.LibraryNotFound) as e:
            fs.find_library("/nowhere/libflash_steps.so")  # a path given goes before FLASH_STEPS_LIB
        self.assertTrue(e.exception.message.startswith("/nowhere/libflash_steps.so does not exist; build it (cmake -B "
                                                       "build -G Ninja && cmake --build build"), e.exception.message)
        self.assertIsInstance(e.exception, OSError)

    def test_candidates(self):
        for d in ("build", "build-release", "build-asan", "buildx"):
            (self.repo / d).mkdir()
        (self.repo / "build.txt").write_text("not a directory")
        got = [str(p.relative_to(self.repo)) for p in fs.library_candidates(self.repo)]
        self.assertEqual(got, ["build/libflash_steps.so", "build-asan/libflash_steps.so",
                               "build-release/libflash_steps.so", "buildx/libflash_steps.so"])

    @needs_library
    def test_build_dirs_are_searched_and_one_that_fails_to_load_is_passed_over(self):
        (self.repo / "build").mkdir()
        (self.repo / "build" / "libflash_steps.so").write_text("not a shared library")
        (self.repo / "build-2").mkdir()
        (self.repo / "build-2" / "libflash_steps.so").symlink_to(LIB.resolve())
        out = self.library()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), str(self.repo / "build-2" / "libflash_steps.so"))
        out = self.library(str(LIB))  # FLASH_STEPS_LIB first
        self.assertEqual(out.stdout.strip(), str(LIB))

    def test_an_empty_FLASH_STEPS_LIB_is_said_to_be_empty(self):
        out = self.library("")  # and the candidates are looked at, as when it is not set
        self.assertIn("libflash_steps.so not found: FLASH_STEPS_LIB is set but empty and none of "
                      f"{self.repo / 'build' / 'libflash_steps.so'} exists", out.stderr)

    def test_a_relative_path_is_the_current_directorys(self):
        (self.repo / "lib.so").write_text("not a library")
        out = run_python("import flash_steps\nprint(flash_steps.find_library('./lib.so')[0])", self.repo / "python",
                         "./lib.so", cwd=self.repo)
        self.assertEqual(out.stdout.strip(), str(self.repo / "lib.so"), out.stderr)
        out = self.library("./none.so", cwd=self.repo)
        self.assertIn(f"FLASH_STEPS_LIB is ./none.so ({self.repo / 'none.so'}), which does not exist", out.stderr)

    @needs_library
    def test_a_relative_FLASH_STEPS_LIB_loads(self):
        # Path("./libflash_steps.so") is "libflash_steps.so", which dlopen looked for on the system's path
        (self.repo / "libflash_steps.so").symlink_to(LIB.resolve())
        out = self.library("./libflash_steps.so", cwd=self.repo)
        self.assertEqual(out.stdout.strip(), str(self.repo / "libflash_steps.so"), out.stderr)

    def test_what_is_not_libflash_steps_is_refused_before_it_is_used(self):
        unrelated = Path(_ctypes.__file__)  # a shared library, with no fs_* function
        with self.assertRaises(fs.LibraryNotFound) as e:
            fs.Library(unrelated)
        self.assertEqual(e.exception.message, f"{unrelated}: not libflash_steps (it has no fs_last_error or "
                                              "fs_step_count)")
        data = unrelated.read_bytes()
        files = {"empty.so": b"", "text.so": b"not a library", "elf32.so": b"\x7fELF\x01\x01\x01" + bytes(57),
                 "cut.so": data[:len(data) // 2]}
        for name, content in files.items():
            (self.repo / name).write_bytes(content)
        (self.repo / "dir.so").mkdir()
        for name, why in (("empty.so", "not an ELF file (it does not start with \\x7fELF)"),
                          ("text.so", "not an ELF file (it does not start with \\x7fELF)"),
                          ("elf32.so", "not a 64-bit ELF file"), ("dir.so", "not a regular file"),
                          ("cut.so", f"{len(data) // 2} bytes, shorter than the {len(data)} its ELF headers give (a "
                                     "truncated copy?)")):
            with self.assertRaises(fs.LibraryNotFound) as e:
                fs.Library(self.repo / name)
            self.assertEqual(e.exception.message, f"{self.repo / name}: {why}")
        out = self.library(str(self.repo / "text.so"))
        self.assertIn(f"LibraryNotFound: cannot load {self.repo / 'text.so'}: not an ELF file", out.stderr)

    @needs_library
    def test_a_truncated_library_is_refused_not_mapped(self):
        # dlopen maps a copy cut short past its end: SIGBUS killed the process
        cut = self.repo / "libflash_steps.so"
        with open(LIB, "rb") as f:
            cut.write_bytes(f.read(LIB.stat().st_size * 2 // 3))
        out = self.library(str(cut))
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertIn(f"cannot load {cut}: {cut.stat().st_size} bytes, shorter than the {LIB.stat().st_size} its ELF "
                      "headers give", out.stderr)


class Layout(unittest.TestCase):
    """The ctypes structs against the header, compiled by a C compiler."""

    @unittest.skipUnless(shutil.which("cc"), "no C compiler")
    def test_structs_match_the_header(self):
        fields = {
            fs.FsStrides: ("fs_strides", ["batch", "row", "head", "dim"]),
            fs.FsProblem: ("fs_problem", [f for f, _ in fs.FsProblem._fields_]),
            fs.FsDecodeProblem: ("fs_decode_problem", [f for f, _ in fs.FsDecodeProblem._fields_]),
            fs.FsBackwardProblem: ("fs_backward_problem", [f for f, _ in fs.FsBackwardProblem._fields_]),
        }
        lines = []
        for struct, (cname, names) in fields.items():
            lines.append(f'printf("%zu\\n", sizeof({cname}));')
            lines += [f'printf("%zu\\n", offsetof({cname}, {n}));' for n in names]
        src = "#include <stddef.h>\n#include <stdio.h>\n#include \"flash_steps.h\"\nint main(void) {\n" + \
            "\n".join(lines) + "\nreturn 0;\n}\n"
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "layout.c").write_text(src)
            exe = Path(d) / "layout"
            subprocess.run(["cc", "-I", str(REPO / "common"), str(Path(d) / "layout.c"), "-o", str(exe)], check=True)
            want = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
        got = []
        for struct, (_, names) in fields.items():
            got.append(ctypes.sizeof(struct))
            got += [getattr(struct, n).offset for n in names]
        self.assertEqual(got, want)

    def test_every_function_of_the_header_has_a_signature(self):
        header = (REPO / "common" / "flash_steps.h").read_text()
        import re
        declared = set(re.findall(r"FS_API\s+[\w\s\*]+?\b(fs_\w+)\s*\(", header))
        self.assertEqual(declared, set(fs._capi.SIGNATURES))


@needs_library
class Library(unittest.TestCase):
    def setUp(self):
        self.lib = fs.library(LIB)

    def test_every_function_is_exported(self):
        self.assertEqual(self.lib.missing, [])

    def test_steps(self):
        steps = fs.steps()
        self.assertEqual(steps[0].id, "01_naive")
        self.assertEqual(steps[0].dir, "01_naive")
        self.assertEqual(len({s.id for s in steps}), len(steps))
        self.assertTrue(all(s.lesson and s.name and s.min_compute_capability >= 80 for s in steps))
        self.assertEqual([s.id for s in steps if s.runs("decode")], ["10_decoding"])
        self.assertFalse(any(s.runs("backward") for s in steps if s.id < "11"))  # the backward starts at step 11
        self.assertTrue(all(s.runs("forward") for s in steps if s.id < "11"))
        self.assertTrue(all(s.runs("forward") or s.runs("backward") for s in steps))
        self.assertTrue(all(set(s.passes) <= {"forward", "decode", "backward"} for s in steps))

    def test_problem_init_and_strides(self):
        p = self.lib.problem(2, 512, 512, 16, 16, 128, "bf16", True)
        self.assertEqual((p.batch, p.seqlen_q, p.heads_q, p.head_dim, p.dtype, p.causal), (2, 512, 16, 128, 1, 1))
        self.assertAlmostEqual(p.softmax_scale, 128 ** -0.5, places=6)
        self.assertEqual((p.q.batch, p.q.row, p.q.head, p.q.dim), (512 * 16 * 128, 16 * 128, 128, 1))
        p = self.lib.problem(2, 512, 512, 16, 16, 128, "fp16", False, {"o": (1, 2, 3, 1)})
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.check("01_naive", p)  # the library read our strides
        self.assertIn("multiple of 8", e.exception.message)

    def test_a_refusal_is_raised_with_the_library_sentence(self):
        p = self.lib.problem(2, 512, 512, 16, 16, 12, "fp16", False)
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.check("07g_flash_attention2", p)
        self.assertEqual(e.exception.status, fs._capi.FS_ERR_INVALID)
        self.assertEqual(e.exception.status_name, "FS_ERR_INVALID")
        self.assertEqual(e.exception.function, "fs_check")
        self.assertIn("head_dim is 12", e.exception.message)
        self.assertIn("head_dim is 12", str(e.exception))
        self.assertIsInstance(e.exception, ValueError)
        with self.assertRaises(fs.UnknownStep) as e:
            self.lib.check("99_nothing", p)
        self.assertIn("no step has id '99_nothing'", e.exception.message)
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.run("01_naive", self.lib.problem(2, 512, 512, 16, 16, 128, "fp16", False), 0, 0, 0, 0, 0)
        self.assertIn("null", e.exception.message)
        self.assertTrue(str(e.exception).startswith("fs_run(01_naive): "))

    def test_usable_is_the_library_rule(self):
        # the strides usable() passes on are those the library accepts (it refuses the others naming a stride;
        # one it accepts may still be refused here for want of a device)
        rng = random.Random(21)
        for _ in range(300):
            heads, seqlen = rng.choice([1, 2, 8]), rng.choice([1, 2, 64])
            strides = tuple(rng.choice([0, 8, 64, 120, 128, 1024, 4100, 8192, -8]) for _ in range(3)) + (1,)
            view = FakeTensor((2, seqlen, heads, 128), strides=strides)
            p = self.lib.problem(2, 64, seqlen, 8, heads, 128, "fp16", False, {"k": strides})
            try:
                self.lib.check("01_naive", p)
                refused = False
            except fs.FlashStepsError as e:
                refused = isinstance(e, fs.InvalidArgument) and "K's" in e.message and "stride" in e.message
            self.assertEqual(passed_on(view), not refused, (strides, heads, seqlen))

    def test_init_sizes_and_flags_are_checked_before_ctypes(self):
        # ctypes would wrap batch 2**64 + 2 to 2 and seqlen_k 2**63 to -2**63; the C ABI refuses causal 2
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.problem(2 ** 64 + 2, 512, 512, 16, 16, 128, "fp16", False)
        self.assertEqual(e.exception.message, "batch is 18446744073709551618; it must be an integer from "
                                              "-9223372036854775808 to 9223372036854775807")
        self.assertEqual(e.exception.function, "fs_problem_init")
        for call, want in ((lambda: self.lib.problem(2, 512, 2 ** 63, 16, 16, 128, "fp16", False),
                            "seqlen_k is 9223372036854775808; it must be an integer from"),
                           (lambda: self.lib.problem(2, 512, 512, 16, 16, 128.0, "fp16", False),
                            "head_dim is 128.0; it must be an integer from"),
                           (lambda: self.lib.problem(2, 512, 512, 16, 16, 128, "fp16", 2),
                            "causal is 2; it must be True, False, 0 or 1"),
                           (lambda: self.lib.decode_problem(2, 1, 64, 8, 8, 64, "fp16", False, 2 ** 64 + 16),
                            "page_size is 18446744073709551632; it must be an integer from"),
                           (lambda: self.lib.backward_problem(2, 64, 64, 8, 8, 64, "fp16", False, deterministic="no"),
                            "deterministic is 'no'; it must be True, False, 0 or 1"),
                           (lambda: self.lib.problem(2, 64, 64, 8, 8, 64, "fp16", False, {"o": (1, 2, 3)}),
                            "strides['o'] is (1, 2, 3); it must have one entry per dimension (batch, row, head, dim)"),
                           (lambda: self.lib.problem(2, 64, 64, 8, 8, 64, "fp16", False, {"q": (0, 2 ** 64, 8, 1)}),
                            "row in strides['q'] (0, 18446744073709551616, 8, 1) is 18446744073709551616; it must be")):
            with self.assertRaises(fs.InvalidArgument) as e:
                call()
            self.assertTrue(e.exception.message.startswith(want), e.exception.message)
        p = self.lib.problem(True + 1, 512, 512, 16, 16, 128, "fp16", 1)
        self.assertEqual((p.batch, p.causal), (2, 1))

    def test_decode_problem(self):
        p = self.lib.decode_problem(2, 1, 4096, 32, 8, 128, "fp16", False, 64)
        self.assertEqual((p.page_size, p.num_pages, p.max_pages_per_seq, p.block_table_stride), (64, 128, 64, 64))
        self.assertEqual(self.lib.decode_kv_bytes(p), 2.0 * 2 * 4096 * 8 * 128 * 2)
        self.assertEqual(self.lib.decode_kv_bytes(p, [1024, 0]), 2.0 * 1024 * 8 * 128 * 2)
        for lengths, want in (([1024, 0, 7], "num_lengths is 3"), ([1024, 4097], "4097"), ([-1, 0], "-1")):
            with self.assertRaises(fs.InvalidArgument) as e:  # the library's sentences
                self.lib.decode_kv_bytes(p, lengths)
            self.assertEqual(e.exception.function, "fs_decode_kv_bytes")
            self.assertIn(want, e.exception.message)
        for bad in (2 ** 31, 2 ** 32 + 5, 1.5, "7", True, None):  # ctypes would wrap 2**32 + 5 to 5
            with self.assertRaises(fs.InvalidArgument) as e:
                self.lib.decode_kv_bytes(p, [0, bad])
            self.assertEqual(e.exception.message, f"lengths[1] is {bad!r}; it must be an integer from -2147483648 to "
                                                  "2147483647")
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.check("01_naive", p)
        self.assertIn("has no decoding entry", e.exception.message)
        self.assertEqual(e.exception.function, "fs_decode_check")
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.runner("10_decoding", p, 0, 0, 0, 0, 0, 0, 0)()
        self.assertIn("Q is a null pointer", e.exception.message)
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.runner("10_decoding", p, 0, 0, 0)  # a pointer list of another pass
        self.assertIn("fs_run_decode takes 7: q, k_cache, v_cache, block_table, cache_seqlens, o, lse",
                      e.exception.message)
        with self.assertRaises(fs.InvalidArgument):
            self.lib.check("10_decoding", fs.FsStrides())  # not a problem

    def test_backward_problem_written_by_the_library(self):
        p = self.lib.backward_problem(2, 256, 512, 8, 2, 64, "bf16", True, deterministic=True)
        self.assertEqual((p.attention.batch, p.attention.seqlen_q, p.attention.seqlen_k, p.attention.heads_q,
                          p.attention.heads_kv, p.attention.head_dim, p.attention.dtype, p.attention.causal),
                         (2, 256, 512, 8, 2, 64, 1, 1))
        self.assertEqual(p.deterministic, 1)
        self.assertEqual((p.d_o.batch, p.d_o.row, p.d_o.head, p.d_o.dim), (256 * 8 * 64, 8 * 64, 64, 1))
        self.assertEqual((p.dk.batch, p.dk.row, p.dk.head, p.dk.dim), (512 * 2 * 64, 2 * 64, 64, 1))
        self.assertEqual((p.dv.row, p.dq.row), (2 * 64, 8 * 64))
        p = self.lib.backward_problem(2, 256, 512, 8, 2, 64, "bf16", True, strides={"dq": (1, 2, 3, 1), "k": (0, 0, 0, 1)})
        self.assertEqual((p.dq.batch, p.attention.k.batch), (1, 0))

    def test_backward_refusals(self):
        no_backward = next(s.id for s in fs.steps() if not s.runs("backward"))
        p = self.lib.backward_problem(2, 256, 256, 8, 8, 64, "fp16", False)
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.check(no_backward, p)
        self.assertIn("backward", e.exception.message)
        p.deterministic = 2
        for s in [s.id for s in fs.steps() if s.runs("backward")]:
            with self.assertRaises(fs.InvalidArgument) as e:
                self.lib.check(s, p)
            self.assertIn("deterministic is 2", e.exception.message)

    def test_a_backward_only_step_refuses_forward_problems(self):
        for s in [s.id for s in fs.steps() if not s.runs("forward")]:
            with self.assertRaises(fs.InvalidArgument):
                self.lib.check(s, self.lib.problem(2, 256, 256, 8, 8, 64, "fp16", False))

    def test_window_reaches_the_library(self):
        # fs_problem_flops counts the pairs a window lets attend (4·B·Hq·d each): the library's closed form against
        # fs_results.visible (the Python statement of the rule) pair by pair; the library's sentences judge the values
        for sq, sk, causal, window in ((300, 200, False, (16, 40)), (200, 300, True, (64, -1)),
                                       (128, 128, False, (0, 0)), (96, 160, False, (-1, 10)),
                                       (160, 96, True, (500, 500)), (64, 64, True, (-1, -1))):
            pairs = sum(fs_results.visible(i, j, sq, sk, causal, window) for i in range(sq) for j in range(sk))
            p = self.lib.problem(2, sq, sk, 4, 2, 64, "fp16", causal, window=window)
            self.assertEqual(self.lib.flops(p), 4.0 * 2 * 4 * 64 * pairs, (sq, sk, causal, window))
            b = self.lib.backward_problem(2, sq, sk, 4, 2, 64, "fp16", causal, window=window)
            self.assertEqual((b.attention.window, self.lib.flops(b)), (1, 2.5 * self.lib.flops(p)))
        # causal without a window keeps FlashAttention's convention, half of Sq·Sk (not the 64·65/2 pairs)
        self.assertEqual(self.lib.flops(self.lib.problem(2, 64, 64, 4, 2, 64, "fp16", True)),
                         4.0 * 2 * 4 * 64 * 64 * 32)
        p = self.lib.problem(2, 256, 256, 4, 4, 64, "fp16", False, window=(-2, 0))
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.check("07g_flash_attention2", p)
        self.assertEqual(e.exception.message, "window_left is -2; it must be at least -1 (-1: unbounded on that side)")
        p = self.lib.problem(2, 256, 256, 4, 4, 64, "fp16", False, window=(64, 64))
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.check("07g_flash_attention2", p)
        self.assertIn("window is 1 (64, 64); step 07g_flash_attention2 has no sliding window", e.exception.message)
        with self.assertRaises(fs.InvalidArgument) as e:  # ctypes would wrap 2**32 to 0
            self.lib.problem(2, 256, 256, 4, 4, 64, "fp16", False, window=(2 ** 32, 0))
        self.assertEqual(e.exception.function, "fs_problem_init")
        self.assertTrue(e.exception.message.startswith("window is (4294967296, 0); it must be None"))

    def test_varlen_reaches_the_library(self):
        # A variable-length batch of 3 sequences (5, 0, 7 query rows; 3, 4, 9 keys), causal: the addresses of the
        # offsets are never read by fs_check, so any will do; the FLOPs from host copies, each sequence its own
        p = self.lib.problem(1, 1, 1, 4, 2, 64, "fp16", True)
        cu_q, cu_k = [0, 5, 5, 12], [0, 3, 7, 16]
        p.batch, p.seqlen_q, p.seqlen_k, p.total_q, p.total_k = 3, 7, 9, 12, 16
        p.q.batch = p.k.batch = p.v.batch = p.o.batch = 0
        p.cu_seqlens_q, p.cu_seqlens_k = 0x7F0000001000, 0x7F0000002000
        self.assertEqual(self.lib.varlen_flops(p, cu_q, cu_k), 4.0 * 4 * 64 * (5 * 3 / 2 + 0 + 7 * 9 / 2))
        self.assertGreaterEqual(self.lib.flops(p), self.lib.varlen_flops(p, cu_q, cu_k))  # at the bounds
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.varlen_flops(p, [0, 5, 4, 12], cu_k)
        self.assertEqual(e.exception.message, "cu_seqlens_q[2] is 4, below cu_seqlens_q[1] = 5: the offsets must not "
                         "decrease")
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.varlen_flops(p, [0, 5, 12], cu_k)
        self.assertEqual(e.exception.message, "cu_seqlens_q has 3 offsets; a batch of 3 sequences has batch + 1 = 4")
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.check("07g_flash_attention2", p)
        self.assertIn("cu_seqlens_q is set (a variable-length batch of 3 sequences); step 07g_flash_attention2 has no "
                      "variable-length batches (NULL turns it off)", e.exception.message)
        p.q.batch = 8
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.check_offsets(p)
        self.assertEqual(e.exception.message, "with cu_seqlens the tensors are (total, heads, head_dim): q.batch is 8, "
                         "it must be 0")
        self.lib.check_offsets(self.lib.problem(2, 64, 64, 4, 2, 64, "fp16", False))  # dense: nothing to check

    def test_shared_rules(self):
        p = self.lib.problem(8, 2048, 2048, 16, 16, 128, "fp16", False)
        self.assertEqual(self.lib.flops(p), 4.0 * 8 * 16 * 2048 * 2048 * 128)
        b = self.lib.backward_problem(8, 2048, 2048, 16, 16, 128, "fp16", True)
        self.assertEqual(self.lib.flops(b), 2.5 * 2.0 * 8 * 16 * 2048 * 2048 * 128)
        self.assertEqual(self.lib.backward_bound("fp16", 0.25, 8.0), 2 * 0.25 + 2.0 ** -11 * 8.0)
        self.assertEqual(self.lib.backward_bound("bf16", 0.0, 4.0), 2.0 ** -8 * 4.0)
        with self.assertRaises(fs.InvalidArgument):
            self.lib.backward_bound("fp16", -1.0, 1.0)
        self.assertEqual(self.lib.tolerance("bf16", 2.0), (2 * 2.0 ** -7, 2.0 ** -7, 1e-4))
        with self.assertRaises(fs.InvalidArgument):
            self.lib.tolerance("fp16", float("nan"))
        self.assertEqual(self.lib.speedups(["01_naive", "02_x"], [4.0, 2.0]), [(1.0, 0.0), (2.0, 2.0)])
        self.assertEqual(self.lib.sweep_shape(16384, 2048, 128), (8, 16))
        with self.assertRaises(fs.InvalidArgument) as e:
            self.lib.sweep_shape(16384, 3000, 128)
        self.assertIn("seqlen is 3000", e.exception.message)
        self.assertEqual(self.lib.sweep(True)["seqlens"], [1024, 2048, 4096])


class FakeTensor:
    """What the checks read of a torch tensor: shape, stride(), dtype and device (by their names), data_ptr()."""

    def __init__(self, shape, dtype="torch.float16", strides=None, device="cuda:0", address=0x7F0000000000):
        self.shape, self.dtype, self.device, self.address = tuple(shape), dtype, device, address
        self._strides = strides or tuple(int(math.prod(shape[i + 1:])) for i in range(len(shape)))

    def stride(self):
        return self._strides

    def data_ptr(self):
        return self.address


def passed_on(t) -> bool:
    """Whether flash_steps' usable() passes t on as it is, rather than copying it (torch stood in for)."""
    t.clone = lambda memory_format: ("a copy", memory_format)
    with mock.patch.object(fs._torch, "_torch", lambda: types.SimpleNamespace(contiguous_format="contiguous")):
        got = fs._torch.usable(t)
    assert got is t or got == ("a copy", "contiguous"), got
    return got is t


class Arguments(unittest.TestCase):
    """flash_steps.forward_problem / backward_problem / decode_problem: the checks before the C call."""

    def setUp(self):
        self.q = FakeTensor((2, 64, 8, 128))
        self.kv = FakeTensor((2, 96, 2, 128))

    def refused(self, fn, *args):
        with self.assertRaises(fs.InvalidArgument) as e:
            fn("test", *args)
        self.assertEqual(e.exception.status, fs._capi.FS_ERR_INVALID)
        return e.exception.message

    def test_problem_of_tensors(self):
        p = fs.forward_problem("test", self.q, self.kv, self.kv, self.q, True, None)
        self.assertEqual((p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim, p.causal, p.dtype),
                         (2, 64, 96, 8, 2, 128, 1, fs.FS_FP16))
        self.assertAlmostEqual(p.softmax_scale, 128 ** -0.5, places=6)
        self.assertEqual((p.k.batch, p.k.row, p.k.head, p.k.dim), (96 * 2 * 128, 2 * 128, 128, 1))
        bshd = FakeTensor((2, 64, 8, 128), "torch.bfloat16", strides=(64 * 8 * 128, 128, 64 * 128, 1))  # a (B,H,N,d) transposed
        p = fs.forward_problem("test", bshd, bshd, bshd, FakeTensor((2, 64, 8, 128), "torch.bfloat16"), False, 0.5)
        self.assertEqual((p.q.row, p.q.head, p.dtype, p.softmax_scale), (128, 64 * 128, fs.FS_BF16, 0.5))

    def test_wrong_dimensions(self):
        msg = self.refused(fs.forward_problem, FakeTensor((64, 8, 128)), self.kv, self.kv, self.q, False, None)
        self.assertEqual(msg, "Q's shape is (64, 8, 128); it must have one entry per dimension (batch, seqlen, heads, "
                              "head_dim)")

    def test_mixed_and_unsupported_dtypes(self):
        bf = FakeTensor((2, 96, 2, 128), "torch.bfloat16")
        msg = self.refused(fs.forward_problem, self.q, bf, self.kv, self.q, False, None)
        self.assertIn("dtype mismatch: Q is torch.float16, K is torch.bfloat16, V is torch.float16", msg)
        f32 = FakeTensor((2, 64, 8, 128), "torch.float32")
        msg = self.refused(fs.forward_problem, f32, f32, f32, f32, False, None)
        self.assertEqual(msg, "Q is torch.float32; the dtype must be torch.float16 or torch.bfloat16")

    def test_devices(self):
        cpu = [FakeTensor(t.shape, device="cpu") for t in (self.q, self.kv, self.kv, self.q)]
        self.assertIn("Q is on cpu; flash_steps runs on a CUDA device", self.refused(fs.forward_problem, *cpu, False, None))
        other = FakeTensor(self.kv.shape, device="cuda:1")
        self.assertIn("V is on cuda:1 but Q is on cuda:0",
                      self.refused(fs.forward_problem, self.q, self.kv, other, self.q, False, None))

    def test_shapes_that_disagree(self):
        msg = self.refused(fs.forward_problem, self.q, self.kv, FakeTensor((2, 95, 2, 128)), self.q, False, None)
        self.assertIn("V is (2, 95, 2, 128) but K is (2, 96, 2, 128); they must match", msg)
        msg = self.refused(fs.forward_problem, self.q, FakeTensor((3, 96, 2, 128)), FakeTensor((3, 96, 2, 128)),
                           self.q, False, None)
        self.assertIn("batch (dimension 0) and head_dim (dimension 3) must match", msg)
        msg = self.refused(fs.forward_problem, self.q, self.kv, self.kv, FakeTensor((2, 64, 8, 64)), False, None)
        self.assertIn("O is (2, 64, 8, 64) but Q is (2, 64, 8, 128)", msg)

    def test_gqa_must_divide(self):
        kv3 = FakeTensor((2, 96, 3, 128))
        msg = self.refused(fs.forward_problem, self.q, kv3, kv3, self.q, False, None)
        self.assertEqual(msg, "Q has 8 heads and K, V 3; heads_q must be a multiple of heads_kv (GQA)")

    def test_last_stride_must_be_1(self):
        q = FakeTensor((2, 64, 8, 128), strides=(64 * 8 * 256, 8 * 256, 256, 2))
        msg = self.refused(fs.forward_problem, q, self.kv, self.kv, self.q, False, None)
        self.assertEqual(msg, "Q's last dimension (head_dim) has stride 2; it must be 1 (contiguous)")

    def forward(self, causal=False, scale=None):
        return fs.forward_problem("test", self.q, self.kv, self.kv, self.q, causal, scale)

    def test_scale(self):
        for bad in (0.0, -1.0, float("inf"), float("nan"), -10 ** 400):
            self.assertIn("it must be finite and > 0", self.refused(fs.forward_problem, self.q, self.kv, self.kv,
                                                                    self.q, False, bad))
        # a float32 holds neither: 1e-50 would be 0 and 1e39 inf, which the library would then refuse
        # --scale's rule (runner/cli.cpp): the nearest float32 positive and finite, which 1e-50 (0) and 1e39
        # (inf) are not, and 1e-45 (2^-149, the smallest) is
        for bad in (1e-50, 7e-46, 1e39, 10 ** 400):
            self.assertEqual(self.refused(fs.forward_problem, self.q, self.kv, self.kv, self.q, False, bad),
                             f"scale is {bad}; it must be a number from 1e-45 to 3.4028235e+38 (positive and finite "
                             "as a float32, which softmax_scale is)")
        for bad in ("abc", "0.5", True, b"1", [0.5], 1j):
            self.assertEqual(self.refused(fs.forward_problem, self.q, self.kv, self.kv, self.q, False, bad),
                             f"scale is {bad!r}; it must be a real number (an int or a float) or None")
        for good, want in ((1, 1.0), (0.5, 0.5), (Fraction(1, 4), 0.25), (2.0 ** -149, 2.0 ** -149), (1e-45, 2.0 ** -149),
                           (3.4028234663852886e+38, 3.4028234663852886e+38)):
            self.assertEqual(self.forward(scale=good).softmax_scale, want)
        if numpy is not None:
            self.assertEqual(self.forward(scale=numpy.float64(0.125)).softmax_scale, 0.125)
            self.assertEqual(self.forward(scale=numpy.float32(0.5)).softmax_scale, 0.5)

    def test_flags_are_bools_or_0_or_1(self):
        # bool() would make every one of these a 1 (causal 'no' too); the C ABI refuses 2
        for bad in (2, -1, "no", "", None, 0.5, b"\x01", [1]):
            self.assertEqual(self.refused(fs.forward_problem, self.q, self.kv, self.kv, self.q, bad, None),
                             f"causal is {bad!r}; it must be True, False, 0 or 1")
        # what equals 0 or 1 keeps meaning it, as before (1.0, a numpy bool)
        self.assertEqual([self.forward(causal=c).causal for c in (True, False, 1, 0, 1.0)], [1, 0, 1, 0, 1])
        if numpy is not None:
            self.assertEqual([self.forward(causal=c).causal for c in (numpy.True_, numpy.False_)], [1, 0])
            self.assertIn("must be True, False, 0 or 1", self.refused(fs.forward_problem, self.q, self.kv, self.kv,
                                                                      self.q, numpy.array([1, 0]), None))
        lse = FakeTensor((2, 8, 64), "torch.float32")
        args = [self.q, self.kv, self.kv, self.q, lse, self.q, self.q, self.kv, self.kv, False, None]
        self.assertEqual(self.refused(fs.backward_problem, *args, 2),
                         "deterministic is 2; it must be True, False, 0 or 1")
        self.assertEqual(fs.backward_problem("test", *args, 1).deterministic, 1)
        q, cache = FakeTensor((4, 1, 32, 128)), FakeTensor((4, 4096, 8, 128))
        self.assertEqual(self.refused(fs.decode_problem, q, cache, cache, q, None, None, False, None, None, 0, 2),
                         "checked is 2; it must be True, False, 0 or 1")

    def test_num_splits_and_max_seqlen_k_are_integers(self):
        q, cache = FakeTensor((4, 1, 32, 128)), FakeTensor((4, 4096, 8, 128))

        def decode(num_splits=0, max_seqlen_k=None):
            return fs.decode_problem("test", q, cache, cache, q, None, None, False, None, max_seqlen_k, num_splits,
                                     False)
        # ctypes would make 2**32 + 1 a 1 and 2**32 a 0 (the heuristic), int() 1.9 a 1 and '7' a 7
        for bad in (2 ** 32 + 1, 2 ** 32, 2 ** 64 + 7, -1, 129, 1.9, "7", True, None):
            with self.assertRaises(fs.InvalidArgument) as e:
                decode(num_splits=bad)
            self.assertEqual(e.exception.message,
                             f"num_splits is {bad!r}; it must be 0 (the step's heuristic) or an integer from 1 to 128")
        self.assertEqual([decode(num_splits=n).num_splits for n in (0, 1, 128)], [0, 1, 128])
        for bad in (2 ** 64 + 100, 100.0, "100", False):
            with self.assertRaises(fs.InvalidArgument) as e:
                decode(max_seqlen_k=bad)
            self.assertEqual(e.exception.message,
                             f"max_seqlen_k is {bad!r}; it must be an integer between 0 and the cache's capacity, 4096")
        self.assertEqual(decode(max_seqlen_k=100).attention.seqlen_k, 100)
        if numpy is not None:
            self.assertEqual(decode(num_splits=numpy.int64(3), max_seqlen_k=numpy.int32(7)).num_splits, 3)

    def test_softcap(self):
        # the value is the library's to judge (finite, >= 0; 0 off); what is no real number is refused here
        self.assertEqual(self.forward().softcap, 0.0)
        p = fs.forward_problem("test", self.q, self.kv, self.kv, self.q, False, None, softcap=30)
        self.assertEqual(p.softcap, 30.0)
        for bad in ("30", True, None, b"1", [30.0], 1j):
            self.assertEqual(self.refused(fs.forward_problem, self.q, self.kv, self.kv, self.q, False, None, None, bad),
                             f"softcap is {bad!r}; it must be a real number (0: off)")
        self.assertEqual(fs.forward_problem("test", self.q, self.kv, self.kv, self.q, False, None, softcap=10 ** 400).softcap,
                         float("inf"))  # then refused by the library's rule, in its sentence
        lse = FakeTensor((2, 8, 64), "torch.float32")
        args = [self.q, self.kv, self.kv, self.q, lse, self.q, self.q, self.kv, self.kv]
        self.assertEqual(fs.backward_problem("test", *args, True, None, False, softcap=2.5).attention.softcap, 2.5)

    def test_window(self):
        # FlashAttention's window_size, a pair (left, right), as window = 1 and its bounds; None: off (0, 0, 0). The
        # values are the library's to judge (each >= -1); what is no pair of int32s is refused here, before ctypes
        def fields(p):
            return p.window, p.window_left, p.window_right
        self.assertEqual(fields(self.forward()), (0, 0, 0))
        for window, want in (((128, 0), (1, 128, 0)), ([-1, 32], (1, -1, 32)), ((0, 0), (1, 0, 0)),
                             ((-5, 7), (1, -5, 7)), ((2 ** 31 - 1, -2 ** 31), (1, 2 ** 31 - 1, -2 ** 31)),
                             (iter((3, 4)), (1, 3, 4)), (None, (0, 0, 0))):
            p = fs.forward_problem("test", self.q, self.kv, self.kv, self.q, True, None, window=window)
            self.assertEqual(fields(p), want, window)
        if numpy is not None:
            p = fs.forward_problem("test", self.q, self.kv, self.kv, self.q, False, None,
                                   window=numpy.array([64, 64], dtype=numpy.int32))
            self.assertEqual(fields(p), (1, 64, 64))
        rule = ("it must be None (no sliding window) or a pair (left, right) of int32 integers, FlashAttention's "
                "window_size (-1: unbounded on that side)")
        for bad in ((1,), (1, 2, 3), (), "1,2", b"12", 5, 0, True, (1.0, 2), (True, 0), (1, None), ("1", "2"),
                    {1, 2}, {1: 0, 2: 0}, (2 ** 31, 0), (0, -2 ** 31 - 1), (2 ** 64 + 5, 0), [[1], 2], 1.5):
            self.assertEqual(self.refused(fs.forward_problem, self.q, self.kv, self.kv, self.q, False, None, None, 0.0,
                                          bad), f"window is {bad!r}; {rule}")
        lse = FakeTensor((2, 8, 64), "torch.float32")
        args = [self.q, self.kv, self.kv, self.q, lse, self.q, self.q, self.kv, self.kv]
        p = fs.backward_problem("test", *args, True, None, False, window=(64, -1))
        self.assertEqual(fields(p.attention), (1, 64, -1))
        self.assertEqual(self.refused(fs.backward_problem, *args, True, None, False, 0.0, (64,)),
                         f"window is (64,); {rule}")
        # every entry point refuses before it allocates (fake tensors cannot be allocated like)
        for call, function in ((lambda: fs.forward(self.q, self.kv, self.kv, window=(1,)), "flash_steps.forward"),
                               (lambda: fs.backward(*args[:6], window="1,1"), "flash_steps.backward"),
                               (lambda: fs.attention(self.q, self.kv, self.kv, window=(1.5, 0)),
                                "flash_steps.attention")):
            with self.assertRaises(fs.InvalidArgument) as e:
                call()
            self.assertEqual(e.exception.function, function)
            self.assertTrue(e.exception.message.startswith("window is "), e.exception.message)

    def test_varlen(self):
        # FlashAttention's varlen layout: Q, O (total_q, heads, d), K, V (total_k, heads_kv, d), int32 offsets
        q, kv = FakeTensor((12, 8, 128)), FakeTensor((16, 2, 128))
        cu_q = FakeTensor((4,), "torch.int32", address=0x7F0000001000)
        cu_k = FakeTensor((4,), "torch.int32", address=0x7F0000002000)
        p = fs.varlen_problem("test", q, kv, kv, q, cu_q, cu_k, 7, 9, True, None)
        self.assertEqual((p.batch, p.seqlen_q, p.seqlen_k, p.total_q, p.total_k, p.heads_q, p.heads_kv, p.head_dim,
                          p.causal), (3, 7, 9, 12, 16, 8, 2, 128, 1))
        self.assertEqual((p.cu_seqlens_q, p.cu_seqlens_k), (0x7F0000001000, 0x7F0000002000))
        self.assertEqual((p.q.batch, p.q.row, p.q.head, p.k.batch, p.k.row), (0, 8 * 128, 128, 0, 2 * 128))
        lse = FakeTensor((8, 12), "torch.float32")
        self.assertEqual(fs.varlen_problem("test", q, kv, kv, q, cu_q, cu_k, 7, 9, True, None, lse).total_q, 12)
        args = [q, kv, kv, q, lse, q, q, kv, kv, cu_q, cu_k, 7, 9]
        b = fs.varlen_backward_problem("test", *args, True, None, False, window=(4, 0))
        self.assertEqual((b.attention.total_k, b.d_o.batch, b.dk.row, b.attention.window_left), (16, 0, 256, 4))
        refused = lambda *a: self.refused(fs.varlen_problem, *a)  # noqa: E731
        self.assertEqual(refused(q, kv, kv, q, FakeTensor((4,), "torch.int64"), cu_k, 7, 9, False, None),
                         "cu_seqlens_q is torch.int64; it must be torch.int32")
        self.assertEqual(refused(q, kv, kv, q, cu_q, FakeTensor((5,), "torch.int32"), 7, 9, False, None),
                         "cu_seqlens_k is (5,) but cu_seqlens_q is (4,); both hold batch + 1 offsets")
        self.assertEqual(refused(q, kv, kv, q, FakeTensor((4,), "torch.int32", device="cpu"), cu_k, 7, 9, False,
                                 None), "cu_seqlens_q is on cpu but Q is on cuda:0; they must be on one device")
        self.assertEqual(refused(q, kv, kv, q, FakeTensor((4,), "torch.int32", strides=(2,)), cu_k, 7, 9, False, None),
                         "cu_seqlens_q is (4,) with strides (2,); it must be a contiguous (batch + 1,) of offsets, "
                         "cu[0] = 0 ... cu[batch] = total")
        self.assertEqual(refused(q, kv, kv, q, cu_q, cu_k, -1, 9, False, None),
                         "max_seqlen_q is -1; it must be an integer from 0 to 2147483647")
        self.assertEqual(refused(q, kv, kv, q, cu_q, cu_k, 7, "9", False, None),
                         "max_seqlen_k is '9'; it must be an integer from 0 to 2147483647")
        self.assertEqual(refused(self.q, kv, kv, q, cu_q, cu_k, 7, 9, False, None),
                         "Q's shape is (2, 64, 8, 128); it must have one entry per dimension (total, heads, head_dim)")
        self.assertEqual(refused(q, kv, kv, q, cu_q, cu_k, 7, 9, False, None, FakeTensor((8, 11), "torch.float32")),
                         "LSE is (8, 11); a variable-length batch's is (heads_q, total_q) = (8, 12)")
        with self.assertRaises(fs.InvalidArgument) as e:  # refused before anything is allocated
            fs.varlen_attention(q, kv, kv, cu_q, cu_k, 7, 9, window=(1,))
        self.assertEqual(e.exception.function, "flash_steps.varlen_attention")

    def test_backward_arguments(self):
        lse = FakeTensor((2, 8, 64), "torch.float32")
        args = [self.q, self.kv, self.kv, self.q, lse, self.q, self.q, self.kv, self.kv]
        p = fs.backward_problem("test", *args, True, None, True)
        self.assertEqual((p.attention.heads_kv, p.deterministic, p.dk.row, p.d_o.row), (2, 1, 256, 1024))
        bad = list(args)
        bad[7] = FakeTensor((2, 96, 8, 128))  # dK with Q's heads
        self.assertIn("dK is (2, 96, 8, 128) but K is (2, 96, 2, 128)", self.refused(fs.backward_problem, *bad, False, None, False))
        bad = list(args)
        bad[4] = FakeTensor((2, 64, 8), "torch.float32")
        self.assertIn("LSE is (2, 64, 8); it must be (batch, heads_q, seqlen_q) = (2, 8, 64)",
                      self.refused(fs.backward_problem, *bad, False, None, False))
        bad[4] = FakeTensor((2, 8, 64), "torch.float16")
        self.assertIn("LSE is torch.float16; it must be torch.float32",
                      self.refused(fs.backward_problem, *bad, False, None, False))
        bad = list(args)
        bad[5] = FakeTensor((2, 64, 8, 128), "torch.bfloat16")
        self.assertIn("dO is torch.bfloat16", self.refused(fs.backward_problem, *bad, False, None, False))

    def test_a_tensor_is_read_once_every_entry_an_int64(self):
        tensor = "; it must be a tensor (with shape, stride(), dtype, device and data_ptr())"
        dims = "it must have one entry per dimension (batch, seqlen, heads, head_dim)"
        int64 = "it must be an integer from -9223372036854775808 to 9223372036854775807"
        big = FakeTensor((2 ** 64 + 2, 64, 8, 128), strides=(65536, 1024, 128, 1))  # ctypes would make the batch 2
        for q, want in (
                (None, "Q is None" + tensor), (5, "Q is 5" + tensor), ("q", "Q is 'q'" + tensor),
                # a 5-entry stride() was a TypeError, a 3-entry one the library's "head_dim stride is 0"
                (FakeTensor((2, 64, 8, 128), strides=(65536, 1024, 128, 1, 1)),
                 f"Q's stride() is (65536, 1024, 128, 1, 1); {dims}"),
                (FakeTensor((2, 64, 8, 128), strides=(65536, 1024, 128)),
                 f"Q's stride() is (65536, 1024, 128); {dims}"),
                (FakeTensor((2, 64, 8, 128), strides=5), f"Q's stride() is 5; {dims}"),
                (big, f"batch in Q's shape (18446744073709551618, 64, 8, 128) is 18446744073709551618; {int64}"),
                (FakeTensor((2, 64, 8, 128.0), strides=(65536, 1024, 128, 1)),
                 f"head_dim in Q's shape (2, 64, 8, 128.0) is 128.0; {int64}"),
                (FakeTensor((2, 64, True, 128), strides=(65536, 1024, 128, 1)),
                 f"heads in Q's shape (2, 64, True, 128) is True; {int64}"),
                (FakeTensor((2, 64, 8, 128), strides=(65536, 2 ** 63, 128, 1)),
                 f"seqlen in Q's stride() (65536, 9223372036854775808, 128, 1) is 9223372036854775808; {int64}"),
                (FakeTensor((2, 64, 8, 128), strides=(65536, "1024", 128, 1)),
                 f"seqlen in Q's stride() (65536, '1024', 128, 1) is '1024'; {int64}")):
            self.assertEqual(self.refused(fs.forward_problem, q, self.kv, self.kv, self.q, False, None), want)
        for address in (-16, 2 ** 64, 16.0, "0x10", None):
            self.assertEqual(self.refused(fs.forward_problem, FakeTensor((2, 64, 8, 128), address=address), self.kv,
                                          self.kv, self.q, False, None),
                             f"Q's data_ptr() is {address!r}; it must be an integer from 0 to 18446744073709551615")

    def test_backward_needs_the_lse_and_every_tensor_its_dimensions(self):
        lse = FakeTensor((2, 8, 64), "torch.float32")
        args = [self.q, self.kv, self.kv, self.q, lse, self.q, self.q, self.kv, self.kv]
        without = args[:4] + [None] + args[5:]
        want = "lse is None; backward needs the forward's LSE, fp32 (batch, heads_q, seqlen_q)"  # was an AttributeError
        self.assertEqual(self.refused(fs.backward_problem, *without, False, None, False), want)
        with self.assertRaises(fs.InvalidArgument) as e:
            fs.backward(*without[:6])  # refused before anything is allocated (fake tensors could not be)
        self.assertEqual(e.exception.message, want)
        self.assertEqual(e.exception.function, "flash_steps.backward")
        bad = list(args)
        bad[4] = FakeTensor((2, 8), "torch.float32")
        self.assertEqual(self.refused(fs.backward_problem, *bad, False, None, False),
                         "LSE's shape is (2, 8); it must have one entry per dimension (batch, heads_q, seqlen_q)")
        p = fs.backward_problem("test", *args[:6], None, None, None, False, None, False)  # dQ, dK, dV: allocated
        self.assertEqual([(s.batch, s.row, s.head, s.dim) for s in (p.dq, p.dk)],
                         [(64 * 8 * 128, 8 * 128, 128, 1), (96 * 2 * 128, 2 * 128, 128, 1)])
        q, cache, lens = FakeTensor((4, 1, 32, 128)), FakeTensor((4, 4096, 8, 128)), FakeTensor((4,), "torch.int32")
        self.assertEqual(self.refused(fs.decode_problem, q, cache, cache, q, FakeTensor((4, 1), "torch.int32"), None,
                                      False, None, None, 0, False),
                         "cache_seqlens's shape is (4, 1); it must have one entry per dimension (batch)")
        pages = FakeTensor((300, 64, 8, 128))
        self.assertEqual(self.refused(fs.decode_problem, q, pages, pages, q, lens, FakeTensor((4,), "torch.int32"),
                                      False, None, None, 0, False),
                         "block_table's shape is (4,); it must have one entry per dimension (batch, max_pages_per_seq)")

    def test_every_entry_point_refuses_before_allocating(self):
        # fake tensors cannot be allocated like, nor launched: every refusal here comes before both
        calls = (
            (lambda: fs.forward(self.q, self.kv, self.kv, causal="yes"), "flash_steps.forward", "causal is 'yes'"),
            (lambda: fs.forward(self.q, self.kv, self.kv, scale="abc"), "flash_steps.forward", "scale is 'abc'"),
            (lambda: fs.forward(self.q, self.kv, self.kv, out=FakeTensor((2, 64, 8, 64))), "flash_steps.forward",
             "O is (2, 64, 8, 64) but Q is (2, 64, 8, 128)"),
            (lambda: fs.forward(self.q, self.kv, self.kv, lse=FakeTensor((2, 8, 64), "torch.float32", address=2)),
             "flash_steps.forward", "LSE pointer 0x2 is not 4-byte aligned"),
            (lambda: fs.forward(self.q, self.kv, self.kv, step=7), "flash_steps.forward", "step is 7"),
            (lambda: fs.decode(self.q, self.kv, self.kv, num_splits=2 ** 32), "flash_steps.decode",
             "num_splits is 4294967296"),
            (lambda: fs.decode(self.q, self.kv, self.kv, checked=2), "flash_steps.decode", "checked is 2"),
            (lambda: fs.attention(self.q, self.kv, self.kv, causal=2), "flash_steps.attention", "causal is 2"),
            (lambda: fs.attention(self.q, self.kv, self.kv, deterministic=2), "flash_steps.attention",
             "deterministic is 2"),
            (lambda: fs.attention(self.q, FakeTensor((2, 96, 3, 128)), FakeTensor((2, 96, 3, 128))),
             "flash_steps.attention", "Q has 8 heads and K, V 3"),
            (lambda: fs.attention(self.q, self.kv, self.kv, backward_step=b"11"), "flash_steps.attention",
             "backward_step is b'11'"),
            (lambda: fs.attention(self.q, self.kv, None), "flash_steps.attention", "V is None"))
        for call, function, start in calls:
            with self.assertRaises(fs.InvalidArgument) as e:
                call()
            self.assertEqual(e.exception.function, function)
            self.assertTrue(e.exception.message.startswith(start), e.exception.message)

    def test_pointers_by_the_c_rules(self):
        # validate_tensors of common/*/rules.cpp, which fs_run applies but fs_check and fs_workspace_size
        # (asked first) do not: null where there is work, 16-byte (LSE, cache_seqlens, the table: 4-byte) aligned
        base = 0x7F0000000000

        def at(t, address):
            return FakeTensor(t.shape, t.dtype, t.stride(), address=address)
        lse = FakeTensor((2, 8, 64), "torch.float32")
        forward = [self.q, self.kv, self.kv, self.q]
        for i, name in enumerate("QKVO"):
            for address, want in ((0, f"{name} is a null pointer"),
                                  (base + 8,
                                   f"{name} pointer 0x7f0000000008 is not 16-byte aligned (address mod 16 = 8)")):
                args = list(forward)
                args[i] = at(args[i], address)
                self.assertEqual(self.refused(fs.forward_problem, *args, False, None, lse), want)
        self.assertEqual(self.refused(fs.forward_problem, *forward, False, None, at(lse, base + 6)),
                         "LSE pointer 0x7f0000000006 is not 4-byte aligned (address mod 4 = 2)")
        fs.forward_problem("test", *forward, False, None, at(lse, 0))  # LSE may be NULL, or only 4-byte aligned
        fs.forward_problem("test", *forward, False, None, at(lse, base + 4))
        empty_kv = FakeTensor((2, 0, 2, 128))  # no key: K and V are not read
        fs.forward_problem("test", self.q, at(empty_kv, 0), at(empty_kv, 0), self.q, False, None)
        empty_q = FakeTensor((2, 0, 8, 128))  # no query: nothing at all is read or written
        fs.forward_problem("test", at(empty_q, 0), at(self.kv, 0), self.kv, at(empty_q, 0), False, None)
        # the backward: Q, K, V, O, LSE, dO only with both seqlens > 0, dQ with queries, dK and dV with keys
        back = [self.q, empty_kv, empty_kv, self.q, lse, self.q, self.q, empty_kv, empty_kv]
        no_keys = [at(t, 0) for t in back]
        self.assertEqual(self.refused(fs.backward_problem, *no_keys, False, None, False), "dQ is a null pointer")
        no_keys[6] = self.q  # dQ is written (zeros); the others may be NULL
        fs.backward_problem("test", *no_keys, False, None, False)
        work = [self.q, self.kv, self.kv, self.q, at(lse, 0), self.q, self.q, self.kv, self.kv]
        self.assertEqual(self.refused(fs.backward_problem, *work, False, None, False), "LSE is a null pointer")
        # decoding: the caches and a paged cache's table with keys to read; cache_seqlens and LSE 4-byte aligned
        q, pages, table, lens = (FakeTensor((4, 1, 32, 128)), FakeTensor((300, 64, 8, 128)),
                                 FakeTensor((4, 70), "torch.int32"), FakeTensor((4,), "torch.int32"))
        for args, want in (((q, at(pages, base + 4), pages, q, lens, table),
                            "the K cache pointer 0x7f0000000004 is not 16-byte aligned (address mod 16 = 4)"),
                           ((q, pages, at(pages, 0), q, lens, table), "the V cache is a null pointer"),
                           ((q, pages, pages, q, lens, at(table, 0)), "the block table is a null pointer"),
                           ((q, pages, pages, q, at(lens, base + 1), table),
                            "cache_seqlens pointer 0x7f0000000001 is not 4-byte aligned (address mod 4 = 1)")):
            self.assertEqual(self.refused(fs.decode_problem, *args, False, None, None, 0, False), want)
        fs.decode_problem("test", q, at(pages, 0), at(pages, 0), q, None, at(table, 0), False, None, 0, 0, False)

    def test_a_block_table_means_a_paged_cache(self):
        # page_size 0 with a table made the library say "num_pages is 40 with a contiguous cache (page_size 0)"
        q, table = FakeTensor((4, 1, 8, 64)), FakeTensor((4, 3), "torch.int32")
        for page_size in (0, 8, 24, -16):
            pages = FakeTensor((40, page_size, 2, 64), strides=(2048, 128, 64, 1))
            self.assertEqual(self.refused(fs.decode_problem, q, pages, pages, q, None, table, False, None, None, 0,
                                          False),
                             f"the K cache is (40, {page_size}, 2, 64) with a block table: a paged cache (num_pages, "
                             f"page_size, heads_kv, head_dim) of page_size {page_size}; page_size must be a "
                             "multiple of 16 from 16")
        pages = FakeTensor((40, 16, 2, 64))
        p = fs.decode_problem("test", q, pages, pages, q, None, table, False, None, None, 0, False)
        self.assertEqual((p.page_size, p.num_pages, p.max_pages_per_seq, p.attention.seqlen_k), (16, 40, 3, 48))

    def test_usable_copies_what_the_c_abi_refuses(self):
        # an expanded tensor over heads (head stride 0) was passed on, for the library to refuse
        as_is = [(strides, heads, address) for strides, heads, address in (
            ((8192, 128, 0, 1), 8, 0), ((1024, 0, 128, 1), 8, 0),  # expanded over heads, over rows
            ((65536, 64, 8192, 1), 8, 0), ((8192, 1028, 128, 1), 8, 0), ((65536, 1024, 128, 2), 8, 0),
            ((65536, 1024, 128, 1), 8, 8), ((65536, 1024, -128, 1), 8, 0),
            ((0, 1024, 128, 1), 8, 0), ((8192, 128, 0, 1), 1, 0), ((65536, 1024, 128, 1), 8, 0))
            if passed_on(FakeTensor((2, 64, heads, 128), strides=strides, address=0x7F0000000000 + address))]
        self.assertEqual(as_is, [((0, 1024, 128, 1), 8, 0),  # a batch stride of 0 broadcasts
                                 ((8192, 128, 0, 1), 1, 0),  # a head stride of 0 over one head
                                 ((65536, 1024, 128, 1), 8, 0)])

    def test_lse_is_contiguous_as_torch_makes_it(self):
        # torch.empty((2, 8, 0)) has strides (8, 1, 1), which were refused for not being (0, 0, 1)
        kv = FakeTensor((2, 96, 1, 128))
        for lse in (FakeTensor((2, 8, 0), "torch.float32", strides=(8, 1, 1)),
                    FakeTensor((2, 1, 64), "torch.float32", strides=(64, 4096, 1))):  # one head: its stride unread
            q = FakeTensor((2, lse.shape[2], lse.shape[1], 128))
            fs.backward_problem("test", q, kv, kv, q, lse, q, q, kv, kv, False, None, False)
            fs.forward_problem("test", q, kv, kv, q, False, None, lse)
        self.assertEqual(self.refused(fs.forward_problem, self.q, self.kv, self.kv, self.q, False, None,
                                      FakeTensor((2, 8, 64), "torch.float32", strides=(512, 1, 8))),
                         "LSE has strides (512, 1, 8); it must be contiguous, (512, 64, 1)")

    def test_decode_arguments(self):
        q = FakeTensor((4, 1, 32, 128))
        cache = FakeTensor((4, 4096, 8, 128))
        lens = FakeTensor((4,), "torch.int32")
        p = fs.decode_problem("test", q, cache, cache, q, lens, None, False, None, None, 0, False)
        self.assertEqual((p.attention.batch, p.attention.seqlen_k, p.attention.heads_kv, p.page_size, p.num_pages),
                         (4, 4096, 8, 0, 0))
        pages = FakeTensor((300, 64, 8, 128))
        table = FakeTensor((4, 70), "torch.int32")
        p = fs.decode_problem("test", q, pages, pages, q, lens, table, True, None, 2048, 3, True)
        self.assertEqual((p.page_size, p.num_pages, p.max_pages_per_seq, p.block_table_stride, p.attention.seqlen_k,
                          p.num_splits, p.checked, p.attention.causal), (64, 300, 70, 70, 2048, 3, 1, 1))
        self.assertIn("max_seqlen_k is 5000; it must be an integer between 0 and the cache's capacity, 4480",
                      self.refused(fs.decode_problem, q, pages, pages, q, lens, table, False, None, 5000, 0, False))
        self.assertIn("cache_seqlens is torch.int64",
                      self.refused(fs.decode_problem, q, cache, cache, q, FakeTensor((4,), "torch.int64"), None, False,
                                   None, None, 0, False))
        self.assertIn("a contiguous cache's batch (dimension 0) must match",
                      self.refused(fs.decode_problem, q, pages, pages, q, None, None, False, None, None, 0, False))


class DefaultStep(unittest.TestCase):
    """The step used when none is given: the newest that accepts the problem, among those with the pass."""

    class FakeLibrary:
        def __init__(self, refuse):
            self.refuse, self.calls = refuse, []

        def steps(self):
            def step(i, *passes):
                return fs.Step(i, i, "lesson", i, 80, passes)
            return [step("07g_fa2", "forward"), step("08_hopper", "forward"),
                    step("10_decoding", "forward", "decode"), step("11_backward", "backward")]

        def check(self, step_id, p):
            self.calls.append(step_id)
            if step_id in self.refuse:
                raise fs.InvalidArgument(1, "fs_check", f"{step_id} refuses")

    def setUp(self):
        fs._torch._defaults.clear()

    def test_newest_that_accepts(self):
        lib = self.FakeLibrary({"10_decoding"})  # 11 has no forward (not asked), 10 refuses this one
        p = fs.FsProblem(batch=1, head_dim=64)
        self.assertEqual(fs._torch._default_step(lib, p, 0), "08_hopper")
        self.assertEqual(lib.calls, ["10_decoding", "08_hopper"])
        self.assertEqual(fs._torch._default_step(lib, p, 0), "08_hopper")  # remembered
        self.assertEqual(len(lib.calls), 2)
        self.assertEqual(fs._torch._default_step(lib, fs.FsProblem(batch=2), 0), "08_hopper")
        self.assertEqual(len(lib.calls), 4)  # another problem: asked again

    def test_only_steps_with_the_pass(self):
        lib = self.FakeLibrary(set())
        self.assertEqual(fs._torch._default_step(lib, fs.FsBackwardProblem(), 0), "11_backward")
        self.assertEqual(fs._torch._default_step(lib, fs.FsDecodeProblem(), 0), "10_decoding")

    def test_none_accepts(self):
        lib = self.FakeLibrary({"11_backward"})
        with self.assertRaises(fs.InvalidArgument) as e:
            fs._torch._default_step(lib, fs.FsBackwardProblem(), 0)
        self.assertEqual(e.exception.message, "no registered step runs this backward problem on this device "
                                              "(11_backward: 11_backward refuses)")


if __name__ == "__main__":
    unittest.main()
