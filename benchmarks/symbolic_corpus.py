"""Index expressions of the kind kernels produce, written only with the operators that kc's UOp and
tinygrad's UOp share, so that both compilers can be timed on the same input. Plain Python: this file
imports neither."""


def corpus(V, tag: str) -> dict:
  """{name: expression}. V(name, lo, hi) makes a variable; `tag` makes every name unique, so that a fresh
  build shares nothing with an earlier one and simplify() runs cold."""
  def v(name, lo, hi): return V(f"{name}_{tag}", lo, hi)
  g0, g1, g2 = v("gidx0", 0, 63), v("gidx1", 0, 31), v("gidx2", 0, 15)
  l0, l1 = v("lidx0", 0, 3), v("lidx1", 0, 7)
  r0, r1, r2 = v("ridx0", 0, 15), v("ridx1", 0, 2), v("ridx2", 0, 2)
  u0 = v("upcast0", 0, 3)
  out = {}
  # a locally grouped dim split back into its reshaped parts
  a = g0 * 4 + l0
  out["grouped_split"] = (a // 8) * 512 + (a % 8) * 64 + ((g1 * 16 + r0 + 3) // 4) % 32 * 2 + (r0 + 1) % 2
  # matmul A with upcast rows and an unrolled reduce, flattened through a reshape
  row = (g1 * 8 + l1) * 4 + u0
  out["matmul_upcast"] = (row * 256 + r0 * 16 + u0 * 4) // 4 * 4 + (row * 256 + r0 * 16) % 4
  # three merged dims split by // and % (a reshape that cannot stay one view)
  i = g0 * 64 + l0 * 16 + g2
  out["reshape_merge"] = (i // 32) % 8 * 1024 + (i % 32) * 4 + (i // 256) * 32768 + (i // 4) % 8
  # 3x3 conv over a padded 32x32 image: the index and its validity
  iy, ix = g1 + r1 - 1, g2 * 2 + r2 - 1
  out["conv2d_index"] = r0 * 1024 + iy * 32 + ix + (g0 // 16) * 16384
  out["conv2d_valid"] = ((iy < 32) & (0 < iy + 1) & (ix < 32) & (0 < ix + 1)).where(r0 * 1024 + iy * 32 + ix, 0)
  # a flipped, padded and shrunk axis
  fl = (63 - (g0 * 4 + u0)) + 2
  out["flip_pad_shrink"] = ((fl - 2) % 64) * 8 + (fl < 66).where((fl - 2) // 64, 0) * 512 + l1
  # softmax-like: a reduce index that cancels against its own quotient
  s = r0 * 16 + g2
  out["cancel_terms"] = s - (s // 16) * 16 + (g1 * 4 + l0) * 2 - (g1 * 8) + l0 * 6
  # the index of an image (x,y) pair: a row-major dim split into 4-wide texels
  t = (g1 * 64 + g0) * 4 + u0
  out["image_texel"] = (t // 4) % 64 + ((t // 256) % 32) * 64 + (t % 4)
  return out


def time_simplify(V, tag: str, fresh: int, warm_repeats: int, nodes, render) -> dict:
  """{name: figures} for every corpus expression: median simplify() time over `fresh` fresh builds (cold) and over
  `warm_repeats` repeats on one build (warm), node counts in and out (`nodes` counts a graph) and the result as text
  (`render`). The same loop times kc and tinygrad."""
  import statistics, time
  res = {}
  for name in corpus(V, "probe"):
    builds = [corpus(V, f"{tag}{k}")[name] for k in range(fresh)]
    cold = []
    for e in builds:
      t0 = time.perf_counter(); e.simplify(); cold.append(time.perf_counter() - t0)
    e = builds[0]
    warm = []
    for _ in range(warm_repeats):
      t0 = time.perf_counter(); e.simplify(); warm.append(time.perf_counter() - t0)
    res[name] = {"nodes_in": nodes(e), "nodes_out": nodes(e.simplify()), "cold_s": statistics.median(cold),
                 "warm_s": statistics.median(warm), "render": render(e.simplify())}
  return res
