"""Executed warp instructions of a launch: the kernel's sm_90 machine code (nvdisasm of the
NVRTC build, :mod:`gpumodel.sass`) walked with the global loads and stores its trace recorded
(:mod:`gpumodel.trace`).

The machine code is split into basic blocks (a block starts at a label or after a branch,
an ``EXIT`` or a ``RET``) joined by its branches: the control-flow graph. A warp runs one path
through it, from the entry to an ``EXIT``; every instruction on the path is issued once, a
predicated one too (as ``inst_executed`` counts). Which path: the trace tells, per warp, how
many global loads and stores of each width it executed (its warp requests: each is one
``LDG`` or ``STG`` of the warp), and how many window lines its loads walked
(:func:`gpumodel.traffic.line_counts`: runs of loads at a constant address step, runs of those
runs). Among the paths that make those accesses (of each class, at least the path's
unguarded ones and at most all of them: the trace has no record of an access whose predicate
is off, which the warp still issues) and run each *load loop* outside
the innermost once per line of its level (:func:`load_loop_levels`), the warp's is taken to
be the one of the fewest instructions: a flow of one unit through the graph (each block's
count is the flow through it, loops any number of times), found by a small integer program
(:func:`scipy.optimize.milp`) once per distinct count of accesses and lines. So a loop that
loads runs as often as the trace says, an outer loop once per row, unrolled copies of a loop
as far as they go and remainders for the rest, and code without loads (a division's slow
path, a loop that only moves a window's start) its shortest way. Two kinds of branch without
loads are not left to that choice:

* a branch whose predicate compares kernel parameters with constants only
  (:func:`parameter_branches`: a divisor given or counted, padding counted or not) goes the
  way the launch's parameters (:attr:`gpumodel.trace.Launch.parameters`) set it;
* a region where NVCC lets a warp's lanes diverge (``BSSY`` ... ``BSYNC``) and that makes no
  global access is charged whole, every side (:func:`_fold_convergent_regions`): lanes on
  different data (a window's taps compared, a tap in range or not) take every side, and the
  warp issues them all.

What this leaves out, so the count is a lower bound in these cases (``bench/issued.py`` holds
it against Nsight Compute's counts on a GPU):

* other branches without global accesses are taken their shortest way: a division's 64-bit
  slow path (the kernels' offsets fit in 32 bits), a skipped ``while`` (a window inside the
  input), the sides of a branch inside a region that loads, a loop whose lanes run different
  trip counts (the warp runs the most);
* the lines of a warp are counted, not the loads of each: the program may put more of a
  window's taps in one row's pass than the hardware does, to run an unrolled body more;
* a warp whose lanes diverge at a branch that the loads tell apart issues both sides; one
  path counts one side (the pooling kernels diverge so at the edges of a plane only);
* a subroutine call (``CALL``) costs the subroutine's shortest path to its ``RET``.

A region charged whole may be charged more than the warp issues where its lanes agree (a
global average's lanes past the end of a row), so the count can also exceed the GPU's.

When no path matches the trace's counts exactly (the host compiler made a different number
of accesses than the GPU's, e.g. two loads merged into one wider one), the path that misses
by the fewest accesses is taken and :attr:`IssueCount.unmatched` says by how many.
"""
from __future__ import annotations

import functools
import operator
import re
from dataclasses import dataclass, field

import numpy as np

from . import traffic

#: Opcodes (before their first ".") after which a basic block ends.
BLOCK_END = frozenset({"BRA", "EXIT", "RET", "BRX", "JMP", "JMX", "KILL"})
#: Global memory instructions the trace records (atomics are not recorded by the trace).
GLOBAL_LOADS = frozenset({"LDG", "LD"})
GLOBAL_STORES = frozenset({"STG", "ST"})
#: Bytes per lane by an access's size suffix (none: 32 bits).
ACCESS_BYTES = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}
#: Objective weight of one access the path misses or adds against the trace: larger than any
#: kernel's instruction count, so a path matching the trace always wins.
MISMATCH_COST = 1e6
#: Objective weight of one pass of a load loop more or fewer than the trace's lines: above
#: any pass's instructions, below an access missed.
PASS_MISMATCH_COST = 1e4

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_LABEL = re.compile(r"^\s*([.$][\w.$]*):\s*$")
_TARGET = re.compile(r"`\(([^)]+)\)")


