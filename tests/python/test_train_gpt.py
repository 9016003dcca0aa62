"""bench/train_gpt.py without a GPU: the synthetic language (plain Python), the packing of --varlen's
documents and their mask (plain Python, against the definition), the verdict on made-up loss curves, the
command line, and the plot; with PyTorch (test_train_gpt.Torch, its own ctest entry), the batched
generator against the plain one, the torch mask and the packed data, and tiny trainings on the CPU."""
import bisect
import math
import random
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "bench"))

import train_gpt as tg  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


def uniforms(seed, n):
    rng = random.Random(seed)
    return [(rng.random(), rng.random()) for _ in range(n)]


class LanguageRules(unittest.TestCase):
    lang = tg.Language(7)

    def test_markov_rows(self):
        lang = self.lang
        self.assertEqual(len(lang.probs), lang.text_tokens + 1)
        for row, cum in zip(lang.probs, lang.cum):
            self.assertAlmostEqual(sum(row), 1.0, places=12)
            self.assertEqual(cum[-1], 1.0)
            self.assertEqual(cum, sorted(cum))
        self.assertEqual(sum(p > 0 for p in lang.probs[0]), 6)
        self.assertEqual(lang.probs[-1], [1.0 / lang.text_tokens] * lang.text_tokens)
        self.assertEqual(tg.Language(7).probs, lang.probs)
        self.assertNotEqual(tg.Language(8).probs, lang.probs)

    def test_sequence_follows_the_rules(self):
        lang, n_text = self.lang, self.lang.text_tokens
        for seed in range(20):
            s = tg.generate_sequence(lang, uniforms(seed, 513))
            tokens, logp, recall = s["tokens"], s["logp"], s["recall"]
            self.assertEqual(len(tokens), 513)
            first, t = {}, 0
            while t < len(tokens):
                tok = tokens[t]
                self.assertTrue(0 <= tok < lang.vocab)
                self.assertFalse(recall[t])
                if tok < n_text:
                    self.assertLess(logp[t], 0.0)
                    t += 1
                    continue
                self.assertAlmostEqual(logp[t], math.log(lang.p_anchor / lang.anchors))
                seg = range(t + 1, min(t + 1 + lang.segment, len(tokens)))
                self.assertTrue(all(tokens[i] < n_text for i in seg), "no anchor inside a segment")
                if tok in first:
                    src = first[tok] + 1
                    for j, i in enumerate(seg):
                        self.assertTrue(recall[i])
                        self.assertEqual(tokens[i], tokens[src + j])
                        self.assertEqual(logp[i], 0.0)
                        self.assertEqual(s["markov_logp"][i], logp[src + j])
                else:
                    first[tok] = t
                    self.assertFalse(any(recall[i] for i in seg))
                t = seg.stop
            for i, tok in enumerate(tokens):  # never a token the rules give no probability
                self.assertTrue(math.isfinite(logp[i]))
                if i > 0 and tok < n_text and not recall[i] and tokens[i - 1] < n_text:
                    self.assertGreater(lang.probs[tokens[i - 1]][tok], 0.0)

    def test_the_language_copies_and_the_floors_are_ordered(self):
        lang = self.lang
        sum_lp = sum_mlp = 0.0
        counts, copied, n = [0] * lang.vocab, 0, 0
        for seed in range(40):
            s = tg.generate_sequence(lang, uniforms(100 + seed, 513))
            sum_lp += sum(s["logp"][1:])
            sum_mlp += sum(s["markov_logp"][1:])
            copied += sum(s["recall"][1:])
            n += 512
            for tok in s["tokens"][1:]:
                counts[tok] += 1
        f = tg.floors(sum_lp, sum_mlp, counts)
        self.assertGreater(copied / n, 0.1, "a good share of the tokens are copies")
        self.assertLess(f["entropy_floor"], f["markov_floor"] - 0.2)
        self.assertLess(f["markov_floor"], f["unigram_entropy"] - 1.0)
        self.assertLess(f["unigram_entropy"], math.log(lang.vocab) + 1e-9)

    def test_floors(self):
        f = tg.floors(-4 * math.log(2), -4.0, [2, 2, 0])
        self.assertAlmostEqual(f["entropy_floor"], math.log(2))
        self.assertAlmostEqual(f["markov_floor"], 1.0)
        self.assertAlmostEqual(f["unigram_entropy"], math.log(2))

    def test_bad_parameters(self):
        with self.assertRaises(ValueError):
            tg.Language(1, text_tokens=4, successors=5)


