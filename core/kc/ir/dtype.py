"""Data types. DTypes are interned: building the same type twice gives the same object, so `is`,
`==` and hashing are identity-fast on the UOp construction path."""
from __future__ import annotations
import functools, math, sys, warnings
from dataclasses import dataclass, fields
from typing import Any, Final, Optional
import numpy as np
from kc.errors import DTypeError

_INTERNED: dict[tuple, "DType"] = {}
_VECTORS: dict[tuple["DType", int], "DType"] = {}  # DType.vec's answers


def _intern(cls, *args):
  key = (cls, *args)
  if (ret := _INTERNED.get(key)) is None:
    ret = _INTERNED[key] = cls(*args)
  return ret


@dataclass(frozen=True, eq=False, repr=False)
class DType:
  priority: int        # position in the promotion order; also breaks ties in rendering
  itemsize: int        # bytes of the whole (vector) value
  name: str
  fmt: Optional[str]   # struct/numpy format character of the scalar, None where numpy has none
  count: int           # vector width, 1 for scalars
  _scalar: Optional["DType"]

  def __reduce__(self): return _intern, (type(self), *(getattr(self, f.name) for f in fields(self)))
  def __repr__(self): return f"dtypes.{self.name}" if self.count == 1 else f"dtypes.{self.scalar().name}.vec({self.count})"
  def __lt__(self, other: "DType"): return (self.priority, self.itemsize, self.name) < (other.priority, other.itemsize, other.name)

  @property
  def base(self) -> "DType": return self

  def scalar(self) -> "DType": return self if self._scalar is None else self._scalar

  def vec(self, n: int) -> "DType":
    # asked for on every vector UOp the codegen builds: the answer once per (dtype, width)
    if type(n) is int and (ret := _VECTORS.get((self, n))) is not None: return ret
    if not isinstance(n, int) or n < 1: raise DTypeError(f"vector width must be a positive int, got {n!r}")
    if self.count != 1: raise DTypeError(f"cannot make a vector of the vector type {self}")
    ret = self if n == 1 or self == dtypes.void else _intern(DType, self.priority, self.itemsize * n, f"{self.name}x{n}", None, n, self)
    if type(n) is int: _VECTORS[(self, n)] = ret
    return ret

  def ptr(self, local: bool = False, size: int = -1) -> "PtrDType":
    return _intern(PtrDType, self.priority, 8, f"{'l' if local else ''}ptr.{self.name}", None, 1, None, self, local, 1, size)

  @property
  def np(self) -> Optional[np.dtype]:
    """The numpy dtype of the scalar type, None where numpy has none (bfloat16, void, pointers)."""
    return None if self.count != 1 or self.fmt is None else np.dtype(self.fmt)

  @property
  def min(self): return dtypes.min(self)
  @property
  def max(self): return dtypes.max(self)


@dataclass(frozen=True, eq=False, repr=False)
class PtrDType(DType):
  _base: DType = None      # type: ignore[assignment]
  local: bool = False      # points into work-group (local/shared) memory rather than global memory
  v: int = 1               # a pointer to vectors of this width
  size: int = -1           # elements behind the pointer, -1 when unknown

  @property
  def base(self) -> DType: return self._base
  def __repr__(self): return f"{self._base!r}.ptr({'local=True' if self.local else ''}{f', size={self.size}' if self.size != -1 else ''})"
  def scalar(self) -> "PtrDType": return self if self.v == 1 else self._base.ptr(self.local, self.size)
  def vec(self, n: int) -> "PtrDType":
    if self.v != 1: raise DTypeError(f"cannot make a vector of the vector pointer {self}")
    return self if n == 1 else _intern(type(self), *self._fields_with(v=n))
  def ptr(self, local=False, size=-1): raise DTypeError(f"cannot make a pointer to the pointer {self}")
  def _fields_with(self, **kw): return tuple(kw.get(f.name, getattr(self, f.name)) for f in fields(self))
  @property
  def np(self): return None


