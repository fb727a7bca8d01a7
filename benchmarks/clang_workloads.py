"""The CLANG anchor workloads, described once for kc and for tinygrad's driver (plain Python: imports neither).

name -> (what is measured, the amount per call: bytes for GB/s or flops for GFLOP/s, input shapes)."""

N16M = 1 << 24
CONV = (32, 32, 64, 64, 3)  # cin, cout, H, W, k: 3x3, padding 1

WORKLOADS = {
  "add_16M": ("GB/s", 3 * 4 * N16M, [(N16M,), (N16M,)]),
  "mul_add_exp_16M": ("GB/s", 4 * 4 * N16M, [(N16M,), (N16M,), (N16M,)]),
  "sum_16M": ("GB/s", 4 * N16M, [(N16M,)]),
  "matmul_512": ("GFLOP/s", 2 * 512 ** 3, [(512, 512), (512, 512)]),
  "matmul_1024": ("GFLOP/s", 2 * 1024 ** 3, [(1024, 1024), (1024, 1024)]),
  "conv2d_3x3_32ch_64px": ("GFLOP/s", 2 * CONV[0] * CONV[1] * CONV[4] ** 2 * CONV[2] * CONV[3],
                           [(CONV[0], CONV[2], CONV[3]), (CONV[1], CONV[0], CONV[4], CONV[4])]),
  "softmax_1024x1024": ("GB/s", 2 * 4 * 1024 * 1024, [(1024, 1024)]),
}