def sees(cu, left, i, j):
    """The definition of --varlen's mask: row i sees key j iff both are in one document, j <= i and
    i - j <= left (left < 0: no window)."""
    doc = lambda t: bisect.bisect_right(cu, t) - 1  # noqa: E731
    return doc(i) == doc(j) and j <= i and (left < 0 or i - j <= left)


class Packing(unittest.TestCase):
    def test_document_lengths(self):
        for total, lo, hi in ((8192, 32, 512), (2048, 16, 256), (100, 5, 10), (7, 7, 14), (500, 1, 2)):
            for seed in range(30):
                lengths = tg.document_lengths(random.Random(seed), total, lo, hi)
                self.assertEqual(sum(lengths), total)
                self.assertTrue(all(lo <= n <= hi for n in lengths), (total, lo, hi, seed, lengths))
                self.assertEqual(lengths, tg.document_lengths(random.Random(seed), total, lo, hi), "seeded")
                cu = tg.cu_seqlens(lengths)
                self.assertEqual((cu[0], cu[-1], len(cu)), (0, total, len(lengths) + 1))
                self.assertTrue(all(a < b for a, b in zip(cu, cu[1:])), "strictly increasing")
        runs = {tuple(tg.document_lengths(random.Random(seed), 8192, 32, 512)) for seed in range(10)}
        self.assertEqual(len(runs), 10, "other seeds, other lengths")
        many = [n for seed in range(20) for n in tg.document_lengths(random.Random(seed), 8192, 32, 512)]
        self.assertLess(min(many), 64)
        self.assertGreater(max(many), 480)
        self.assertGreater(sum(n > 256 for n in many) / len(many), 0.3, "a window of 256 matters")
        for bad in ((10, 0, 5), (10, 4, 7), (3, 4, 8)):
            with self.assertRaises(ValueError):
                tg.document_lengths(random.Random(0), *bad)

    def test_mask_against_the_definition(self):
        rng = random.Random(3)
        for total in (1, 17, 60):
            for left in (-1, 0, 1, 4, 9, 100):
                cu = tg.cu_seqlens(tg.document_lengths(rng, total, 1, 12))
                first = tg.first_visible_key(cu, left)
                self.assertEqual(len(first), total)
                mask = [[first[i] <= j <= i for j in range(total)] for i in range(total)]  # packed_mask's rule
                self.assertEqual(mask, [[sees(cu, left, i, j) for j in range(total)] for i in range(total)],
                                 (cu, left))
        self.assertEqual(tg.first_visible_key([0, 3, 8], 2), [0, 0, 0, 3, 3, 3, 4, 5])
        self.assertEqual(tg.first_visible_key([0, 3, 8], -1), [0, 0, 0, 3, 3, 3, 3, 3])


def curves(n=300, offset=0.0, wobble=0.004, start=4.0, end=1.2):
    """A made-up loss curve and copies of it that differ by a given wobble, as correct kernels do."""
    base = [end + (start - end) * math.exp(-i / 40) for i in range(n)]
    return base, [x + wobble * math.sin(i) for i, x in enumerate(base)], [x + offset + wobble * math.cos(i)
                                                                         for i, x in enumerate(base)]


