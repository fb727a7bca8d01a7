"""SHUFFLE: lanes of one vector, or of two vectors' concatenation, in any order (repeats too). Its typing rules, and
every backend that gets one (the renderers that compute on vectors: CLANG, LLVM; EMU interpreting it) gives numpy's
take of the concatenation."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
from kc import Buffer, dtypes
from kc.errors import UOpError
from kc.codegen.linearize import linearize
from kc.ir.uop import Ops, UOp, shuffle_lanes

F32 = dtypes.float32


def _vector_load(buf: UOp, offset: int, width: int) -> UOp:
  return UOp(Ops.LOAD, F32.vec(width), (UOp(Ops.INDEX, buf.dtype, (buf, UOp.const(dtypes.int32, offset))),))


def shuffle_kernel(width: int, sources: int, lanes: tuple[int, ...], through_alu: bool) -> list[UOp]:
  """out[0:len(lanes)] = SHUFFLE of the vectors in[0:width] (and in[width:2*width]); `through_alu`: the vectors are
  computed (x + x), each read only by the SHUFFLE."""
  out, inp = UOp(Ops.DEFINE_GLOBAL, F32.ptr(), (), 0), UOp(Ops.DEFINE_GLOBAL, F32.ptr(), (), 1)
  vectors = [_vector_load(inp, i * width, width) for i in range(sources)]
  values = [v + v for v in vectors] if through_alu else vectors
  shuffle = UOp(Ops.SHUFFLE, F32.vec(len(lanes)), tuple(values), lanes)
  store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, UOp.const(dtypes.int32, 0))), shuffle))
  return linearize(UOp(Ops.SINK, dtypes.void, (store,)))


def run_uops(device: str, uops: list[UOp], x: np.ndarray, n_out: int) -> np.ndarray:
  dev = kc.Device[device]
  src = dev.renderer.render("shuffled", uops)
  prg = dev.runtime("shuffled", dev.compiler.compile(src))
  out, inp = Buffer(device, n_out, F32).allocate(), Buffer(device, x.size, F32).copyin(x)
  prg(out, inp)
  return out.numpy()


DEVICES = [d for d in ("CLANG", "LLVM", "EMU") if kc.Device.unavailable_reason(d) is None]


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=20, deadline=None)
@given(st.sampled_from([2, 4, 8, 16]), st.sampled_from([1, 2]), st.sampled_from([2, 4, 8, 16]), st.booleans(), st.data())
def test_a_shuffle_takes_numpys_lanes_of_the_concatenation(device, width, sources, k, through_alu, data):
  lanes = tuple(data.draw(st.lists(st.integers(0, width * sources - 1), min_size=k, max_size=k), label="lanes"))
  x = np.arange(1, 2 * width + 1, dtype=np.float32) * 1.5
  want = (x[:width * sources] * (2 if through_alu else 1))[list(lanes)]
  got = run_uops(device, shuffle_kernel(width, sources, lanes, through_alu), x, k)
  np.testing.assert_array_equal(got, want)


def test_a_computed_source_read_for_several_lanes_is_computed_once_in_c():
  if "CLANG" not in DEVICES: pytest.skip("CLANG is unavailable")
  src = kc.Device["CLANG"].renderer.render("shuffled", shuffle_kernel(4, 1, (0, 2), through_alu=True))
  assert src.count("val0+val0") == 1  # held in a variable, not written into each lane


def test_shuffle_lanes_name_each_lanes_vector_and_place():
  a, b = (UOp(Ops.DEFINE_ACC, F32.vec(4), (UOp.const(F32.vec(4), 0.0),), (i,)) for i in range(2))
  s = UOp(Ops.SHUFFLE, F32.vec(4), (a, b), (0, 5, 7, 2))
  assert shuffle_lanes(s) == [(a, 0), (b, 1), (b, 3), (a, 2)]


@pytest.mark.parametrize("why", ["no source", "three sources", "a scalar source", "sources of two dtypes", "one lane",
                                 "a lane past the end", "a negative lane", "a lane that is no int", "the wrong dtype", "a list arg"])
def test_a_malformed_shuffle_is_a_uop_error(why):
  v4, v8 = (UOp(Ops.DEFINE_ACC, F32.vec(n), (UOp.const(F32.vec(n), 0.0),), (n,)) for n in (4, 8))
  srcs, arg, dt = (v4, v4), (0, 7), F32.vec(2)
  if why == "no source": srcs = ()
  elif why == "three sources": srcs = (v4, v4, v4)
  elif why == "a scalar source": srcs = (UOp.const(F32, 1.0),)
  elif why == "sources of two dtypes": srcs = (v4, v8)
  elif why == "one lane": arg, dt = (1,), F32
  elif why == "a lane past the end": arg = (0, 8)
  elif why == "a negative lane": arg = (-1, 0)
  elif why == "a lane that is no int": arg = (0, 1.0)
  elif why == "the wrong dtype": dt = F32.vec(4)
  else: arg = [0, 1]
  with pytest.raises(UOpError):
    UOp(Ops.SHUFFLE, dt, srcs, arg)


def test_a_renderers_remembered_lanes_are_render_lanes_and_stay_bounded():
  # the C-style renderers remember each vector name's lane spellings (CStyleLanguage._lanes_of): the same strings as
  # render_lane gives, in CLANG's, OpenCL's and CUDA's spellings, and a bounded memo however many names come by
  from kc.renderer.cstyle import CStyleLanguage
  for r in (kc.Device.renderer("CLANG"), CStyleLanguage()):
    for dt in (dtypes.float32.vec(4), dtypes.float32.vec(16), dtypes.bool.vec(8)):
      assert r._lanes_of("alu3", dt) == tuple(r.render_lane("alu3", dt, i) for i in range(dt.count))
    for i in range(5000): r._lanes_of(f"alu{i}", dtypes.float32.vec(2))
    assert len(r.__dict__["_lane_spellings"].names) <= 4096
  # and no setting of the renderer: the Program cache's key of a renderer is the same before and after it rendered
  from kc.runtime.program_cache import renderer_text
  r = type(kc.Device.renderer("CLANG"))()
  before = renderer_text(r)
  r._lanes_of("acc0", dtypes.float32.vec(16))
  assert renderer_text(r) == before
