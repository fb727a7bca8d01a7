"""kc: a pluggable kernel compiler runtime."""
from kc.helpers import distribution_version as _distribution_version
from kc.errors import (KcError, UOpError, SymbolicError, RewriteError, InvalidASTError, ShapeError, KernelOptError,
                       CompileError, DeviceUnavailable, PluginError, DTypeError, ArgumentError, ConfigError,
                       UnknownDeviceError, AllocationError, OptsError, InvalidOptError, DeviceLostError)
from kc.ir.dtype import DType, PtrDType, ImageDType, dtypes, least_upper_dtype
from kc.ir.uop import Ops, GroupOp, UOp, Variable, sint
from kc.ir.rewrite import UPat, PatternMatcher, graph_rewrite
from kc.ir.symbolic import resolve, sym_infer, ssimplify, smax, smin
from kc.shape import ShapeTracker, View
from kc.runtime.device import Device, Buffer
from kc.kernel import Kernel, Opt, OptOps
from kc.renderer import Renderer, TensorCore, Program
from kc.api import compile, run, CompiledKernel, CompiledProgram, SplitCompiledKernel  # noqa: A004
from kc import ast
from kc import config
from kc.config import Context  # kc.Context(KC_BEAM=2): a scoped override of environment knobs

from_dlpack = Buffer.from_dlpack  # kc.from_dlpack(x, device=None, copy=False): a Buffer over any DLPack producer's memory

__version__ = _distribution_version("kc-core")

__all__ = ["KcError", "UOpError", "SymbolicError", "RewriteError", "InvalidASTError", "ShapeError", "KernelOptError",
           "CompileError", "DeviceUnavailable", "PluginError", "DTypeError", "ArgumentError", "ConfigError", "UnknownDeviceError", "AllocationError",
           "OptsError", "InvalidOptError", "DeviceLostError", "DType", "PtrDType", "ImageDType", "dtypes",
           "least_upper_dtype", "Ops", "GroupOp", "UOp", "Variable", "sint", "UPat", "PatternMatcher", "graph_rewrite",
           "resolve", "sym_infer", "ssimplify", "smax", "smin", "ShapeTracker", "View", "Device", "Buffer", "from_dlpack",
           "Kernel", "Opt", "OptOps", "Renderer", "TensorCore", "Program", "compile", "run", "CompiledKernel", "CompiledProgram",
           "SplitCompiledKernel", "ast", "config", "Context"]
