"""bench/figures.py: the maps it draws are the steps' own (checked against the notes' tables, the PTX
ISA's rules and, when the runner is built, against what the C++ prints), and every figure is drawn.
The drawing test needs matplotlib (its own ctest entry, python.plots); the C++ comparison needs the
flash-steps runner ($FLASH_STEPS_RUNNER, which ctest sets, or build/flash-steps)."""
import contextlib
import importlib
import io
import math
import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "bench"))

import figures  # noqa: E402


def has_matplotlib():
    try:
        importlib.import_module("matplotlib")
        return True
    except ImportError:
        return False


def runner_path():
    path = Path(os.environ.get("FLASH_STEPS_RUNNER") or REPO / "build" / "flash-steps")
    return path if path.is_file() and os.access(path, os.X_OK) else None


class Causal(unittest.TestCase):
    def test_the_drawn_example(self):
        # Sq = 3, Sk = 5: bottom-right lets row i see keys 0 .. i + 2; top-left keys 0 .. i
        br = [[figures.sees(i, j, 3, 5, "bottom-right") for j in range(5)] for i in range(3)]
        tl = [[figures.sees(i, j, 3, 5, "top-left") for j in range(5)] for i in range(3)]
        self.assertEqual([sum(r) for r in br], [3, 4, 5])
        self.assertEqual([sum(r) for r in tl], [1, 2, 3])
        # Sq = 5, Sk = 3: bottom-right leaves rows 0 and 1 without a key
        self.assertEqual([sum(figures.sees(i, j, 5, 3, "bottom-right") for j in range(3)) for i in range(5)],
                         [0, 0, 1, 2, 3])

    def test_square_problems_agree(self):
        for n in (1, 4, 7):
            for i in range(n):
                for j in range(n):
                    self.assertEqual(figures.sees(i, j, n, n, "bottom-right"), figures.sees(i, j, n, n, "top-left"))


class OnlineSoftmax(unittest.TestCase):
    def two_pass(self, s, v):
        m = max(s)
        l = sum(math.exp(x - m) for x in s)
        return m, l, sum(math.exp(x - m) * y for x, y in zip(s, v))

    def test_one_pass_is_the_two_pass_answer(self):
        m, l, o = figures.online_states(figures.EXAMPLE_SCORES, figures.EXAMPLE_VALUES)[-1]
        m2, l2, o2 = self.two_pass(figures.EXAMPLE_SCORES, figures.EXAMPLE_VALUES)
        self.assertEqual(m, m2)
        self.assertAlmostEqual(l, l2, places=12)
        self.assertAlmostEqual(o, o2, places=12)

    def test_merge_of_two_halves_is_one_pass(self):
        s, v = figures.EXAMPLE_SCORES, figures.EXAMPLE_VALUES
        for cut in range(1, len(s)):
            a = figures.online_states(s[:cut], v[:cut])[-1]
            b = figures.online_states(s[cut:], v[cut:])[-1]
            merged, whole = figures.merge(a, b), figures.online_states(s, v)[-1]
            for x, y in zip(merged, whole):
                self.assertAlmostEqual(x, y, places=12)

    def test_merge_with_one_key_is_the_recurrence(self):
        s, v = figures.EXAMPLE_SCORES, figures.EXAMPLE_VALUES
        states = figures.online_states(s, v)
        for j in range(1, len(s)):
            step = figures.merge(states[j - 1], (s[j], 1.0, v[j]))  # a single key: m = s, l = 1, o = v
            for x, y in zip(step, states[j]):
                self.assertAlmostEqual(x, y, places=12)


class ThreadGrid(unittest.TestCase):
    def test_every_element_has_one_thread(self):
        s, o = figures.s_owner_map(), figures.o_owner_map()
        self.assertNotIn(-1, [t for row in s for t in row])
        self.assertNotIn(-1, [t for row in o for t in row])
        counts = {}
        for row in s:
            for t in row:
                counts[t] = counts.get(t, 0) + 1
        self.assertEqual(set(counts.values()), {16})  # a 4 × 4 register tile each

    def test_note03_table(self):
        # note 03: q_row(t, i) = t/16 + 16·i, key(t, j) = t%16 + 16·j, o_col(t) = (t%16)·HEAD_DIM/16
        s = figures.s_owner_map()
        self.assertEqual(s[0][0], 0)
        self.assertEqual(s[17][33], 16 * 1 + 1)
        self.assertEqual(figures.o_owner_map()[48][127], 15)


