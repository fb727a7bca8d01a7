"""Dialect facts a Renderer declares and the core reads: vector widths; the shared C-style pieces (bfloat16 kept as
its bits and computed in float) and their documentation."""
import ast, inspect, textwrap
import pytest
import kc
from kc import Ops, dtypes, ast as A, Kernel, Opt, OptOps, KcError
from kc.renderer.cstyle import CStyleLanguage


class VecC(CStyleLanguage):
  """A C-like dialect whose vector widths a test sets per dtype."""
  device = "VECC"
  kernel_prefix, buffer_prefix = "__kernel ", "__global "
  code_for_workitem = {"g": lambda d: f"get_group_id({d})", "l": lambda d: f"get_local_id({d})", "i": lambda d: f"get_global_id({d})"}
  float4 = "(float4)"

  def __init__(self, widths: dict):
    self.widths = widths

  def vector_widths(self, dt):
    return self.widths.get(dt, ())


def _copy_program(renderer, dt=dtypes.float32, upcast=8):
  k = Kernel(A.sink(A.store(0, A.arg(1, dt, (128,)) + A.const(1, dt, (128,)))), renderer)
  k.apply_opt(Opt(OptOps.UPCAST, 0, upcast))
  return k.to_program()


def _vector_loads(prg) -> list[int]:
  return [u.dtype.count for u in prg.uops if u.op is Ops.LOAD and u.dtype.count > 1]


def test_default_widths_are_float4_and_float2():
  class Plain(CStyleLanguage): device = "PLAIN"
  r = Plain()
  assert r.vector_widths(dtypes.float32) == (4, 2) and r.vector_widths(dtypes.float16) == (4, 2)
  assert r.vector_widths(dtypes.int32) == () and r.vector_widths(dtypes.float64) == ()

  class NoVectors(Plain): supports_float4 = False
  assert NoVectors().vector_widths(dtypes.float32) == ()


def test_builtin_renderers_keep_their_widths():
  r = kc.Device.renderer("OPENCL")
  assert r.vector_widths(dtypes.float32) == (4, 2) and r.vector_widths(dtypes.float16) == (4, 2)
  assert r.vector_widths(dtypes.int32) == ()
  # CLANG declares the host's registers (16 floats with AVX-512, 8 with AVX2), always down to float4 and float2
  w = kc.Device.renderer("CLANG").vector_widths(dtypes.float32)
  assert w[-2:] == (4, 2) and list(w) == sorted(w, reverse=True) and all(x & (x - 1) == 0 for x in w) and w[0] <= 16
  assert kc.Device.renderer("CLANG").vector_widths(dtypes.int32) == ()


def test_wider_vectors_fold_eight_loads_into_one():
  prg = _copy_program(VecC({dtypes.float32: (8, 4, 2)}))
  assert _vector_loads(prg) == [8]
  assert "float8" in prg.src


def test_default_width_splits_an_upcast_of_eight_into_two_float4():
  assert _vector_loads(_copy_program(VecC({dtypes.float32: (4, 2)}))) == [4, 4]


def test_no_widths_keeps_accesses_scalar():
  prg = _copy_program(VecC({}))
  assert _vector_loads(prg) == [] and "float4" not in prg.src


def test_widths_for_other_dtypes():
  prg = _copy_program(VecC({dtypes.int32: (4,)}), dt=dtypes.int32, upcast=4)
  assert _vector_loads(prg) == [4] and "int4" in prg.src


@pytest.mark.parametrize("bad", [(2, 4), (4, 1), (4, 4), ("4",)])
def test_bad_widths_are_a_typed_error(bad):
  with pytest.raises(KcError, match="vector_widths"): _copy_program(VecC({dtypes.float32: bad}))


def test_bfloat16_as_bits_is_shared_by_the_c_dialects():
  for name in ("CLANG", "OPENCL"):
    r = kc.Device.renderer(name)
    assert r.bfloat16_as_bits and r.extra_matcher is CStyleLanguage.bfloat16_in_float
    assert r.render_dtype(dtypes.bfloat16) == r.render_dtype(dtypes.uint16)
    assert r.render_dtype(dtypes.bfloat16.vec(4)) == r.render_dtype(dtypes.uint16.vec(4))


def test_bfloat16_kernel_computes_in_float():
  x = A.arg(1, dtypes.bfloat16, (16,))
  sink = A.sink(A.store(0, (x * x < x).where(x + 1, x).cast(dtypes.float32)))
  for name in ("CLANG", "OPENCL"):
    prg = Kernel(sink, kc.Device.renderer(name)).to_program()
    bf16_alu = [u for u in prg.uops if u.op in (Ops.ADD, Ops.MUL, Ops.CMPLT) and dtypes.bfloat16 in (u.dtype.scalar(), u.src[0].dtype.scalar())]
    assert bf16_alu == []  # every op on bfloat16 values ran in float
    assert "__kc_bf2f(" in prg.src and "__kc_f2bf(" in prg.src and "__bf16" not in prg.src


def test_a_dialect_without_bfloat16_bits_keeps_the_c_type():
  class Plain(CStyleLanguage): device = "PLAIN"
  r = Plain()
  assert r.render_dtype(dtypes.bfloat16) == "__bf16" and r.render_cast(dtypes.bfloat16, "x") == "(__bf16)(x)"


def test_every_override_point_is_documented():
  # an attribute's docstring is the string statement right after its assignment in the class body
  cls = next(n for n in ast.parse(textwrap.dedent(inspect.getsource(CStyleLanguage))).body if isinstance(n, ast.ClassDef))
  undocumented = []
  for stmt, after in zip(cls.body, cls.body[1:] + [None]):
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
      target = stmt.target if isinstance(stmt, ast.AnnAssign) else stmt.targets[0]
      if not (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
        undocumented.append(target.id)
    elif isinstance(stmt, ast.FunctionDef) and not stmt.name.startswith("_") and ast.get_docstring(stmt) is None:
      undocumented.append(stmt.name)
  assert undocumented == []
