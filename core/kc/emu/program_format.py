"""The EMU program format: the UOp list EmuRenderer renders, as a readable listing and one line holding the
pickled UOps; loading it unpickles UOps and dtypes only."""
from __future__ import annotations
import base64, io, pickle, zlib
from kc.ir.uop import UOp


FORMAT = "kc-emu-1"  # the tag of the serialized program line; bump when the payload changes shape


_ALLOWED_GLOBALS = {("kc.ir.uop", "UOp"), ("kc.ir.uop", "Ops"), ("kc.ir.dtype", "_intern"), ("kc.ir.dtype", "DType"),
                    ("kc.ir.dtype", "PtrDType"), ("kc.ir.dtype", "ImageDType"), ("kc.renderer", "WMMAArg")}


class _UOpUnpickler(pickle.Unpickler):
  """Unpickles UOp lists only: a program is data, and loading one must never import or call anything else."""

  def find_class(self, module, name):
    if (module, name) in _ALLOWED_GLOBALS: return super().find_class(module, name)
    raise pickle.UnpicklingError(f"a serialized EMU program may only hold UOps and dtypes, not {module}.{name}")


def describe(pc: int, u: UOp, pos: dict) -> str:
  """One line of the listing: position, op, dtype, source positions, arg."""
  srcs = ",".join(str(pos.get(s, "?")) for s in u.src)
  arg = u.arg.render() if isinstance(u.arg, UOp) else repr(u.arg)
  return f"{pc:4d} {u.op.name:<14s} {str(u.dtype):<28s} [{srcs}] {arg}"


def serialize(name: str, uops: list[UOp]) -> str:
  """The EMU 'source': a readable listing in comments (for DEBUG and `kc render`) and one line holding the
  program itself, which is all the compiler reads."""
  listing, pos = [f"# EMU program {name}: {len(uops)} uops"], {}
  for i, u in enumerate(uops):
    listing.append("# " + describe(i, u, pos))
    pos.setdefault(u, i)
  payload = base64.b64encode(zlib.compress(pickle.dumps((name, list(uops)), protocol=pickle.HIGHEST_PROTOCOL))).decode()
  return "\n".join(listing + [f"{FORMAT} {payload}"]) + "\n"


def load_program(data: bytes) -> tuple[str, list[UOp]]:
  """(name, uops) from the bytes EmuCompiler made."""
  name, uops = _UOpUnpickler(io.BytesIO(zlib.decompress(data))).load()
  if not isinstance(name, str) or not isinstance(uops, list) or not all(isinstance(u, UOp) for u in uops):
    raise pickle.UnpicklingError("the payload is not a (name, [UOp, ...]) pair")
  return name, uops
