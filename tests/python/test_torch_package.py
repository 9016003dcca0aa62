"""The flash_steps package on a GPU with PyTorch: forward against SDPA's math backend in fp32, attention's
gradients against an fp32 reference by fs_backward_bound (ref_err: SDPA's error in the dtype), GQA, strided views, the deterministic mode, decode on a contiguous and a paged
cache, softcapped attention and its gradients against a softcapped fp32 reference, sliding windows (forward,
backward and autograd) against an fp32 reference with an explicit mask, variable-length batches against each
sequence's explicit reference, and bench/fs_results.py's reference with a
window. Its own ctest entry, python.torch: Skipped (77) without PyTorch or a CUDA device."""
import itertools
import math
import sys
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))

import flash_steps as fs  # noqa: E402
import fs_results  # noqa: E402  (visible: the rule of causal and the window, written once)

try:
    import torch
    import torch.nn.functional as F
    HAVE_CUDA = torch.cuda.is_available()
except ImportError:
    torch = F = None
    HAVE_CUDA = False

needs_gpu = unittest.skipUnless(HAVE_CUDA, "needs PyTorch and a CUDA device")


def reference(q, k, v, causal, scale=None):
    """O of (B, N, H, d) tensors by SDPA's math backend in fp32 (GQA: K and V repeated), and the
    function for its gradients."""
    hq, hkv = q.shape[2], k.shape[2]
    qf, kf, vf = (x.detach().float().transpose(1, 2).requires_grad_() for x in (q, k, v))
    kr, vr = (x.repeat_interleave(hq // hkv, dim=1) for x in (kf, vf))
    mask = None
    if causal:
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(q.shape[1], k.shape[1])
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(qf, kr, vr, attn_mask=mask, scale=scale)

    def grads(d_o):
        g = torch.autograd.grad(o, (qf, kf, vf), d_o.float().transpose(1, 2))
        return [x.transpose(1, 2) for x in g]
    return o.transpose(1, 2), grads


def low_precision_grads(q, k, v, d_o, causal):
    """The same gradients from SDPA in the inputs' dtype (flash, the backend it picks for these shapes; not
    the math backend, which may compute fp16 in fp32): the ref_err of the bound. Causal only with
    seqlen_q == seqlen_k, where PyTorch's top-left is_causal is the bottom-right rule."""
    assert not causal or q.shape[1] == k.shape[1]
    hq, hkv = q.shape[2], k.shape[2]
    ql, kl, vl = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    kr, vr = (x.repeat_interleave(hq // hkv, dim=1) for x in (kl, vl))
    o = F.scaled_dot_product_attention(ql, kr, vr, is_causal=causal)
    return [x.transpose(1, 2) for x in torch.autograd.grad(o, (ql, kl, vl), d_o.transpose(1, 2))]


def key_mask(sq, sk, causal, window, device):
    """[sq][sk]: whether row i sees key j (fs_results.visible: bottom-right causal, the window)."""
    i, j = torch.arange(sq, device=device)[:, None], torch.arange(sk, device=device)[None, :]
    return fs_results.visible(i, j, sq, sk, causal, window)


def explicit(q, k, v, causal, softcap=0.0, window=None, dtype=torch.float32 if HAVE_CUDA else None):
    """O (B, N, H, d) and LSE (B, H, N) of (B, N, H, d) tensors written out in `dtype` (fp32: the reference; the
    inputs' dtype: the same computation rounded, the ref_err of the bound): the logits softcapped when softcap
    > 0, the keys key_mask hides at -inf, the softmax in fp32, a row with no key 0 (LSE -inf), as the library
    defines them; and its gradients function."""
    hq, hkv, sq, sk, d = q.shape[2], k.shape[2], q.shape[1], k.shape[1], q.shape[3]
    qf, kf, vf = (x.detach().to(dtype).transpose(1, 2).requires_grad_() for x in (q, k, v))
    kr, vr = (x.repeat_interleave(hq // hkv, dim=1) for x in (kf, vf))
    s = torch.matmul(qf, kr.transpose(2, 3)) * d ** -0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.float().masked_fill(~key_mask(sq, sk, causal, window, q.device), float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()  # the softmax does not depend on it: no gradient through it
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    l = e.sum(dim=-1, keepdim=True)
    p = torch.where(l > 0, e / l.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(e))
    o = torch.matmul(p.to(dtype), vr)
    lse = (m + torch.log(l)).squeeze(-1).detach()

    def grads(d_o):
        return [x.transpose(1, 2) for x in torch.autograd.grad(o, (qf, kf, vf), d_o.to(dtype).transpose(1, 2))]
    return o.transpose(1, 2), lse, grads


@needs_gpu
class Torch(unittest.TestCase):
    def setUp(self):
        self.gen = torch.Generator(device="cuda")
        self.gen.manual_seed(7)
        self.lib = fs.library()

    def draw(self, *shape, dtype=None):
        x = torch.randn(*shape, device="cuda", generator=self.gen) + 0.25
        return x.to(dtype or torch.float16)

    def has_backward(self):
        return any(s.runs("backward") for s in fs.steps())

    def test_forward_against_the_math_backend(self):
        for dtype in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                q, k, v = self.draw(2, 300, 8, 64, dtype=dtype), self.draw(2, 500, 2, 64, dtype=dtype), \
                    self.draw(2, 500, 2, 64, dtype=dtype)
                o, lse = fs.forward(q, k, v, causal=causal)
                ref, _ = reference(q, k, v, causal)
                atol, rtol, _ = self.lib.tolerance("fp16" if dtype == torch.float16 else "bf16",
                                                   float(v.abs().max()))
                err = (o.float() - ref).abs()
                self.assertTrue(bool((err <= atol + rtol * ref.abs()).all()), f"{dtype} causal={causal}: "
                                f"max error {float(err.max())}")
                self.assertEqual(tuple(lse.shape), (2, 8, 300))
                self.assertTrue(bool(torch.isfinite(lse).all()))

    def test_strided_views_and_a_given_step(self):
        qkv = self.draw(2, 256, 3, 4, 64)  # a packed QKV buffer: three strided views
        q, k, v = qkv.unbind(dim=2)
        o_views, _ = fs.forward(q, k, v, step="07g_flash_attention2")
        o_copies, _ = fs.forward(q.contiguous(), k.contiguous(), v.contiguous(), step="07g_flash_attention2")
        self.assertTrue(torch.equal(o_views, o_copies))
        with self.assertRaises(fs.InvalidArgument) as e:
            fs.forward(q.cpu(), k.cpu(), v.cpu())
        self.assertIn("flash_steps runs on a CUDA device", e.exception.message)
        with self.assertRaises(fs.InvalidArgument) as e:
            fs.forward(q, k, v, step="01_naive", scale=float("nan"))
        self.assertIn("scale is nan", e.exception.message)

    def test_attention_gradients(self):
        if not self.has_backward():
            self.skipTest("no registered step has a backward pass")
        for dtype, dname in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
            for causal in (False, True):
                sq = 512 if causal else 384  # see low_precision_grads
                for hkv in (8, 2):
                    q = self.draw(2, sq, 8, 128, dtype=dtype).requires_grad_()
                    k = self.draw(2, 512, hkv, 128, dtype=dtype).requires_grad_()
                    v = self.draw(2, 512, hkv, 128, dtype=dtype).requires_grad_()
                    d_o = self.draw(2, sq, 8, 128, dtype=dtype)
                    o = fs.attention(q, k, v, causal=causal)
                    o.backward(d_o)
                    _, grads = reference(q, k, v, causal)
                    exact = grads(d_o)
                    lowp = low_precision_grads(q, k, v, d_o, causal)
                    scale = max(float(ex.abs().max()) for ex in exact)  # the problem's scale (fs_backward_bound)
                    for name, got, ex, lp in zip(("dQ", "dK", "dV"), (q.grad, k.grad, v.grad), exact, lowp):
                        self.assertEqual(got.shape, ex.shape)
                        err = float((got.float() - ex).abs().max())
                        bound = self.lib.backward_bound(dname, float((lp.float() - ex).abs().max()), scale)
                        self.assertLessEqual(err, bound, f"{name} {dname} causal={causal} heads_kv={hkv}")

    def test_softcapped_attention_and_its_gradients(self):
        # softcap 2: logits of these inputs reach about 5, so tanh bends and the slope 1 - t^2 matters
        steps = [s.id for s in fs.steps() if s.runs("backward")]
        for dtype, dname in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
            for causal in (False, True):
                q = self.draw(2, 384, 8, 64, dtype=dtype).requires_grad_()
                k = self.draw(2, 512, 2, 64, dtype=dtype).requires_grad_()
                v = self.draw(2, 512, 2, 64, dtype=dtype).requires_grad_()
                d_o = self.draw(2, 384, 8, 64, dtype=dtype)
                try:
                    o = fs.attention(q, k, v, causal=causal, softcap=2.0)
                except fs.InvalidArgument as e:  # a GPU without a softcapping step: refused, never wrong
                    self.assertIn("softcap is 2", e.message)
                    continue
                o.backward(d_o)
                ref, _, grads = explicit(q, k, v, causal, softcap=2.0)
                atol, rtol, _ = self.lib.tolerance(dname, float(v.abs().max()))
                err = (o.float() - ref).abs()
                self.assertTrue(bool((err <= atol + rtol * ref.abs()).all()), f"{dname} causal={causal}: O error "
                                f"{float(err.max())}")
                exact = grads(d_o)
                _, _, low = explicit(q, k, v, causal, softcap=2.0, dtype=dtype)
                lowp = low(d_o)
                plain = fs.attention(q.detach(), k.detach(), v.detach(), causal=causal)
                self.assertGreater(float((plain.float() - ref).abs().max()), 10 * float(err.max()))  # the cap bites
                scale = max(float(ex.abs().max()) for ex in exact)
                for name, got, ex, lp in zip(("dQ", "dK", "dV"), (q.grad, k.grad, v.grad), exact, lowp):
                    got_err = float((got.float() - ex).abs().max())
                    bound = self.lib.backward_bound(dname, float((lp.float() - ex).abs().max()), scale)
                    self.assertLessEqual(got_err, bound, f"{name} {dname} causal={causal} ({steps})")
        with self.assertRaises(fs.InvalidArgument) as e:
            fs.forward(q.detach(), k.detach(), v.detach(), step="09f_persistent", softcap=2.0)
        self.assertIn("step 09f_persistent has no softcapping", e.exception.message)

    # (window, seqlen_q, seqlen_k): bands of either side, one side unbounded, a single key (rows 0-127 with none
    # where seqlen_q > seqlen_k), wider than the sequence, odd lengths
    WINDOWS = (((128, 0), 384, 512), ((64, 64), 384, 512), ((-1, 32), 384, 512), ((0, 0), 512, 384),
               ((4096, 4096), 300, 300), ((32, -1), 257, 389))

    def check_gradients(self, got, exact, low, dname, what):
        scale = max(float(ex.abs().max()) for ex in exact)  # the problem's scale (fs_backward_bound)
        for name, g, ex, lp in zip(("dQ", "dK", "dV"), got, exact, low):
            self.assertEqual(g.shape, ex.shape)
            err = float(torch.nan_to_num((g.float() - ex).abs(), nan=math.inf).max())
            bound = self.lib.backward_bound(dname, float((lp.float() - ex).abs().max()), scale)
            self.assertLessEqual(err, bound, f"{name} {what}")

    def test_windowed_attention_forward_backward_and_gradients(self):
        refused = []
        for window, sq, sk in self.WINDOWS:
            for causal in (False, True):
                for dtype, dname, d, hkv in ((torch.float16, "fp16", 64, 2), (torch.float16, "fp16", 128, 8),
                                             (torch.bfloat16, "bf16", 64, 8), (torch.bfloat16, "bf16", 128, 2)):
                    what = f"window {window} causal={causal} sq {sq} sk {sk} {dname} d {d} heads_kv {hkv}"
                    q = self.draw(2, sq, 8, d, dtype=dtype).requires_grad_()
                    k = self.draw(2, sk, hkv, d, dtype=dtype).requires_grad_()
                    v = self.draw(2, sk, hkv, d, dtype=dtype).requires_grad_()
                    d_o = self.draw(2, sq, 8, d, dtype=dtype)
                    try:
                        o = fs.attention(q, k, v, causal=causal, window=window)
                    except fs.InvalidArgument as e:  # a GPU without a windowed step: refused, never wrong
                        self.assertIn(f"window is 1 ({window[0]}, {window[1]})", e.message)
                        refused.append(what)
                        continue
                    o.backward(d_o)
                    ref, ref_lse, grads = explicit(q, k, v, causal, window=window)
                    atol, rtol, lse_tol = self.lib.tolerance(dname, float(v.abs().max()))
                    err = (o.float() - ref).abs()
                    self.assertTrue(bool((err <= atol + rtol * ref.abs()).all()), f"{what}: O error {float(err.max())}")
                    exact = grads(d_o)
                    _, _, low = explicit(q, k, v, causal, window=window, dtype=dtype)
                    lowp = low(d_o)
                    self.check_gradients((q.grad, k.grad, v.grad), exact, lowp, dname, f"attention, {what}")
                    # forward and backward called apart: O, LSE (-inf for a row that sees no key), the gradients
                    o2, lse = fs.forward(q.detach(), k.detach(), v.detach(), causal=causal, window=window)
                    self.assertTrue(bool((o2.float() - ref).abs().le(atol + rtol * ref.abs()).all()), what)
                    no_key = torch.isinf(ref_lse)
                    self.assertTrue(bool(torch.equal(torch.isinf(lse), no_key)), f"{what}: LSE -inf where no key")
                    self.assertTrue(bool(((lse - ref_lse).abs() <= lse_tol * (1 + ref_lse.abs()))[~no_key].all()), what)
                    mask = key_mask(sq, sk, causal, window, q.device)
                    self.assertTrue(bool((o2[:, ~mask.any(dim=1)] == 0).all()), f"{what}: O = 0 where no key")
                    got = fs.backward(q.detach(), k.detach(), v.detach(), o2, lse, d_o, causal=causal, window=window)
                    self.check_gradients(got, exact, lowp, dname, f"backward, {what}")
                    if not torch.equal(mask, key_mask(sq, sk, causal, None, q.device)):  # the window hides keys
                        plain = fs.attention(q.detach(), k.detach(), v.detach(), causal=causal)
                        self.assertGreater(float((plain.float() - ref).abs().max()), 10 * float(err.max()), what)
        if torch.cuda.get_device_capability()[0] == 9:  # step 13b's GPU: it runs every one of them
            self.assertEqual(refused, [], f"refused by {[s.id for s in fs.steps()]}")
        q, k, v = (self.draw(1, 256, 2, 64) for _ in range(3))
        with self.assertRaises(fs.InvalidArgument) as e:
            fs.forward(q, k, v, step="07g_flash_attention2", window=(128, 0))
        self.assertIn("window is 1 (128, 0); step 07g_flash_attention2 has no sliding window", e.exception.message)

    def test_varlen_attention_against_each_sequence(self):
        # Packed sequences of 0, 1 and odd lengths, a query length unlike the key length in each, against explicit()
        # on each sequence alone (its own lengths: causal and the window bottom-right on them); the backward in both
        # modes (autograd through varlen_attention, and varlen_backward called apart) against each sequence's
        # gradients, keys no row sees (sequence 0: 3 keys, no row) getting dK = dV = 0 and rows that see no key
        # dQ = 0; deterministic twice, bitwise equal.
        lq, lk = [0, 1, 7, 64, 65, 130], [3, 0, 64, 7, 65, 200]
        cu = [torch.tensor([0] + list(itertools.accumulate(x)), dtype=torch.int32, device="cuda") for x in (lq, lk)]
        rows = lambda c, b: slice(int(c[b]), int(c[b + 1]))  # noqa: E731
        for causal, window, softcap in ((False, None, 0.0), (True, None, 0.0), (False, (20, 5), 0.0),
                                        (True, (40, 0), 8.0)):
            for dtype, dname, d, hkv in ((torch.float16, "fp16", 64, 2), (torch.bfloat16, "bf16", 128, 8)):
                what = f"varlen causal={causal} window {window} softcap {softcap} {dname} d {d} heads_kv {hkv}"
                q = self.draw(sum(lq), 8, d, dtype=dtype).requires_grad_()
                k, v = (self.draw(sum(lk), hkv, d, dtype=dtype).requires_grad_() for _ in range(2))
                d_o = self.draw(sum(lq), 8, d, dtype=dtype)
                options = dict(causal=causal, window=window, softcap=softcap)
                try:
                    o = fs.varlen_attention(q, k, v, cu[0], cu[1], max(lq), max(lk), check_offsets=True, **options)
                except fs.InvalidArgument as e:  # a GPU without a step that has them: refused, never wrong
                    self.assertIn("cu_seqlens_q is set (a variable-length batch of 6 sequences)", e.message)
                    continue
                o2, lse = fs.varlen_forward(q.detach(), k.detach(), v.detach(), cu[0], cu[1], max(lq), max(lk),
                                            **options)
                self.assertEqual(lse.shape, (8, sum(lq)))
                atol, rtol, lse_tol = self.lib.tolerance(dname, float(v.abs().max()))
                refs = []
                for b in range(len(lq)):
                    qb, kb, vb = q[rows(cu[0], b)][None], k[rows(cu[1], b)][None], v[rows(cu[1], b)][None]
                    got, got_lse = o[rows(cu[0], b)].float(), lse[:, rows(cu[0], b)]
                    if lq[b] == 0:
                        continue
                    if lk[b] == 0:  # no key: O = 0, LSE = -inf
                        self.assertTrue(bool((got == 0).all() and torch.isneginf(got_lse).all()), what)
                        continue
                    ref, ref_lse, grads = explicit(qb, kb, vb, causal, softcap, window)
                    refs.append((b, grads, explicit(qb, kb, vb, causal, softcap, window, dtype=dtype)[2]))
                    self.assertTrue(bool((got - ref[0]).abs().le(atol + rtol * ref[0].abs()).all()), f"{what}, seq {b}")
                    self.assertTrue(bool((o2[rows(cu[0], b)].float() == got).all()), what)
                    no_key = torch.isinf(ref_lse[0])
                    self.assertTrue(bool(torch.equal(torch.isinf(got_lse), no_key)), what)
                    self.assertTrue(bool(((got_lse - ref_lse[0]).abs() <= lse_tol * (1 + ref_lse[0].abs()))[~no_key]
                                         .all()), f"{what}, seq {b}: LSE")

                # each sequence's gradients for its rows of dO, once (autograd.grad frees the graph it runs)
                expected = [(b, exact_grads(db), low_grads(db)) for b, exact_grads, low_grads, db in
                            ((b, e, lo, d_o[rows(cu[0], b)][None]) for b, e, lo in refs)]

                def check(grads, how):
                    dq, dk, dv = grads
                    self.assertEqual((dq.shape, dk.shape, dv.shape), (q.shape, k.shape, v.shape), how)
                    for b, exact, low in expected:
                        got = (dq[rows(cu[0], b)][None], dk[rows(cu[1], b)][None], dv[rows(cu[1], b)][None])
                        self.check_gradients(got, exact, low, dname, f"{how}, seq {b}")
                    for b in range(len(lq)):  # the sequences without a reference: one side empty
                        if lk[b] == 0:
                            self.assertTrue(bool((dq[rows(cu[0], b)] == 0).all()), f"{how}, seq {b}: dQ = 0")
                        if lq[b] == 0:
                            self.assertTrue(bool((dk[rows(cu[1], b)] == 0).all() and (dv[rows(cu[1], b)] == 0).all()),
                                            f"{how}, seq {b}: dK = dV = 0")

                o.backward(d_o)  # 13c's backward runs variable-length batches: no refusal where its forward ran
                check((q.grad, k.grad, v.grad), f"{what}, autograd")
                for deterministic in (False, True):
                    how = f"{what}, varlen_backward deterministic={deterministic}"
                    args = (q.detach(), k.detach(), v.detach(), o2, lse, d_o, cu[0], cu[1], max(lq), max(lk))
                    got = fs.varlen_backward(*args, deterministic=deterministic, **options)
                    check(got, how)
                    if deterministic:
                        again = fs.varlen_backward(*args, deterministic=True, **options)
                        for g, g2 in zip(got, again):
                            self.assertTrue(torch.equal(g, g2), f"{how}: bitwise repeatable")
                qd, kd, vd = (x.detach().clone().requires_grad_() for x in (q, k, v))
                fs.varlen_attention(qd, kd, vd, cu[0], cu[1], max(lq), max(lk), deterministic=True, **options) \
                    .backward(d_o)
                check((qd.grad, kd.grad, vd.grad), f"{what}, autograd deterministic")
        bad = torch.tensor([0, 1, 0, 72, 136, 201, 402], dtype=torch.int32, device="cuda")
        q, k, v = (self.draw(n, 2, 64) for n in (sum(lq), sum(lk), sum(lk)))
        with self.assertRaises(fs.InvalidArgument) as e:  # checked offsets: the first bad one named, nothing run
            fs.varlen_forward(q, k, v, bad, cu[1], max(lq), max(lk), check_offsets=True)
        self.assertEqual(e.exception.message, "cu_seqlens_q[2] is 0, below cu_seqlens_q[1] = 1: the offsets must not "
                         "decrease")

    def test_the_benchmarks_reference_with_a_window(self):
        # bench/fs_results.py's reference (compare_torch's check) masks the same keys as the explicit one here
        for window, sq, sk in self.WINDOWS:
            for causal in (False, True):
                q, k, v, d_o = self.draw(1, sq, 2, 64), self.draw(1, sk, 2, 64), self.draw(1, sk, 2, 64), \
                    self.draw(1, sq, 2, 64)
                ref = fs_results.reference(torch, q, k, v, causal, 64 ** -0.5, 2, chunk=100, window=window)
                o, lse, grads = explicit(q, k, v, causal, window=window)
                what = f"window {window} causal={causal} sq {sq} sk {sk}"
                self.assertLess(float((ref["o"].transpose(0, 1).float() - o[0]).abs().max()), 1e-4, what)
                self.assertTrue(bool(torch.equal(torch.isinf(ref["lse"]), torch.isinf(lse[0]))), what)
                finite = ~torch.isinf(lse[0])
                self.assertLess(float((ref["lse"].float() - lse[0])[finite].abs().max()), 1e-4, what)
                exact = fs_results.reference(torch, q, k, v, causal, 64 ** -0.5, 2, d_o=d_o, chunk=100, window=window)
                for name, g in zip(("dq", "dk", "dv"), grads(d_o)):
                    self.assertLess(float((exact[name].transpose(0, 1) - g[0]).abs().max()), 1e-3, f"{name} {what}")

    def test_deterministic_backward_is_repeatable(self):
        if not self.has_backward():
            self.skipTest("no registered step has a backward pass")
        q, k, v, d_o = (self.draw(1, 1024, 4, 64) for _ in range(4))
        o, lse = fs.forward(q, k, v, causal=True)
        first = fs.backward(q, k, v, o, lse, d_o, causal=True, deterministic=True)
        first = [g.clone() for g in first]
        again = fs.backward(q, k, v, o, lse, d_o, causal=True, deterministic=True)
        for a, b in zip(first, again):
            self.assertTrue(torch.equal(a.view(torch.int16), b.view(torch.int16)))

    def test_gradient_of_a_broadcast_output_gradient(self):
        if not self.has_backward():
            self.skipTest("no registered step has a backward pass")
        q, k, v = (self.draw(1, 128, 2, 64).requires_grad_() for _ in range(3))
        fs.attention(q, k, v).sum().backward()  # dO = ones expanded: strides 0, copied for the C ABI
        self.assertTrue(all(bool(torch.isfinite(g).all()) for g in (q.grad, k.grad, v.grad)))

    def test_decode_contiguous_and_paged(self):
        b, sk, hq, hkv, d, page = 3, 1000, 8, 2, 128, 64
        q = self.draw(b, 1, hq, d)
        k, v = self.draw(b, sk, hkv, d), self.draw(b, sk, hkv, d)
        lens = torch.tensor([1000, 17, 640], dtype=torch.int32, device="cuda")
        o, lse = fs.decode(q, k, v, cache_seqlens=lens)
        for i in range(b):
            n = int(lens[i])
            want, _ = fs.forward(q[i:i + 1], k[i:i + 1, :n].contiguous(), v[i:i + 1, :n].contiguous())
            self.assertLess(float((o[i:i + 1].float() - want.float()).abs().max()), 1e-2)
        pages_per_seq = math.ceil(sk / page)
        table = torch.randperm(b * pages_per_seq, device="cuda").to(torch.int32).view(b, pages_per_seq)
        k_pages = k.new_zeros(b * pages_per_seq, page, hkv, d)
        v_pages = v.new_zeros(b * pages_per_seq, page, hkv, d)
        padded = pages_per_seq * page
        for x, pages in ((k, k_pages), (v, v_pages)):
            full = x.new_zeros(b, padded, hkv, d)
            full[:, :sk] = x
            pages[table.reshape(-1).long()] = full.view(b * pages_per_seq, page, hkv, d)
        o_paged, _ = fs.decode(q, k_pages, v_pages, cache_seqlens=lens, block_table=table, max_seqlen_k=sk)
        self.assertLess(float((o_paged.float() - o.float()).abs().max()), 1e-2)


if __name__ == "__main__":
    unittest.main()
