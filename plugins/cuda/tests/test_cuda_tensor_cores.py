"""CUDA's tensor cores: kc's fragment layout of each declared TensorCore is the one the PTX ISA documents for its
mma.sync instruction (up to renumbering M, N, K), each arch declares exactly the instructions it has, and the
helpers the renderer writes compile to cubin."""
import pytest
from kc.backend import FragmentLayout, TensorCore, dtypes, layout_mismatch
from kc_cuda.tensor_cores import all_mmas, documented_layout, fp8_dtypes, mmas_for
from kc_cuda.renderer import CUDARenderer


@pytest.mark.parametrize("mma", all_mmas(), ids=lambda m: str(m.tc))
def test_layout_is_the_documented_one(mma):
  assert layout_mismatch(mma.tc, documented_layout(mma.tc)) is None


def test_a_wrong_layout_is_caught():
  # the m16n8k16 description with B's lane bits for N in the wrong order: the check must name the operand
  good = all_mmas()[0].tc
  swapped = TensorCore(dims=good.dims, dtype_in=good.dtype_in, dtype_out=good.dtype_out, threads=good.threads, reduce_axes=good.reduce_axes,
                       expanded_shape=good.expanded_shape, st1_pattern=good.st1_pattern,
                       st2_pattern=(((1, 1), (1, 2), (1, 4), (0, 0), (0, 1)), good.st2_pattern[1]), upcast_axes=good.upcast_axes)
  assert "of B" in layout_mismatch(swapped, documented_layout(good))
  # slots in another register order are wrong too: the renderer packs registers in slot order
  doc = documented_layout(good)
  reordered = FragmentLayout(a=tuple(lane[::-1] for lane in doc.a), b=doc.b, c=doc.c)
  assert layout_mismatch(good, reordered) is not None


def test_registers_match_fragment_sizes():
  for m in all_mmas():
    sizes = [1, 1, 1]
    for i in range(3):
      for _, amt in m.tc.upcast_axes[i]: sizes[i] *= amt
    # each lane's fragment is exactly the instruction's registers, 32 bits each
    assert sizes[0] * (4 if m.tf32_inputs else m.tc.dtype_in.itemsize) == 4 * m.a_regs
    assert sizes[1] * (4 if m.tf32_inputs else m.tc.dtype_in.itemsize) == 4 * m.b_regs
    assert sizes[2] * m.tc.dtype_out.itemsize == 4 * m.c_regs


def test_archs_declare_what_they_have():
  pairs = lambda cc: {(m.tc.dtype_in, m.tc.dtype_out) for m in mmas_for(cc)}
  assert pairs(75) == set()
  base = {(dtypes.float16, dtypes.float32), (dtypes.bfloat16, dtypes.float32), (dtypes.float16, dtypes.float16), (dtypes.float32, dtypes.float32)}
  assert pairs(80) == pairs(86) == base
  assert pairs(89) == pairs(90) == base | {(dt, dtypes.float32) for dt in fp8_dtypes()}
  assert [str(t) for t in CUDARenderer("sm_80").tensor_cores] == [str(m.tc) for m in mmas_for(80)]


def test_fp8_is_declared_where_kc_has_it():
  assert len(fp8_dtypes()) == 2, "kc.dtypes has fp8e4m3 and fp8e5m2"
  assert {m.ptx.split(".")[-2] for m in mmas_for(89) if m.tc.dims[2] == 32} == {"e4m3", "e5m2"}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_each_conformance_matmul_uses_its_own_tensor_core(arch):
  # the corpus's tensor-core matmuls widen their inputs to the accumulator's dtype before multiplying (exact products,
  # as the instruction computes them): each must run on the tensor core of its own dtypes, not on tf32's
  from kc.kernel import Kernel
  from kc_conformance.case import CASES, setup_of
  r = CUDARenderer(arch)
  have = {(t.dtype_in, t.dtype_out) for t in r.tensor_cores}
  checked = 0
  for name, case in CASES.items():
    if not name.startswith("tc_matmul_") or case.tensor_core not in have: continue
    k = Kernel(setup_of(name).sink, r)
    assert k.apply_tensor_cores(1, tc_opt=2), name
    assert (k.tensor_core.dtype_in, k.tensor_core.dtype_out) == case.tensor_core, name
    checked += 1
  assert checked == len(have - {(dtypes.float32, dtypes.float32)}) * 3