@dataclass(frozen=True)
class SassInstruction:
    address: int
    opcode: str  # with its suffixes
    target: str | None  # the label a branch or call names
    guard: str  # its predicate, e.g. "@!P0" ("" or "@PT": none)
    operands: tuple

    @property
    def guarded(self) -> bool:
        """A predicate other than PT guards it."""
        return self.guard not in ("", "@PT")

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def name(self) -> str:
        """The opcode with its suffixes, and the special register a read of one names
        (``S2R SR_TID.X``): the pipe that runs it depends on which."""
        return f"{self.opcode} {self.operands[-1]}" if self.base == "S2R" else self.opcode

    def access(self) -> tuple[int, int] | None:
        """(write 0/1, bytes per lane) of a global load or store, else None."""
        if self.base not in GLOBAL_LOADS and self.base not in GLOBAL_STORES:
            return None
        size = next((ACCESS_BYTES[s] for s in self.opcode.split(".")[1:] if s in ACCESS_BYTES),
                    4)
        return int(self.base in GLOBAL_STORES), size


@dataclass(frozen=True)
class Block:
    start: int  # index of its first instruction
    instructions: tuple
    successors: tuple  # block indices; the exit is -1

    def accesses(self, guarded: bool | None = None) -> dict[tuple[int, int], int]:
        """Global accesses per class (write, bytes): all, or only the ``guarded`` ones (True)
        or the unguarded ones (False)."""
        out: dict[tuple[int, int], int] = {}
        for ins in self.instructions:
            a = ins.access()
            if a and (guarded is None or ins.guarded == guarded):
                out[a] = out.get(a, 0) + 1
        return out


@dataclass(frozen=True)
class ControlFlow:
    """A kernel's basic blocks (the entry is block 0), each with its cost in issued
    instructions (a call costing its subroutine's shortest path), by opcode too."""

    blocks: tuple
    opcodes: tuple  # SassInstruction.name of each; opcode_costs: each block's count of each
    opcode_costs: np.ndarray = field(compare=False)
    #: per loop level of the load loops, outermost first, the header blocks of that level's
    #: loops (see :func:`load_loop_levels`); the innermost level is left out
    pass_headers: tuple = ()
    #: the branches that compare kernel parameters only (:func:`parameter_branches`)
    parameter_branches: tuple = ()

    @functools.cached_property
    def costs(self) -> tuple:  # each block's: its instructions of every opcode
        return tuple(self.opcode_costs.sum(axis=1).tolist())

    def edges_not_taken(self, parameters: bytes) -> frozenset:
        """The edges (block, successor) that no thread of a launch with this parameter buffer
        (:func:`gpumodel.trace.parameter_buffer`) takes: the side of each parameter branch
        its comparison rules out."""
        out = set()
        for b in self.parameter_branches:
            taken = b.taken(parameters)
            if taken is None:
                continue
            target, fall = self.blocks[b.block].successors
            out.add((b.block, fall if taken else target))
        return frozenset(out)

    @property
    def instructions(self) -> int:
        """Static instructions of the kernel's own code (subroutines apart)."""
        return sum(len(b.instructions) for b in self.blocks)


def parse(sass: str) -> tuple[list[SassInstruction], dict[str, int]]:
    """The instructions of one function's SASS text (``nvdisasm -c``) in address order, and
    each label's instruction index."""
    code, labels = [], {}
    for line in sass.splitlines():
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = len(code)
            continue
        m = _LINE.search(line)
        if not m:
            continue
        guard = (m.group(2) or "").strip()
        target = _TARGET.search(m.group(4))
        code.append(SassInstruction(int(m.group(1), 16), m.group(3),
                                    target.group(1) if target else None, guard,
                                    tuple(o.strip() for o in m.group(4).split(","))))
    return code, labels


