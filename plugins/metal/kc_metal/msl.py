"""What Metal's compiler is asked for, decided without Metal: the Metal Shading Language version a macOS release and a
GPU compile (MTLCompileOptions.languageVersion), and the math settings that make kernels give IEEE (numpy's) results.
Pure functions, so every system tests them; kc_metal.compiler applies them to an MTLCompileOptions on a Mac.

Why set both math settings: from macOS 15 on, MTLCompileOptions has mathMode (safe, relaxed, fast) and, apart from
it, mathFloatingPointFunctions (fast or precise), which Apple's MTLLibrary.h documents as defaulting to *fast*. mathMode
safe alone then still compiles every unqualified sin, exp2, log2 or sqrt to its fast variant, whose results are
outside kc's tolerances (sin of large arguments, exp2 near float's range). Before macOS 15 only fastMathEnabled exists,
and turning it off makes both the arithmetic and the functions precise."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional
from kc.backend import ConfigError


@dataclass(frozen=True, order=True)
class MSLVersion:
  """A Metal Shading Language version; `mtl_value` is its MTLLanguageVersion (major << 16 | minor, MTLLibrary.h)."""
  major: int
  minor: int

  @property
  def mtl_value(self) -> int: return self.major << 16 | self.minor

  def __str__(self): return f"{self.major}.{self.minor}"


# the newest MSL each macOS has (Apple's MTLLanguageVersion availability): macOS 26 followed 15
MSL_OF_MACOS = {(10, 13): MSLVersion(2, 0), (10, 14): MSLVersion(2, 1), (10, 15): MSLVersion(2, 2),
                (11,): MSLVersion(2, 3), (12,): MSLVersion(2, 4), (13,): MSLVersion(3, 0), (14,): MSLVersion(3, 1),
                (15,): MSLVersion(3, 2), (26,): MSLVersion(4, 0)}
NEWEST_MSL = max(MSL_OF_MACOS.values())
# what kc's kernels use: simdgroup matrices from MSL 2.3, the bfloat type from MSL 3.1
SIMDGROUP_MATRIX_MSL = MSLVersion(2, 3)
BFLOAT_MSL = MSLVersion(3, 1)
# MSL 3 is Metal 3's language: a GPU without MTLGPUFamilyMetal3 compiles MSL 2.4 at the newest
METAL3_MSL = MSLVersion(3, 0)
BEFORE_METAL3_MSL = MSLVersion(2, 4)

# MTLMathMode and MTLMathFloatingPointFunctions values (MTLLibrary.h)
MATH_MODE_SAFE = 0
MATH_FUNCTIONS_PRECISE = 1


def parse_macos(version: str) -> tuple[int, ...]:
  """platform.mac_ver()'s release ("14.6.1") as ints; a ConfigError for one that is not dotted numbers."""
  try: parts = tuple(int(p) for p in version.strip().split("."))
  except ValueError: parts = ()
  if not parts: raise ConfigError(f"macOS version {version!r} is not dotted numbers like '14.6.1'")
  return parts


def msl_for(macos: tuple[int, ...], metal3: bool = True) -> MSLVersion:
  """The newest MSL a Mac compiles: the newest its macOS has (a release newer than kc knows gets the newest kc
  knows), at most MSL 2.4 on a GPU without Metal 3."""
  known = [v for os, v in MSL_OF_MACOS.items() if os <= macos[:len(os)]]
  if not known:
    raise ConfigError(f"macOS {'.'.join(map(str, macos))} is older than 10.13, the first with MSL 2 (kc needs it)")
  newest = max(known)
  return newest if metal3 or newest < METAL3_MSL else BEFORE_METAL3_MSL


@dataclass(frozen=True)
class CompileSettings:
  """What kc sets on an MTLCompileOptions. The math fields hold the value to set, None where that OS lacks the
  property: mathMode and mathFloatingPointFunctions from macOS 15 on, fastMathEnabled before (deprecated there)."""
  language: MSLVersion
  math_mode: Optional[int]
  math_functions: Optional[int]
  fast_math: Optional[bool]

  def describe(self) -> str:
    math = "mathMode=safe mathFloatingPointFunctions=precise" if self.math_mode is not None else "fastMathEnabled=NO"
    return f"languageVersion=MSL {self.language} ({self.language.mtl_value}) {math}"


def compile_settings(language: MSLVersion, has_math_mode: bool) -> CompileSettings:
  """IEEE results on every macOS: safe math with precise functions where the OS has mathMode (macOS 15 on), fast
  math off before; and the MSL version asked for explicitly, so which features compile does not hang on a default."""
  if has_math_mode: return CompileSettings(language, MATH_MODE_SAFE, MATH_FUNCTIONS_PRECISE, None)
  return CompileSettings(language, None, None, False)


def apply_settings(settings: CompileSettings, options) -> object:
  """Set `settings` on `options` (an MTLCompileOptions, or anything with its setters) and return it."""
  options.setLanguageVersion_(settings.language.mtl_value)
  if settings.math_mode is not None:
    options.setMathMode_(settings.math_mode)
    options.setMathFloatingPointFunctions_(settings.math_functions)
  else: options.setFastMathEnabled_(settings.fast_math)
  return options


def has_math_mode(options) -> bool:
  """Whether an MTLCompileOptions has macOS 15's mathMode (and mathFloatingPointFunctions) properties."""
  return hasattr(options, "setMathMode_") and hasattr(options, "setMathFloatingPointFunctions_")
