"""Bad opts and bad kc.run inputs raise the specific kc.KcError subclass, with a message that names the bad value and
what would be valid: OptsError for an opts value, InvalidOptError (an OptsError and a KernelOptError) for an Opt no
kernel can take, KernelOptError naming the op, the axis and the valid range for an axis past this kernel's shape,
ArgumentError for kc.run's inputs."""
import inspect
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import kc
import kc.errors
from kc import ast as A, dtypes
from kc.errors import ArgumentError, ConfigError, InvalidOptError, KcError, KernelOptError, OptsError
from kc.kernel import Kernel, Opt, OptOps

F = lambda i, *s: A.arg(i, dtypes.float32, s)  # noqa: E731


def test_every_error_is_a_kc_error_and_the_public_names_stay():
  classes = [c for _, c in inspect.getmembers(kc.errors, inspect.isclass) if c.__module__ == "kc.errors"]
  assert all(issubclass(c, KcError) for c in classes), [c for c in classes if not issubclass(c, KcError)]
  for name in ("KcError", "KernelOptError", "InvalidASTError", "CompileError", "DeviceUnavailable", "PluginError",
               "ArgumentError", "ConfigError"):
    assert getattr(kc, name) is getattr(kc.errors, name)
  assert issubclass(OptsError, ValueError) and issubclass(InvalidOptError, OptsError)
  assert issubclass(InvalidOptError, KernelOptError)  # apply_opt's callers catch KernelOptError for every refusal


# ---------------------------------------------------------------------------------------------------------- opts values

@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(max_size=8), st.integers(), st.floats(allow_nan=False),
                 st.dictionaries(st.integers(), st.integers(), max_size=2)))
def test_an_opts_value_that_is_no_choice_is_an_opts_error_naming_it(value):
  if value in ("hand", "none", "beam"): return
  k = Kernel(A.sink(A.store(0, F(1, 8) * 2.0)), kc.Device["EMU"].renderer)
  with pytest.raises(OptsError) as info: kc.api.optimize(k, value)
  assert type(info.value) is OptsError and repr(value) in str(info.value), str(info.value)
  assert "'hand', 'none', 'beam'" in str(info.value)


OP_VALUES = st.one_of(st.sampled_from(list(OptOps)), st.sampled_from(["UPCAST", "upcast", None, 1, 2.0]))
FIELD_VALUES = st.one_of(st.none(), st.integers(-3, 6), st.booleans(), st.sampled_from([0.0, 2.0, "1", (1,)]))


def _field_ok(op, value) -> bool:
  if value is None: return op is OptOps.NOLOCALS
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0


KERNELS = {"elementwise": lambda: A.sink(A.store(0, F(1, 8, 12) + F(2, 8, 12).permute(0, 1))),
           "reduce": lambda: A.sink(A.store(0, F(1, 16, 32).sum(1)))}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(KERNELS)), OP_VALUES, FIELD_VALUES, FIELD_VALUES)
def test_an_opt_no_kernel_can_take_is_an_invalid_opt_error_and_changes_nothing(kernel, op, axis, amt):
  k = Kernel(KERNELS[kernel](), kc.Device["EMU"].renderer)
  before = (k.state.copy(), k.full_shape)
  opt = Opt(op, axis, amt)
  malformed = not isinstance(op, OptOps) or not (_field_ok(op, axis) and _field_ok(op, amt))
  try: k.apply_opt(opt)
  except InvalidOptError as e:
    assert malformed, f"{opt} is well formed but was called malformed: {e}"
    bad = op if not isinstance(op, OptOps) else (axis if not _field_ok(op, axis) else amt)
    assert repr(bad) in str(e) and ("kc.OptOps" in str(e) or "an int >= 0" in str(e)), str(e)
  except KernelOptError as e:
    assert not malformed, f"{opt} is malformed, but raised a plain KernelOptError: {e}"
  else:
    assert not malformed, f"{opt} is malformed, but it applied"
    return
  assert (k.state.copy(), k.full_shape) == before, f"{opt} was refused but changed the Kernel"


SHAPES = st.lists(st.sampled_from([2, 3, 4, 6, 8, 16]), min_size=1, max_size=3).map(tuple)


@settings(max_examples=80, deadline=None)
@given(SHAPES, st.booleans(), st.sampled_from([OptOps.UPCAST, OptOps.LOCAL, OptOps.PADTO, OptOps.SWAP, OptOps.UNROLL,
                                               OptOps.GROUP]), st.integers(0, 4))
def test_an_axis_past_the_shape_names_the_op_the_axis_and_the_valid_axes(shape, reduce, op, past):
  x = F(1, *shape)
  # permuted, the dims do not merge: the kernel keeps one axis per dim
  x = x.permute(*reversed(range(len(shape)))) if len(shape) > 1 else x
  sink = A.sink(A.store(0, x.sum(len(shape) - 1) if reduce and len(shape) > 1 else x * 2.0))
  k = Kernel(sink, kc.Device["EMU"].renderer)
  counts_from = {OptOps.UNROLL: k.first_reduce, OptOps.GROUP: k.first_reduce + k.group_for_reduces}.get(op, 0)
  n = k.shape_len - counts_from
  axis = max(n, 0) + past
  with pytest.raises(KernelOptError) as info: k.apply_opt(Opt(op, axis, 2))
  msg = str(info.value)
  assert type(info.value) is KernelOptError and msg.startswith(f"{op.name} axis {axis} is out of range"), msg
  assert f"shape {k.full_shape}" in msg, msg
  if n <= 0: assert "has no" in msg, msg
  elif n == 1: assert "axis 0" in msg and "0.." not in msg, msg
  else: assert f"axes 0..{n - 1}" in msg, msg


def test_a_refused_opt_in_a_list_says_which_one():
  sink = A.sink(A.store(0, F(1, 4, 5) * 2.0))
  refused = r"opts\[1\] = Opt\(op=OptOps.UPCAST, axis=0, amt=3\) does not apply: 3 does not divide 10"
  with pytest.raises(KernelOptError, match=refused):
    kc.compile(sink, "CLANG", opts=[Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 0, 3)])
  with pytest.raises(ConfigError, match="beam width .* got 0"): kc.api.beam_opts(sink, "CLANG", 0)


# -------------------------------------------------------------------------------------------------------- kc.run's inputs

@settings(max_examples=30, deadline=None)
@given(st.sets(st.integers(0, 4), max_size=4))
def test_kc_run_names_a_missing_or_unread_input(given_indices):
  sink = A.sink(A.store(0, F(1, 4) + F(2, 4)))
  inputs = {i: np.ones(4, np.float32) for i in given_indices}
  if given_indices == {1, 2}:
    assert np.array_equal(kc.run(sink, inputs, device="EMU")[0], np.full(4, 2.0, np.float32))
    return
  with pytest.raises(ArgumentError) as info: kc.run(sink, inputs, device="EMU")
  msg = str(info.value)
  assert "reads buffers [1, 2]" in msg, msg
  if (extra := sorted(given_indices - {1, 2})):
    assert f"has buffer {extra[0]}, {'an output' if extra[0] == 0 else 'not a buffer of the kernel'}" in msg, msg
  else: assert f"needs an input for buffer {min({1, 2} - given_indices)} (float32, shape (4,))" in msg, msg