def _blocks(code, labels, start: int, end: int) -> list[Block]:
    """The basic blocks of ``code[start:end]`` (one function), successors as block indices."""
    leaders = {start} | {i for i in labels.values() if start <= i < end}
    for i in range(start, end):
        if code[i].base in BLOCK_END and i + 1 < end:
            leaders.add(i + 1)
    starts = sorted(leaders)
    index = {s: k for k, s in enumerate(starts)}
    blocks = []
    for k, s in enumerate(starts):
        stop = starts[k + 1] if k + 1 < len(starts) else end
        body = tuple(code[s:stop])
        last = body[-1]
        nxt = [k + 1] if k + 1 < len(starts) else []
        if last.base in ("BRX", "JMX", "JMP"):
            raise ValueError(f"gpumodel.instructions: indirect branch {last.opcode} at "
                             f"{last.address:#x} is not modeled")
        if last.base == "BRA":
            succ = [index[labels[last.target]]] + (nxt if last.guarded else [])
        elif last.base in ("EXIT", "RET", "KILL"):
            succ = [-1] + (nxt if last.guarded else [])
        else:
            succ = nxt
        blocks.append(Block(s, body, tuple(dict.fromkeys(succ))))
    return blocks


def control_flow(sass: str) -> ControlFlow:
    """The control-flow graph of one kernel's SASS text (its subroutines, labelled ``$...``,
    after its own code, costed into the calls)."""
    code, labels = parse(sass)
    subroutines = sorted(i for name, i in labels.items() if name.startswith("$"))
    end = subroutines[0] if subroutines else len(code)
    bounds = {i: (subroutines[k + 1] if k + 1 < len(subroutines) else len(code))
              for k, i in enumerate(subroutines)}
    opcodes = tuple(sorted({i.name for i in code}))
    column = {name: k for k, name in enumerate(opcodes)}

    @functools.lru_cache(maxsize=None)
    def subroutine_mix(name: str) -> np.ndarray:
        first = labels[name]
        blocks = _blocks(code, labels, first, bounds[first])
        mixes = np.array([mix_of(b) for b in blocks])
        return _solve(blocks, tuple(mixes.sum(axis=1)), ())[2] @ mixes

    def mix_of(block: Block) -> np.ndarray:
        mix = np.zeros(len(opcodes))
        for i in block.instructions:
            mix[column[i.name]] += 1
            if i.base == "CALL":
                mix += subroutine_mix(i.target)
        return mix

    blocks = _blocks(code, labels, 0, end)
    mixes = _fold_convergent_regions(blocks, labels) @ np.array([mix_of(b) for b in blocks])
    return ControlFlow(tuple(blocks), opcodes, mixes, load_loop_levels(blocks),
                       parameter_branches(blocks))


#: Offset of a kernel's first parameter in constant bank 0 (sm_90).
PARAMETER_BASE = 0x210
_CONSTANT = re.compile(r"^c\[0x0\]\[(0x[0-9a-f]+)\]$")
_COMPARISONS = {"EQ": operator.eq, "NE": operator.ne, "LT": operator.lt, "LE": operator.le,
                "GT": operator.gt, "GE": operator.ge}
#: Opcodes whose last operand is a predicate they read (not write).
_READS_LAST_PREDICATE = ("ISETP", "UISETP", "FSETP", "SEL", "USEL", "FSEL", "PLOP3")