class Banks(unittest.TestCase):
    def test_note04_tables(self):
        for r in range(8):
            for c in range(8):
                self.assertEqual(figures.bank_map("row-major")[r][c], 4 * c)
                self.assertEqual(figures.bank_map("padded")[r][c], 4 * ((r + c) % 8))
                self.assertEqual(figures.bank_map("swizzled")[r][c], 4 * (c ^ r))

    def test_the_k_read(self):
        # note 03: "S: read K ... 32 (4) — 8-way in every phase"; both layouts of step 04: 4
        self.assertEqual(figures.k_read_wavefronts("row-major"), 32)
        self.assertEqual(figures.k_read_wavefronts("padded"), 4)
        self.assertEqual(figures.k_read_wavefronts("swizzled"), 4)

    def test_textbook_cases_of_the_model(self):
        # tests/test_bank_model.cpp's cases: 32 consecutive words, a column of 128-byte rows, a broadcast
        self.assertEqual(figures.wavefronts([4 * l for l in range(32)], 4), 1)
        self.assertEqual(figures.wavefronts([128 * l for l in range(32)], 4), 32)
        self.assertEqual(figures.wavefronts([0] * 32, 4), 1)
        self.assertEqual(figures.wavefronts([16 * l for l in range(32)], 16), 4)


class Fragments(unittest.TestCase):
    def test_each_lane_holds_its_share(self):
        for grid, per_lane in ((figures.c_fragment(), 4), (figures.a_fragment(), 8), (figures.b_fragment(), 4)):
            counts = {}
            for row in grid:
                for lane, _ in row:
                    counts[lane] = counts.get(lane, 0) + 1
            self.assertEqual(counts, {lane: per_lane for lane in range(32)})

    def test_s_accumulators_are_p_fragments(self):
        # note 06: two n8 tiles of C side by side hold the A fragment, lane for lane
        c, a = figures.c_fragment(), figures.a_fragment()
        for r in range(16):
            for col in range(16):
                self.assertEqual(a[r][col][0], c[r][col % 8][0])


class Tiles(unittest.TestCase):
    def test_note07_counts(self):
        # 43 tiles of 48 keys at N = 2048 (note 07, Masking); the last one ragged, so masked
        self.assertEqual(figures.kv_tiles_for(0, 128, 48, 2048, 2048, False), (43, 42))
        classes = figures.tile_classes(1024, 1024, 128, 48, causal=True)
        self.assertEqual(len(classes), 8)
        self.assertEqual([sum(k != "skipped" for k, _ in row) for row in classes], [3, 6, 8, 11, 14, 16, 19, 22])
        for row in classes:  # visits count down from the last tile; masked ones first
            visited = [(k, v) for k, v in row if k != "skipped"]
            self.assertEqual([v for _, v in visited], list(range(len(visited) - 1, -1, -1)))
            kinds = [k for k, _ in sorted(visited, key=lambda kv: kv[1])]
            self.assertEqual(kinds, sorted(kinds, key=lambda k: k != "masked"))

    def test_launch_order(self):
        self.assertEqual([figures.block_tile(x, 8) for x in range(3)], [(0, 7), (0, 6), (0, 5)])
        self.assertEqual(figures.block_tile(8, 8), (1, 7))


