"""kc.renderer.batch: C-family sources renamed apart for one compiler run."""
import re
import pytest
from kc.backend import batch_member, batch_source
from kc.errors import CompileError

OPENCL = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
          "__attribute__((noinline)) static float h(float x) { return x; }\n"
          "__kernel void E_4(__global double* d) {\n  d[0] = h(1.0f);\n}\n")


def test_every_file_scope_name_is_renamed_and_only_global_ones_exported():
  m = batch_member(2, OPENCL, hoist=("#pragma OPENCL EXTENSION",))
  assert m.hoisted == ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable",) and "#pragma" not in m.text
  assert m.exported == {"E_4": "kcb2_E_4"}
  assert m.text.startswith("#define h kcb2_h\n#define E_4 kcb2_E_4\n") and m.text.rstrip().endswith("#undef h\n#undef E_4")


def test_a_batch_writes_each_hoisted_line_once_before_the_members():
  ms = [batch_member(i, OPENCL, hoist=("#pragma OPENCL EXTENSION",)) for i in range(3)]
  text = batch_source(ms)
  assert text.count("#pragma OPENCL EXTENSION cl_khr_fp64") == 1 and text.index("#pragma") < text.index("#define")
  assert re.findall(r"#define E_4 (\w+)", text) == ["kcb0_E_4", "kcb1_E_4", "kcb2_E_4"]


@pytest.mark.parametrize("src, hoist", [(OPENCL, ("#include",)),  # a pragma the backend does not let the batch hoist
                                        ("#define X 1\nvoid k(float* d) { d[0] = X; }\n", ("#include",)),
                                        ("static inline float h(float x) { return x; }\n", ("#include",))])
def test_a_source_a_batch_cannot_hold_is_a_compile_error(src, hoist):
  with pytest.raises(CompileError): batch_member(0, src, hoist=hoist)
