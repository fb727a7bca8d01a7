"""The rules kc-metal's runtime follows on a Mac, checked here without one: the compile options (IEEE math on every
macOS, an explicit MSL version, bfloat16 only where MSL has it), pyobjc's ownership of what `new…` methods return, the
alignment a buffer view needs (the rule EMU checks impersonating METAL), Metal's 31 argument slots, synchronize's
order against stand-in command buffers, and the install hint on a Mac without pyobjc. plugins/metal/mac_check.py
checks the same on a Mac."""
import re, sys
from pathlib import Path
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st
import kc
from kc import InvalidASTError, Opt, OptOps, dtypes
from kc import ast as A
from kc.backend import ConfigError, KcError
from kc.emu import MisalignedAccessError
import kc_metal
from kc_metal.family import family_named
from kc_metal.launch import GPUError, LaunchError, PendingWork, argument_alignments, check_alignment
from kc_metal.msl import (BFLOAT_MSL, MSL_OF_MACOS, NEWEST_MSL, CompileSettings, MSLVersion, apply_settings, compile_settings, has_math_mode,
                          msl_for, parse_macos)
from kc_metal.renderer import BUFFER_ARGUMENT_ENTRIES, MetalRenderer
from kc_metal.retained import NEW_SELECTORS, python_name, register_new_selectors, selector_metadata

PACKAGE = Path(kc_metal.__file__).parent


# ----------------------------------------------------------------------------------------------- compile options

class StandInOptions:
  """An MTLCompileOptions of one macOS: the setters it has record what they were called with."""

  def __init__(self, math_mode: bool):
    self.calls: dict[str, object] = {}
    setters = ["setLanguageVersion_", "setFastMathEnabled_"] + (["setMathMode_", "setMathFloatingPointFunctions_"] if math_mode else [])
    for name in setters: setattr(self, name, lambda value, name=name: self.calls.__setitem__(name, value))


@pytest.mark.parametrize("macos", ["15.0", "15.6.1", "26.0", "26.1"])
def test_macos_15_and_later_get_safe_math_and_precise_functions(macos):
  options = StandInOptions(math_mode=True)
  assert has_math_mode(options)
  settings = compile_settings(msl_for(parse_macos(macos)), has_math_mode(options))
  apply_settings(settings, options)
  # mathMode safe alone leaves mathFloatingPointFunctions at its default, fast: sin and exp2 would be the fast ones
  assert options.calls == {"setLanguageVersion_": settings.language.mtl_value, "setMathMode_": 0, "setMathFloatingPointFunctions_": 1}
  assert "precise" in settings.describe()


@pytest.mark.parametrize("macos", ["13.7", "14.0", "14.6.1"])
def test_earlier_macos_turns_fast_math_off(macos):
  options = StandInOptions(math_mode=False)
  assert not has_math_mode(options)
  settings = compile_settings(msl_for(parse_macos(macos)), has_math_mode(options))
  apply_settings(settings, options)
  assert options.calls == {"setLanguageVersion_": settings.language.mtl_value, "setFastMathEnabled_": False}
  assert settings == CompileSettings(settings.language, None, None, False)


@given(major=st.sampled_from([11, 12, 13, 14, 15, 26]), minor=st.integers(0, 9), patch=st.integers(0, 9))
def test_language_version_is_the_newest_the_os_has(major, minor, patch):
  language = msl_for((major, minor, patch))
  assert language == MSL_OF_MACOS[(major,)]
  assert language.mtl_value == language.major * 65536 + language.minor  # MTLLanguageVersion3_1 == 196609
  renderer = MetalRenderer(family_named("apple9"), language)
  # bfloat is MSL 3.1's: macOS 13 declares no bfloat16, so its cases skip as a capability instead of failing to compile
  assert renderer.supports_dtype(dtypes.bfloat16) == (major >= 14) == (language >= BFLOAT_MSL)
  assert any(tc.dtype_in == dtypes.bfloat16 for tc in renderer.tensor_cores) == (major >= 14)