@unittest.skipUnless(runner_path(), "the flash-steps runner is not built (set FLASH_STEPS_RUNNER)")
class AgainstTheCpp(unittest.TestCase):
    """The Python maps against what the C++ of the steps prints: the same functions."""

    def run_runner(self, *args):
        return subprocess.run([str(runner_path()), *args], check=True, capture_output=True, text=True).stdout

    def test_bank_maps_and_the_k_read(self):
        text = self.run_runner("banks")
        for step, layout in (("03_smem_tiling", "row-major"), ("04_pad", "padded"), ("04_swizzle", "swizzled")):
            section = text.split(f"== {step}:")[1].split("\n== ")[0]
            rows = re.findall(r"^\s+(\d+)\s+((?:\s*\d+){16})\s*$", section.split("key \\ chunk")[1].split("\n", 1)[1], re.M)
            printed = [[int(x) for x in cells.split()] for _, cells in rows[:10]]
            self.assertEqual(printed, figures.bank_map(layout, rows=10), step)
            worst = re.search(r"S = Q·Kᵀ: read K\s+16\s+\d+\s+\d+\s+\d+\s+\d+\s+(\d+)", section)
            self.assertEqual(int(worst.group(1)), figures.k_read_wavefronts(layout), step)

    def test_fragment_maps(self):
        text = self.run_runner("explain", "--step", "06_ldmatrix_mma")

        def grid(title, rows):
            body = text.split(title)[1].split("\n\n")[0]
            return [[int(x) for x in line.split("|")[1].split()] for line in body.splitlines()[2:2 + rows]]

        for title, mine in (("C/D (16 x 8", figures.c_fragment()), ("A (16 x 16)", figures.a_fragment()),
                            ("B (16 x 8, k x n)", figures.b_fragment())):
            self.assertEqual(grid(title, 16), [[lane for lane, _ in row] for row in mine], title)
        lanes = re.findall(r"cols 0-7: lane (\d+)\s+cols 8-15: lane (\d+)", text)
        self.assertEqual(len(lanes), 16)
        for r, (left, right) in enumerate(lanes):
            self.assertEqual(figures.ldmatrix_x4_quadrants(int(left)), (r, 0))
            self.assertEqual(figures.ldmatrix_x4_quadrants(int(right)), (r, 8))

    def test_window_tile_maps(self):
        # every map step 13b's explain prints (common/step/window.h's kv_span) is the brute force of the definition;
        # the figure's three panels among them
        text = self.run_runner("explain", "--step", figures.WINDOW_STEP)
        maps = figures.parse_tile_maps(text)
        figures.window_panels(text)
        for key, rows in maps.items():
            self.assertEqual(rows, figures.tile_map(*key), key)


class Descriptors08(unittest.TestCase):
    """Step 08's wgmma descriptors, written again in figures.py, against explain's table and by hand."""

    def test_by_hand(self):
        # start 0, LBO 16 (encoded 1), SBO 1024 (encoded 64), 128-byte swizzle (1 << 62)
        self.assertEqual(figures.matrix_descriptor(0, 16, 1024), 0x4000004000010000)
        self.assertEqual([figures.k_major_step_offset(128, ks) for ks in (0, 1, 3, 4, 7)], [0, 32, 96, 16384, 16480])

    @unittest.skipUnless(runner_path(), "the flash-steps runner is not built")
    def test_against_the_runner(self):
        text = subprocess.run([str(runner_path()), "explain", "--step", "08_tma_wgmma"], capture_output=True,
                              text=True, check=True).stdout
        found = re.findall(r"start \+(\d+), LBO (\d+), SBO (\d+), 128-byte swizzle\s+->\s+0x([0-9a-f]+)", text)
        self.assertGreaterEqual(len(found), 20)
        for start, lbo, sbo, value in found:
            self.assertEqual(figures.matrix_descriptor(int(start), int(lbo), int(sbo)), int(value, 16))


class Ownership12(unittest.TestCase):
    """Step 12's dQ tiles, written again in figures.py (hopper_dq_tile), against explain's tile table."""

    def test_by_hand(self):
        self.assertEqual([figures.hopper_dq_tile(wg, 128) for wg in (0, 1)], [(0, 0), (1, 0)])  # d 64: row halves
        self.assertEqual([figures.hopper_dq_tile(wg, 64) for wg in (0, 1)], [(0, 0), (0, 1)])   # d 128: column halves

    @unittest.skipUnless(runner_path(), "the flash-steps runner is not built")
    def test_against_the_runner(self):
        text = subprocess.run([str(runner_path()), "explain", "--step", "12b_async_wgmma"], capture_output=True,
                              text=True, check=True).stdout
        found = re.findall(r"HEAD_DIM (\d+): BLOCK_Q (\d+), .*?; dQ tiles: warpgroup 0 rows (\d+)\+, cols (\d+)\+; "
                           r"warpgroup 1 rows (\d+)\+, cols (\d+)\+", text)
        self.assertEqual([(int(d), int(q)) for d, q, *_ in found], list(figures.HOPPER_BACKWARD_CONFIGS))
        for _, block_q, *starts in found:
            t = figures.HOPPER_BACKWARD_DQ_TILE
            self.assertEqual([int(x) for x in starts], [t * x for wg in (0, 1)
                                                        for x in figures.hopper_dq_tile(wg, int(block_q))])