@dataclass(frozen=True)
class ParameterBranch:
    """A conditional branch or exit whose predicate compares kernel parameters and constants
    only (``ISETP``), so that every thread of a launch goes the same way."""

    block: int  # the block it ends
    when: bool  # taken when the comparison holds (else when it fails)
    compare: str  # EQ, NE, LT, LE, GT, GE
    unsigned: bool
    operands: tuple  # each an int, or ("parameter", offset in the constant bank)

    def taken(self, parameters: bytes) -> bool | None:
        """Whether the launch with this parameter buffer takes it; None: a parameter it
        reads lies outside the buffer."""
        values = []
        for o in self.operands:
            if isinstance(o, tuple):
                at = o[1] - PARAMETER_BASE
                if at < 0 or at + 4 > len(parameters):
                    return None
                o = int.from_bytes(parameters[at:at + 4], "little", signed=not self.unsigned)
            elif self.unsigned:
                o &= 0xFFFFFFFF
            values.append(o)
        return _COMPARISONS[self.compare](*values) == self.when


def parameter_branches(blocks) -> tuple:
    """The :class:`ParameterBranch` es among the blocks' closing branches and exits: the
    predicate set by an ``ISETP`` of immediates and uniform registers, each loaded
    (``ULDC``) from a kernel parameter, each definition the nearest before its use and in a
    block that dominates it, with no loop around one and not the other."""
    code = [(k, i) for k, b in enumerate(blocks) for i in b.instructions]  # index: address order
    dominators = _dominators(blocks)
    back = [(s, b) for b, block in enumerate(blocks) for s in block.successors if 0 <= s <= b]

    def reaches(d: int, u: int) -> bool:  # the definition in block d reaches its use in u
        return d in dominators[u] and all(
            b < d or s > u or (s <= d and b >= u) for s, b in back)

    def definition(n: int, register: str) -> int | None:
        """Index in code of the nearest instruction before n that may write ``register`` (a
        register: its first operand, or the pair a 64-bit ULDC loads; a predicate: any
        operand but the predicate read last by a compare or select)."""
        predicate = "P" in register
        for j in range(n - 1, -1, -1):
            ins = code[j][1]
            ops = [o.lstrip("!") for o in ins.operands]
            if not predicate:
                if ops[0] == register or (ins.base == "ULDC" and ".64" in ins.opcode
                                          and _next_register(ops[0]) == register):
                    return j
                continue
            where = [i for i, o in enumerate(ops) if o == register]
            if where and not (ins.base in _READS_LAST_PREDICATE and where == [len(ops) - 1]):
                return j
        return None

    def operand(n: int, text: str):
        if text in ("RZ", "URZ"):
            return 0
        if re.fullmatch(r"-?0x[0-9a-f]+|-?\d+", text):
            return int(text, 0)
        j = definition(n, text) if text.startswith("UR") else None
        if j is None or not reaches(code[j][0], code[n][0]):
            return None
        ins = code[j][1]
        m = _CONSTANT.match(ins.operands[1]) if ins.base == "ULDC" else None
        if not m:
            return None
        return ("parameter", int(m.group(1), 16) + 4 * (ins.operands[0] != text))

    out = []
    for k, block in enumerate(blocks):
        last = block.instructions[-1]
        if last.base not in ("BRA", "EXIT") or len(block.successors) != 2 or not last.guarded:
            continue
        predicate = last.guard.lstrip("@!")
        j = definition(block.start + len(block.instructions) - 1, predicate)
        if j is None or not reaches(code[j][0], k):
            continue
        ins = code[j][1]
        parts = ins.opcode.split(".")
        if (ins.base not in ("ISETP", "UISETP") or len(ins.operands) != 5
                or ins.operands[0] != predicate or ins.operands[1] not in ("PT", "UPT")
                or ins.operands[4] not in ("PT", "UPT") or "AND" not in parts
                or not _COMPARISONS.keys() & set(parts)):
            continue
        a, b = operand(j, ins.operands[2]), operand(j, ins.operands[3])
        if a is None or b is None:
            continue
        compare = next(p for p in parts if p in _COMPARISONS)
        out.append(ParameterBranch(k, not last.guard.startswith("@!"), compare,
                                   "U32" in parts, (a, b)))
    return tuple(out)


