"""bench/fs_results.py, the core the tools of bench/ share: library path, results files (names, head, JSON
and CSV), ceilings, markers, the environment, the median, and FlashAttention-4 found or not (a stub module
stands in for it: no PyTorch or GPU needed)."""
import contextlib
import csv
import datetime
import io
import json
import os
import sys
import tempfile
import types
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


@contextlib.contextmanager
def fa4_stub(version, calls=None, out=lambda q: "out"):
    """flash_attn.cute as a stub module (its flash_attn_func records its calls in `calls` and returns
    (out(q), "lse")), or, with version None, absent; fs_results looks for it afresh inside and after."""
    saved = {name: sys.modules.get(name) for name in ("flash_attn", "flash_attn.cute")}
    if version is None:
        sys.modules["flash_attn"] = None  # import flash_attn.cute: ModuleNotFoundError
    else:
        def flash_attn_func(q, k, v, **kw):
            if calls is not None:
                calls.append(("fa4", q, k, v, kw))
            return out(q), "lse"
        package = types.ModuleType("flash_attn")
        package.__path__ = []
        cute = types.ModuleType("flash_attn.cute")
        cute.flash_attn_func, cute.__version__, package.cute = flash_attn_func, version, cute
        sys.modules.update({"flash_attn": package, "flash_attn.cute": cute})
    fs_results.fa4.cache_clear()
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        fs_results.fa4.cache_clear()


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


class ResultsFiles(unittest.TestCase):
    date = datetime.datetime(2026, 12, 1, 9, 8, 7, tzinfo=datetime.timezone.utc)

    def test_names_and_head(self):
        self.assertEqual(fs_results.results_base("out", "compare_torch_backward", self.date),
                         Path("out") / "compare_torch_backward-20261201-090807")
        head = fs_results.result_head("compare_torch", "decode", self.date, "abc", {"gpu": "H200"}, "lib.so")
        self.assertEqual(list(head), ["tool", "mode", "schema", "date", "commit", "environment", "library"])
        self.assertEqual(head["date"], "2026-12-01T09:08:07Z")
        self.assertNotIn("mode", fs_results.result_head("train_gpt", None, self.date, "abc", {}, "lib.so"))

    def test_json_and_csv(self):
        result = {**fs_results.result_head("compare_torch", None, self.date, "abc", {"gpu": "H200"}, "x"),
                  "rows": [{"impl": "fa4", "kind": "fa4", "ms": 0.5, "extra": 1}, {"impl": "09d", "kind": "step"}]}
        with tempfile.TemporaryDirectory() as d, contextlib.redirect_stderr(io.StringIO()) as err:
            base = Path(d) / "sub" / "run"
            fs_results.write_results(result, base, ["date", "commit", "gpu", "impl", "kind", "ms"])
            self.assertEqual(fs_results.load_json(base.with_suffix(".json")), result)
            rows = list(csv.DictReader(base.with_suffix(".csv").open()))
        self.assertEqual(rows[0], {"date": "2026-12-01T09:08:07Z", "commit": "abc", "gpu": "H200", "impl": "fa4",
                                   "kind": "fa4", "ms": "0.5"})
        self.assertEqual(rows[1]["ms"], "")
        self.assertIn("compare_torch: wrote", err.getvalue())

    def test_small_rules(self):
        self.assertEqual(fs_results.median([3.0, 1.0, 2.0]), 2.0)
        self.assertEqual(fs_results.median([4.0, 1.0, 2.0, 3.0]), 2.5)
        self.assertEqual(fs_results.cudnn_version(91900), "9.19.0")
        self.assertEqual(fs_results.cudnn_version(None), "none")
        self.assertEqual(fs_results.first_line(RuntimeError("\n  No available kernel.\n more")), "No available kernel.")
        self.assertEqual(fs_results.first_line(AssertionError()), "AssertionError")

    def test_hbm_ceiling(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "ceilings-x.json"
            path.write_text(json.dumps(synthetic.ceilings_result()))
            self.assertEqual(fs_results.hbm_ceiling(path), {"tbs": 4.5, "path": str(path),
                                                            "device": "NVIDIA H200 (sm_90, 132 SMs)"})


def fake_torch(version="2.11.0"):
    """What fs_results.environment reads of torch."""
    props = types.SimpleNamespace(major=9, minor=0, multi_processor_count=132, total_memory=141 * 2 ** 30,
                                  L2_cache_size=60 << 20)
    cuda = types.SimpleNamespace(get_device_properties=lambda i: props, get_device_name=lambda i: "NVIDIA H200")
    return types.SimpleNamespace(cuda=cuda, version=types.SimpleNamespace(cuda="13.0"), __version__=version,
                                 backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(version=lambda: 91900)))


class FlashAttention4(unittest.TestCase):
    def test_present(self):
        with fa4_stub("4.0.0b36"):
            found = fs_results.fa4()
            self.assertEqual((found["version"], found["note"]), ("4.0.0b36", ""))
            self.assertTrue(callable(found["func"]))
            env = fs_results.environment(fake_torch())
            self.assertEqual(env["fa4"], "4.0.0b36")
            self.assertEqual(fs_results.backend_label("fa4", env), "FA4 4.0.0b36")
        self.assertEqual((env["gpu"], env["cudnn"], env["compute_capability"]), ("NVIDIA H200", "9.19.0", "9.0"))

    def test_absent(self):
        with fa4_stub(None):
            found = fs_results.fa4()
            self.assertIsNone(found["func"])
            self.assertEqual(found["note"], "FlashAttention-4 not installed (pip install flash-attn-4): no fa4 column")
            env = fs_results.environment(fake_torch())
            self.assertEqual(env["fa4"], "none")
            self.assertEqual(fs_results.backend_label("fa4", env), "FA4")
            self.assertEqual(fs_results.backend_label("cudnn", env), "PyTorch SDPA cuDNN")

    def test_installed_but_broken(self):
        # flash_attn.cute is there but one of its own imports fails (the CUTLASS DSL, say): said so.
        with tempfile.TemporaryDirectory() as d, fa4_stub(None):
            for name in ("flash_attn", "flash_attn.cute"):
                sys.modules.pop(name, None)
            (Path(d) / "flash_attn" / "cute").mkdir(parents=True)
            (Path(d) / "flash_attn" / "__init__.py").write_text("")
            (Path(d) / "flash_attn" / "cute" / "__init__.py").write_text("import cutlass_dsl_not_here\n")
            sys.path.insert(0, d)
            try:
                note = fs_results.fa4()["note"]
            finally:
                sys.path.remove(d)
        self.assertIn("FlashAttention-4 does not import (No module named 'cutlass_dsl_not_here')", note)


if __name__ == "__main__":
    unittest.main()
