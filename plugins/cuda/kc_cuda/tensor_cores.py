"""CUDA's tensor cores as kc TensorCores: warp-wide mma.sync instructions (PTX ISA, "Warp-level matrix multiply-
accumulate instructions"), each with the fragment layout the hardware uses and the PTX the renderer spells.

Every instruction here is an m16n8kK shape: a warp of 32 lanes computes D (16 x 8) = A (16 x K) @ B (K x 8) + C. In
the PTX documentation's terms a lane's `groupID` is lane >> 2 and its `threadID_in_group` is lane % 4; the layouts
below are the documentation's tables as functions of (lane, register slot). kc's TensorCore descriptions are written
so that kc's own fragment layout (kc.backend.derive_fragment_layout) equals these up to a renumbering of M, N and K
(kc.backend.layout_mismatch): plugins/cuda/tests check that for every declared tensor core, and EMU runs the same
descriptions to check the numbers (KC_EMULATE=CUDA).

How a description reads: the warp's lanes are five binary thread axes, two of N then three of M (lane bits 0-1 and
2-4). The rest of N and M (one bit each) and every bit of K are upcast axes, split into bits by expanded_shape; the
st patterns swap lane bits and upcast bits in A's and B's views, so that a lane reads the K (or N) elements the
instruction gives it; upcast_axes then gathers each operand's register slots from the upcast bits it depends on."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable
from kc.backend import DType, FragmentLayout, KcError, TensorCore, dtypes

Coord = tuple[int, int]
WARP = 32
_THREADS = ((0, 2), (0, 2), (1, 2), (1, 2), (1, 2))  # lane bits 0-1: N, bits 2-4: M


@dataclass(frozen=True)
class MMA:
  """One mma.sync shape and type: the TensorCore kc optimizes with and what the renderer needs to spell it."""
  tc: TensorCore
  ptx: str                # the instruction, e.g. mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
  min_capability: int     # the lowest compute capability (major * 10 + minor) that has it
  a_regs: int             # 32-bit registers per lane of A, B and C/D
  b_regs: int
  c_regs: int
  tf32_inputs: bool = False  # float inputs rounded to tf32 (cvt.rna.tf32.f32) before the instruction


def _tc_k16(dtype_in: DType, dtype_out: DType) -> TensorCore:
  """m16n8k16 (half, bfloat16 inputs). Upcast bits: K0 | K2 K1 | K3 | N0 | M0."""
  return TensorCore(dims=(8, 16, 16), dtype_in=dtype_in, dtype_out=dtype_out, threads=_THREADS, reduce_axes=((0, 2), (1, 4), (2, 2)),
                    expanded_shape=(2, 2, 2, 2, 2, 2),
                    st1_pattern=(((1, 2), (1, 1), (0, 2), (0, 3), (0, 4)), ((1, 0), (0, 0), (0, 1), (1, 3), (1, 4), (1, 5))),
                    st2_pattern=(((1, 2), (1, 1), (1, 4), (0, 0), (0, 1)), ((1, 0), (0, 2), (0, 3), (1, 3), (0, 4), (1, 5))),
                    upcast_axes=(((2, 2), (4, 2), (0, 2)), ((2, 2), (0, 2)), ((4, 2), (3, 2))))


def _tc_k8_tf32() -> TensorCore:
  """m16n8k8 with tf32 inputs (float32 data). Upcast bits: K1 K0 | K2 | N0 | M0."""
  return TensorCore(dims=(8, 16, 8), dtype_in=dtypes.float32, dtype_out=dtypes.float32, threads=_THREADS, reduce_axes=((0, 4), (1, 2)),
                    expanded_shape=(2, 2, 2, 2, 2),
                    st1_pattern=(((1, 1), (1, 0), (0, 2), (0, 3), (0, 4)), ((0, 0), (0, 1), (1, 2), (1, 3), (1, 4))),
                    st2_pattern=(((1, 1), (1, 0), (1, 3), (0, 0), (0, 1)), ((0, 2), (0, 3), (1, 2), (0, 4), (1, 4))),
                    upcast_axes=(((1, 2), (3, 2)), ((1, 2),), ((3, 2), (2, 2))))


def _tc_k32_fp8(dtype_in: DType) -> TensorCore:
  """m16n8k32 with fp8 inputs. Upcast bits: K1 K0 | K3 K2 | K4 | N0 | M0."""
  return TensorCore(dims=(8, 16, 32), dtype_in=dtype_in, dtype_out=dtypes.float32, threads=_THREADS, reduce_axes=((0, 4), (1, 4), (2, 2)),
                    expanded_shape=(2, 2, 2, 2, 2, 2, 2),
                    st1_pattern=(((1, 3), (1, 2), (0, 2), (0, 3), (0, 4)), ((1, 0), (1, 1), (0, 0), (0, 1), (1, 4), (1, 5), (1, 6))),
                    st2_pattern=(((1, 3), (1, 2), (1, 5), (0, 0), (0, 1)), ((1, 0), (1, 1), (0, 2), (0, 3), (1, 4), (0, 4), (1, 6))),
                    upcast_axes=(((2, 2), (4, 2), (0, 4)), ((2, 2), (0, 4)), ((4, 2), (3, 2))))


def _ptx_type(dt: DType) -> str:
  return {dtypes.float16: "f16", dtypes.bfloat16: "bf16", dtypes.float32: "f32"}.get(dt) or {"fp8e4m3": "e4m3", "fp8e5m2": "e5m2"}[dt.name]


def _mma(tc: TensorCore, min_capability: int, tf32: bool = False) -> MMA:
  n, m, k = tc.dims
  ti, to = "tf32" if tf32 else _ptx_type(tc.dtype_in), _ptx_type(tc.dtype_out)
  bits_in, bits_out = (32 if tf32 else tc.dtype_in.itemsize * 8), tc.dtype_out.itemsize * 8
  return MMA(tc, f"mma.sync.aligned.m{m}n{n}k{k}.row.col.{to}.{ti}.{ti}.{to}", min_capability,
             a_regs=m * k * bits_in // 32 // WARP, b_regs=k * n * bits_in // 32 // WARP, c_regs=m * n * bits_out // 32 // WARP, tf32_inputs=tf32)


def fp8_dtypes() -> tuple[DType, ...]:
  """kc's fp8 dtypes (e4m3, e5m2), where this kc has them."""
  return tuple(dt for dt in (getattr(dtypes, "fp8e4m3", None), getattr(dtypes, "fp8e5m2", None)) if dt is not None)


