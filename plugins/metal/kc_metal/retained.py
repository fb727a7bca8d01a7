"""Ownership of what Metal's `new…` methods return, for every pyobjc the [runtime] extra allows.

Cocoa's naming rule gives the caller a +1 reference from a method in the `new` family, instance methods included
(clang's ARC method families). pyobjc-core before 12.2.3 applied the rule to class methods only (pyobjc issue #690):
it retained the MTLBuffer, MTLLibrary, MTLFunction, MTLComputePipelineState and MTLCommandQueue these instance methods
return once more, so dropping the last Python reference freed nothing (a BEAM search leaked every library and pipeline
it built, and the allocator's out-of-memory recovery could free no memory).

The fix that holds on both sides of that release is pyobjc's own selector metadata: each `new…` selector kc calls is
registered with `already_retained` on its return value, the way pyobjc-core registers alloc and copy. Before 12.2.3
that adds the missing rule; from 12.2.3 on it says what pyobjc already assumes. A registration replaces the selector's
metadata rather than merging into it, so each entry repeats what pyobjc-framework-Metal declares for the selector
(its argument types, the `error:` out-parameters) besides the return value. Explicit release() calls would instead
over-release on a fixed pyobjc."""
from __future__ import annotations

_OUT_ERROR = {"type": b"^@", "type_modifier": b"o"}  # an NSError** out-parameter: pyobjc returns it as a second value

# selector: its full metadata (protocol methods of MTLDevice, MTLLibrary, registered on NSObject as pyobjc-framework-
# Metal registers them), with the return value marked as already retained
NEW_SELECTORS: dict[bytes, dict] = {
  b"newBufferWithLength:options:": {"arguments": {2: {"type": b"Q"}, 3: {"type": b"Q"}}},
  b"newCommandQueue": {},
  b"newLibraryWithSource:options:error:": {"arguments": {2: {"type": b"@"}, 3: {"type": b"@"}, 4: _OUT_ERROR}},
  b"newFunctionWithName:": {"arguments": {2: {"type": b"@"}}},
  b"newComputePipelineStateWithFunction:error:": {"arguments": {2: {"type": b"@"}, 3: _OUT_ERROR}},
}


def selector_metadata(selector: bytes) -> dict:
  """The metadata kc registers for `selector`: its arguments, and a return value the caller owns."""
  return {"required": True, "retval": {"type": b"@", "already_retained": True}, **NEW_SELECTORS[selector]}


def python_name(selector: bytes) -> str:
  """The Python name pyobjc gives a selector: newBufferWithLength:options: is newBufferWithLength_options_."""
  return selector.decode().replace(":", "_")


def register_new_selectors(objc) -> None:
  """Register the metadata of every selector in NEW_SELECTORS with `objc` (pyobjc's module), after Metal's own
  bindings are imported (a later registration replaces an earlier one) and before any of them is called."""
  updating = getattr(objc, "_updatingMetadata", None)  # pyobjc's frameworks bracket registrations so caches refresh
  if updating is not None: updating(True)
  try:
    for selector in NEW_SELECTORS: objc.registerMetaDataForSelector(b"NSObject", selector, selector_metadata(selector))
  finally:
    if updating is not None: updating(False)
