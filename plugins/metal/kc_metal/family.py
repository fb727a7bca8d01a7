"""Apple GPU families: what a Metal device (or KC_METAL_FAMILY, without one) can run.

The family decides what the renderer declares: simdgroup matrices (kc's tensor cores) from Apple7 (A14, M1) on,
bfloat simdgroup matrices from Apple9 (A17 Pro, M3) on. A Mac family (Intel or AMD GPUs in Macs) gets none: their
SIMD width is not always 32, and the 8x8 fragment layout kc relies on is only known for Apple GPUs."""
from __future__ import annotations
from dataclasses import dataclass
from kc.backend import ConfigError, knob

ENV_FAMILY = "KC_METAL_FAMILY"


@dataclass(frozen=True)
class GPUFamily:
  """One MTLGPUFamily: its name as kc spells it ("apple9") and the MTLGPUFamily enum value the runtime asks about."""
  name: str
  mtl_value: int
  apple: int = 0  # the Apple generation (7 for Apple7); 0 for a Mac family

  @property
  def has_simdgroup_matrix(self) -> bool: return self.apple >= 7

  @property
  def has_bfloat_simdgroup_matrix(self) -> bool: return self.apple >= 9


# MTLGPUFamilyApple1 = 1001 ... MTLGPUFamilyApple9 = 1009, MTLGPUFamilyMac2 = 2002 (Metal's MTLDevice.h)
APPLE_FAMILIES = tuple(GPUFamily(f"apple{n}", 1000 + n, n) for n in range(1, 10))
MAC_FAMILIES = (GPUFamily("mac2", 2002),)
FAMILIES = {f.name: f for f in APPLE_FAMILIES + MAC_FAMILIES}
NEWEST = APPLE_FAMILIES[-1]
FAMILY = knob(ENV_FAMILY, str, NEWEST.name, "the Metal GPU family rendered for without a device (apple7, apple8, ...)",
              __name__)


def family_named(name: str) -> GPUFamily:
  """The family called `name` ("apple9", case and spaces ignored); a ConfigError naming KC_METAL_FAMILY otherwise."""
  key = name.strip().lower()
  if key not in FAMILIES:
    raise ConfigError(f"{ENV_FAMILY}={name!r} is not a Metal GPU family kc knows: use one of {', '.join(FAMILIES)}, "
                      f"or unset it for {NEWEST.name}")
  return FAMILIES[key]


def family_from_env() -> GPUFamily:
  """The family a renderer without a device renders for: KC_METAL_FAMILY, else the newest Apple family."""
  return family_named(FAMILY.get())


def newest_supported(supports) -> GPUFamily:
  """The newest family a device supports, asking `supports(mtl_value) -> bool` (MTLDevice.supportsFamily:), Apple
  families first: an Apple GPU also reports Mac2, but its Apple family is what decides simdgroup matrices."""
  for fam in reversed(APPLE_FAMILIES):
    if supports(fam.mtl_value): return fam
  for fam in MAC_FAMILIES:
    if supports(fam.mtl_value): return fam
  return APPLE_FAMILIES[0]  # none kc knows: the oldest family, which declares no tensor cores
