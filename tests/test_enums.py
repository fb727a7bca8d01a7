"""kc.enums: Ops and OptOps keep every enum behaviour kc and pickle use, with a metaclass that has no __getattr__
(the hook that made every `Ops.X` read slow on Python 3.10 and 3.11)."""
import copy, enum, pickle
import pytest
from kc.enums import PlainMembersType, has_getattr_hook, plain_members
from kc.ir.uop import Ops
from kc.kernel.opt import OptOps


@pytest.mark.parametrize("cls", [Ops, OptOps])
def test_the_enum_behaves_as_before(cls):
  names = [m.name for m in cls]
  assert names == list(cls.__members__) and len(cls) == len(names) and len(set(names)) == len(names)
  for m in cls:
    assert cls[m.name] is m and cls(m.value) is m and m in cls and isinstance(m, cls)
    assert pickle.loads(pickle.dumps(m)) is m and copy.deepcopy(m) is m
    assert repr(m) == f"{cls.__name__}.{m.name}"
  assert list(reversed(cls)) == list(cls)[::-1]
  with pytest.raises(KeyError): cls["NOPE"]
  with pytest.raises(ValueError, match="is not a valid"): cls(10 ** 6)
  first = next(iter(cls))
  with pytest.raises(AttributeError): setattr(cls, first.name, first)
  with pytest.raises(AttributeError): delattr(cls, first.name)
  assert getattr(cls, first.name) is first


def test_int_members_stay_ints_and_ordered_as_defined():
  assert Ops.ADD == int(Ops.ADD) and hash(Ops.ADD) == hash(int(Ops.ADD)) and f"{Ops.ADD}" == "Ops.ADD"
  assert sorted(Ops) == list(Ops) and sorted([OptOps.LOCAL, OptOps.TC]) == [OptOps.TC, OptOps.LOCAL]


def test_no_getattr_hook_where_enum_has_one():
  slow = has_getattr_hook(enum.EnumMeta)
  for cls in (Ops, OptOps):
    assert (type(cls) is PlainMembersType) == slow
    assert not has_getattr_hook(type(cls))
  assert not has_getattr_hook(PlainMembersType) and has_getattr_hook(type("WithHook", (type,), {"__getattr__": lambda c, n: 0}))


def test_a_new_enum_gets_the_same_treatment():
  class Color(enum.Enum):
    RED = 1
    BLUE = 2
  plain_members(Color)
  assert list(Color) == [Color.RED, Color.BLUE] and Color(2) is Color.BLUE and Color["RED"] is Color.RED
  assert Color.RED.name == "RED" and Color.BLUE.value == 2