@dataclass(frozen=True, eq=False, repr=False)
class ImageDType(PtrDType):
  """An OpenCL image of RGBA texels of `_base` (half or float), `shape` = (height, width, 4)."""
  shape: tuple = ()
  def __repr__(self): return f"dtypes.{self.name}({self.shape})"


class dtypes:
  """The namespace of kc's dtypes and the functions over them."""
  # the kind of a scalar type ("b"ool, "i"nt, "u"nsigned, "f"loat) and its value range are looked up in tables
  # filled once below: these predicates run for every UOp built and every range computed
  @staticmethod
  def is_float(x: DType) -> bool: return _KIND.get(x._scalar or x) == "f" or isinstance(x, ImageDType)
  @staticmethod
  def is_int(x: DType) -> bool: return _KIND.get(x._scalar or x) in ("i", "u")
  @staticmethod
  def is_unsigned(x: DType) -> bool: return _KIND.get(x._scalar or x) == "u"
  @staticmethod
  def is_bool(x: DType) -> bool: return (x._scalar or x) is dtypes.bool

  @staticmethod
  def min(dt: DType):
    if (r := _RANGE.get(dt._scalar or dt)) is None: raise DTypeError(f"{dt} has no minimum")
    return r[0]

  @staticmethod
  def max(dt: DType):
    if (r := _RANGE.get(dt._scalar or dt)) is None: raise DTypeError(f"{dt} has no maximum")
    return r[1]

  @staticmethod
  def finfo(dt: DType) -> tuple[int, int]:
    """(exponent bits, mantissa bits) of a float dtype."""
    if (r := {dtypes.float16: (5, 10), dtypes.bfloat16: (8, 7), dtypes.float32: (8, 23), dtypes.float64: (11, 52),
              dtypes.fp8e4m3: (4, 3), dtypes.fp8e5m2: (5, 2)}.get(dt.scalar())) is None:
      raise DTypeError(f"{dt} is not a float type")
    return r

  @staticmethod
  def from_numpy(x) -> DType:
    try: key = np.dtype(x)
    except TypeError as e: raise DTypeError(f"{x!r} is not a numpy dtype") from e
    if (ret := _FROM_NUMPY.get(key)) is None:
      raise DTypeError(f"numpy dtype {key} has no kc dtype; supported: {', '.join(sorted(str(k) for k in _FROM_NUMPY))}")
    return ret

  @staticmethod
  def from_py(x) -> DType:
    """The default dtype of a Python value (numpy's rules would make ints int64; kernels index with int32)."""
    if isinstance(x, bool): return dtypes.bool
    if isinstance(x, int): return dtypes.int32
    if isinstance(x, float): return dtypes.float32
    if isinstance(x, (tuple, list)) and x:
      return max((dtypes.from_py(v) for v in x), key=lambda d: d.priority)
    raise DTypeError(f"no dtype for the Python value {x!r}")

  @staticmethod
  def as_const(val: Any, dtype: DType):
    """`val` as the Python scalar that a CONST of `dtype` holds: bool, int or float."""
    dt = dtype.scalar()
    if isinstance(val, (tuple, list)): return tuple(dtypes.as_const(v, dt) for v in val)
    if dt == dtypes.bool: return bool(val)
    if dtypes.is_int(dt):
      if isinstance(val, float) and not math.isfinite(val): raise DTypeError(f"cannot hold {val} in {dt}")
      return int(val)
    if dtypes.is_float(dt): return float(val)
    raise DTypeError(f"{dtype} cannot hold a constant")

  @staticmethod
  def fields() -> dict[str, DType]: return dict(_BY_NAME)

  @staticmethod
  def imageh(shp) -> ImageDType: return _image(dtypes.half, shp)
  @staticmethod
  def imagef(shp) -> ImageDType: return _image(dtypes.float32, shp)

  void: Final[DType] = _intern(DType, -1, 0, "void", None, 1, None)
  bool: Final[DType] = _intern(DType, 0, 1, "bool", "?", 1, None)
  int8: Final[DType] = _intern(DType, 1, 1, "int8", "b", 1, None)
  uint8: Final[DType] = _intern(DType, 2, 1, "uint8", "B", 1, None)
  int16: Final[DType] = _intern(DType, 3, 2, "int16", "h", 1, None)
  uint16: Final[DType] = _intern(DType, 4, 2, "uint16", "H", 1, None)
  int32: Final[DType] = _intern(DType, 5, 4, "int32", "i", 1, None)
  uint32: Final[DType] = _intern(DType, 6, 4, "uint32", "I", 1, None)
  int64: Final[DType] = _intern(DType, 7, 8, "int64", "q", 1, None)
  uint64: Final[DType] = _intern(DType, 8, 8, "uint64", "Q", 1, None)
  float16: Final[DType] = _intern(DType, 9, 2, "float16", "e", 1, None)
  bfloat16: Final[DType] = _intern(DType, 10, 2, "bfloat16", None, 1, None)
  float32: Final[DType] = _intern(DType, 11, 4, "float32", "f", 1, None)
  float64: Final[DType] = _intern(DType, 12, 8, "float64", "d", 1, None)
  # OCP FP8 (numpy has none): e4m3 is the "fn" variant (no infinities, NaN = S.1111.111, max 448), e5m2 is IEEE-like
  # (infinities, max 57344). They share float16's priority: the promotion lattice, not the priority, orders them
  # below it, and a sort puts them first among the floats (itemsize breaks the tie). The existing types keep their
  # numbers, so pickled UOps of kernels without fp8 stay byte-identical.
  fp8e4m3: Final[DType] = _intern(DType, 9, 1, "fp8e4m3", None, 1, None)
  fp8e5m2: Final[DType] = _intern(DType, 9, 1, "fp8e5m2", None, 1, None)

  # aliases
  half = float16; float = float32; double = float64
  float8_e4m3fn = fp8e4m3; float8_e5m2 = fp8e5m2  # ml_dtypes' (and PyTorch's) names
  char = int8; uchar = uint8; short = int16; ushort = uint16; int = int32; uint = uint32; long = int64; ulong = uint64

  uints = (uint8, uint16, uint32, uint64)
  sints = (int8, int16, int32, int64)
  ints = uints + sints
  fp8s = (fp8e4m3, fp8e5m2)
  floats = (float16, bfloat16, float32, float64) + fp8s  # fp8 last: code that walks the floats in order sees them as before
  all = (bool,) + ints + floats

  default_int = int32
  default_float = float32