def test_language_versions_known_and_refused():
  assert MSLVersion(3, 1).mtl_value == 196609 and str(MSLVersion(3, 1)) == "3.1"
  assert msl_for((10, 15, 7)) == MSLVersion(2, 2) and msl_for((27, 0)) == NEWEST_MSL == MSLVersion(4, 0)
  assert msl_for((15, 1), metal3=False) == MSLVersion(2, 4)  # MSL 3 is Metal 3's: an older GPU compiles 2.4
  assert not MetalRenderer(family_named("apple7"), MSLVersion(2, 2)).tensor_cores  # simdgroup matrices are MSL 2.3's
  with pytest.raises(ConfigError, match="10.12"): msl_for((10, 12))
  with pytest.raises(ConfigError, match="dotted numbers"): parse_macos("")
  assert MetalRenderer().language == NEWEST_MSL  # without a device: the newest kc knows


def test_macos_13_skips_bfloat16_cases_as_a_capability():
  from kc_conformance.capabilities import capability_set, declared
  have = capability_set(declared(MetalRenderer(family_named("apple8"), msl_for((13, 6)))))
  assert "dtype:bfloat16" not in have and "dtype:float16" in have


# ----------------------------------------------------------------------------------------------- ownership (pyobjc)

def test_every_new_method_kc_calls_is_registered_as_owned():
  called = set()
  for path in PACKAGE.glob("*.py"): called |= set(re.findall(r"\.(new\w+_)\(", path.read_text()))
  assert called and called <= {python_name(s) for s in NEW_SELECTORS}, called - {python_name(s) for s in NEW_SELECTORS}


@pytest.mark.parametrize("selector", sorted(NEW_SELECTORS))
def test_new_selector_metadata_owns_the_result_and_keeps_the_arguments(selector):
  meta = selector_metadata(selector)
  assert meta["retval"] == {"type": b"@", "already_retained": True}
  parts = selector.decode().split(":")[:-1]
  assert sorted(meta.get("arguments", {})) == list(range(2, 2 + len(parts)))  # 0 and 1 are self and _cmd
  for i, part in enumerate(parts, start=2):  # a registration replaces pyobjc's: the error out-parameter must stay
    assert (meta["arguments"][i] == {"type": b"^@", "type_modifier": b"o"}) == part.endswith("error")


def test_registration_brackets_the_update():
  log = []

  class StandInObjC:
    def _updatingMetadata(self, flag): log.append(("updating", flag))
    def registerMetaDataForSelector(self, cls, sel, meta): log.append((cls, sel, meta["retval"]["already_retained"]))
  register_new_selectors(StandInObjC())
  assert log[0] == ("updating", True) and log[-1] == ("updating", False)
  assert {entry[1] for entry in log[1:-1]} == set(NEW_SELECTORS) and all(entry[0] == b"NSObject" and entry[2] for entry in log[1:-1])


# ----------------------------------------------------------------------------------------------- view alignment

def _doubled(n: int, dt, upcast: int):
  sink = A.sink(A.store(0, A.arg(1, dt, (n,)) * 2))
  return sink, [Opt(OptOps.UPCAST, 0, upcast)] if upcast > 1 else []


def _metal_source(sink, opts) -> kc.Program:
  k = kc.Kernel(sink, MetalRenderer())
  for o in opts: k.apply_opt(o)
  return k.to_program()


@pytest.mark.parametrize("dt,upcast,need", [(dtypes.int8, 1, 1), (dtypes.uint8, 1, 1), (dtypes.float16, 1, 2), (dtypes.bfloat16, 1, 2),
                                            (dtypes.float32, 1, 4), (dtypes.int64, 1, 8), (dtypes.float16, 4, 8), (dtypes.float32, 4, 16),
                                            (dtypes.float32, 2, 8)])
