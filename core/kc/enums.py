"""Enum members read at a plain class attribute's speed.

On Python 3.10 and 3.11 the metaclass of every Enum (enum.EnumMeta) defines `__getattr__`, and a metaclass that
defines one routes every attribute read of its classes through a slower hook: `Ops.ADD` costs four times a plain
class attribute (54 ns against 14), and codegen tests `u.op is Ops.X` hundreds of thousands of times per kernel (a
tenth of a compile). `plain_members` gives an enum a metaclass of its own without the hook, keeping what kc and
pickle use of an enum class: iteration in definition order, len, `E[name]`, `E(value)`, membership,
`__members__`, and members that cannot be reassigned. The members are the same objects with the same methods. On
a Python whose EnumMeta has no `__getattr__` the enum is left as it is."""
from __future__ import annotations
from types import MappingProxyType
from typing import TypeVar

E = TypeVar("E", bound=type)


class PlainMembersType(type):
  """An enum class's metaclass without `__getattr__` (see the module docstring)."""

  def __iter__(cls): return (cls._member_map_[name] for name in cls._member_names_)
  def __reversed__(cls): return (cls._member_map_[name] for name in reversed(cls._member_names_))
  def __len__(cls): return len(cls._member_names_)
  def __getitem__(cls, name): return cls._member_map_[name]
  def __contains__(cls, member): return isinstance(member, cls) and member._name_ in cls._member_map_
  def __repr__(cls): return f"<enum {cls.__name__!r}>"
  def __bool__(cls): return True

  @property
  def __members__(cls): return MappingProxyType(cls._member_map_)

  def __call__(cls, value):
    """The member of this value (what unpickling a member asks)."""
    try: return cls._value2member_map_[value]
    except (KeyError, TypeError): raise ValueError(f"{value!r} is not a valid {cls.__qualname__}") from None

  def __setattr__(cls, name, value):
    if name in cls.__dict__.get("_member_map_", {}): raise AttributeError(f"cannot reassign member {name!r}")
    super().__setattr__(name, value)

  def __delattr__(cls, name):
    if name in cls.__dict__.get("_member_map_", {}): raise AttributeError(f"cannot delete member {name!r}")
    super().__delattr__(name)


def has_getattr_hook(meta: type) -> bool:
  """Whether a metaclass (or one of its bases) defines `__getattr__`: enum.EnumMeta on Python 3.10 and 3.11."""
  return any("__getattr__" in vars(m) for m in meta.__mro__ if m is not type and m is not object)


def plain_members(cls: E) -> E:
  """`cls` (an Enum) with PlainMembersType as its metaclass where its own metaclass has a `__getattr__`."""
  if has_getattr_hook(type(cls)): cls.__class__ = PlainMembersType
  return cls
