"""The compiled code of gpupool's kernels: the NVRTC compile the CuPy backend makes (its
``OPTIONS``, ``-arch=sm_90``, a cubin, with ptxas's resource report), disassembled with
``nvdisasm``, and how many global loads it keeps in flight at once. No GPU is needed.

A *run* is the global loads (``LDG``) started, along the straight-line machine code, before the
first instruction that reads or overwrites the destination of one still pending: that
instruction waits for them, so a run is one batch of loads in flight together. A kernel whose
loads are independent but written one after another in the source may still be compiled into
runs of one (each load waited for before the next starts); the trace, taken on a CPU,
cannot see this.

The scan is linear: it follows the code in address order, not its branches, so each code path
(a fixed-K window's unrolled taps and a general loop, a loop body and its remainder) counts
once, however often it runs. It keeps the runs per straight-line block (a block and a run end
at a label or after a branch), so that the model can pick the block an epoch ran: how it turns
runs into rounds is ``COMPILED_BATCH`` in :mod:`gpumodel.traffic`.

``nvdisasm`` comes from the ``nvidia-cuda-nvdisasm`` wheel (the ``test`` extra); without it
:func:`nvdisasm` raises, so the model never assumes a batching it has not read.
"""
from __future__ import annotations

import importlib.util
import io
import math
import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ARCH = "90"

#: Opcodes (before their first ".") that write no register: stores, reductions, control flow,
#: barriers. Every register they name is read.
NO_DESTINATION = frozenset({
    "ST", "STG", "STS", "STL", "RED", "REDG", "BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "CALL",
    "BAR", "MEMBAR", "DEPBAR", "BSSY", "BSYNC", "WARPSYNC", "NOP", "YIELD", "ERRBAR", "CCTL",
    "FENCE", "BPT", "KILL"})
#: Opcodes whose first operands are predicates: a comparison writes no general register; a
#: shuffle writes its second operand.
PREDICATE_FIRST = frozenset({"ISETP", "FSETP", "DSETP", "HSETP2", "PSETP", "PLOP3", "FCHK"})
SECOND_DESTINATION = frozenset({"SHFL"})
#: Registers an LDG writes, by its width suffix (32 bits and narrower: one).
LOAD_WIDTH = {"64": 2, "128": 4}

#: Opcodes after which control may leave the straight line.
BRANCHES = frozenset({"BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "CALL", "KILL"})

_LABEL = re.compile(r"\s*\.L_x_\d+:")
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_.]*)"
                          r"\s*([^;]*);")
_FUNCTION = re.compile(r"\s*\.text\.(\S+):")
_REGISTER = re.compile(r"\bR(\d+)\b")


@dataclass(frozen=True)
class Compiled:
    """One NVRTC compile of a source file's kernels: the cubin, each name expression's mangled
    name, and the compile log (ptxas's ``-v`` report)."""

    cubin: bytes
    mangled: dict
    log: str


def compile_kernels(nvrtc, source: str, names, arch: str = ARCH) -> Compiled:
    """Compile ``names`` (name expressions) of ``source`` as gpupool's CuPy backend does
    (``gpupool.cuda.kernels.OPTIONS``) for sm_``arch``, to a cubin, with ptxas's resource report.
    ``nvrtc``: :func:`cudacpu.real_nvrtc`'s namespace, used inside
    :func:`cudacpu.installed_cupy`."""
    from gpupool.cuda import kernels as cuda_kernels
    names = list(dict.fromkeys(names))
    program = nvrtc.compiler._NVRTCProgram(source, "kernel.cu", name_expressions=names,
                                           method="cubin")
    options = tuple(nvrtc.core.assemble_cupy_compiler_options(cuda_kernels.OPTIONS)) + (
        f"-arch=sm_{arch}", "--device-as-default-execution-space", "-Xptxas=-v")
    log = io.StringIO()
    cubin, mapping = program.compile(options, log)
    return Compiled(_whole_elf(bytes(cubin)), {n: mapping[n] for n in names},
                    log.getvalue().replace("\0", ""))