def test_alignment_is_what_the_kernel_reads(dt, upcast, need):
  prg = _metal_source(*_doubled(64, dt, upcast))
  assert argument_alignments(prg.src, prg.name) == {0: need, 1: need}
  check_alignment(prg.name, {0: need, 1: need}, [0, need])
  if need > 1:
    with pytest.raises(LaunchError, match=f"buffer 1 in {need}-byte values.*byte {need // 2}"):
      check_alignment(prg.name, {0: need, 1: need}, [0, need // 2])


def test_odd_offsets_of_byte_data_are_legal_and_4_bytes_do_not_suffice_for_wide_reads():
  byte = _metal_source(*_doubled(64, dtypes.int8, 1))
  check_alignment(byte.name, argument_alignments(byte.src, byte.name), [0, 3])  # the old `% 4` rule refused this view
  vec = _metal_source(*_doubled(64, dtypes.float32, 4))
  with pytest.raises(LaunchError): check_alignment(vec.name, argument_alignments(vec.src, vec.name), [0, 4])  # float4 at 4


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dt=st.sampled_from([dtypes.int8, dtypes.float16, dtypes.float32, dtypes.int64]), upcast=st.sampled_from([1, 2, 4]),
       offset=st.integers(0, 16))
@example(dt=dtypes.int8, upcast=1, offset=1)  # legal: the old rule refused it
@example(dt=dtypes.float32, upcast=4, offset=4)  # a float4 four bytes in: the old rule let it through
@example(dt=dtypes.int64, upcast=1, offset=4)  # a long four bytes in: the same
def test_metal_refuses_a_view_exactly_where_emu_as_metal_faults(emu_metal, dt, upcast, offset):
  n = 16
  sink, opts = _doubled(n, dt, upcast)
  k = kc.compile(sink, device="EMU", opts=opts or "none")
  prg = _metal_source(sink, opts)
  assert [u.op for u in k.program.uops] == [u.op for u in prg.uops]  # EMU runs the very UOps Metal renders
  base = kc.Buffer("EMU", n * dt.itemsize + 32, dtypes.uint8).allocate()
  base.copyin(np.arange(base.size, dtype=np.uint8))
  view = base.view(n, dt, offset=offset)
  out = kc.Buffer("EMU", n, dt).allocate()
  try: check_alignment(prg.name, argument_alignments(prg.src, prg.name), [0, offset])
  except LaunchError: metal_refuses = True
  else: metal_refuses = False
  try: k._handle(out, view, global_size=k.program.global_size, local_size=k.program.local_size, wait=True)
  except MisalignedAccessError: emu_faults = True
  else: emu_faults = False
  assert metal_refuses == emu_faults, (dt, upcast, offset)
  if not emu_faults:
    want = (np.frombuffer(bytes(range(offset, offset + n * dt.itemsize)), dtype=dt.np) * 2).astype(dt.np)
    np.testing.assert_array_equal(out.numpy(), want)


# ----------------------------------------------------------------------------------------------- argument limit

def _sum_of(inputs: int):
  """out = the sum of `inputs` inputs: a kernel of inputs + 1 buffers."""
  x = A.arg(1, dtypes.float32, (8,))
  for i in range(2, inputs + 1): x = x + A.arg(i, dtypes.float32, (8,))
  return A.sink(A.store(0, x))


def test_metal_declares_its_31_argument_slots():
  assert MetalRenderer().max_kernel_args == BUFFER_ARGUMENT_ENTRIES == 31
  prg = _metal_source(_sum_of(30), [])  # the output and 30 inputs: every slot, [[buffer(30)]] the last
  assert "[[buffer(30)]]" in prg.src and "[[buffer(31)]]" not in prg.src


@pytest.mark.parametrize("inputs", [31, 32, 40])
def test_the_kernel_refuses_more_buffers_than_metal_takes(inputs):
  with pytest.raises(InvalidASTError, match=f"takes {inputs + 1} arguments.*more than the 31"): kc.Kernel(_sum_of(inputs), MetalRenderer())


def test_variables_the_kernel_reads_take_slots_too():
  n = kc.Variable("n", 1, 64)
  def sink(inputs: int):  # a reduce to n: the loop reads n, so n is an argument
    x = A.arg(1, dtypes.float32, (n,)).sum(0)
    for i in range(2, inputs + 1): x = x + A.arg(i, dtypes.float32, (n,)).sum(0)
    return A.sink(A.store(0, x))
  prg = _metal_source(sink(29), [])
  assert (len(prg.globals), len(prg.vars)) == (30, 1) and "[[buffer(30)]]" in prg.src
  kc.Kernel(sink(30), MetalRenderer())  # 31 buffers: the Kernel takes them, and refuses the program n makes 32 arguments
  with pytest.raises(InvalidASTError, match=r"takes 32 arguments \(31 buffers and 1 Variables\)"): _metal_source(sink(30), [])
  e = A.sink(A.store(0, A.arg(1, dtypes.float32, (n,)) * 2))  # n only sizes the launch: no argument
  assert not _metal_source(e, []).vars


def test_emu_as_metal_refuses_and_plain_emu_runs_it(emu_metal):
  sink = _sum_of(31)
  with pytest.raises(InvalidASTError, match="31"): kc.compile(sink, device="EMU")
  emu_metal.impersonate(None)
  args = [np.full(8, i, np.float32) for i in range(1, 32)]
  out = np.zeros(8, np.float32)
  kc.compile(sink, device="EMU")(out, *args)  # EMU's own renderer declares no limit
  np.testing.assert_array_equal(out, np.full(8, sum(range(1, 32)), np.float32))


# ----------------------------------------------------------------------------------------------- synchronize

class StandInError:
  def __init__(self, text: str): self.text = text
  def localizedDescription(self): return self.text


class StandInCommandBuffer:
  """A committed MTLCommandBuffer: waiting records it in `log`; error() is its failure, None when it ran."""

  def __init__(self, log: list, label: str, error=None): self.log, self.label, self._error = log, label, error
  def waitUntilCompleted(self): self.log.append(self.label)
  def error(self): return None if self._error is None else StandInError(self._error)


def test_synchronize_waits_for_every_buffer_then_raises_the_first_failure():
  log: list = []
  work = PendingWork()
  for label, error in (("a", None), ("b", "Caused GPU Address Fault Error"), ("c", None), ("d", "Execution timed out")):
    work.add(f"kernel_{label}", StandInCommandBuffer(log, label, error))
  with pytest.raises(GPUError, match="kernel kernel_b failed on the GPU: Caused GPU Address Fault.*1 more.*kernel_d") as e:
    work.synchronize()
  assert log == ["a", "b", "c", "d"]  # all four waited on before the raise: none still writes what a copy reads next
  assert isinstance(e.value, KcError)
  work.synchronize()  # reported once


def test_a_free_waits_without_raising_and_the_next_synchronize_reports():
  log: list = []
  work = PendingWork()
  work.add("broken", StandInCommandBuffer(log, "x", "Invalid Resource"))
  work.wait()  # what a free does: the buffer may be in use, the error is not the free's
  assert log == ["x"]
  work.add("fine", StandInCommandBuffer(log, "y"))
  with pytest.raises(GPUError, match="kernel broken"): work.synchronize()
  assert log == ["x", "y"]


def test_the_runtime_frees_with_wait_and_copies_with_synchronize():
  # the device's own code (pyobjc is needed to run it): frees wait, copies and waits raise
  src = (PACKAGE / "runtime.py").read_text()
  free = src[src.index("def _free"):src.index("def _contents")]
  assert "self.device.pending.wait()" in free and "self.device.synchronize()" not in free
  assert "self.device.synchronize()" in src[src.index("def _contents"):src.index("def copyin")]


# ----------------------------------------------------------------------------------------------- install hint

def test_a_mac_without_the_runtime_extra_is_told_to_install_it(monkeypatch):
  monkeypatch.setattr(sys, "platform", "darwin")
  monkeypatch.setitem(sys.modules, "Metal", None)  # import Metal fails as it does without pyobjc-framework-Metal
  monkeypatch.delitem(sys.modules, "kc_metal.runtime", raising=False)
  monkeypatch.delitem(sys.modules, "kc_metal.compiler", raising=False)
  reason = kc_metal.unavailable_reason()
  assert "kc-metal[runtime]" in reason and "'Metal'" in reason