class Verdict(unittest.TestCase):
    def run_verdict(self, test, spread, **kw):
        ref, _, _ = curves()
        kw.setdefault("entropy_floor", 1.0)
        return tg.verdict({"sdpa_flash": ref, "sdpa_cudnn": spread, "flash_steps": test}, 50, 3.0, 0.01, **kw)

    def test_windows(self):
        self.assertEqual(tg.windows(300, 50), [(0, 50), (50, 100), (100, 150), (150, 200), (200, 250), (250, 300)])
        self.assertEqual(tg.windows(110, 50), [(0, 50), (50, 110)])
        self.assertEqual(tg.windows(130, 50), [(0, 50), (50, 100), (100, 130)])
        self.assertEqual(tg.windows(10, 50), [(0, 10)])

    def test_pass_within_the_spread(self):
        _, spread, test = curves()
        v = self.run_verdict(test, spread)
        self.assertTrue(v["pass"], v["reasons"])
        self.assertEqual(len(v["windows"]), 6)
        self.assertTrue(all(w["ok"] for w in v["windows"]))
        self.assertTrue(all(r["ok"] for r in v["learned"].values()))

    def test_offset_fails(self):
        _, spread, test = curves(offset=0.1)
        v = self.run_verdict(test, spread)
        self.assertFalse(v["pass"])
        self.assertIn("mean |flash_steps - sdpa_flash|", v["reasons"][0])

    def test_late_divergence_fails(self):
        _, spread, test = curves()
        test = test[:250] + [x + 0.2 for x in test[250:]]
        v = self.run_verdict(test, spread)
        self.assertFalse(v["pass"])
        self.assertEqual([w["ok"] for w in v["windows"]], [True] * 5 + [False])

    def test_the_spread_sets_the_tolerance(self):
        _, spread, test = curves(offset=0.05)
        self.assertFalse(self.run_verdict(test, spread)["pass"])
        wide = [x + 0.03 for x in spread]
        self.assertTrue(self.run_verdict(test, wide)["pass"])

    def test_the_largest_spread_counts(self):
        ref, spread, test = curves(offset=0.05)
        losses = {"sdpa_flash": ref, "sdpa_cudnn": spread, "sdpa_efficient": [x + 0.03 for x in spread],
                  "flash_steps": test}
        self.assertTrue(tg.verdict(losses, 50, 3.0, 0.01, 1.0)["pass"])

    def test_not_learning_fails(self):
        flat = [4.0 + 0.001 * math.sin(i) for i in range(300)]
        v = tg.verdict({"sdpa_flash": flat, "sdpa_cudnn": flat, "flash_steps": flat}, 50, 3.0, 0.01, 1.0)
        self.assertFalse(v["pass"])
        self.assertTrue(all("did not learn" in r for r in v["reasons"]))
        self.assertEqual(len(v["reasons"]), 3)

    def test_nan_and_missing_runs_fail(self):
        ref, spread, test = curves()
        test[123] = math.nan
        v = self.run_verdict(test, spread)
        self.assertFalse(v["pass"])
        self.assertIn("step 123", v["reasons"][0])
        v = tg.verdict({"sdpa_flash": ref, "flash_steps": ref}, 50, 3.0, 0.01, 1.0)
        self.assertFalse(v["pass"])
        self.assertIn("no second SDPA backend", v["reasons"][0])
        self.assertFalse(tg.verdict({"sdpa_flash": ref, "sdpa_cudnn": ref}, 50, 3.0, 0.01, 1.0)["pass"])
        self.assertFalse(tg.verdict({"sdpa_flash": ref, "sdpa_cudnn": ref, "flash_steps": ref[:-1]},
                                    50, 3.0, 0.01, 1.0)["pass"])

    def test_first_gradients(self):
        _, spread, test = curves()
        ok = {"flash_steps": {"a": 0.01, "b": 0.04}, "sdpa_cudnn": {"a": 0.02, "b": 0.001}}
        v = self.run_verdict(test, spread, grad_diffs=ok)
        self.assertTrue(v["pass"], v["reasons"])
        self.assertAlmostEqual(v["grads"]["a"]["allowed"], 0.06)
        self.assertAlmostEqual(v["grads"]["b"]["allowed"], 0.05)
        for bad in (0.3, math.nan, math.inf):
            v = self.run_verdict(test, spread, grad_diffs={**ok, "flash_steps": {"a": bad, "b": 0.0}})
            self.assertFalse(v["pass"])
            self.assertIn("first gradient of a", v["reasons"][0])
        v = self.run_verdict(test, spread, grad_diffs={"sdpa_cudnn": ok["sdpa_cudnn"]})
        self.assertFalse(v["pass"])

    def test_summary_names_the_verdict(self):
        _, spread, test = curves()
        v = self.run_verdict(test, spread, grad_diffs={"flash_steps": {"a": 0.01}, "sdpa_cudnn": {"a": 0.02}})
        result = {"verdict": v, "floors": {"entropy_floor": 1.0, "markov_floor": 1.3, "unigram_entropy": 3.7}}
        self.assertTrue(tg.summary(result).endswith("\nPASS"))
        v["pass"], v["reasons"] = False, ["a reason"]
        self.assertIn("a reason", tg.summary(result))
        full = fake_result()
        full["floors"]["copied_markov_cost"] = 1.5
        self.assertIn("on copied tokens", tg.summary(full))
        self.assertTrue(tg.summary(result).endswith("\nFAIL"))

    def test_learning_rate_schedule(self):
        self.assertAlmostEqual(tg.lr_factor(0, 20, 300), 1 / 20)
        self.assertAlmostEqual(tg.lr_factor(19, 20, 300), 1.0)
        self.assertAlmostEqual(tg.lr_factor(20, 20, 300), 1.0)
        self.assertAlmostEqual(tg.lr_factor(299, 20, 300), 0.1)


