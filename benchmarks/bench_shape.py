"""Benchmark: building the index expression of a multi-view ShapeTracker.

The tracker is conv-like: a padded input read through sliding 3x3 windows (pad, repeat, shrink, reshape, permute:
the chain a framework lowers conv2d to, which keeps two views because the validity depends on oy+ky), then an
im2col flattening, a pad of the patch axis and a transpose, which stack two more views that do not collapse.
Run: python benchmarks/bench_shape.py"""
from __future__ import annotations
import itertools, math, pathlib, sys
sys.path.insert(0, str(pathlib.Path(__file__).parent))
from results import median_time, write_section  # noqa: E402
from kc import ShapeTracker, UOp, dtypes  # noqa: E402


def conv_windows(B: int, C: int, H: int, W: int, k: int, pad: int) -> ShapeTracker:
  """(B, oy, ox, C, ky, kx) windows of a padded (B, C, H, W) input, as a framework's pooling would build them."""
  Hp, Wp = H + 2 * pad, W + 2 * pad
  t = ShapeTracker.from_shape((B, C, H, W)).pad(((0, 0), (0, 0), (pad, pad), (pad, pad)))
  e = math.ceil(k * (Hp + 1) / Hp)  # repeat so that a window step of Hp+1 wraps onto the next row
  t = t.reshape((B, C, 1, Hp, 1, Wp)).expand((B, C, e, Hp, e, Wp)).reshape((B, C, e * Hp, e * Wp))
  t = t.shrink(((0, B), (0, C), (0, k * (Hp + 1)), (0, k * (Wp + 1)))).reshape((B, C, k, Hp + 1, k, Wp + 1))
  o = Hp - k + 1
  return t.shrink(((0, B), (0, C), (0, k), (0, o), (0, k), (0, o))).permute((0, 3, 5, 1, 2, 4))


def four_view_tracker(B=2, C=4, H=8, W=8, k=3) -> ShapeTracker:
  t = conv_windows(B, C, H, W, k, pad=1)
  o, patch = H, C * k * k
  t = t.reshape((B, o * o, patch))                                    # im2col rows: a third view
  t = t.pad(((0, 0), (0, 0), (0, 4))).reshape((B, o * o, (patch + 4) // 4, 4))
  return t.permute((0, 2, 1, 3)).reshape((B * (patch + 4) // 4, o * o * 4)).simplify()  # transposed: a fourth


RANGE_IDS = itertools.count(1)  # one counter for the whole run: no two builds share a RANGE


def fresh_indices(t: ShapeTracker):
  """RANGE placeholders never used before: every node of the expression is new, so the build and its simplify run
  cold (the hash-consed UOps and their simplify memos of earlier runs cannot be reused)."""
  n = next(RANGE_IDS)
  return [UOp.range(dtypes.int32, 0, s, n * 100 + i) for i, s in enumerate(t.shape)]


def build_index(t: ShapeTracker):
  return t.to_indexed_uops(fresh_indices(t))


def main() -> None:
  t = four_view_tracker()
  assert len(t.views) == 4, t
  idx, valid = t.to_indexed_uops()
  n_uops = len({**idx.toposort, **valid.toposort})
  cold = lambda: build_index(t)  # noqa: E731
  cold_s = median_time(cold, repeats=15)
  warm_s = median_time(lambda: t.to_indexed_uops(), repeats=15, number=100)
  build_s = median_time(four_view_tracker, repeats=15, number=10)
  one = conv_windows(2, 4, 8, 8, 3, pad=0).simplify()
  one_s = median_time(lambda: build_index(one), repeats=15)
  rows = [
    ("index expression, 4-view conv-like tracker, build + simplify", f"{cold_s * 1e3:.2f} ms", f"{n_uops} UOps (index + valid)"),
    ("same, memoized (second call)", f"{warm_s * 1e6:.1f} us", ""),
    ("movement ops building that tracker (view caches warm)", f"{build_s * 1e6:.1f} us", f"{len(t.views)} views"),
    ("index expression, unpadded conv windows (1 view)", f"{one_s * 1e3:.2f} ms", f"{len(one.views)} view"),
  ]
  body = "## bench_shape: ShapeTracker index expressions\n\n`python benchmarks/bench_shape.py`; tracker: " + \
         f"shape {t.shape}, views {[v.shape for v in t.views]}\n\n| what | median | |\n|---|---|---|\n" + \
         "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows) + "\n"
  for a, b, c in rows: print(f"{a:62s} {b:>10s}  {c}")
  write_section("bench_shape", body)


if __name__ == "__main__":
  main()
