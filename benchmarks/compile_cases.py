"""The kernels bench_compile times, described by shapes so that kc and tinygrad build the same math. Each case
gets a fresh size per repeat (`i`) so that no cache makes a repeat cheaper than a first compile."""

CASES = {
  "matmul_256": lambda i: ("matmul", (256 + i, 256, 256)),
  "elementwise_add_1M": lambda i: ("add", (1024 + i, 1024)),
  "row_sum_4096": lambda i: ("rowsum", (4096 + 4 * i, 256)),
  "conv2d_3x3_16ch_32px": lambda i: ("conv2d", (16, 16, 32 + i, 32, 3)),
}
