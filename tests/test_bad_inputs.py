"""The catalogue of bad inputs: every one ends in its own kc.KcError subclass with a message that names the problem
(never a crash, a bare Python exception or a silent wrong answer). One row per input: what is done, the exact error
class, and a pattern the message must match."""
from __future__ import annotations
import numpy as np
import pytest
import kc
from kc import ast as A, dtypes, Variable
from kc.errors import (ArgumentError, CompileError, ConfigError, DTypeError, InvalidASTError, InvalidOptError, KcError,
                       KernelOptError, OptsError, PluginError, ShapeError, SymbolicError, UnknownDeviceError)
from kc.runtime.device import InvalidBufferError
from kc.kernel import Kernel, Opt, OptOps
from kc.runtime.plugins import PLUGIN_API_VERSION, PluginTable, validate_spec
from kc.emu import open_device as open_emulator  # what kc.Device['EMU'] opens (once per process)

f32, i32, u8 = dtypes.float32, dtypes.int32, dtypes.uint8
pytestmark = pytest.mark.usefixtures("cache_dir")


def X(*shape, i=1, dt=f32): return A.arg(i, dt, shape)
def copy_kernel(device="CLANG", opts="hand"): return kc.compile(A.sink(A.store(0, X(4, 4) * 2.0)), device=device, opts=opts)
def rows(): return np.zeros((4, 4), np.float32)


AST = [
  ("negative buffer index", lambda: A.arg(-1, f32, (4,)), InvalidASTError, "buffer index is a non-negative int, got -1"),
  ("dtype given as a string", lambda: A.arg(0, "float", (4,)), InvalidASTError, "unknown dtype 'float'"),
  ("negative dim", lambda: A.arg(0, f32, (4, -1)), InvalidASTError, r"non-negative ints or Variables, got \(4, -1\)"),
  ("shape of strings", lambda: A.arg(0, f32, "ab"), InvalidASTError, "a shape is a tuple"),
  ("shapes that do not broadcast", lambda: X(4, 4) + X(3, i=2), InvalidASTError, r"\(4, 4\), \(3,\) do not broadcast"),
  ("reduce axis out of range", lambda: X(4, 4).sum(5), InvalidASTError, r"reduce axis 5 out of range for 2 dims"),
  ("repeated reduce axis", lambda: X(4, 4).sum((0, 0)), InvalidASTError, r"repeated .*axis"),
  ("reshape that changes the size", lambda: X(4, 4).reshape(5, 3), ShapeError, r"cannot reshape \(4, 4\) \(16 elements\) to \(5, 3\)"),
  ("permute that is no permutation", lambda: X(4, 4).permute(0, 0), ShapeError, r"\(0, 0\) is not an order of the 2 axes"),
  ("expand of a dim that is not 1", lambda: X(4, 4).expand(3, 4), ShapeError, r"\(4, 4\) does not broadcast to \(3, 4\)"),
  ("shrink out of bounds", lambda: X(4, 4).shrink(((0, 5), (0, 4))), ShapeError, "out of bounds for shape"),
  ("negative pad", lambda: X(4, 4).pad(((-1, 0), (0, 0))), ShapeError, "negative amount"),
  ("flip of a missing axis", lambda: X(4, 4).flip(3), ShapeError, "flip axis 3 out of range"),
  ("bitwise and of floats", lambda: X(4) & X(4, i=2), DTypeError, "and needs bool or int operands, got float32"),
  ("where with branches that do not broadcast", lambda: (X(4) > 0).where(X(3, i=2), 0.0), InvalidASTError, "do not broadcast"),
  ("integer ** a negative integer", lambda: X(4, dt=i32) ** -1, InvalidASTError, "negative"),
  ("bitcast between sizes", lambda: X(4).bitcast(dtypes.int16), InvalidASTError, "bitcast needs equal sizes"),
  ("combining with a string", lambda: X(4) + "a", DTypeError, "str 'a'"),  # numpy: a TypeError
  ("int scalar that does not fit uint8", lambda: X(4, dt=u8) + 300, DTypeError, r"300.*uint8"),
  ("an empty sink", lambda: A.sink(), InvalidASTError, r"sink takes one or more A.store"),
  ("a store of a number", lambda: A.store(0, 3), InvalidASTError, "store takes a kc.ast expression, got int"),
  ("two stores to one buffer", lambda: A.sink(A.store(0, X(4)), A.store(0, X(4))), InvalidASTError, r"same buffer index: \[0, 0\]"),
  ("one buffer with two dtypes", lambda: A.sink(A.store(0, X(4) + X(4, dt=i32).cast(f32))),
   InvalidASTError, "buffer 1 is used as float32 and as int32"),
  ("one buffer with two sizes", lambda: A.sink(A.store(0, X(4) + X(8)[:4])), InvalidASTError, "buffer 1 is declared with 4 and with 8 elements"),
  ("a buffer read through another view than it is written", lambda: A.sink(A.store(0, A.arg(0, f32, (4,)).flip(0))), InvalidASTError, "buffer 0"),
  ("Variable with min > max", lambda: Variable("n", 5, 1), SymbolicError, "min 5 > max 1"),
  ("bool() of an expression", lambda: bool(X(4) == 0), InvalidASTError, "truth value"),
]

