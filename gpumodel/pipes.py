"""Which execution pipe of an SM sub-partition runs each sm_90 instruction, and how many warp
instructions per clock each pipe takes.

A sub-partition's scheduler issues one warp instruction per clock, but its pipes are
narrower: 16 lanes of integer and logic (``alu``), 16 + 16 lanes of 32-bit floating point
(``fmaheavy`` and ``fmalite``: an FFMA goes to either, an IMAD to the heavy one only), 16 of
64-bit floating point, 4 of conversions and special functions (``xu``). A kernel made mostly of
one pipe's instructions waits on that pipe before the scheduler: an integer- and
compare-heavy pooling kernel issues at half rate.

The pipes and what each runs are those of Nsight Compute's ``smsp__inst_executed_pipe_*``
metrics (its Kernel Profiling Guide, "Pipelines"); the rates are the CUDA C++ Programming
Guide's arithmetic throughputs for compute capability 9.0 (results per clock per SM, over four
sub-partitions of 32 lanes). :func:`pipe_of` was checked opcode by opcode against ncu's
per-pipe counts of gpupool's kernels on an H200 (``bench/results/issued-h200-*.json``,
``tests/test_instructions.py``).
"""
from __future__ import annotations

#: Warp instructions per clock per sub-partition of each pipe whose rate is below the
#: scheduler's (CUDA C++ Programming Guide, arithmetic instruction throughput, compute
#: capability 9.0: 64 results per clock per SM for 32-bit integer add, compare, min/max,
#: shift, logic and multiply-add, and for 64-bit floating point; 16 for conversions and
#: special functions; 128 for 32-bit floating point, both FMA pipes together).
RATES = {"alu": 0.5, "fmaheavy": 0.5, "fp64": 0.5, "xu": 0.125}
#: Pipes that take one warp instruction per clock or that a pooling kernel hardly uses: the
#: scheduler's rate bounds them.
OTHER_PIPES = ("fma", "lsu", "adu", "cbu", "uniform", "other")
PIPES = tuple(RATES) + OTHER_PIPES

_BY_BASE = {
    # integer add, compare, select, logic, shifts, min/max (paired float16 too, VHMNMX as
    # ncu counts it), predicates, fp32->fp16 packing
    **dict.fromkeys((
        "IADD3", "IABS", "ISETP", "FSETP", "HSETP2", "ISET", "FSET", "SEL", "FSEL", "LOP3",
        "SHF", "LEA", "PRMT", "IMNMX", "VIMNMX", "VHMNMX", "FMNMX", "HMNMX2", "PLOP3", "P2R",
        "R2P", "BMSK", "SGXT", "F2FP", "FCHK", "VOTE", "CS2R", "MOV", "BREV", "FLO", "POPC"),
        "alu"),
    # integer multiply(-add), and the add NVCC issues there to spare the ALU: the heavy FMA
    # pipe only
    **dict.fromkeys(("IMAD", "IMUL", "IDP", "VIADD"), "fmaheavy"),
    # 32-bit and paired 16-bit floating point: either FMA pipe
    **dict.fromkeys(("FFMA", "FADD", "FMUL", "HFMA2", "HADD2", "HMUL2", "FSWZADD"), "fma"),
    **dict.fromkeys(("DFMA", "DADD", "DMUL", "DSETP", "DMNMX"), "fp64"),
    # conversions and special functions
    **dict.fromkeys(("F2I", "I2F", "F2F", "I2I", "FRND", "MUFU", "I2FP", "F2IP"), "xu"),
    **dict.fromkeys(("LDG", "STG", "LD", "ST", "LDS", "STS", "LDL", "STL", "ATOM", "ATOMG",
                     "ATOMS", "RED", "REDG", "SHFL", "MEMBAR", "LDSM", "ERRBAR"), "lsu"),
    # constants, block ids, barriers
    **dict.fromkeys(("LDC", "S2UR", "BAR"), "adu"),
    **dict.fromkeys(("BSSY", "BSYNC", "WARPSYNC", "CALL", "RET", "EXIT", "BMOV", "YIELD"),
                    "cbu"),
}


#: Opcodes no pipe of ncu's counts: uniform constant loads, branches.
_NO_PIPE = frozenset(("ULDC", "BRA", "NOP"))


def pipe_of(name: str) -> str:
    """The pipe that runs an instruction, by its name (its opcode, with or without suffixes;
    a special register's read with the register, ``SassInstruction.name``):
    one of :data:`PIPES`. A thread's id comes through the LSU, a block's through the ADU."""
    opcode, _, register = name.partition(" ")
    base = opcode.split(".")[0]
    if base == "S2R":
        return "adu" if register.startswith("SR_CTAID") else "lsu"
    if base in _NO_PIPE:
        return "other"
    if base.startswith("U") and base not in _BY_BASE:
        return "uniform"
    return _BY_BASE.get(base, "other")


def by_pipe(opcodes: dict) -> dict[str, float]:
    """Warp instructions per pipe of a count per opcode."""
    out = dict.fromkeys(PIPES, 0.0)
    for opcode, n in opcodes.items():
        out[pipe_of(opcode)] += n
    return out



def issue_clocks(warp_instructions: float, per_pipe: dict | None) -> dict[str, float]:
    """Clocks of one sub-partition for ``warp_instructions`` split over pipes as ``per_pipe``
    (:func:`by_pipe`; None: not split), by what takes them: the scheduler (one per clock),
    each pipe of :data:`RATES` (its rate), and the two FMA pipes together (one per clock)."""
    clocks = {"scheduler": warp_instructions}
    if per_pipe:
        clocks.update({p: per_pipe.get(p, 0.0) / r for p, r in RATES.items()})
        clocks["fma"] = per_pipe.get("fma", 0.0) + per_pipe.get("fmaheavy", 0.0)
    return clocks