def _image(base: DType, shp) -> ImageDType:
  shp = tuple(shp)
  if len(shp) != 3 or shp[2] != 4 or not all(isinstance(s, int) and s > 0 for s in shp):
    raise DTypeError(f"an image shape is (height, width, 4) of positive ints, got {shp}")
  name = f"image{'h' if base == dtypes.half else 'f'}"
  return _intern(ImageDType, 100, 4 * base.itemsize, name, None, 1, None, base, False, 4, -1, shp)


_KIND: dict[DType, str] = {dtypes.bool: "b", **{d: "i" for d in dtypes.sints}, **{d: "u" for d in dtypes.uints},
                           **{d: "f" for d in dtypes.floats}}
# e4m3 has no infinities: its range ends at its largest finite values, which also makes -448 the identity of a max
# reduce (-inf would become NaN in it)
_RANGE: dict[DType, tuple] = {dtypes.bool: (False, True), **{d: (-math.inf, math.inf) for d in dtypes.floats},
                              dtypes.fp8e4m3: (-448.0, 448.0),
                              **{d: (0, 2 ** (8 * d.itemsize) - 1) for d in dtypes.uints},
                              **{d: (-2 ** (8 * d.itemsize - 1), 2 ** (8 * d.itemsize - 1) - 1) for d in dtypes.sints}}
_BY_NAME: dict[str, DType] = {dt.name: dt for dt in dtypes.all}
_FROM_NUMPY: dict[np.dtype, DType] = {np.dtype(dt.fmt): dt for dt in _BY_NAME.values() if dt.fmt is not None}

