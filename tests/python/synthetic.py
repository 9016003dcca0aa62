"""Synthetic result files shaped like bench/compare_torch.py's, `flash-steps --json`'s,
`flash-steps resources --json`'s and flash_steps_ceilings' output, for the CPU tests of bench/.
The numbers are invented round numbers, not measurements."""

TFLOPS = {"01_naive": 2.0, "02_tiled": 20.0, "03_online": 100.0, "torch_flash": 300.0, "torch_cudnn": 500.0,
          "torch_efficient": 160.0, "torch_math": 40.0, "fa4": 450.0}


def flops(b, n, h, d, causal):
    f = 4.0 * b * h * n * n * d
    return f / 2 if causal else f


PREVIOUS = {"02_tiled": "01_naive", "03_online": "02_tiled"}


def add_speedups(step_rows):
    """x_step01 and x_prev of one shape's step rows, as compare_torch.py stores them (from the library's
    fs_speedups); written out for this invented ladder, where each step's previous step is fixed."""
    timed = {r.get("impl") or r["id"]: r for r in step_rows if r.get("ms")}
    for step, r in timed.items():
        if "01_naive" in timed:
            r["x_step01"] = timed["01_naive"]["ms"] / r["ms"]
        if PREVIOUS.get(step) in timed:
            r["x_prev"] = timed[PREVIOUS[step]]["ms"] / r["ms"]


def compare_result(seqlens=(1024, 2048, 4096), head_dims=(128,), causals=(False, True), dtypes=("fp16",), fa4=False):
    """fa4: with FlashAttention-4's rows (backend fa4, kind "fa4") and its version in the environment."""
    steps = [{"id": "01_naive", "name": "naive", "lesson": "three kernels", "min_compute_capability": 80},
             {"id": "02_tiled", "name": "tiled", "lesson": "tiles", "min_compute_capability": 80},
             {"id": "03_online", "name": "online", "lesson": "online softmax", "min_compute_capability": 80},
             {"id": "04_refuser", "name": "refuser", "lesson": "refuses d=128", "min_compute_capability": 80}]
    rows = []
    for d in head_dims:
        for causal in causals:
            for dtype in dtypes:
                for n in seqlens:
                    b, h = 16384 // n, 16 if d == 128 else 32
                    f = flops(b, n, h, d, causal)
                    base = dict(batch=b, seqlen=n, heads=h, head_dim=d, causal=causal, dtype=dtype, flops=f)
                    start = len(rows)
                    for impl in ("torch_flash", "torch_cudnn", "torch_efficient", "torch_math") + ("fa4",) * fa4 + (
                            "01_naive", "02_tiled", "03_online", "04_refuser"):
                        kind = "torch" if impl.startswith("torch_") else "fa4" if impl == "fa4" else "step"
                        r = dict(base, impl=impl, kind=kind, status="ok", reason="")
                        if impl == "04_refuser":
                            r.update(status="refused", reason="head_dim is 128; this step needs 64.")
                        elif impl == "01_naive" and n > 1024:
                            r.update(status="skipped", reason="a launch would take about 200 ms, over --max-launch-ms 100")
                        elif impl == "torch_math" and n > 2048:
                            r.update(status="skipped", reason="the math backend needs too much memory")
                        else:
                            ms = f / (TFLOPS[impl] * 1e12) * 1e3
                            r.update(ms=ms, min_ms=ms * 0.99, max_ms=ms * 1.02, iters=20, tflops=TFLOPS[impl],
                                     max_abs_err=1e-3, mismatches=0, nonfinite=0, **{"pass": True})
                        rows.append(r)
                    add_speedups([r for r in rows[start:] if r["kind"] == "step"])
    return {
        "tool": "compare_torch", "schema": 1, "date": "2026-11-30T12:00:00Z", "commit": "abc123def456",
        "environment": {"gpu": "NVIDIA H200", "driver": "580.159.03", "cuda": "13.0", "torch": "2.11.0+cu130",
                        "cudnn": "91900", "sm_count": 132, **({"fa4": "4.0.0b36"} if fa4 else {})},
        "timing": {"statistic": "median", "iters": 20, "l2_flush": True},
        "ladder": {"batch": 8, "seqlen": 2048, "heads": 16, "head_dim": 128, "causal": False, "dtype": "fp16"},
        "steps": steps, "backends": ["flash", "cudnn", "efficient", "math"] + ["fa4"] * fa4, "complete": True,
        "rows": rows,
    }


def runner_result():
    f = flops(8, 2048, 16, 128, False)
    rows = []
    for sid, status in (("01_naive", "PASS"), ("02_tiled", "PASS"), ("03_online", "PASS"), ("04_refuser", "REFUSED")):
        r = {"id": sid, "status": status, "lesson": "", "reason": "" if status != "REFUSED" else "head_dim is 128."}
        if status == "PASS":
            ms = f / (TFLOPS[sid] * 1e12) * 1e3
            r.update(ms=ms, tflops=TFLOPS[sid], max_abs_err=1e-3)
        rows.append(r)
    add_speedups(rows)
    for r in rows:  # the runner writes 0 where there is nothing to compare
        if "ms" in r:
            r.setdefault("x_step01", 0)
            r.setdefault("x_prev", 0)
    rows.append({"id": "cublas", "status": "PASS", "lesson": "", "reason": "", "ms": 3.0, "tflops": 91.6})
    return {"tool": "flash-steps", "commit": "abc123def456", "date": "2026-11-30T11:59:00Z",
            "device": "NVIDIA H200 (sm_90, 132 SMs)",
            "problem": {"batch": 8, "seqlen_q": 2048, "seqlen_k": 2048, "heads_q": 16, "heads_kv": 16,
                        "head_dim": 128, "dtype": "fp16", "causal": False, "softmax_scale": 0.088, "flops": f},
            "timing": {"iters": 20, "warmup": 2, "l2_flush": True, "statistic": "median"}, "rows": rows}


def ceilings_result(device="NVIDIA H200 (sm_90, 132 SMs)"):
    def ceiling(cid, value, unit, available=True, reason=""):
        return {"id": cid, "value": value, "unit": unit, "best": value * 1.01, "median": value,
                "available": available, "reason": reason}
    return {"tool": "flash_steps_ceilings", "commit": "abc123def456", "date": "2026-11-30T11:00:00Z",
            "device": device,
            "ceilings": [ceiling("mma_sync_f16", 600.0, "TFLOP/s"), ceiling("mma_sync_bf16", 590.0, "TFLOP/s"),
                         ceiling("wgmma_f16", 900.0, "TFLOP/s"),
                         ceiling("wgmma_bf16", 0.0, "TFLOP/s", False, "not measured in this invented file"),
                         ceiling("hbm_read", 4.5, "TB/s")]}
