"""The kernels bench_compile times, described by shapes so that kc and tinygrad build the same math. Each repeat
`i` shifts a size a little so that no cache makes a repeat cheaper than a first compile."""

CASES = {
  "add": lambda i: ("add", (4096 + i, 4096)),
  "sum": lambda i: ("rowsum", (4096 + 4 * i, 4096)),
  "matmul_1024": lambda i: ("matmul", (1024 + 4 * i, 1024, 1024)),
  "conv2d_3x3_32ch_64px": lambda i: ("conv2d", (32, 32, 64 + i, 64, 3)),
  "softmax_1024": lambda i: ("softmax", (1024 + i, 1024)),
}

# the size index of the one untimed compile each case gets first (no timed repeat uses it)
WARMUP = 1000
# the first size index of the step-by-step timings (apart from the timed repeats)
STAGE_SIZES = 100