# The promotion lattice: each type's immediate supertypes. It reproduces numpy's promote_types for every
# pair numpy has (int8+uint8 -> int16, int64+uint64 -> float64, int16+float16 -> float32, ...), with
# bfloat16 placed beside float16 (both widen to float32, and to each other only through float32).
# fp8: every e4m3 and every e5m2 value is exact in float16 and in bfloat16 (their exponent ranges and mantissas fit in
# both), so each fp8 type sits directly below both 16-bit floats, and bool below each fp8 type (0 and 1 are exact).
# Neither fp8 type holds the other (e4m3 has the finer mantissa, e5m2 the wider range), so they meet in float16, the
# lower-priority of the two minimal common supertypes, as int8 + bfloat16 does. No existing pair's result changes:
# the new types only add supertypes to bool, whose joins with the others are still the others.
_PROMOTES_TO: dict[DType, tuple[DType, ...]] = {
  dtypes.bool: (dtypes.int8, dtypes.uint8, dtypes.fp8e4m3, dtypes.fp8e5m2),
  dtypes.fp8e4m3: (dtypes.float16, dtypes.bfloat16), dtypes.fp8e5m2: (dtypes.float16, dtypes.bfloat16),
  dtypes.int8: (dtypes.int16, dtypes.float16, dtypes.bfloat16), dtypes.uint8: (dtypes.int16, dtypes.uint16, dtypes.float16, dtypes.bfloat16),
  dtypes.int16: (dtypes.int32, dtypes.float32), dtypes.uint16: (dtypes.int32, dtypes.uint32, dtypes.float32),
  dtypes.int32: (dtypes.int64, dtypes.float64), dtypes.uint32: (dtypes.int64, dtypes.uint64, dtypes.float64),
  dtypes.int64: (dtypes.float64,), dtypes.uint64: (dtypes.float64,),
  dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,), dtypes.float32: (dtypes.float64,), dtypes.float64: (),
}


def _upper_set(dt: DType) -> frozenset[DType]:
  out, todo = {dt}, [dt]
  while todo:
    for sup in _PROMOTES_TO[todo.pop()]:
      if sup not in out: out.add(sup); todo.append(sup)
  return frozenset(out)


_UPPER = {dt: _upper_set(dt) for dt in _PROMOTES_TO}


def least_upper_dtype(*dts: DType) -> DType:
  """The smallest dtype every argument promotes to (the join in the promotion lattice)."""
  if not dts: raise DTypeError("least_upper_dtype needs at least one dtype")
  scalars = [d.scalar() for d in dts]
  for d in scalars:
    if d not in _UPPER: raise DTypeError(f"{d} takes no part in type promotion")
  common = frozenset.intersection(*(_UPPER[d] for d in scalars))
  # the minimal common supertypes; where ints and floats both qualify (int8+uint8 -> int16 or float16) numpy
  # keeps the integer kind, which is the lower priority
  minimal = [c for c in common if not any(o is not c and c in _UPPER[o] for o in common)]
  return min(minimal, key=lambda d: d.priority)


def least_upper_float(dt: DType) -> DType:
  """The float type an operation that needs floats (exp2, division) computes a `dt` in: floats keep their type,
  bools and ints use the default float, as kernel code does (numpy would widen int32 to float64)."""
  return dt if dtypes.is_float(dt) else dtypes.default_float


# ***** bfloat16 <-> float: the one implementation of kc.ir.codec and constant folding (a value is an array of one)

