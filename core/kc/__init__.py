"""kc: a pluggable kernel compiler runtime."""
from importlib.metadata import PackageNotFoundError, version as _version
from kc.errors import (KcError, UOpError, SymbolicError, RewriteError, InvalidASTError, ShapeError, KernelOptError,
                       CompileError, DeviceUnavailable, PluginError, DTypeError)
from kc.dtype import DType, PtrDType, ImageDType, dtypes, least_upper_dtype
from kc.uop import Ops, GroupOp, UOp, Variable, sint
from kc.rewrite import UPat, PatternMatcher, graph_rewrite
from kc.symbolic import resolve, sym_infer, ssimplify, smax, smin
from kc.shape import ShapeTracker, View
from kc.device import Device, Buffer

try: __version__ = _version("kc")
except PackageNotFoundError: __version__ = "0.0.0+unknown"

__all__ = ["KcError", "UOpError", "SymbolicError", "RewriteError", "InvalidASTError", "ShapeError", "KernelOptError",
           "CompileError", "DeviceUnavailable", "PluginError", "DTypeError", "DType", "PtrDType", "ImageDType", "dtypes",
           "least_upper_dtype", "Ops", "GroupOp", "UOp", "Variable", "sint", "UPat", "PatternMatcher", "graph_rewrite",
           "resolve", "sym_infer", "ssimplify", "smax", "smin", "ShapeTracker", "View", "Device", "Buffer"]