def all_mmas() -> list[MMA]:
  """Every tensor-core instruction kc uses, in the order the Kernel tries them: tf32 last, since a float32 tensor core
  also takes half, bfloat16 or fp8 inputs widened to float (exactly, at a quarter of the K per instruction)."""
  return [_mma(_tc_k16(dtypes.float16, dtypes.float32), 80), _mma(_tc_k16(dtypes.bfloat16, dtypes.float32), 80),
          _mma(_tc_k16(dtypes.float16, dtypes.float16), 80), *(_mma(_tc_k32_fp8(dt), 89) for dt in fp8_dtypes()),
          _mma(_tc_k8_tf32(), 80, tf32=True)]


def mmas_for(capability: int) -> list[MMA]:
  """The instructions a GPU of compute capability `capability` (major * 10 + minor) has."""
  return [m for m in all_mmas() if capability >= m.min_capability]


# ----------------------------------------------------------------------------------------------------- the documented layouts
# PTX ISA, "Matrix Fragments for mma.m16n8k16 / mma.m16n8k8 / mma.m16n8k32": (row, col) of each register slot of a
# lane. A is M x K, B is K x N, C and D are M x N.

def _layout(a: Callable[[int, int], Coord], b: Callable[[int, int], Coord], c: Callable[[int, int], Coord],
            slots: tuple[int, int, int]) -> FragmentLayout:
  frag = lambda f, n: tuple(tuple(f(lane, i) for i in range(n)) for lane in range(WARP))
  return FragmentLayout(a=frag(a, slots[0]), b=frag(b, slots[1]), c=frag(c, slots[2]))


def _c(lane: int, i: int) -> Coord: return ((lane >> 2) + 8 * (i >> 1), (lane % 4) * 2 + (i & 1))


def documented_layout(tc: TensorCore) -> FragmentLayout:
  """The fragment layout the PTX ISA documents for the instruction `tc` stands for."""
  k = tc.dims[2]
  if k == 16:  # a0..a7: rows g, g, g+8, g+8, g, g, g+8, g+8; cols 2t + (i & 1), + 8 from a4
    return _layout(lambda l, i: ((l >> 2) + 8 * ((i >> 1) & 1), (l % 4) * 2 + (i & 1) + 8 * (i >> 2)),
                   lambda l, i: ((l % 4) * 2 + (i & 1) + 8 * (i >> 1), l >> 2), _c, (8, 4, 4))
  if k == 8:  # tf32: a0..a3: rows g, g+8, g, g+8; cols t, t, t+4, t+4
    return _layout(lambda l, i: ((l >> 2) + 8 * (i & 1), (l % 4) + 4 * (i >> 1)), lambda l, i: ((l % 4) + 4 * i, l >> 2), _c, (4, 2, 4))
  if k == 32:  # fp8: a0..a15: rows g (a0-3, a8-11), g+8 (a4-7, a12-15); cols 4t + (i & 3), + 16 from a8
    return _layout(lambda l, i: ((l >> 2) + 8 * ((i >> 2) & 1), (l % 4) * 4 + (i & 3) + 16 * (i >> 3)),
                   lambda l, i: ((l % 4) * 4 + (i & 3) + 16 * (i >> 2), l >> 2), _c, (16, 8, 4))
  raise KcError(f"no documented mma.sync layout for {tc}: kc-cuda declares m16n8k8, m16n8k16 and m16n8k32 only")