def _with_opts(opts, shape=(4, 4)): return kc.compile(A.sink(A.store(0, X(*shape) * 2.0)), "CLANG", opts=opts)


def _run_with(inputs: list) -> dict:
  return kc.run(A.sink(A.store(0, X(4))), {i: np.ones(4, f32.np) for i in inputs}, device="CLANG")


OPTS = [
  ("an opts string kc does not know", lambda: kc.compile(A.sink(A.store(0, X(4, 4))), "CLANG", opts="fast"), OptsError,
   "opts must be 'hand', 'none', 'beam'.*got 'fast'"),
  ("an opts of the wrong type", lambda: _with_opts(3), OptsError, "opts must be.*got int 3"),
  ("a list holding a non-Opt", lambda: _with_opts([Opt(OptOps.UPCAST, 0, 2), 7]),
   OptsError, r"opts\[1\] is int 7, not a kc.Opt"),
  ("an op that is not an OptOps", lambda: _with_opts([Opt("UPCAST", 0, 4)]),
   InvalidOptError, "op must be a kc.OptOps .*got 'UPCAST'"),
  ("a negative amount", lambda: _with_opts([Opt(OptOps.UPCAST, 0, -4)]),
   InvalidOptError, "UPCAST's amount must be an int >= 0.*got -4"),
  ("an axis that is not an int", lambda: _with_opts([Opt(OptOps.UPCAST, 0.0, 4)]),
   InvalidOptError, "axis must be an int >= 0, got 0.0"),
  ("an axis past the shape", lambda: _with_opts([Opt(OptOps.UPCAST, 7, 4)]),
   KernelOptError, r"opts\[0\] = Opt\(op=OptOps.UPCAST, axis=7, amt=4\) does not apply: UPCAST axis 7 is out of range: "
   r"this kernel has only axis 0 \(shape \(16,\)\)"),
  ("an amount that does not divide", lambda: kc.compile(A.sink(A.store(0, X(4, 5) * 2.0)), "CLANG", opts=[Opt(OptOps.UPCAST, 0, 3)]),
   KernelOptError, "3 does not divide 20"),
  ("LOCAL on a device without locals", lambda: kc.compile(A.sink(A.store(0, X(4, 4) * 2.0)), "CLANG", opts=[Opt(OptOps.LOCAL, 0, 2)]),
   KernelOptError, "does not support local"),
  ("not an Opt", lambda: Kernel(A.sink(A.store(0, X(4))), kc.Device["CLANG"].renderer).apply_opt(("UPCAST", 0, 4)),
   InvalidOptError, r"not an Opt: \('UPCAST', 0, 4\) \(tuple\)"),
  ("an upcast of a reduce axis", lambda: kc.compile(A.sink(A.store(0, X(4, 8).sum(1))), "CLANG", opts=[Opt(OptOps.UPCAST, 1, 2)]),
   KernelOptError, "upcast is for non-reduce"),
  ("GROUP on a device without shared memory", lambda: kc.compile(A.sink(A.store(0, X(64).sum(0))), "CLANG", opts=[Opt(OptOps.GROUP, 0, 8)]),
   KernelOptError, "local or shared"),
]