def _next_register(name: str) -> str:
    m = re.fullmatch(r"(U?R)(\d+)", name)
    return f"{m.group(1)}{int(m.group(2)) + 1}" if m else ""


def _dominators(blocks) -> list[set]:
    """Each block's dominators (itself included), block 0 the entry."""
    preds = [[] for _ in blocks]
    for b, block in enumerate(blocks):
        for s in block.successors:
            if s >= 0:
                preds[s].append(b)
    every = set(range(len(blocks)))
    dom = [{0}] + [set(every) for _ in blocks[1:]]
    changed = True
    while changed:
        changed = False
        for b in range(1, len(blocks)):
            new = {b} | (set.intersection(*(dom[p] for p in preds[b])) if preds[b] else set())
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


def _fold_convergent_regions(blocks, labels) -> np.ndarray:
    """The matrix that charges each branching region making no global access whole to the
    block that opens it (row: the block charged, column: the block whose instructions). NVCC
    opens a region where a warp's lanes may diverge with ``BSSY`` (closed by the ``BSYNC``
    before its label): a warp runs every side that one of its lanes takes, and with lanes on
    different data (a window's taps compared, a tap in range or not, an empty window) that
    is every side, except a block that calls a subroutine (a division's slow path, which no
    lane takes on ordinary operands).

    A region is folded only if it holds no global access (the trace then picks the path), no
    exit, no backward branch (a loop's count is unknown) and no region of its own other than
    a slow path's (a region around a call). A region holding others chooses among whole
    alternatives (a divisor given or counted, a tile whole or cut), which the lanes of a
    warp take alike: those are left to the shortest path, their inner regions folded."""
    charge = np.eye(len(blocks))
    starts = [b.start for b in blocks]

    def inside(first: int, label: str) -> list:
        return [k for k, s in enumerate(starts) if first < s < labels[label]]

    def openings(ks) -> list:
        return [(blocks[k].start, i.target) for k in ks for i in blocks[k].instructions
                if i.base == "BSSY" and i.target in labels]

    def calls(k: int) -> bool:
        return any(i.base == "CALL" for i in blocks[k].instructions)

    def slow_path(first: int, label: str) -> bool:
        ks = inside(first, label)
        return any(calls(k) for k in ks) and not openings(ks)

    folded = set()
    for opener, block in enumerate(blocks):
        if opener in folded:
            continue
        for ins in block.instructions:
            if ins.base != "BSSY" or ins.target not in labels:
                continue
            ks = inside(block.start, ins.target)
            if not ks or any(
                    blocks[k].accesses() or k in folded
                    or any(i.base in ("EXIT", "RET", "KILL") for i in blocks[k].instructions)
                    or any(0 <= s <= k for s in blocks[k].successors)
                    for k in ks) or not all(slow_path(*o) for o in openings(ks)):
                continue
            for k in ks:
                if not calls(k):
                    charge[opener] += charge[k]
                charge[k] = 0
            folded.update(ks)
    return charge


def load_loop_levels(blocks) -> tuple:
    """The header blocks of the *load loops* by nesting level, outermost first, the innermost
    level left out. A loop is a back edge's span of blocks (header to branch, in address
    order, as NVCC lays loops out); a load loop is one that holds a global load and no global
    store (a store marks the loop over outputs). Levels: how many load loops hold a loop. The
    innermost level walks the taps of a window line (however unrolled: the load count fixes
    it); each level outside it walks lines, planes... whose counts the trace gives
    (:func:`line_counts`)."""
    spans = {}
    for b, block in enumerate(blocks):
        for s in block.successors:
            if 0 <= s <= b:
                spans[s] = max(spans.get(s, s), b)
    def holds(h, write):
        return any(w == write for k in range(h, spans[h] + 1)
                   for w, _ in blocks[k].accesses())
    loops = [(h, e) for h, e in spans.items() if holds(h, 0) and not holds(h, 1)]
    depth = {h: sum(1 for g, f in loops if g <= h and e <= f and (g, f) != (h, e))
             for h, e in loops}
    levels = max(depth.values(), default=-1) + 1
    return tuple(tuple(sorted(h for h in depth if depth[h] == d)) for d in range(levels - 1))