def bf16_bits(x) -> np.ndarray:
  """float32 values to bfloat16 bits, rounding to nearest even; NaNs stay (quiet) NaNs."""
  bits = np.asarray(x, dtype=np.float32).view(np.uint32)
  rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
  nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
  return np.where(nan, ((bits >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16), rounded)


def bf16_values(bits) -> np.ndarray:
  """bfloat16 bits to their float32 values: exact."""
  return (np.asarray(bits).astype(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_bf16(x) -> np.ndarray:
  """Values rounded to bfloat16 through float32 (past its range: inf), as the C dialects' __kc_f2bf((float)x) rounds
  them, as float32."""
  with np.errstate(over="ignore"): return bf16_values(bf16_bits(np.asarray(x).astype(np.float32)))


# ***** fp8 <-> float: the one implementation the emulator, the argument checks and constant folding share

@dataclass(frozen=True)
class FP8Format:
  """The encoding of one fp8 type: sign, `exp_bits` exponent bits with bias 2^(exp_bits-1)-1, `man_bits` mantissa bits."""
  exp_bits: int
  man_bits: int
  max_value: float    # the largest finite value
  has_inf: bool       # e5m2: an all-ones exponent is inf (mantissa 0) or NaN; e4m3fn: only S.1111.111 is NaN

  @property
  def bias(self) -> int: return (1 << (self.exp_bits - 1)) - 1


FP8_FORMATS: dict[DType, FP8Format] = {dtypes.fp8e4m3: FP8Format(4, 3, 448.0, False), dtypes.fp8e5m2: FP8Format(5, 2, 57344.0, True)}


def _fp8_decode_table(f: FP8Format) -> np.ndarray:
  """The float32 value of each of the 256 codes (all exact in float32)."""
  codes = np.arange(256)
  exp, man = (codes >> f.man_bits) & ((1 << f.exp_bits) - 1), codes & ((1 << f.man_bits) - 1)
  # exponent 0 is subnormal: no implicit 1, and the smallest normal exponent
  mag = np.ldexp(np.where(exp == 0, man, man + (1 << f.man_bits)).astype(np.float64), np.maximum(exp, 1) - f.bias - f.man_bits)
  top = exp == (1 << f.exp_bits) - 1
  if f.has_inf: mag = np.where(top, np.where(man == 0, np.inf, np.nan), mag)
  else: mag = np.where(top & (man == (1 << f.man_bits) - 1), np.nan, mag)
  return np.where(codes & 0x80, -mag, mag).astype(np.float32)


_FP8_VALUES = {dt: _fp8_decode_table(f) for dt, f in FP8_FORMATS.items()}
# the finite non-negative values, codes 0.. in increasing order: a rounded magnitude's code is its position here
_FP8_FINITE = {dt: t[:0x80][np.isfinite(t[:0x80])].astype(np.float64) for dt, t in _FP8_VALUES.items()}
for _t in (*_FP8_VALUES.values(), *_FP8_FINITE.values()): _t.flags.writeable = False


def fp8_to_float32(bits, dt: DType) -> np.ndarray:
  """fp8 codes (any integer array, read as uint8) to their float32 values: exact."""
  return _FP8_VALUES[dt.scalar()][np.asarray(bits).astype(np.uint8)]


def float_to_fp8(x, dt: DType) -> np.ndarray:
  """Float values (float64 or narrower, rounded once) to fp8 codes as uint8: round to nearest even, subnormals
  included; past the largest finite value e4m3 becomes NaN and e5m2 inf (ml_dtypes' conversion, CUDA's
  __nv_cvt_float_to_fp8 with __NV_NOSAT); NaN stays NaN. The sign of zeros and NaNs is kept."""
  f = FP8_FORMATS[dt.scalar()]
  x = np.asarray(x, dtype=np.float64)
  mag = np.abs(x)
  with np.errstate(invalid="ignore", over="ignore"):
    # the quantum of |x|'s binade (subnormals share the smallest normal binade's); dividing by a power of two is
    # exact, so np.rint (ties to even) rounds to the nearest representable value exactly once
    exp = np.maximum(np.frexp(mag)[1] - 1, 1 - f.bias)
    quantum = np.ldexp(1.0, exp - f.man_bits)
    rounded = np.rint(mag / quantum) * quantum
    code = np.searchsorted(_FP8_FINITE[dt.scalar()], np.minimum(rounded, f.max_value)).astype(np.uint8)
  overflow, nan = rounded > f.max_value, np.isnan(x)
  code = np.where(overflow, 0x7C if f.has_inf else 0x7F, code)
  code = np.where(nan, 0x7E if f.has_inf else 0x7F, code)
  return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def round_fp8(x, dt: DType) -> np.ndarray:
  """`x` rounded to the fp8 type `dt`, as float32 values."""
  return fp8_to_float32(float_to_fp8(x, dt), dt)


def _round_float(fmt: str):
  def rnd(x: float) -> float:
    with np.errstate(over="ignore"): return float(np.array(x, dtype=fmt))
  return rnd


def _wrap_int(dt: DType):
  bits, signed = 8 * dt.itemsize, not dtypes.is_unsigned(dt)
  mask, half = (1 << bits) - 1, 1 << (bits - 1)
  def wrap(x) -> int:
    x = int(x) & mask
    return x - (1 << bits) if signed and x >= half else x
  return wrap


# the largest finite value of each float type
FLOAT_MAX: dict[DType, float] = {dtypes.float16: 65504.0, dtypes.bfloat16: 3.3895313892515355e38,
                                 dtypes.float32: 3.4028234663852886e38, dtypes.float64: sys.float_info.max,
                                 dtypes.fp8e4m3: 448.0, dtypes.fp8e5m2: 57344.0}


@functools.lru_cache(maxsize=None)
def _finite_values(dt: DType) -> np.ndarray:
  """Every finite value of a float type of at most 16 bits, ascending, each zero once (float64)."""
  codes = np.arange(1 << (8 * dt.itemsize))
  with np.errstate(all="ignore"):  # NaN codes
    if dt == dtypes.float16: vals = codes.astype(np.uint16).view(np.float16).astype(np.float64)
    elif dt == dtypes.bfloat16: vals = (codes.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else: vals = fp8_to_float32(codes, dt).astype(np.float64)
  return np.unique(vals[np.isfinite(vals)])


def next_float(dt: DType, v: float, up: bool) -> float:
  """The value of float type `dt` next to its value `v`, toward +inf (`up`) or -inf; past the largest finite value
  +-inf (also for e4m3, which has none: callers treat that as unbounded)."""
  dt = dt.scalar()
  inf = math.inf if up else -math.inf
  if dt == dtypes.float64: return math.nextafter(v, inf)
  if dt == dtypes.float32:
    with np.errstate(over="ignore"): return float(np.nextafter(np.float32(v), np.float32(inf)))
  vals = _finite_values(dt)
  i = int(np.searchsorted(vals, v, side="right" if up else "left")) + (0 if up else -1)
  return float(vals[i]) if 0 <= i < len(vals) else inf


def cast_scalar(dt: DType, x):
  """The value a CAST to `dt` gives the Python scalar `x` (bool, int or float), as the devices compute it: floats to
  ints truncate; a NaN, an infinity or a value outside the int's range (which C leaves undefined) converts as numpy's
  astype does on this machine, as EMU computes it; never an error."""
  s = dt.scalar()
  if dtypes.is_int(s) and isinstance(x, float) and not (math.isfinite(x) and dtypes.min(s) <= int(x) <= dtypes.max(s)):
    with np.errstate(invalid="ignore", over="ignore"), warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)
      return int(np.array([x], dtype=np.float64).astype(s.np)[0])
  return truncate(s, dtypes.as_const(x, s))


def truncate(dt: DType, x):
  """`x` as the backend would hold it in `dt`: ints wrap around, floats round to the type's precision."""
  return _TRUNCATE[dt.scalar()](x)


_TRUNCATE = {dtypes.bool: bool, dtypes.float64: float, dtypes.float32: _round_float("f"), dtypes.float16: _round_float("e"),
             dtypes.bfloat16: lambda x: float(round_bf16(float(x))), **{dt: _wrap_int(dt) for dt in dtypes.ints},
             **{dt: (lambda x, dt=dt: float(round_fp8(float(x), dt))) for dt in dtypes.fp8s}}
