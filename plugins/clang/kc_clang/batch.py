"""Many kernels from one C compiler run: the sources are compiled as one translation unit into one object, then each
kernel's shared object is linked from it.

A C compile of one small kernel is mostly fixed cost (the compiler starting, math.h parsed, the driver's link: 55 of
85 ms with gcc 12 here, more with clang 14), so a batch pays it once. Each source keeps its own meaning: its file-scope
names (kernel, static helpers, the split symbol) are renamed per member by a #define before it and an #undef after,
so two kernels of the same name or the same helper never meet; each member's library is then linked from the one
object keeping only what that member reaches (--gc-sections), with its own names exported again (--defsym) and
nothing else (a version script). The links run the linker itself, not the driver (clang's driver alone takes 40 ms to
start), with what the driver's own link line (asked once with -###) says about the target and the library folders, and
none of what a kernel's library does without: the C runtime's start and end objects (crti.o, crtbeginS.o, ...), libc
and libgcc_s, and gcc's LTO plugin (collect2 then ld). A kernel calls only libm and libgcc (half and 128-bit
conversions), and now and then memcpy, which the process's own libc provides when the library loads: with -lm and
-lgcc a member's link takes 10 ms instead of 18 (gcc 12's line) or 29 (clang 14's). A link line this cannot read runs
as the driver wrote it. That needs the GNU linker's options, which Linux's gcc and clang use; elsewhere
batching_supported() is False and sources compile one by one. A member any of this cannot represent (a preprocessor
line of its own) makes the batch fail, and kc's Compiler.compile_many then builds the sources one by one."""
from __future__ import annotations
import functools, os, re, shlex, shutil, subprocess, sys, tempfile
from dataclasses import dataclass
from typing import Optional, Sequence
from kc.backend import BatchMember, CompileError, batch_member, batch_source


def batching_supported() -> bool:
  """Whether this platform's linker takes the options a member's link needs (GNU ld on Linux)."""
  return sys.platform.startswith("linux")


def link_options(m: BatchMember, version_script: str) -> list[str]:
  """The linker options that make a member's library: only what its names reach, exported under their own names."""
  return ["--gc-sections", f"--version-script={version_script}", *(f"--defsym={old}={new}" for old, new in m.exported.items())]


@dataclass(frozen=True)
class LinkCommand:
  """The linker command a driver runs for one object `obj` to library `lib` (placeholder paths in `argv`)."""
  argv: tuple[str, ...]
  obj: str
  lib: str