def _solve(blocks, costs, targets, passes=(), not_taken=frozenset()) -> tuple:
    """(instructions, accesses missed, runs of each block) of the cheapest unit flow from
    block 0 to the exit whose global accesses meet ``targets`` ((class, count) pairs; class
    (write, bytes): a count between the flow's unguarded accesses and all of them) and whose
    loop headers run ``passes`` ((header blocks, count) pairs) times, as nearly as they can
    (a missed pass costs PASS_MISMATCH_COST), and that takes no edge of ``not_taken``."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    edges = [(b, s) for b, block in enumerate(blocks) for s in block.successors]
    n_edges = len(edges)
    classes = [k for k, _ in targets]
    n_vars = n_edges + 2 * len(classes) + 2 * len(passes)
    # conservation: flow out of a block = flow into it (+1 for the entry)
    rows = np.zeros((len(blocks), n_vars))
    for e, (b, s) in enumerate(edges):
        rows[b, e] += 1
        if s >= 0:
            rows[s, e] -= 1
    bound = np.zeros(len(blocks))
    bound[0] = 1
    constraints = [LinearConstraint(rows, bound, bound)]
    objective = np.zeros(n_vars)
    for e, (b, _) in enumerate(edges):
        objective[e] = costs[b]
    if classes:
        # a path's accesses of a class lie between its unguarded ones and all of them: the
        # trace has no record of an access predicated off
        least, most = np.zeros((len(classes), n_vars)), np.zeros((len(classes), n_vars))
        sure = [block.accesses(guarded=False) for block in blocks]
        made = [block.accesses() for block in blocks]
        for e, (b, _) in enumerate(edges):
            for k, cls in enumerate(classes):
                least[k, e] = sure[b].get(cls, 0)
                most[k, e] = made[b].get(cls, 0)
        for k in range(len(classes)):
            least[k, n_edges + 2 * k] = -1
            most[k, n_edges + 2 * k + 1] = 1
        want = np.array([c for _, c in targets], float)
        constraints.append(LinearConstraint(least, -np.inf, want))
        constraints.append(LinearConstraint(most, want, np.inf))
        objective[n_edges:n_edges + 2 * len(classes)] = MISMATCH_COST
    if passes:
        first = n_edges + 2 * len(classes)
        runs = np.zeros((len(passes), n_vars))
        for k, (headers, _) in enumerate(passes):
            for e, (b, _) in enumerate(edges):
                runs[k, e] = b in headers
            runs[k, first + 2 * k] = 1
            runs[k, first + 2 * k + 1] = -1
        want = np.array([c for _, c in passes], float)
        constraints.append(LinearConstraint(runs, want, want))
        objective[first:] = PASS_MISMATCH_COST
    upper = np.full(n_vars, np.inf)
    upper[[e for e, edge in enumerate(edges) if edge in not_taken]] = 0
    done = milp(objective, constraints=constraints, integrality=np.ones(n_vars),
                bounds=Bounds(0, upper))
    if done.x is None:
        raise RuntimeError(f"gpumodel.instructions: no path through the kernel ({done.message})")
    flow = np.round(done.x)
    runs = np.zeros(len(blocks))
    np.add.at(runs, [b for b, _ in edges], flow[:n_edges])
    return (float(objective[:n_edges] @ flow[:n_edges]),
            float(flow[n_edges:n_edges + 2 * len(classes)].sum()), runs)


@dataclass(frozen=True)
class IssueCount:
    """Executed warp instructions of one traced launch."""

    warp_instructions: float
    warps: int
    unmatched: float  # accesses of the trace no path of the machine code makes, over warps
    paths: dict  # warp accesses ((class, count), ...) -> (warps, instructions per warp)
    opcodes: dict  # opcode (SassInstruction.name) -> warp instructions


def count(launch, flow: ControlFlow) -> IssueCount:
    """The executed warp instructions of ``launch`` (a :class:`gpumodel.trace.Launch`) whose
    kernel's machine code is ``flow`` (see the module docstring). A warp with no global access
    (every lane out of range) takes the shortest path to an exit."""
    r = traffic.warp_requests(launch)
    warps_per_block = -(-launch.threads_per_block // traffic.WARP)
    warps = launch.recorded_blocks * warps_per_block
    warp_id = r["block"] * warps_per_block + r["warp"]
    per_warp: dict[int, list] = {}
    if len(warp_id):
        cls = r["write"] * 64 + r["size"]
        keys, counts = np.unique(np.stack([warp_id, cls]), axis=1, return_counts=True)
        for w, c, n in zip(keys[0].tolist(), keys[1].tolist(), counts.tolist()):
            per_warp.setdefault(w, []).append(((c // 64, c % 64), n))
    levels = len(flow.pass_headers)
    line_warps, lines = traffic.line_counts(launch, levels)
    by_warp = dict(zip(line_warps.tolist(), map(tuple, lines.tolist())))
    signatures: dict[tuple, int] = {}
    for w, items in per_warp.items():
        sig = (tuple(items), by_warp.get(w, (0,) * levels))
        signatures[sig] = signatures.get(sig, 0) + 1
    silent = warps - sum(signatures.values())
    if silent:
        empty = ((), (0,) * levels)
        signatures[empty] = signatures.get(empty, 0) + silent
    paths, total, missed = {}, 0.0, 0.0
    mix = np.zeros(len(flow.opcodes))
    not_taken = flow.edges_not_taken(launch.parameters)
    for sig, n in signatures.items():
        instructions, miss, runs = _path(flow, sig, not_taken)
        paths[sig] = (n, instructions)
        total += n * instructions
        missed += n * miss
        mix += n * (runs @ flow.opcode_costs)
    return IssueCount(total, warps, missed, paths, dict(zip(flow.opcodes, mix.tolist())))


def _path(flow: ControlFlow, signature: tuple, not_taken=frozenset()) -> tuple:
    """(instructions, accesses missed, runs of each block) of a warp making ``signature``'s
    accesses (and walking its lines, :func:`gpumodel.traffic.line_counts`): per class
    (write, bytes) if some path matches that, else per direction, bytes apart."""
    signature, lines = signature
    # the outermost pass level walks the trace's highest line level
    passes = tuple((headers, n) for headers, n in zip(flow.pass_headers, lines[::-1]))
    instructions, missed, runs = _solve(flow.blocks, flow.costs, signature, passes, not_taken)
    if missed:
        merged: dict[tuple, int] = {}
        for (write, size), n in signature:
            merged[write] = merged.get(write, 0) + n
        coarse = _solve(_by_direction(flow.blocks), flow.costs, tuple(
            ((w, 0), n) for w, n in sorted(merged.items())), passes, not_taken)
        if coarse[1] < missed:
            instructions, missed, runs = coarse
    return instructions, missed, runs


@functools.lru_cache(maxsize=64)
def _by_direction(blocks):
    """``blocks`` with every access's width set to 0 (accesses counted by direction)."""
    def widthless(ins):
        a = ins.access()
        if a is None:
            return ins
        return _Widthless(ins.address, ins.opcode, ins.target, ins.guard, ins.operands)
    return tuple(Block(b.start, tuple(widthless(i) for i in b.instructions), b.successors)
                 for b in blocks)


@dataclass(frozen=True)
class _Widthless(SassInstruction):
    def access(self):
        a = super().access()
        return None if a is None else (a[0], 0)