def _whole_elf(image: bytes) -> bytes:
    """``image`` padded with zeros to the end of its last header or section: CuPy hands back
    the cubin as a C string, without its final NUL byte, which nvdisasm needs."""
    if image[:4] != b"\x7fELF" or image[4] != 2:
        raise ValueError("not a 64-bit ELF image")
    phoff, shoff = struct.unpack_from("<QQ", image, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", image, 0x36)
    end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    return image + b"\0" * max(0, end - len(image))


def nvdisasm() -> Path:
    """The ``nvdisasm`` of the installed ``nvidia-cuda-nvdisasm`` wheel (the newest CUDA major
    if several); ``FileNotFoundError`` when none is installed."""
    spec = importlib.util.find_spec("nvidia")
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    found = sorted((f for root in roots for f in root.glob("cu*/bin/nvdisasm") if f.is_file()),
                   key=lambda f: int(f.parent.parent.name[2:] or 0))
    if not found:
        raise FileNotFoundError(
            "nvdisasm not found (the model reads each kernel's load batching from its machine "
            "code): pip install 'nvidia-cuda-nvdisasm==13.*' (in gpupool's test extra)")
    return found[-1]


def disassemble(cubin: bytes) -> dict[str, str]:
    """Mangled kernel name -> its SASS text (``nvdisasm -c``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([str(nvdisasm()), "-c", f.name], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"nvdisasm failed: {done.stderr.strip()[:500]}")
    functions: dict[str, list[str]] = {}
    lines = None
    for line in done.stdout.splitlines():
        m = _FUNCTION.match(line)
        if m:
            lines = functions.setdefault(m.group(1), [])
        elif lines is not None:
            lines.append(line)
    return {name: "\n".join(body) for name, body in functions.items()}


@dataclass(frozen=True)
class Instruction:
    opcode: str  # with its suffixes: LDG.E.64.CONSTANT
    writes: tuple  # general registers written
    reads: tuple  # general registers read (addresses included)
    labelled: bool = False  # a branch target: a block starts here

    @property
    def is_global_load(self) -> bool:
        return self.opcode.split(".")[0] == "LDG"


def instructions(sass: str) -> list[Instruction]:
    """The instructions of one function's SASS, in address order."""
    out = []
    labelled = False
    for line in sass.splitlines():
        if _LABEL.match(line):
            labelled = True
            continue
        m = _INSTRUCTION.search(line)
        if not m:
            continue
        opcode, operands = m.group(1), [p.strip() for p in m.group(2).split(",") if p.strip()]
        base = opcode.split(".")[0]
        regs = [tuple(int(r) for r in _REGISTER.findall(p)) for p in operands]
        if base in NO_DESTINATION or base in PREDICATE_FIRST or not regs:
            written, read = (), sum(regs, ())
        else:
            d = 1 if base in SECOND_DESTINATION else 0
            written, read = regs[d] if d < len(regs) else (), sum(regs[:d] + regs[d + 1:], ())
            if base == "LDG" and written:
                width = next((LOAD_WIDTH[s] for s in opcode.split(".") if s in LOAD_WIDTH), 1)
                written = tuple(range(written[0], written[0] + width))
        out.append(Instruction(opcode, written, read, labelled))
        labelled = False
    return out


def load_blocks(code: list[Instruction]) -> list[tuple]:
    """The runs of global loads (see the module docstring) of each straight-line block of
    ``code`` that has any, in order. A block ends before a label and after a branch; so does a
    run (what is pending there depends on the path taken)."""
    blocks, runs, current, pending = [], [], 0, set()

    def end_run():
        nonlocal current, pending
        if current:
            runs.append(current)
        current, pending = 0, set()

    def end_block():
        nonlocal runs
        end_run()
        if runs:
            blocks.append(tuple(runs))
        runs = []

    for ins in code:
        if ins.labelled:
            end_block()
        if pending.intersection(ins.reads) or pending.intersection(ins.writes):
            end_run()
        if ins.is_global_load:
            current += 1
            pending.update(ins.writes)
        if ins.opcode.split(".")[0] in BRANCHES:
            end_block()
    end_block()
    return blocks


def load_runs(code: list[Instruction]) -> list[int]:
    """The runs of global loads of ``code``, block after block (:func:`load_blocks`)."""
    return [r for block in load_blocks(code) for r in block]


@dataclass(frozen=True)
class LoadBatching:
    """A kernel's global loads as compiled: per straight-line block, its runs."""

    blocks: tuple

    @property
    def runs(self) -> tuple:
        return tuple(r for block in self.blocks for r in block)

    @property
    def loads(self) -> int:
        return sum(self.runs)

    @property
    def batch(self) -> float:
        """Loads per run over the whole code (inf: no global load): n loads, each as likely
        to be any of the compiled ones, take n / batch waits on average (the harmonic mean of
        the run lengths, weighted by their loads)."""
        return _per_run(self.blocks)

    def batch_for(self, loads: int) -> float:
        """Loads per run of the blocks of the fewest global loads that are at least ``loads``
        (the code an epoch of that many loads ran straight through, some of its loads perhaps
        predicated off), or of the whole code when no block holds that many (see
        ``COMPILED_BATCH`` in :mod:`gpumodel.traffic`)."""
        fit = min((sum(b) for b in self.blocks if sum(b) >= loads), default=None)
        return _per_run([b for b in self.blocks if sum(b) == fit] or self.blocks)


def _per_run(blocks) -> float:
    runs = [r for block in blocks for r in block]
    return sum(runs) / len(runs) if runs else math.inf


def load_batching(compiled: Compiled) -> dict[str, LoadBatching]:
    """Name expression -> :class:`LoadBatching` of each kernel of ``compiled``."""
    code = disassemble(compiled.cubin)
    return {name: LoadBatching(tuple(load_blocks(instructions(code[mangled]))))
            for name, mangled in compiled.mangled.items()}
