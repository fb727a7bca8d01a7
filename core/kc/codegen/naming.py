"""Kernel names: terminal colours by axis kind, and the source-safe function name."""
import re, string

_COLORS = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"]
_SAFE = set(string.ascii_letters + string.digits + "_")


def colored(s: str, color: str) -> str:
  """`s` in an ANSI colour; an upper-case colour name is the bright variant."""
  return f"\x1b[{60 * (color.upper() == color) + 30 + _COLORS.index(color.lower())}m{s}\x1b[0m"


def ansistrip(s: str) -> str: return re.sub("\x1b\\[(K|.*?m)", "", s)


def ansilen(s: str) -> int: return len(ansistrip(s))


def to_function_name(s: str) -> str:
  """A C identifier from a kernel name: colours dropped, every other unsafe character as two hex digits."""
  return "".join(c if c in _SAFE else f"{ord(c):02X}" for c in ansistrip(s))