CALLS = [
  ("too few buffers", lambda: copy_kernel()(rows()), ArgumentError, "takes 2 buffers"),
  ("a wrong dtype", lambda: copy_kernel()(rows(), np.zeros((4, 4), np.int32)), ArgumentError, "must be float32, got an array of int32"),
  ("a wrong shape", lambda: copy_kernel()(rows(), np.zeros((9, 4), np.float32)), ArgumentError, r"must have shape \(4, 4\).*\(9, 4\)"),
  ("a transposed shape", lambda: kc.compile(A.sink(A.store(0, X(2, 3) * 2.0)), "CLANG")(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32)),
   ArgumentError, r"\(2, 3\).*\(3, 2\)"),
  ("a list instead of an array", lambda: copy_kernel()(rows(), [1.0] * 16), ArgumentError, "numpy array or a kc.Buffer, got list"),
  ("a read-only output", lambda: copy_kernel()(np.zeros((4, 4), np.float32).copy().__array__().view() if False else _readonly(), rows()),
   ArgumentError, "read-only"),
  ("a non-contiguous output", lambda: copy_kernel()(np.zeros((4, 8), np.float32)[:, ::2], rows()), ArgumentError, "not C-contiguous"),
  ("an unknown Variable", lambda: copy_kernel()(rows(), rows(), n=3), SymbolicError, r"no Variables \['n'\]"),
  ("a Variable out of its range", lambda: _symbolic()(np.zeros(9, np.float32), np.zeros(9, np.float32), n=9),
   SymbolicError, r"must be an int in 1..8"),
  ("a Buffer on another device", lambda: copy_kernel()(kc.Buffer("EMU", 16, f32), rows()), ArgumentError, "is on EMU"),
  ("a negative Buffer size", lambda: kc.Buffer("CLANG", -1, f32), InvalidBufferError, "size is an element count >= 0, got -1"),
  ("kc.run without an input", lambda: kc.run(A.sink(A.store(0, X(4, 4))), {}, device="CLANG"), ArgumentError,
   r"needs an input for buffer 1 \(float32, shape \(4, 4\)\): .* reads buffers \[1\], and `inputs` has \[\]"),
  ("kc.run with an input the kernel does not read", lambda: _run_with([1, 2]),
   ArgumentError, "has buffer 2, not a buffer of the kernel"),
  ("kc.run with an input for an output", lambda: _run_with([0, 1]), ArgumentError, "has buffer 0, an output"),
]


def _readonly():
  a = np.zeros((4, 4), np.float32)
  a.flags.writeable = False
  return a


def _symbolic():
  n = Variable("n", 1, 8)
  return kc.compile(A.sink(A.store(0, A.arg(1, f32, (n,)) * 2.0)), device="CLANG")


DEVICES = [
  ("an unknown device", lambda: kc.Device["NOPE"], UnknownDeviceError, "unknown device 'NOPE'.*CLANG"),
  ("compile for an unknown device", lambda: kc.compile(A.sink(A.store(0, X(4))), device="NOPE"), UnknownDeviceError, "NOPE"),
  # a device given as a non-str (an array, as when arguments are passed where the AST goes) is refused by its type,
  # never tested for truth
  ("compile for a device that is an array", lambda: kc.compile(A.sink(A.store(0, X(4))), np.zeros(3)), KcError, "device name is a str"),
  ("beam_opts for a device that is an array", lambda: kc.api.beam_opts(A.sink(A.store(0, X(4))), np.zeros(3)), KcError, "device name is a str"),
  ("C the compiler refuses", lambda: kc.Device["CLANG"].compiler.compile("this is not C"), CompileError, "failed to compile"),
]


@pytest.mark.parametrize("what,fxn,cls,pattern", AST + OPTS + CALLS + DEVICES, ids=[c[0] for c in AST + OPTS + CALLS + DEVICES])
def test_bad_input(what, fxn, cls, pattern):
  with pytest.raises(KcError) as info: fxn()
  assert type(info.value) is cls, f"{what}: {type(info.value).__name__} ({info.value}), expected {cls.__name__}"
  assert info.match(pattern)


