"""Shrinking a finding to a small repro, and the signature that classifies it.

``shrink`` deletes what the finding does not need -- caller steps, results, a scenario's
between-call actions, statements, then inputs nothing reads -- keeping each deletion only when
the same kind of finding remains.
``signature`` names the class: which comparison failed (or the crash's exception) and the ops
of the shrunk program.
"""

from __future__ import annotations

import re
from dataclasses import replace

from .runner import Outcome, run


def kind(outcome: Outcome) -> str:
    """What failed, without the ops: the comparison and what it compared, or the crash's error
    (prefixed by the program's kind for scenarios)."""
    prefix = "" if outcome.program.kind == "ops" else f"{outcome.program.kind}: "
    if outcome.crash is not None:
        stage, _, error = outcome.crash.partition(": ")
        return f"{prefix}crash ({stage}) {error.split(':')[0]}"
    d = outcome.difference
    where = re.split(r"[ \[]", re.sub(r"\b(a|G)\d+\b", "", d.where))[0]
    text = f"{prefix}{d.check} of {where}"
    if d.check == "aliasing":
        text += ": " + re.sub(r"\d+", "#", d.detail)
    if ".grad" in d.where:
        text += " .grad"
    return text


def signature(outcome: Outcome) -> str:
    p = outcome.program
    ops = " ".join(sorted(set(p.ops) | set(getattr(p, "action_ops", ())))) or "(no ops)"
    caller = [
        f for f, on in (("backward", p.backward_outside), ("mutates a result", p.mutate_result is not None)) if on
    ]
    return f"{kind(outcome)} | {ops}" + (f" | caller {'+'.join(caller)}" if caller else "")


def _outputs(program) -> list[str]:
    return program.body[-1].removeprefix("return ").rstrip(",").split(", ")


def _unused(program):
    """The program without arguments and captured tensors that nothing reads."""
    text = "\n".join(program.body + program.inputs)
    used = lambda n: sum(1 for _ in re.finditer(rf"\b{n}\b", text)) > (1 if n in program.arg_names else 0)  # noqa: E731
    args = [n for n in program.arg_names if used(n)]
    caps = [n for n in program.cap_names if re.search(rf"\b{n}\b", "\n".join(program.body))]
    keep = lambda line, names: line.split(" = ")[0] in names  # noqa: E731
    return replace(program, arg_names=args, cap_names=caps, inputs=[s for s in program.inputs if keep(s, args)],
                   captures=[s for s in program.captures if keep(s, caps)])  # fmt: skip


def shrink(outcome: Outcome, backend: str = "llvm", budget: int = 60) -> Outcome:
    """A smaller program with the same kind of finding (``kind``), within ``budget`` runs."""
    target = kind(outcome)
    best = outcome

    def attempt(program) -> bool:
        nonlocal best, budget
        if budget <= 0:
            return False
        budget -= 1
        trial = run(program, backend)
        if trial.finding and kind(trial) == target:
            best = trial
            return True
        return False

    p = best.program
    if p.backward_outside:
        attempt(replace(p, backward_outside=False))
    if best.program.mutate_result is not None:
        attempt(replace(best.program, mutate_result=None))
    for i in range(len(getattr(best.program, "actions", ())) - 1, -1, -1):  # a scenario's between-call actions
        p = best.program
        attempt(
            replace(p, actions=p.actions[:i] + p.actions[i + 1 :], action_ops=p.action_ops[:i] + p.action_ops[i + 1 :])
        )
    outputs = _outputs(best.program)
    if len(outputs) > 1:
        for j, out in enumerate(outputs):
            p = best.program
            mutate = 0 if p.mutate_result == j else None
            if attempt(replace(p, body=[*p.body[:-1], f"return {out}"], mutate_result=mutate)):
                break
    changed = True
    while changed and budget > 0:
        changed = False
        for i in range(len(best.program.body) - 2, -1, -1):
            p = best.program
            if i < len(p.body) - 1 and attempt(
                replace(p, body=p.body[:i] + p.body[i + 1 :], ops=p.ops[:i] + p.ops[i + 1 :])
            ):
                changed = True
    smaller = _unused(best.program)
    if smaller.arg_names != best.program.arg_names or smaller.cap_names != best.program.cap_names:
        attempt(smaller)
    return best
