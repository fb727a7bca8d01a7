"""Metal's tensor cores: simdgroup_matrix 8x8x8 multiply-accumulates on one 32-lane simdgroup.

Each lane of a simdgroup holds 2 elements of every 8x8 simdgroup matrix (A as M x K, B as K x N, C/D as M x N).
Apple does not document which; the layout below is the one MLX's GEMM kernels rely on (see SIMDGROUP_LAYOUT):
for lane l, row = (l>>4&1)*4 + (l>>1&3) and col = (l>>3&1)*4 + (l&1)*2 + slot. As bits:

  row bits (0, 1, 2) = lane bits (1, 2, 4);  col bits (0, 1, 2) = (slot, lane bit 0, lane bit 3)

kc makes one kernel axis per bit. C/D needs no permutation: its N bit 0 is the early upcast (the fragment slot), the
lanes' LOCALs take N bits 1, 2 (lanes 0 and 3) and M bits 0, 1, 2 (lanes 1, 2, 4), exactly the hardware's C. A and B
then read K through the lanes and the slot where the hardware has it: the st patterns move A's K onto lanes 0 and 3
and the slot axis, and B's K onto lanes 1, 2 and 4, with the same K bit in the same hardware position for both
(A's slot and B's lane 1: K bit 0 of the hardware; A's lane 0 and B's lane 2: bit 1; A's lane 3 and B's lane 4: bit 2).
The three K unrolls are then held by the lanes, so every fragment is the one upcast axis of 2 (N bit 0's axis)."""
from __future__ import annotations
from kc.backend import DType, FragmentLayout, TensorCore, dtypes

DIMS = (8, 8, 8)  # (N, M, K)
LANES = 32

# expanded_shape splits the upcast axes (K's unroll of 8, then N's early upcast of 2) into bits, most significant
# first: expanded position 0 = K bit 2, 1 = K bit 1, 2 = K bit 0, 3 = N bit 0 (the fragment slot).
# A pattern entry (0, y) reads the original warp (lane) dim y, (1, y) the original expanded dim y.
_THREADS = [(0, 2), (1, 2), (1, 2), (0, 2), (1, 2)]  # lane bits 0..4: N1, M0, M1, N2, M2
_EXPANDED = (2, 2, 2, 2)
# A (M x K): lanes 1, 2, 4 keep M; lane 0 reads K bit 1, lane 3 K bit 2, the slot K bit 0; N's positions go where A
# does not look (the other expanded positions)
_ST1 = (((1, 1), (0, 1), (0, 2), (1, 0), (0, 4)), ((0, 0), (0, 3), (1, 3), (1, 2)))
# B (K x N): lanes 0, 3 and the slot keep N; lane 1 reads K bit 0, lane 2 K bit 1, lane 4 K bit 2; M's lanes go to
# the expanded positions B does not look at
_ST2 = (((0, 0), (1, 2), (1, 1), (0, 3), (1, 0)), ((0, 1), (0, 2), (0, 4), (1, 3)))
_FRAGMENT = [(1, 2)]  # upcast axis 1 (N's early upcast): the 2 elements each lane holds of A, B and C


def simdgroup_tensor_core(dtype_in: DType, dtype_out: DType) -> TensorCore:
  """The 8x8x8 simdgroup_multiply_accumulate of dtype_in matrices into a dtype_out accumulator."""
  return TensorCore(dims=DIMS, dtype_in=dtype_in, dtype_out=dtype_out, threads=_THREADS, reduce_axes=[(0, 8)],
                    upcast_axes=(_FRAGMENT, _FRAGMENT, _FRAGMENT), st1_pattern=_ST1, st2_pattern=_ST2, expanded_shape=_EXPANDED)


# (dtype_in, dtype_out) pairs simdgroup matrices multiply: float and half from Apple7 (A14/M1) on, bfloat from Apple9
# (A17/M3) on, where MSL 3.1 has bfloat simdgroup matrices
BASE_PAIRS = ((dtypes.float32, dtypes.float32), (dtypes.float16, dtypes.float32), (dtypes.float16, dtypes.float16))
BFLOAT_PAIRS = ((dtypes.bfloat16, dtypes.float32),)


def simdgroup_coord(lane: int) -> tuple[int, int]:
  """(row, col) of the first of the two elements lane `lane` holds of an 8x8 simdgroup matrix; the second is
  (row, col + 1). MLX, mlx/backend/metal/kernels/steel/gemm/mma.h, BaseMMAFrag<T, 8, 8>::get_coord."""
  qid = lane // 4
  return (qid & 4) + (lane // 2) % 4, (qid & 2) * 2 + (lane % 2) * 2


def _fragment() -> tuple[tuple[tuple[int, int], ...], ...]:
  return tuple(((r, c), (r, c + 1)) for r, c in map(simdgroup_coord, range(LANES)))


# The hardware's layout in FragmentLayout's terms: every matrix (A as (m, k), B as (k, n), C as (m, n)) the same way
SIMDGROUP_LAYOUT = FragmentLayout(a=_fragment(), b=_fragment(), c=_fragment())
