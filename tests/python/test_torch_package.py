"""The flash_steps package on a GPU with PyTorch: forward against SDPA's math backend in fp32, attention's
gradients against an fp32 reference by fs_backward_bound (ref_err: SDPA's error in the dtype), GQA, strided views, the deterministic mode, decode on a contiguous and a paged
cache, softcapped attention and its gradients against a softcapped fp32 reference. Its own ctest entry, python.torch: Skipped (77) without PyTorch or a CUDA device."""
import math
import sys
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "python"))

import flash_steps as fs  # noqa: E402

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


def softcapped(q, k, v, causal, softcap, dtype=torch.float32 if HAVE_CUDA else None):
    """O of (B, N, H, d) tensors with softcapped logits, written out in `dtype` (fp32: the reference; the
    inputs' dtype: the same computation rounded, the ref_err of the bound), and its gradients function."""
    hq, hkv, sq, sk, d = q.shape[2], k.shape[2], q.shape[1], k.shape[1], q.shape[3]
    qf, kf, vf = (x.detach().to(dtype).transpose(1, 2).requires_grad_() for x in (q, k, v))
    kr, vr = (x.repeat_interleave(hq // hkv, dim=1) for x in (kf, vf))
    s = torch.matmul(qf, kr.transpose(2, 3)) * d ** -0.5
    s = softcap * torch.tanh(s / softcap)
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    o = torch.matmul(torch.softmax(s.float(), dim=-1).to(dtype), vr)

    def grads(d_o):
        return [x.transpose(1, 2) for x in torch.autograd.grad(o, (qf, kf, vf), d_o.to(dtype).transpose(1, 2))]
    return o.transpose(1, 2), grads


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
                ref, grads = softcapped(q, k, v, causal, 2.0)
                atol, rtol, _ = self.lib.tolerance(dname, float(v.abs().max()))
                err = (o.float() - ref).abs()
                self.assertTrue(bool((err <= atol + rtol * ref.abs()).all()), f"{dname} causal={causal}: O error "
                                f"{float(err.max())}")
                exact = grads(d_o)
                _, low = softcapped(q, k, v, causal, 2.0, dtype)
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
