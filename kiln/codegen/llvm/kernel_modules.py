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
