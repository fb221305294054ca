"""Which kernels LLVM compiles together, as one module (``engine.join_modules``): a module's set-up
(pass managers, analyses, the object file) is then paid once for several kernels.

>>> from kiln.codegen.llvm.engine import LIGHT, TINY
>>> grouped([LIGHT + "a", TINY + "b", LIGHT + "c", LIGHT + "d"])
[[0, 3], [2], [1]]
"""

from __future__ import annotations

#: Kernels LLVM compiles in one module at most (``engine.NEXT_MODULE``: a module's set-up is paid once).
#: The kernels of a tier go to two modules at least, though: the two compile workers share a request
#: by modules (``worker_pool``), and one module would leave one of them idle.
KERNELS_PER_MODULE = 8


def grouped(texts: list[str]) -> list[list[int]]:
    """The kernels of module texts ``texts`` (by position) in groups compiled as one module each:
    kernels of one tier (their first line: ``backend._tier_line``) together, at most ``KERNELS_PER_MODULE``
    to a group and two groups a tier where it has two kernels, the groups of a tier about equally
    long (the longest text to the shortest group)."""
    tiers: dict[str, list[int]] = {}
    for k, text in enumerate(texts):
        tiers.setdefault(text.split("\n", 1)[0], []).append(k)
    groups: list[list[int]] = []
    for members in tiers.values():
        count = max(-(-len(members) // KERNELS_PER_MODULE), min(len(members), 2))
        mine: list[list[int]] = [[] for _ in range(count)]
        sizes = [0] * count
        for k in sorted(members, key=lambda k: -len(texts[k])):
            smallest = sizes.index(min(sizes))
            mine[smallest].append(k)
            sizes[smallest] += len(texts[k])
        groups += [sorted(group) for group in mine if group]
    return groups


#: LLVM's time on a kernel, roughly, per 1000 characters of its LLVM IR, by tier (its first line):
#: measured (CPU time, each of DCGAN's 60 kernels alone) 2-8 ms for the full pipeline, 2-4 ms light,
#: 0.2-0.6 ms tiny.
_MS_PER_1000_CHARS = {"; kiln: light": 2.5, "; kiln: tiny": 0.4}
_FULL_MS_PER_1000_CHARS = 4.0

#: LLVM's time (ms, by ``llvm_ms``) at which a module of a compile that starts while the rest is
#: generated (``Modules``) is full: big enough that its set-up (about 2 ms) stays small, small
#: enough that LLVM starts early and two workers share the work evenly.
MODULE_MS = 40.0


def llvm_ms(text: str) -> float:
    """LLVM's time on the kernel of LLVM IR ``text`` (its module), roughly, in milliseconds."""
    tier = text.split("\n", 1)[0]
    return len(text) / 1000 * _MS_PER_1000_CHARS.get(tier, _FULL_MS_PER_1000_CHARS)


class Modules:
    """Kernels put into modules as they are generated, for a compile that starts meanwhile
    (``compile_stream``): ``add`` says when a module is full (``KERNELS_PER_MODULE`` kernels, or
    ``MODULE_MS`` of LLVM's time), ``rest`` groups the kernels left as ``grouped`` does, the costliest
    module first. With ``first_alone`` (a program of more kernels than a module takes), the first
    kernel is a module of its own: LLVM then starts on it at once rather than idle while the generator
    makes the rest of a first module (DCGAN's first module of eight kernels was full 20-40 ms into its
    ~130 ms of generation, LLVM's core idle until then), for one module's set-up (1-2 ms of LLVM's time).

    >>> from kiln.codegen.llvm.engine import LIGHT
    >>> modules = Modules(first_alone=True)
    >>> [modules.add(k, LIGHT + "x" * 8000) for k in range(4)]
    [[0], None, [1, 2], None]
    >>> modules.rest()
    [[3]]
    """

    def __init__(self, first_alone: bool = False) -> None:
        self._open: dict[str, tuple[list[int], list[str]]] = {}  # tier -> its kernels not yet sent, and texts
        self._first = first_alone  # the next kernel is the first, and goes alone

    def add(self, k: int, text: str) -> list[int] | None:
        """Kernel ``k`` (LLVM IR ``text``) into its tier's open module: the module when it is full, else None."""
        if self._first:
            self._first = False
            return [k]
        members, texts = self._open.setdefault(text.split("\n", 1)[0], ([], []))
        members.append(k)
        texts.append(text)
        if len(members) < KERNELS_PER_MODULE and sum(map(llvm_ms, texts)) < MODULE_MS:
            return None
        del self._open[text.split("\n", 1)[0]]
        return members

    def rest(self) -> list[list[int]]:
        """The kernels no full module took, grouped (``grouped``), the costliest module first."""
        members = [k for ks, _ in self._open.values() for k in ks]
        texts = [t for _, ts in self._open.values() for t in ts]
        self._open.clear()
        groups = sorted(grouped(texts), key=lambda group: -sum(llvm_ms(texts[i]) for i in group))
        return [[members[i] for i in group] for group in groups]
