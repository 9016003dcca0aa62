"""What the result tools of bench/ share: where libflash_steps.so is, the files in bench/results/
(the newest of a kind, the ceilings of the GPU), and the generated text between two marker lines of
a markdown file. Plain Python: no GPU, PyTorch or matplotlib needed."""
from __future__ import annotations

import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


# ---- the library -------------------------------------------------------------------------------

def library_path(explicit: str | os.PathLike | None = None) -> Path:
    """The libflash_steps.so to load: the one given, else $FLASH_STEPS_LIB, else build/libflash_steps.so
    (the README's build directory)."""
    return Path(explicit or os.environ.get("FLASH_STEPS_LIB") or REPO / "build" / "libflash_steps.so")


# ---- results files -----------------------------------------------------------------------------

def load_json(path: str | os.PathLike) -> dict:
    with open(path) as f:
        return json.load(f)


def newest(directory: str | os.PathLike, pattern: str) -> Path | None:
    """The newest file by name: the names carry a UTC date-time, so the name order is the time order."""
    files = sorted(Path(directory).glob(pattern))
    return files[-1] if files else None


# The ceilings a GPU reaches, measured by flash_steps_ceilings: bench/results/ceilings-*.json,
#   {"tool", "commit", "date", "device",
#    "ceilings": [{"id", "value", "unit", "best", "median", "available", "reason"}, ...]}
CEILING_LABELS = {
    "mma_sync_f16": "mma.sync fp16", "mma_sync_bf16": "mma.sync bf16",
    "wgmma_f16": "wgmma fp16", "wgmma_bf16": "wgmma bf16",
    "fma_f32": "fp32 FMA", "ex2_approx": "ex2.approx", "hbm_read": "HBM read", "d2d_copy": "device copy",
}


class CeilingsError(ValueError):
    pass


def load_ceilings(path: str | os.PathLike) -> dict:
    """{"path", "device", "commit", "date", "values": {id: {"value", "unit"}}, "left_out": {id: reason}}:
    the available ceilings of one file, and why the others are not there."""
    data = load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("ceilings"), list):
        raise CeilingsError(f"{path}: not a ceilings file (no \"ceilings\" list)")
    values, left_out = {}, {}
    for c in data["ceilings"]:
        cid = c.get("id")
        if not cid:
            continue
        value = c.get("value")
        if c.get("available", True) and isinstance(value, (int, float)) and value > 0:
            values[cid] = {"value": float(value), "unit": c.get("unit", "")}
        else:
            left_out[cid] = c.get("reason") or "not available"
    return {"path": str(path), "device": data.get("device", ""), "commit": data.get("commit", ""),
            "date": data.get("date", ""), "values": values, "left_out": left_out}


def same_gpu(device: str, gpu: str) -> bool:
    """Whether a ceilings file's device ("NVIDIA H200 (sm_90, 132 SMs)") is the GPU of a results
    file ("NVIDIA H200"); True when either is unknown."""
    if not device or not gpu:
        return True
    return gpu.lower() in device.lower() or device.lower() in gpu.lower()


# ---- generated text between markers ------------------------------------------------------------

class MarkerError(Exception):
    pass


def _marker_span(text: str, begin: str, end: str) -> tuple[int, int]:
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < 0 or j < i:
        raise MarkerError(f"the markers '{begin}' and '{end}' (in that order) were not found")
    return i + len(begin), j


def between_markers(text: str, begin: str, end: str) -> str:
    """What stands between the two marker lines (without the newline after the first)."""
    i, j = _marker_span(text, begin, end)
    return text[i + 1:j] if text.startswith("\n", i) else text[i:j]


def replace_between_markers(text: str, content: str, begin: str, end: str) -> str:
    """text with everything between the two marker lines replaced by content."""
    i, j = _marker_span(text, begin, end)
    return text[:i] + "\n" + content + text[j:]


def update_between_markers(path: str | os.PathLike, content: str, begin: str, end: str) -> bool:
    """Rewrites the file between the markers; True when it changed. Raises MarkerError without them."""
    path = Path(path)
    old = path.read_text()
    new = replace_between_markers(old, content, begin, end)
    if new != old:
        path.write_text(new)
    return new != old