class Timeline05(unittest.TestCase):
    """The cp.async timeline is drawn to the measured scale: the two kernels' ncu durations and stall shares."""

    def test_the_summary_is_parsed(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "ncu.txt"
            path.write_text("metric   kernel\nduration          2.500 ms\nstall: long scoreboard, % of warp cycles"
                            "    10.0 %\nstall: MIO throttle, %   2.0 %\nstall: barrier, %     5.0 %\nstall: wait, %   1.0 %\n")
            self.assertEqual(figures.ncu_summary(path), {"duration": 2.5, "stall: long scoreboard": 10.0,
                                                         "stall: MIO throttle": 2.0, "stall: barrier": 5.0,
                                                         "stall: wait": 1.0})

    def test_periods_are_the_measured_ratio(self):
        prof = {s: figures.ncu_summary(figures.RESULTS / n) for s, n in figures.CP_ASYNC_PROFILES.items()}
        tp = figures.tile_periods()
        self.assertEqual(tp["04_swizzle"]["period"], 1.0)
        self.assertAlmostEqual(tp["05_cp_async"]["period"], prof["05_cp_async"]["duration"] / prof["04_swizzle"]["duration"])
        for step, parts in tp.items():
            self.assertAlmostEqual(parts["load wait"] + parts["barrier"] + parts["rest"], parts["period"])
            self.assertAlmostEqual(parts["load wait"], parts["period"] * prof[step]["stall: long scoreboard"] / 100)
        # the gain drawn is the gain measured (about 1.07x), not a schematic's 1.5x
        self.assertLess(tp["05_cp_async"]["period"], 1.0)
        self.assertGreater(tp["05_cp_async"]["period"], 0.85)


class Ring09(unittest.TestCase):
    """The ring's (index, phase) view against the rule written out by hand for two and three stages."""

    def test_two_stages(self):
        got = [tuple(figures.ring_state(t, 2).values()) for t in range(6)]
        self.assertEqual(got, [(0, 0, 0, None), (1, 0, 0, None), (0, 1, 1, 0), (1, 1, 1, 0), (0, 2, 0, 1),
                               (1, 2, 0, 1)])

    def test_three_stages(self):
        self.assertEqual([figures.ring_state(t, 3)["empty_parity"] for t in range(9)],
                         [None, None, None, 0, 0, 0, 1, 1, 1])


class Persistent09f(unittest.TestCase):
    """Appendix L's picture: 09f's block loads the next tile's K(0) during this tile and its Q only after
    the epilogue has read q_smem; 09e pays a block's exit and start on every tile."""

    def spans(self, persistent):
        return {label: (start, start + length) for row, start, length, kind, label in figures.schedule_09f(persistent)}

    def test_q_after_the_epilogue_k_before_it(self):
        s = self.spans(True)
        for n in (1, 2):
            self.assertEqual(s[f"Q{n}"][0], s[f"O{n - 1}"][1])      # q_empty: O(n - 1) has left q_smem
            self.assertLess(s[f"K{n}(0)"][1], s[f"O{n - 1}"][0])    # K(0) is in before the epilogue starts
            self.assertEqual(s[f"tile {n}"][0], s[f"Q{n}"][1])

    def test_the_persistent_block_saves_the_gap_per_tile(self):
        e, f = self.spans(False), self.spans(True)
        for n in (1, 2):
            self.assertAlmostEqual(e[f"tile {n}"][0] - f[f"tile {n}"][0], n * figures.BLOCK_GAP)


class Schedules09(unittest.TestCase):
    """The consumers' schedules of note 09's figure: a simulation of the kernel's turns, checked for what
    must hold whatever the lengths."""

    def rows(self, variant, tiles=4):
        out = {}
        for row, start, length, kind, label in figures.schedule_09(variant, tiles):
            out.setdefault(row, []).append((start, start + length, kind, label))
        return out

    def test_nothing_overlaps_in_a_row(self):
        for variant in ("09a", "09b", "09c"):
            for row, spans in self.rows(variant).items():
                spans.sort()
                for (_, end, *_), (start, *_) in zip(spans, spans[1:]):
                    self.assertLessEqual(end, start + 1e-9, (variant, row))

    def test_every_product_once(self):
        for variant in ("09a", "09b", "09c"):
            labels = sorted(label for *_, label in self.rows(variant, 3)["tensor cores"])
            self.assertEqual(labels, sorted(f"{j}{k} c{c}" for j in ("S", "PV") for k in range(3) for c in (0, 1)))

    def test_the_softmax_waits_for_what_the_variant_says(self):
        tensor = {label: end for start, end, kind, label in self.rows("09c")["tensor cores"]}
        soft = {label: start for start, end, kind, label in self.rows("09c")["consumer 0"] if kind == "softmax"}
        self.assertEqual(soft["softmax S1"], tensor["S1 c0"])  # 09c: S(k) alone, P·V(k-1) still running
        self.assertLess(soft["softmax S1"], tensor["PV0 c0"])
        tensor = {label: end for start, end, kind, label in self.rows("09b")["tensor cores"]}
        soft = {label: start for start, end, kind, label in self.rows("09b")["consumer 0"] if kind == "softmax"}
        self.assertEqual(soft["softmax S1"], max(tensor["S1 c0"], tensor["PV0 c0"]))  # 09b: both

    def test_the_overlap_keeps_the_tensor_cores_busier(self):
        def busy(variant):
            rows = self.rows(variant, 8)
            end = max(e for spans in rows.values() for _, e, *_ in spans)
            return sum(e - s for s, e, *_ in rows["tensor cores"]) / end
        self.assertGreater(busy("09c"), busy("09b"))

    def test_three_consumers_at_head_dim_64(self):
        """09e's picture: with products half as long as at 128, a third consumer keeps the tensor cores busier,
        every product of every consumer runs once, and the rotation holds (c0, c1, c2, c0, ...)."""
        def spans(variant, n):
            return figures.schedule_09(variant, 6, n, figures.GEMM / 2)

        def busy(variant, n):
            sp = spans(variant, n)
            return sum(l for row, _, l, _, _ in sp if row == "tensor cores") / max(s + l for _, s, l, _, _ in sp)
        self.assertGreater(busy("09e", 3), busy("09c", 2) + 0.05)
        labels = sorted(label for row, *_, label in spans("09e", 3) if row == "tensor cores")
        self.assertEqual(labels, sorted(f"{j}{k} c{c}" for j in ("S", "PV") for k in range(6) for c in range(3)))
        order = [label.split()[1] for row, start, _, _, label in sorted(spans("09e", 3), key=lambda x: x[1])
                 if row == "tensor cores" and label.startswith("S")]
        self.assertEqual(order[:6], ["c0", "c1", "c2", "c0", "c1", "c2"])


class BackwardDataflow(unittest.TestCase):
    """Note 11's dataflow: its arrows join its boxes, and its equations are the kernel's (kernel.cuh's header)."""

    def test_edges_join_nodes(self):
        names = {n for n, *_ in figures.BACKWARD_NODES}
        self.assertTrue(all(a in names and b in names for a, b in figures.BACKWARD_EDGES))
        self.assertEqual(names, {x for edge in figures.BACKWARD_EDGES for x in edge})

    def test_the_equations_are_the_kernels(self):
        header = (REPO / "steps" / "11_backward" / "kernel.cuh").read_text().replace("dQ_tile", "dQ")
        for _, _, _, kind, text in figures.BACKWARD_NODES:
            if kind in ("step", "output"):
                for line in text.replace("−", "-").splitlines():
                    if "=" in line:
                        self.assertTrue(line in header, f"not in steps/11_backward/kernel.cuh: {line}")


class SplitKV(unittest.TestCase):
    """Step 10's heuristic, written again in figures.py, against the shapes its note and explain quote."""

    def test_the_explained_shapes(self):
        # flash-steps explain --step 10_decoding: b1 sk131072 h32/8 -> 30 splits (8 blocks, 2048 tiles),
        # b8 sk32768 -> 4 (64 blocks, 512 tiles), b64 sk4096 and b128 sk2048 -> 1 (the grid fills the GPU)
        self.assertEqual([figures.num_splits_for(b, t) for b, t in ((8, 2048), (64, 512), (512, 64), (1024, 32))],
                         [30, 4, 1, 1])
        self.assertEqual(figures.num_splits_for(8, 1), 1)  # one tile: nothing to split

    @unittest.skipUnless(runner_path(), "the flash-steps runner is not built")
    def test_against_the_runner(self):
        text = subprocess.run([str(runner_path()), "explain", "--step", "10_decoding"], capture_output=True,
                              text=True, check=True).stdout
        found = re.findall(r"(\d+) blocks without a split, (\d+) K/V tiles per sequence -> (\d+) splits?", text)
        self.assertGreaterEqual(len(found), 4)
        for blocks, tiles, splits in found:
            self.assertEqual(figures.num_splits_for(int(blocks), int(tiles)), int(splits), (blocks, tiles))

    def test_the_runs_drawn(self):
        rates = figures.decode_rates()
        self.assertEqual([n for n, _ in rates["10_decoding"]], [1024, 4096, 16384, 65536, 131072])
        self.assertGreater(rates["10_decoding"][-1][1], rates["09d_tile_sizes"][-1][1])  # the split pays
        self.assertLess(rates["10_decoding"][-1][1], figures.hbm_read_tbs() * 1000)  # under the roof
        times, floor = figures.decode_times()
        self.assertEqual([n for n, _ in floor], [n for n, _ in times["10_decoding"]])
        for (n, ms), (_, gbs) in zip(times["10_decoding"], rates["10_decoding"]):
            self.assertAlmostEqual(ms * gbs * 1e6, 8 * 8 * n * 128 * 2 * 2, delta=1e-3 * ms * gbs * 1e6)  # K and V bytes
        for (n, ms), (_, least) in zip(times["10_decoding"], floor):
            self.assertGreater(ms, least)  # never faster than reading K and V at the ceiling


class PagedCache10(unittest.TestCase):
    """The paged cache's picture: its block table, and the copy map of steps/10_decoding/traits.h."""

    def test_every_key_has_a_slot_of_its_own(self):
        slots = [figures.paged_slot(b, j) for b, n in enumerate(figures.PAGED_LENGTHS) for j in range(n)]
        self.assertEqual(len(set(slots)), len(slots))
        self.assertTrue(all(0 <= page < figures.PAGED_POOL and 0 <= row < figures.PAGED_PAGE_SIZE for page, row in slots))
        for n, row in zip(figures.PAGED_LENGTHS, figures.PAGED_TABLE):  # the entries past a sequence: -1
            used = -(-n // figures.PAGED_PAGE_SIZE)
            self.assertTrue(all(p >= 0 for p in row[:used]) and all(p == -1 for p in row[used:]), row)

    def test_the_copies_are_traits_h_table(self):
        # kConfigs of steps/10_decoding/traits.h, read as text: {HEAD_DIM, BLOCK_KV, WARPS, STAGES}, // kD...
        text = (REPO / "steps" / "10_decoding" / "traits.h").read_text()
        rows = [tuple(map(int, r)) for r in re.findall(r"^\s*\{(\d+), (\d+), (\d+), (\d+)\},\s*// kD", text, re.M)]
        self.assertEqual(len(rows), 5)
        first = {}
        for d, kv, warps, _ in rows:
            first.setdefault(d, (kv, warps))
        self.assertEqual(figures.DECODE_COPIES, first)  # the figure's tile at each head_dim is the table's first
        # note 10, Appendix C: 8 keys a thread at head_dim 64 and 128, 16 at 256 (every row of the table)
        self.assertEqual(sorted({(d, figures.rows_per_thread(d, kv, w)) for d, kv, w, _ in rows}),
                         [(64, 8), (128, 8), (256, 16)])

    def test_a_multiple_of_16_keeps_a_threads_keys_in_one_page(self):
        for d in figures.DECODE_COPIES:
            for page_size in range(16, 273, 16):
                for tile in range(9):
                    self.assertTrue(all(len(p) == 1 for p in figures.thread_pages(d, page_size, tile)),
                                    (d, page_size, tile))
        self.assertEqual([len(p) for p in figures.thread_pages(256, 24)], [1, 2, 1, 1])  # the figure's refused size
        self.assertTrue(any(len(p) > 1 for p in figures.thread_pages(256, 8)))


def fake_runner(directory: Path, text: str, status: int = 0) -> Path:
    """An executable that prints text (to stderr too when status is not 0) and exits with status, as
    `flash-steps explain --step 13b_window` would."""
    (directory / "explain.txt").write_text(text)
    script = directory / "flash-steps"
    script.write_text(f"#!/bin/sh\ncat '{directory / 'explain.txt'}'\n" + (f"cat '{directory / 'explain.txt'}' >&2\n"
                                                                           f"exit {status}\n" if status else ""))
    script.chmod(0o755)
    return script


class Window13(unittest.TestCase):
    """Step 13b's tile maps: the brute force of the definition (tile_map) against maps worked out by hand, and
    what the figure draws from explain's text against both; against the C++'s: AgainstTheCpp."""

    @staticmethod
    def hand_panels():
        """The three panels of 13_window.png (16 x 16 tiles of 128), worked out from the bands: causal, the
        diagonal tile masked; causal within 512 keys back, tiles r - 4 and r masked, r - 3 ... r - 1 full; 256
        keys either side, tiles r - 2 and r + 2 masked, r - 1 ... r + 1 full."""
        def row(r, masked, full):
            return "".join("M" if t in masked else "F" if t in full else "." for t in range(16))
        return [[row(r, {r}, range(r)) for r in range(16)],
                [row(r, {r - 4, r}, range(r - 3, r)) for r in range(16)],
                [row(r, {r - 2, r + 2}, range(r - 1, r + 2)) for r in range(16)]]

    @classmethod
    def sample_text(cls, panels=None) -> str:
        """explain's text as the brief of 13b gives its shape: other lines around each map."""
        parts = ["13b_window: + sliding window (window_left, window_right) ...", "", "tile maps of the forward:"]
        for (causal, window), rows in zip(figures.WINDOW_PANELS, panels or cls.hand_panels()):
            parts.append(f"map seqlen_q=2048 seqlen_k=2048 block_q=128 block_kv=128 causal={int(causal)} "
                         f"window={'off' if window is None else '%d,%d' % window}")
            parts += [f"q{i:02d} {r}" for i, r in enumerate(rows)]
            parts.append("  . skipped, M masked, F full")
        parts += ["map seqlen_q=100 seqlen_k=300 block_q=64 block_kv=64 causal=0 window=0,0", "q00 ...MM",
                  "q01 ....M", "(end)"]
        return "\n".join(parts) + "\n"

    def test_the_brute_force_against_maps_by_hand(self):
        cases = {
            (512, 512, 128, 128, True, None): ["M...", "FM..", "FFM.", "FFFM"],
            (512, 512, 128, 128, True, (-1, 32)): ["M...", "FM..", "FFM.", "FFFM"],  # causal's right bound wins
            (512, 512, 128, 128, True, (128, 0)): ["M...", "MM..", ".MM.", "..MM"],
            (512, 512, 128, 128, True, (256, 0)): ["M...", "FM..", "MFM.", ".MFM"],
            (512, 512, 128, 128, False, (64, 64)): ["MM..", "MMM.", ".MMM", "..MM"],
            (100, 300, 64, 64, False, (0, 0)): ["...MM", "....M"],  # row i sees key i + 200 alone
            (100, 300, 64, 64, True, None): ["FFFMM", "FFFFM"],     # the last tile holds keys past 300: masked
            (300, 300, 128, 128, False, (4096, 4096)): ["FFM"] * 3,  # wider than the sequence: all of it
            (5, 3, 2, 2, True, (0, 7)): ["..", "M.", ".M"],          # rows 0 and 1 see no key
        }
        for (sq, sk, bq, bkv, causal, window), want in cases.items():
            self.assertEqual(figures.tile_map(sq, sk, bq, bkv, causal, window), want, (sq, sk, bq, bkv, causal, window))
        for (causal, window), rows in zip(figures.WINDOW_PANELS, self.hand_panels()):
            self.assertEqual(figures.tile_map(*figures.WINDOW_SHAPE, causal, window), rows, (causal, window))

    def test_explains_text_is_drawn_as_the_definition(self):
        text = self.sample_text()
        maps = figures.parse_tile_maps(text)
        self.assertEqual(set(maps), {(*figures.WINDOW_SHAPE, c, w) for c, w in figures.WINDOW_PANELS}
                         | {(100, 300, 64, 64, False, (0, 0))})
        self.assertEqual(maps[(100, 300, 64, 64, False, (0, 0))], ["...MM", "....M"])
        panels = figures.window_panels(text)  # what fig_13_window draws
        self.assertEqual(panels, self.hand_panels())
        self.assertEqual(panels, [figures.tile_map(*figures.WINDOW_SHAPE, c, w) for c, w in figures.WINDOW_PANELS])
        self.assertEqual([figures.band_text(2048, 2048, c, w) for c, w in figures.WINDOW_PANELS],
                         ["j ≤ i", "i − 512 ≤ j ≤ i", "i − 256 ≤ j ≤ i + 256"])
        self.assertEqual(figures.band_text(100, 300, False, (0, 0)), "i + 200 ≤ j ≤ i + 200")
        self.assertEqual(figures.band_text(8, 8, False, None), "every key j")

    def test_a_map_cut_short_or_a_panel_missing(self):
        text = self.sample_text()
        for broken, why in ((text.replace("q07 ", "q7x "), "has 7 rows"), (text.replace("q01 ....M", "q01 ....MM"),
                                                                          "rows of lengths [5, 6]")):
            with self.assertRaises(ValueError) as e:
                figures.parse_tile_maps(broken)
            self.assertIn(why, str(e.exception))
        without = text.replace("causal=0 window=256,256", "causal=0 window=256,255")
        with self.assertRaises(figures.Unavailable) as e:
            figures.window_panels(without)
        self.assertIn("prints no map seqlen_q=2048 seqlen_k=2048 block_q=128 block_kv=128 causal=0 window=256,256",
                      str(e.exception))

    def test_explain_is_asked_of_the_runner(self):
        with tempfile.TemporaryDirectory() as tmp:
            runner = fake_runner(Path(tmp), self.sample_text())
            self.assertEqual(figures.window_panels(figures.explain_text(str(runner), "13b_window")), self.hand_panels())
            failing = fake_runner(Path(tmp), "flash-steps: no step has id '13b_window'\n", status=2)
            with self.assertRaises(figures.Unavailable) as e:
                figures.explain_text(str(failing), "13b_window")
            self.assertIn("explain --step 13b_window` failed: flash-steps: no step has id '13b_window'",
                          str(e.exception))
        for runner in (None, "/nowhere/flash-steps"):
            with self.assertRaises(figures.Unavailable) as e:
                figures.explain_text(runner, "13b_window")
            self.assertIn("no flash-steps runner", str(e.exception))


@unittest.skipUnless(has_matplotlib(), "matplotlib is not installed")
class Softcap13(unittest.TestCase):
    def test_the_slope_is_the_derivative(self):
        for softcap in (0.5, 5.0, 30.0):
            for c in (-40.0, -3.0, 0.0, 0.7, 12.0):
                h = 1e-6
                fd = (figures.capped_logit(c + h, softcap) - figures.capped_logit(c - h, softcap)) / (2 * h)
                self.assertAlmostEqual(figures.capped_slope(c, softcap), fd, places=6)
                self.assertLessEqual(abs(figures.capped_logit(c, softcap)), softcap)

    def test_off_and_the_small_logits(self):
        self.assertEqual(figures.capped_logit(7.5, 0), 7.5)
        self.assertEqual(figures.capped_slope(7.5, 0), 1.0)
        self.assertAlmostEqual(figures.capped_logit(0.01, 30.0), 0.01, places=9)  # tanh(x) ~ x near 0


class Draw(unittest.TestCase):
    def test_every_figure(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(figures.main(["--out-dir", tmp]), 0)
            names = sorted(p.name for p in Path(tmp).glob("*.png"))
            self.assertEqual(sorted({n[:2] for n in names}), sorted(figures.FIGURES))
            for n in names:
                self.assertTrue((Path(tmp) / n).read_bytes().startswith(b"\x89PNG"), n)
            first = (Path(tmp) / names[3]).read_bytes()
            self.assertEqual(figures.main(["--out-dir", tmp, "--only", names[3][:2]]), 0)
            self.assertEqual((Path(tmp) / names[3]).read_bytes(), first)  # the same bytes again

    def test_the_window_figure_is_drawn_from_explain_or_left_out(self):
        with tempfile.TemporaryDirectory() as tmp:
            runner = fake_runner(Path(tmp), Window13.sample_text())
            self.assertEqual(figures.main(["--out-dir", tmp, "--only", "13", "--runner", str(runner)]), 0)
            drawn = (Path(tmp) / "13_window.png").read_bytes()
            self.assertTrue(drawn.startswith(b"\x89PNG"))
            figures.main(["--out-dir", tmp, "--only", "13", "--runner", str(runner)])
            self.assertEqual((Path(tmp) / "13_window.png").read_bytes(), drawn)  # the same bytes again
            out, err = Path(tmp) / "without", io.StringIO()
            with contextlib.redirect_stderr(err):  # no runner: the other figures are drawn, this one is said to be not
                self.assertEqual(figures.main(["--out-dir", str(out), "--only", "13", "--runner", "/nowhere"]), 0)
            self.assertEqual(sorted(p.name for p in out.glob("*.png")), ["13_softcap.png"])
            self.assertIn("13_window.png not drawn: no flash-steps runner at /nowhere", err.getvalue())

    def test_committed_figures_are_these(self):
        # notes/figures/ holds what this script draws (regenerate: python3 bench/figures.py)
        committed = sorted(p.name for p in figures.OUT.glob("*.png"))
        self.assertEqual(sorted({n[:2] for n in committed}), sorted(figures.FIGURES))


if __name__ == "__main__":
    unittest.main()
