"""Python state a trace used to freeze into a stale constant, through paths the guards did not follow.

Each case was silently wrong before (the compiled call replayed the value its trace read, or skipped
the store its trace made, and said nothing): a module found by a computed name or first imported in
the call, a library's config object held in a dict or list, a ``functools.lru_cache``'d helper, an
object whose ``__class__`` is set. As in ``test_python_state_guards.py``, the state changes between
calls and the compiled function is compared with the same function run eagerly on the same state,
call by call; then the reason (a new trace naming the state, or eager calls with the store said) is
checked. Last, floats annealed in a helper's closure, a slot or a deque: read at each call, as a
dict's are (``state_floats.py``), rather than a trace per value until the recompile limit.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib
import os
import sys
import threading
import types

import numpy as np
import pytest

import kiln
from kiln.frontend.jit import reads

from .helpers import compiled_calls
from .test_python_state_guards import _against_eager, _reasons
from .test_state_floats import VALUES, _details
from .test_state_floats import _against_eager as _floats_against_eager

_MODULE = "kiln_test_holes_config"
_OWN_SCALE = 1  # read by this module's own name: ``getattr(sys.modules[__name__], "_OWN_SCALE")``


@pytest.fixture
def config(tmp_path, monkeypatch):
    """A module of the user's program, not imported yet (removed from ``sys.modules`` after the test)."""
    (tmp_path / f"{_MODULE}.py").write_text("SCALE = 1\nCALLS = 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, _MODULE, raising=False)
    yield
    sys.modules.pop(_MODULE, None)


def _imported():
    return importlib.import_module(_MODULE)


# ---------------------------------------------------------------------- a module found by a computed name
def _set_own_scale(i):
    global _OWN_SCALE
    _OWN_SCALE = i + 1


FOUND_BY_NAME = {
    "sys.modules": lambda x: x * sys.modules[_MODULE].SCALE,
    "importlib.import_module": lambda x: x * importlib.import_module(_MODULE).SCALE,
    "__import__": lambda x: x * __import__(_MODULE).SCALE,
    "getattr of the function's own module": lambda x: x * getattr(sys.modules[__name__], "_OWN_SCALE"),  # noqa: B009
}


@pytest.mark.parametrize("how", list(FOUND_BY_NAME))
def test_a_module_found_by_a_computed_name(how, config):
    module = _imported()

    def make():
        module.SCALE = 1
        own = how == "getattr of the function's own module"
        return FOUND_BY_NAME[how], (_set_own_scale if own else lambda i: setattr(module, "SCALE", i + 1))

    f = _against_eager(make)
    name = "_OWN_SCALE" if how == "getattr of the function's own module" else "SCALE"
    assert len(compiled_calls(f)) == 4 and f"{name} changed: 1 -> 2" in _reasons(f)[1], _reasons(f)


_NAME = "SCALE"

BY_COMPUTED_ATTRIBUTE = {
    "vars(module)[key]": lambda module: lambda x: x * vars(module)["SCALE"],
    "module.__dict__[key]": lambda module: lambda x: x * module.__dict__["SCALE"],
    "getattr(module, name)": lambda module: lambda x: x * getattr(module, _NAME),
    "getattr(module, an expression)": lambda module: lambda x: x * getattr(module, "scale".upper()),
}


@pytest.mark.parametrize("how", list(BY_COMPUTED_ATTRIBUTE))
def test_a_modules_global_read_by_a_computed_name(how, config):
    module = _imported()

    def make():
        module.SCALE = 1
        return BY_COMPUTED_ATTRIBUTE[how](module), lambda i: setattr(module, "SCALE", i + 1)

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and f"{_MODULE}.SCALE changed: 1 -> 2" in _reasons(f)[1], _reasons(f)


def test_only_sys_modules_counts_as_finding_modules_by_name():
    # ``model.modules()`` is no way to find a module of the program: guarding every module's globals
    # by the names the code spells for it would retrace a loop whose module-level ``step`` changes
    def spellings(model):
        from sys import modules  # noqa: PLC0415

        return sys.modules, modules, importlib.import_module, __import__, model.modules()

    finds = [lambda: sys.modules["m"], lambda: importlib.import_module("m"), lambda: __import__("m"), spellings]
    assert all(reads.finds_modules([fn.__code__]) for fn in finds)
    assert not reads.finds_modules([(lambda model: model.modules()).__code__])


def test_a_module_found_by_a_computed_name_that_the_call_sets_runs_eagerly(config):
    module = _imported()

    def make():
        module.CALLS = 0

        def count(x):
            sys.modules[_MODULE].CALLS += 1
            return x * sys.modules[_MODULE].CALLS

        return count, lambda i: None

    f = _against_eager(make)
    reason = f"the call changed sys.modules[{_MODULE!r}].CALLS"
    assert compiled_calls(f) == [] and reason in _reasons(f)[-1], _reasons(f)


# ---------------------------------------------------------------------- a module imported inside the call
@pytest.mark.parametrize("first", [True, False], ids=["first import in the call", "imported before"])
def test_a_module_imported_inside_the_call_and_set_there_runs_eagerly(first, config):
    def count(x):
        import kiln_test_holes_config  # noqa: PLC0415

        kiln_test_holes_config.CALLS += 1
        return x * kiln_test_holes_config.CALLS

    def make():
        sys.modules.pop(_MODULE, None)
        if not first:
            _imported()
        return count, lambda i: None

    f = _against_eager(make)
    assert compiled_calls(f) == [] and f"the call changed {_MODULE}.CALLS" in _reasons(f)[-1], _reasons(f)


@pytest.mark.parametrize("how", ["import", "sys.modules"])
def test_a_module_the_program_imports_anew_between_calls(how, config):
    def imports(x):
        import kiln_test_holes_config  # noqa: PLC0415

        return x * kiln_test_holes_config.SCALE

    def make():
        path = _imported().__file__

        def import_anew(i):  # (as ``del sys.modules[name]`` then an import of a changed file would)
            fresh = types.ModuleType(_MODULE)
            fresh.__file__, fresh.SCALE = path, i + 1
            sys.modules[_MODULE] = fresh

        return (imports if how == "import" else FOUND_BY_NAME["sys.modules"]), import_anew

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and f"sys.modules[{_MODULE!r}] is another module now" in _reasons(f)[1]


# ---------------------------------------------------------------------- a library's config object
_LIBRARY = '''
"""A stand-in for an installed config library (OmegaConf, ml_collections, a trainer's arguments)."""
import dataclasses


class ConfigDict:
    """Values in a private dict, handed out by attribute and by key."""

    def __init__(self, **values):
        object.__setattr__(self, "_fields", dict(values))

    def __getattr__(self, name):
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self._fields[name] = value

    def __getitem__(self, name):
        return self._fields[name]

    def to_dict(self):
        return dict(self._fields)


class _Node:
    def __init__(self, value):
        self._val = value

    def value(self):
        return self._val


class NodeConfig:
    """Each value in a node object of its own, the nodes in a private dict."""

    def __init__(self, **values):
        self.__dict__["_content"] = {k: _Node(v) for k, v in values.items()}

    def __getattr__(self, name):
        return self._content[name].value()

    def __setattr__(self, name, value):
        self._content[name]._val = value


@dataclasses.dataclass
class Arguments:
    s: int = 1

    def doubled(self):
        return 2 * self.s
'''


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A package in a folder named as installers name theirs, on ``sys.path``: a library's, not the
    user's (``reads.library_folders``; the patch keeps it one where that folder would not count)."""
    folder = tmp_path / "site-packages"
    (folder / "kiln_test_cfglib").mkdir(parents=True)
    (folder / "kiln_test_cfglib" / "__init__.py").write_text(_LIBRARY)
    monkeypatch.syspath_prepend(str(folder))
    known = reads.library_folders()
    monkeypatch.setattr(reads, "library_folders", lambda: (*known, os.path.realpath(folder) + os.sep))
    monkeypatch.delitem(sys.modules, "kiln_test_cfglib", raising=False)
    import kiln_test_cfglib  # noqa: PLC0415

    yield kiln_test_cfglib
    sys.modules.pop("kiln_test_cfglib", None)


def test_a_folder_of_installed_packages_on_the_path_holds_a_librarys_code(tmp_path, monkeypatch):
    folder = tmp_path / "env" / "site-packages"
    folder.mkdir(parents=True)
    assert not any(str(tmp_path) in f for f in reads.library_folders())
    monkeypatch.syspath_prepend(str(folder))
    assert os.path.realpath(folder) + os.sep in reads.library_folders()


CONFIGS = {
    # (how it is made, how the call reads it, where it is held)
    "ConfigDict in a dict, by attribute": ("ConfigDict", lambda held: held["cfg"].s, "dict"),
    "ConfigDict in a list, by key": ("ConfigDict", lambda held: held[0]["s"], "list"),
    "node config in a dict": ("NodeConfig", lambda held: held["cfg"].s, "dict"),
    "library dataclass in a dict": ("Arguments", lambda held: held["cfg"].s, "dict"),
    "library dataclass's method": ("Arguments", lambda held: held["cfg"].doubled(), "dict"),
}


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_a_librarys_config_held_in_a_container(kind, library):
    cls, read, held = CONFIGS[kind]

    def make():
        cfg = getattr(library, cls)(s=1)
        state = {"cfg": cfg} if held == "dict" else [cfg]
        return (lambda x: x * read(state)), lambda i: setattr(cfg, "s", i + 1)

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and "changed: 1 -> 2" in _reasons(f)[1], _reasons(f)


def test_a_librarys_config_held_in_a_dict_that_the_call_sets_runs_eagerly(library):
    def make():
        state = {"cfg": library.ConfigDict(calls=0)}

        def count(x):
            state["cfg"].calls = state["cfg"].calls + 1
            return x * state["cfg"].calls

        return count, lambda i: None

    f = _against_eager(make)
    assert compiled_calls(f) == [] and "the call changed state['cfg']._fields" in _reasons(f)[-1], _reasons(f)


# ---------------------------------------------------------------------- more paths
def test_a_cached_helper_reads_state_through_the_function_it_wraps():
    def make():
        state = {"s": 1}

        @functools.cache
        def scale():
            return state["s"]

        def change(i):
            state["s"] = i + 1
            scale.cache_clear()

        return (lambda x: x * scale()), change

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 4 and "scale.__wrapped__.<closure>.state['s'] changed" in _reasons(f)[1]


@pytest.mark.parametrize("change", [False, True])
def test_a_helpers_keyword_default_that_is_an_object(change):
    # (its keyword defaults were copied into a new dict at each look, compared by identity: the call ran
    # eagerly, "the call changed helper.__kwdefaults__", though nothing had)
    def make():
        def helper(x, *, kind=np.float32, s=1):
            return x * s * (2 if kind is np.float32 else 3)

        def set_default(i):
            if change:
                helper.__kwdefaults__["kind" if i % 2 else "s"] = np.float64 if i % 2 else i + 1

        return (lambda x: helper(x)), set_default

    f = _against_eager(make)
    if change:  # (calls 1 and 2 change a default, call 3 sets the one call 1 set)
        assert len(f.state.specializations) == 3 and "helper.__kwdefaults__ changed" in _reasons(f)[1], _reasons(f)
    else:
        assert len(f.state.specializations) == 1 and sum(compiled_calls(f)) == 3, _reasons(f)


def test_a_thread_locals_attribute_read_in_another_thread():
    # (the guard held the tracing thread's attribute table: another thread's call ran its program)
    local = threading.local()
    local.s = 1
    f = kiln.compile(lambda x: x * local.s, wait=True)
    assert float(f(kiln.ones(3)).numpy()[0]) == 1.0
    got: list = []

    def other() -> None:
        local.s = 5
        got.append(float(f(kiln.ones(3)).numpy()[0]))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert got == [5.0] and "local.s changed: 1 -> 5" in _reasons(f)[-1], _reasons(f)


def test_a_thread_locals_attribute_the_call_sets_runs_eagerly():
    def make():
        local = threading.local()
        local.calls = 0

        def count(x):
            local.calls += 1
            return x * local.calls

        return count, lambda i: None

    f = _against_eager(make)
    assert compiled_calls(f) == [] and "the call changed local.calls" in _reasons(f)[-1], _reasons(f)


class _One:
    def scaled(self, x):
        return x * 1


class _Two:
    def scaled(self, x):
        return x * 2


@pytest.mark.parametrize("held", ["named", "in a dict"])
def test_an_object_whose_class_is_set_between_calls(held):
    def make():
        obj = _One()
        state = {"obj": obj}
        read = (lambda x: obj.scaled(x)) if held == "named" else (lambda x: state["obj"].scaled(x))
        return read, lambda i: setattr(obj, "__class__", (_One, _Two)[i % 2])

    f = _against_eager(make)
    assert len(compiled_calls(f)) == 2 and "a _One -> a _Two (its __class__ was set)" in _reasons(f)[1], _reasons(f)


def test_an_object_whose_class_the_call_sets_runs_eagerly():
    def make():
        state = {"obj": _One()}

        def swap(x):
            out = state["obj"].scaled(x)
            state["obj"].__class__ = _Two if type(state["obj"]) is _One else _One
            return out

        return swap, lambda i: None

    f = _against_eager(make)
    assert compiled_calls(f) == [] and "the call set the __class__ of a _One object" in _reasons(f)[-1], _reasons(f)


# ---------------------------------------------------------------------- floats read at each call
@dataclasses.dataclass(slots=True)
class _Slotted:
    beta: float = 1.0


def _helper_closure():
    beta = 1.0

    def loss(x):
        return x * beta - 1

    def set_value(v):
        nonlocal beta
        beta = v

    return (lambda x: loss(x)), set_value


def _slot(named: bool):
    s = _Slotted()
    state = {"s": s}
    return ((lambda x: x * s.beta) if named else (lambda x: x * state["s"].beta)), lambda v: setattr(s, "beta", v)


def _deque():
    window = collections.deque([1.0, 2.0], maxlen=2)  # the latest two values: appending drops the oldest
    return (lambda x: x * window[0] + window[1]), window.append


ANNEALED = {
    "helper's closure variable": (_helper_closure, "loss.<closure>.beta"),
    "slot": (lambda: _slot(True), "s.beta"),
    "slot of an object in a dict": (lambda: _slot(False), "state['s'].beta"),
    "deque": (_deque, "window[0], window[1]"),
}


@pytest.mark.parametrize("where", list(ANNEALED))
def test_a_float_annealed_in_a_closure_a_slot_or_a_deque_is_read_at_each_call(where):
    pair, name = ANNEALED[where]

    def make():
        fn, set_value = pair()
        return fn, set_value, (kiln.ones(3),)

    f = _floats_against_eager(make)
    assert len(f.state.specializations) == 3, _details(f)  # main: one per value until the recompile limit
    assert f"{name}: a float read at each call (one program for every value)" in _details(f), _details(f)
    assert sum(compiled_calls(f)) == len(VALUES) - 3


def test_a_float_annealed_in_a_helpers_closure_then_an_int_traces_again():
    fn, set_value = _helper_closure()
    f = kiln.compile(fn, wait=True)
    for v in (*VALUES[:4], 2):
        set_value(v)
        assert float(f(kiln.ones(3)).numpy()[0]) == pytest.approx(v - 1, rel=1e-6, abs=1e-7)
    assert len(f.state.specializations) == 4 and "loss.<closure>.beta changed:" in _details(f).splitlines()[-1]