class CommandLine(unittest.TestCase):
    def test_help_without_torch(self):
        out = subprocess.run([sys.executable, str(REPO / "bench" / "train_gpt.py"), "--help"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("--spread-backends", out.stdout)
        self.assertIn("entropy floor", out.stdout)

    def test_arguments(self):
        a = tg.parse_args([])
        cfg = tg.config_of(a)
        self.assertEqual((cfg["layers"], cfg["d_model"], cfg["heads"], cfg["head_dim"], cfg["seqlen"], cfg["steps"]),
                         (4, 512, 8, 64, 512, 300))
        self.assertEqual(cfg["spread"], ["sdpa_cudnn", "sdpa_efficient"])
        self.assertEqual(tg.config_of(tg.parse_args(["--head-dim", "128"]))["heads"], 4)
        q = tg.config_of(tg.parse_args(["--quick"]))
        self.assertEqual((q["layers"], q["d_model"], q["seqlen"], q["steps"]), (2, 128, 256, 120))
        self.assertNotIn("varlen", cfg)
        self.assertEqual(cfg["reference"], "sdpa_flash")
        v = tg.config_of(tg.parse_args(["--varlen"]))
        self.assertEqual((v["reference"], v["spread"], v["batch"]), ("sdpa_efficient", ["sdpa_math", "sdpa_cudnn"], 1))
        self.assertEqual({k: v["varlen"][k] for k in ("tokens", "min_len", "max_len", "sliding_window")},
                         {"tokens": 8192, "min_len": 32, "max_len": 512, "sliding_window": 256})
        vq = tg.config_of(tg.parse_args(["--varlen", "--quick", "--sliding-window", "-1"]))["varlen"]
        self.assertEqual((vq["tokens"], vq["min_len"], vq["max_len"], vq["sliding_window"]), (2048, 16, 256, -1))
        for bad in (["--spread-backends", "flash"], ["--spread-backends", "fast"], ["--d-model", "320",
                    "--head-dim", "128"], ["--steps", "0"], ["--varlen", "--spread-backends", "efficient"],
                    ["--varlen", "--min-len", "300"], ["--varlen", "--tokens", "8"], ["--varlen", "--sliding-window",
                    "-2"]):
            with self.assertRaises(SystemExit):
                with open("/dev/null", "w") as devnull:
                    saved, sys.stderr = sys.stderr, devnull
                    try:
                        tg.parse_args(bad)
                    finally:
                        sys.stderr = saved


def fake_result(passed=True):
    ref, spread, test = curves(n=120)
    v = tg.verdict({"sdpa_flash": ref, "sdpa_cudnn": spread, "flash_steps": test}, 20, 3.0, 0.01, 1.0)
    runs = {name: {"status": "ok", "losses": c, "recall_losses": [x + 0.5 for x in c]}
            for name, c in (("sdpa_flash", ref), ("sdpa_cudnn", spread), ("flash_steps", test))}
    runs["sdpa_efficient"] = {"status": "error", "reason": "RuntimeError: no kernel"}
    return {"config": {"reference": "sdpa_flash"}, "runs": runs, "verdict": v, "commit": "abc",
            "floors": {"entropy_floor": 1.0, "markov_floor": 1.3, "unigram_entropy": 3.7},
            "environment": {"gpu": "NVIDIA H200"}}


class Draw(unittest.TestCase):
    def test_plot(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("no matplotlib")
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "train_gpt.png"
            tg.plot(fake_result(), path)
            self.assertGreater(path.stat().st_size, 10000)


@unittest.skipIf(torch is None, "no PyTorch")
class Torch(unittest.TestCase):
    def test_batch_generator_follows_the_specification(self):
        lang = tg.Language(3)
        data = tg.generate_batch(torch, lang, 12, 513, seed=5)
        self.assertGreater(data["recall"].double().mean().item(), 0.1)
        for i in range(12):
            s = tg.generate_sequence(lang, [tuple(u) for u in data["uniforms"][i].tolist()])
            self.assertEqual(data["tokens"][i].tolist(), s["tokens"])
            self.assertEqual(data["recall"][i].tolist(), s["recall"])
            for key in ("logp", "markov_logp"):
                for a, b in zip(data[key][i].tolist(), s[key]):
                    self.assertAlmostEqual(a, b, places=12)

    def test_tiny_training_on_the_cpu(self):
        """Two SDPA backends as the test and the reference on the CPU, one as the spread: the whole
        experiment runs, the first gradients agree and the loss falls."""
        args = tg.parse_args(["--quick", "--steps", "30", "--d-model", "64", "--batch", "4", "--seqlen", "128",
                              "--window", "10"])
        cfg = tg.config_of(args)
        runs = {"sdpa_flash": tg.sdpa_attention(torch, "math"), "sdpa_cudnn": tg.sdpa_attention(torch, "math"),
                "flash_steps": tg.sdpa_attention(torch, "math")}
        result = tg.run_experiment(torch, runs, cfg, torch.device("cpu"), log=lambda s: None)
        losses = {n: r["losses"] for n, r in result["runs"].items()}
        self.assertEqual(set(losses), {"sdpa_flash", "sdpa_cudnn", "flash_steps"})
        self.assertEqual(losses["flash_steps"], losses["sdpa_flash"], "the same kernel on the CPU: the same curve")
        self.assertLess(losses["flash_steps"][-1], losses["flash_steps"][0] - 0.3)
        self.assertAlmostEqual(losses["flash_steps"][0], math.log(56), delta=0.1)
        self.assertEqual(max(result["runs"]["flash_steps"]["first_grad_rel_diff"].values()), 0.0)
        self.assertIn("verdict", result)

    def test_gradient_differences_split_qkv(self):
        ref = {"blocks.0.qkv.weight": torch.ones(6, 2), "head.weight": torch.ones(2, 2), "ln.bias": torch.zeros(2)}
        g = {name: t.clone() for name, t in ref.items()}
        g["blocks.0.qkv.weight"][0] = 2.0  # the first q row only
        d = tg.grad_differences(g, ref)
        self.assertEqual(set(d), {"blocks.0.qkv.weight[q]", "blocks.0.qkv.weight[k]", "blocks.0.qkv.weight[v]",
                                  "head.weight", "ln.bias"})
        self.assertAlmostEqual(d["blocks.0.qkv.weight[q]"], math.sqrt(2) / 2)
        self.assertEqual(d["blocks.0.qkv.weight[k]"], 0.0)
        self.assertEqual(d["ln.bias"], 0.0)
        g["ln.bias"][0] = 1.0
        self.assertEqual(tg.grad_differences(g, ref)["ln.bias"], math.inf)

    def test_packed_mask_against_the_definition(self):
        for cu, left in (([0, 3, 8], 2), ([0, 1, 2, 20, 21], 4), ([0, 33], -1), ([0, 5, 30, 31], 0)):
            mask = tg.packed_mask(torch, cu, left, "cpu")
            want = [[sees(cu, left, i, j) for j in range(cu[-1])] for i in range(cu[-1])]
            self.assertEqual(mask.tolist(), want, (cu, left))

    def test_packed_data(self):
        args = tg.parse_args(["--varlen", "--quick", "--steps", "3", "--tokens", "300", "--seqlen", "64",
                              "--min-len", "8", "--sliding-window", "16"])
        cfg = tg.config_of(args)
        lang = tg.Language(cfg["seed"])
        data = tg.make_data(torch, lang, cfg, "cpu")
        for key in ("inputs", "targets", "positions", "recall"):
            self.assertEqual(tuple(data[key].shape), (3, 1, 300), key)
        for step, pack in enumerate(data["packs"]):
            cu = pack["cu_seqlens"]
            self.assertEqual(pack["cu"].tolist(), cu)
            self.assertEqual(pack["cu"].dtype, torch.int32)
            longest = max(b - a for a, b in zip(cu, cu[1:]))
            self.assertEqual((cu[-1], pack["max_seqlen"], pack["left"]), (300, longest, 16))
            x, y, pos = (data[k][step, 0].tolist() for k in ("inputs", "targets", "positions"))
            for a, b in zip(cu, cu[1:]):
                self.assertEqual(pos[a:b], list(range(b - a)), "positions restart in each document")
                self.assertEqual(x[a + 1:b], y[a:b - 1], "within a document the targets are the next inputs")
        again = tg.make_data(torch, lang, cfg, "cpu")
        self.assertTrue(torch.equal(again["inputs"], data["inputs"]))
        self.assertEqual(data["floors"]["documents"], sum(len(p["cu_seqlens"]) - 1 for p in data["packs"]))

    def test_tiny_varlen_training_on_the_cpu(self):
        """--varlen's runs on the CPU: SDPA math with the packed mask as the reference and the spread, and as
        flash_steps a stand-in for varlen_attention that attends each document alone (SDPA math on its rows,
        causal and windowed): the packing, the positions and the mask agree with it."""
        F = torch.nn.functional
        calls = []

        class PerDocument:
            @staticmethod
            def varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal, window, step, backward_step,
                                 deterministic):
                calls.append(window)
                self.assertTrue(causal)
                self.assertIs(cu_q, cu_k)
                self.assertEqual(q.dim(), 3)
                cu = cu_q.tolist()
                self.assertEqual((cu[-1], max_q), (q.shape[0], max(b - a for a, b in zip(cu, cu[1:]))))
                out = []
                for a, b in zip(cu, cu[1:]):
                    i = torch.arange(b - a)
                    mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] <= window[0])
                    out.append(F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v)),
                                                              attn_mask=mask).transpose(0, 1))
                return torch.cat(out)

        args = tg.parse_args(["--varlen", "--quick", "--steps", "30", "--d-model", "64", "--tokens", "512",
                              "--seqlen", "128", "--min-len", "16", "--sliding-window", "24", "--window", "10"])
        cfg = tg.config_of(args)
        runs = {"sdpa_efficient": tg.sdpa_packed_attention(torch, "math"),
                "sdpa_math": tg.sdpa_packed_attention(torch, "math"),
                "flash_steps": tg.flash_steps_packed_attention(PerDocument)}
        result = tg.run_experiment(torch, runs, cfg, torch.device("cpu"), log=lambda s: None)
        self.assertEqual(calls[0], (24, 0))
        self.assertEqual(len(calls), 30 * cfg["layers"])
        losses = {n: r["losses"] for n, r in result["runs"].items()}
        self.assertEqual(losses["sdpa_math"], losses["sdpa_efficient"], "the same kernel: the same curve")
        self.assertAlmostEqual(losses["flash_steps"][0], losses["sdpa_efficient"][0], delta=1e-3)
        self.assertAlmostEqual(losses["flash_steps"][0], math.log(56), delta=0.1)
        self.assertLess(max(result["runs"]["flash_steps"]["first_grad_rel_diff"].values()), 0.05)
        self.assertLess(losses["flash_steps"][-1], losses["flash_steps"][0] - 0.3)
        self.assertLess(max(abs(a - b) for a, b in zip(losses["flash_steps"], losses["sdpa_efficient"])), 0.05)

    def test_a_failing_run_is_recorded(self):
        args = tg.parse_args(["--quick", "--steps", "4", "--d-model", "64", "--batch", "2", "--seqlen", "64",
                              "--window", "2"])
        cfg = tg.config_of(args)

        def broken(q, k, v):
            raise RuntimeError("no kernel for this")
        runs = {"sdpa_flash": tg.sdpa_attention(torch, "math"), "sdpa_cudnn": tg.sdpa_attention(torch, "math"),
                "flash_steps": broken}
        result = tg.run_experiment(torch, runs, cfg, torch.device("cpu"), log=lambda s: None)
        self.assertEqual(result["runs"]["flash_steps"]["status"], "error")
        self.assertFalse(result["verdict"]["pass"])
        self.assertIn("flash_steps failed: RuntimeError: no kernel for this", result["verdict"]["reasons"][0])


if __name__ == "__main__":
    unittest.main()