ENVIRONMENT = [
  ("KC_DEVICE", "NOPE", lambda: kc.Device.DEFAULT, UnknownDeviceError, "NOPE"),
  ("KC_EMULATE", "NOPE", lambda: open_emulator(), UnknownDeviceError, "impersonate 'NOPE'.*registered"),
  ("DEBUG", "loud", lambda: kc.run(A.sink(A.store(0, X(4))), {1: np.ones(4, np.float32)}, device="CLANG"), ConfigError, "DEBUG='loud'"),
  ("KC_TC", "many", lambda: kc.compile(A.sink(A.store(0, X(4, 4).sum(1))), device="EMU", opts=[Opt(OptOps.TC, 0, 0)]),
   ConfigError, "KC_TC='many'"),
  ("KC_TC_OPT", "x", lambda: Kernel(A.sink(A.store(0, X(4, 4).sum(1))), kc.Device["EMU"].renderer).apply_tensor_cores(),
   ConfigError, "KC_TC_OPT='x'"),
  ("KC_CACHE_MAX_MB", "lots", lambda: kc.Device["CLANG"].compiler.compile("int kc_bad_input_probe(void) { return 1; }"),
   ConfigError, "KC_CACHE_MAX_MB"),
  ("KC_CLANG_THREADS", "0", lambda: kc.compile(A.sink(A.store(0, X(1024, 1024) * 2.0)), device="CLANG"), ConfigError, "KC_CLANG_THREADS"),
]


@pytest.mark.parametrize("var,value,fxn,cls,pattern", ENVIRONMENT, ids=[f"{v}={x}" for v, x, *_ in ENVIRONMENT])
def test_bad_environment(monkeypatch, var, value, fxn, cls, pattern):
  monkeypatch.setenv(var, value)
  with pytest.raises(KcError) as info: fxn()
  assert type(info.value) is cls, f"{var}={value}: {type(info.value).__name__} ({info.value}), expected {cls.__name__}"
  assert info.match(pattern)


def test_an_unusable_cache_dir_warns_and_still_compiles(tmp_path, monkeypatch):
  not_a_dir = tmp_path / "file"
  not_a_dir.write_text("")
  monkeypatch.setenv("KC_CACHE_DIR", str(not_a_dir))
  with pytest.warns(Warning, match=str(not_a_dir)):
    out = kc.run(A.sink(A.store(0, X(4) * 2.0)), {1: np.ones(4, np.float32)}, device="CLANG")[0]
  assert np.array_equal(out, np.full(4, 2, np.float32))


class _EntryPoint:
  def __init__(self, name, load): self.name, self.group, self.value, self._load, self.dist = name, "kc.backends", f"kc_{name}", load, None
  def load(self): return self._load()


def test_a_plugin_that_fails_to_import_is_a_plugin_error_when_strict(monkeypatch):
  monkeypatch.setenv("KC_STRICT_PLUGINS", "1")
  def broken(): raise ImportError("No module named 'pyfoo'")
  table = PluginTable(lambda: [_EntryPoint("foo", broken)])
  with pytest.raises(PluginError) as info: table.specs()
  assert type(info.value) is PluginError and info.match("pyfoo")


def test_a_plugin_spec_that_is_not_a_backend_spec_is_a_plugin_error():
  with pytest.raises(PluginError) as info: validate_spec("CUDA", "kc-cuda 1.0")
  assert type(info.value) is PluginError and info.match("kc-cuda 1.0")
  assert PLUGIN_API_VERSION >= 0


def test_the_catalogue_is_at_least_forty_inputs():
  assert len(AST + OPTS + CALLS + DEVICES + ENVIRONMENT) + 3 >= 40


def test_run_refuses_inputs_that_are_not_a_dict():
  sink = A.sink(A.store(0, A.arg(1, dtypes.float32, (4,)) + 1.0))
  with pytest.raises(ArgumentError, match="dict"): kc.run(sink, [np.zeros(4, np.float32)], device="EMU")