@functools.lru_cache(maxsize=None)
def link_command(cmd: tuple[str, ...], flags: tuple[str, ...]) -> Optional[LinkCommand]:
  """What `cmd` runs to link a kernel's library from one object (its -### output), None when it does not say (the
  driver then links)."""
  with tempfile.TemporaryDirectory(prefix="kc-clang-link-") as tmp:
    obj, lib = os.path.join(tmp, "member.o"), os.path.join(tmp, "member.so")
    open(obj, "wb").close()  # clang's driver checks that its inputs exist
    try: r = subprocess.run([*cmd, *flags, obj, "-o", lib, "-lm", "-###"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError): return None
  lines = [ln for ln in (r.stderr + r.stdout).splitlines() if lib in ln and obj in ln and ln.startswith(" ")]
  if r.returncode != 0 or not lines: return None
  try: argv = tuple(shlex.split(lines[-1]))
  except ValueError: return None
  return LinkCommand(argv, obj, lib) if os.path.isabs(argv[0]) and obj in argv and lib in argv else None


# what a lean link keeps of the driver's link line: the target (-m, -z), the hash table style, the build id, the
# unwind table's index, the library folders, -shared; and the libraries a kernel calls, which it links after the object
_KEPT_WITH_VALUE = ("-m", "-z")
_KEPT = re.compile(r"-L.+|--sysroot=.+|--hash-style=\w+|--build-id(=\w+)?|--eh-frame-hdr|-shared")
_LIBRARIES = ("-lm", "-lgcc")
# ... and what it leaves out: the LTO plugin and its options, the C runtime's objects, libc, libgcc_s and the --as-needed
# state around them (the driver's output path comes with -o)
_DROPPED_WITH_VALUE = ("-plugin", "-o")
_DROPPED = re.compile(r"-plugin-opt=.*|-lc|-lgcc_s|--push-state|--pop-state|--(no-)?as-needed|(.*/)?crt\w*\.o")
_GNU_LINKER = re.compile(r"(.*/)?ld(\.(bfd|gold|lld))?")


@dataclass(frozen=True)
class LeanLink:
  """A member's link by the linker itself: `argv` (linker and options) + -o, the member's options, the object, then
  `libraries`."""
  argv: tuple[str, ...]
  libraries: tuple[str, ...]


@functools.lru_cache(maxsize=None)
def lean_link(cmd: tuple[str, ...], flags: tuple[str, ...]) -> Optional[LeanLink]:
  """The link of link_command(cmd, flags) without the C runtime's objects, libc, libgcc_s and the LTO plugin; None
  when the line holds anything else, or the flags make objects only a plugin can link (-flto) or pick a linker
  (-fuse-ld, -B) that collect2 would find but the linker named here would not be."""
  if (link := link_command(cmd, flags)) is None or any(f.startswith(("-flto", "-fuse-ld", "-B")) for f in flags): return None
  if (linker := _linker(cmd, link.argv[0])) is None: return None
  kept: list[str] = []
  libraries: list[str] = []
  args = iter(link.argv[1:])
  for a in args:
    if a == link.obj: continue
    if a in _KEPT_WITH_VALUE: kept += [a, next(args, "")]
    elif a in _DROPPED_WITH_VALUE: next(args, None)
    elif a in _LIBRARIES: libraries.append(a)
    elif _KEPT.fullmatch(a): kept.append(a)
    elif not _DROPPED.fullmatch(a): return None  # an option this does not know: the driver's line as it is
  if "-shared" not in kept or "-lm" not in libraries: return None
  return LeanLink((linker, *kept), tuple(dict.fromkeys(libraries)))


def _linker(cmd: tuple[str, ...], first: str) -> Optional[str]:
  """The GNU-style linker the driver's link line runs: the line's own, or for gcc's collect2 the ld it runs."""
  if os.path.basename(first) == "collect2":
    try: r = subprocess.run([*cmd, "-print-prog-name=ld"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError): return None
    first = r.stdout.strip() if r.returncode == 0 else ""
    if first and not os.path.isabs(first): first = shutil.which(first) or ""
  return first if first and _GNU_LINKER.fullmatch(first) and os.access(first, os.X_OK) else None


def member_link(cmd: Sequence[str], flags: Sequence[str], obj: str, lib: str, options: list[str]) -> list[str]:
  """The command that links one member's library from the batch's object `obj`: the lean link where there is one,
  else the driver's link line, else the driver."""
  if (lean := lean_link(tuple(cmd), tuple(flags))) is not None: return [*lean.argv, "-o", lib, *options, obj, *lean.libraries]
  if (link := link_command(tuple(cmd), tuple(flags))) is None: return [*cmd, *flags, obj, "-o", lib, "-lm", *(f"-Wl,{o}" for o in options)]
  argv = [{link.obj: obj, link.lib: lib}.get(a, a) for a in link.argv]
  at = argv.index(obj)
  return argv[:at] + options + argv[at:]


def build(cmd: Sequence[str], flags: Sequence[str], srcs: Sequence[str], timeout: float = 600) -> list[bytes]:
  """The shared object of every source, from one compile of them all and one link per source. Raises CompileError
  when the batch does not build (any source's error fails it: the caller builds them one by one to say which)."""
  members = [batch_member(i, src) for i, src in enumerate(srcs)]
  with tempfile.TemporaryDirectory(prefix="kc-clang-batch-") as tmp:
    unit, obj = os.path.join(tmp, "batch.c"), os.path.join(tmp, "batch.o")
    with open(unit, "w") as f: f.write(batch_source(members))
    _run([*cmd, *flags, "-ffunction-sections", "-fdata-sections", "-c", unit, "-o", obj], timeout)
    out = []
    for i, m in enumerate(members):
      script, lib = os.path.join(tmp, f"m{i}.map"), os.path.join(tmp, f"m{i}.so")
      with open(script, "w") as f: f.write(f"{{ global: {'; '.join(m.exported)}; local: *; }};\n")
      _run(member_link(cmd, flags, obj, lib, link_options(m, script)), timeout)
      with open(lib, "rb") as f: out.append(f.read())
    return out


def _run(argv: list[str], timeout: float) -> None:
  try: r = subprocess.run(argv, capture_output=True, timeout=timeout)
  except (OSError, subprocess.SubprocessError) as e: raise CompileError(f"{' '.join(argv[:1])} could not build the batch: {e}") from None
  if r.returncode != 0:
    log = (r.stderr + r.stdout).decode(errors="replace")
    raise CompileError(f"{argv[0]} failed to build a batch of kernels (exit {r.returncode})", log=log)
