"""Python-state scenarios: functions that read configs (attributes, dict entries, list contents)
changed between calls, and that mutate Python containers (a counter dict in a closure or a global,
``list.append``, ``dict.update``, a dict argument). Reads through less direct paths too: a class
attribute through an instance, a helper's default argument, a ``functools.partial``'s keywords, a
bound method's object, a numpy array's values (small and large), an environment variable, a dict's order, a
generator resumed. State kept outside dicts, lists and sets too: a ``deque`` window, an ``array.array``, a
``MappingProxyType`` over a dict, a ``ContextVar``, a helper's closure cell (rebound between calls), an
object with ``__slots__`` and a ``SimpleNamespace`` held in dicts, an ``itertools.count`` held in a dict.
Paths found at run time: a module found by a computed name (``sys.modules[name]``,
``importlib.import_module``), a library's config held in a dict (a ``configparser.ConfigParser``), a
``functools.cache``'d helper reading state of its own, an object whose ``__class__`` is set, a module's
global read by a computed name, a helper's keyword default.
A float argument takes another value at each call, and so may a float of Python
state (an attribute, a dict's entry, a list's item, a default argument's dict); branches on such a
float's text or hash (``str``, an f-string, a set of it) must not follow the two values traced.

The comparison after each call covers the results and every container's contents, so a compiled
call that baked a value in, or that skipped a mutation the traced call made, shows as a difference.
"""

from __future__ import annotations

import random

from .generator import TOLERANCE
from .scenario import Builder, Scenario

PREAMBLE = ["import array", "import collections", "import configparser", "import contextvars", "import importlib",
            "import itertools", "import sys", "import weakref", 'STATS = {"calls": 0}', "HISTORY = []",
            # a module of the program's own, one per copy, found by name (gone with the copy's namespace)
            "def anchor(): pass", 'FUZZ_MOD = f"kiln_fuzz_config_{id(anchor)}"', "fuzzmod = types.ModuleType(FUZZ_MOD)",
            'fuzzmod.__file__ = f"/kiln-fuzz/{FUZZ_MOD}.py"', "fuzzmod.scale, fuzzmod.calls = 0.5, 0",
            "sys.modules[FUZZ_MOD] = fuzzmod", "weakref.finalize(anchor, sys.modules.pop, FUZZ_MOD, None)"]  # fmt: skip
SETUP = [
    'counter = {"calls": 0}',
    "log = []",
    "cache = {}",
    "weights = [1.0, 0.5]",
    "cfg = types.SimpleNamespace(scale=1.5, shift=0.5, flag=True, calls=0, reduce=False)",
    'settings = {"scale": 0.5, "shift": 0.25, "mode": "add"}',
    'Knob = type("Knob", (), {"scale": 1.25})',
    "knob = Knob()",
    "knob_scaled = (lambda self, h: h * self.scale).__get__(knob)",
    'scaled = (lambda h, c={"s": 0.75}: h * c["s"])',
    "mul = functools.partial(lambda h, s: h * s, s=1.5)",
    "table = np.array([0.5, 2.0])",
    "big = np.linspace(0.5, 2.0, 5000)",
    'order = {"a": 1.0, "b": -0.5}',
    "gen = (0.5 + k % 3 for k in range(10**6))",
    'os.environ["KILN_FUZZ_SCALE"] = "1.5"',
    "window = collections.deque([0.5, 1.0], maxlen=3)",
    "arr = array.array('d', [0.5, 1.5])",
    "frozen = types.MappingProxyType(settings)",
    "ctx_scale = contextvars.ContextVar('ctx_scale', default=0.5)",
    "scaled_by = (lambda a: (lambda h: h * a))(0.75)",
    'Slotted = type("Slotted", (), {"__slots__": ("scale",)})',
    'slotted = {"obj": Slotted()}',
    'slotted["obj"].scale = 1.25',
    'boxed = {"cfg": types.SimpleNamespace(scale=0.5, calls=0)}',
    'ids = {"next": itertools.count(1)}',
    "parser = configparser.ConfigParser()",
    'parser.read_dict({"train": {"scale": "0.5", "calls": "0"}})',
    'held = {"parser": parser}',
    "cached_scale = functools.cache((lambda st: (lambda: st['s']))({'s': 0.5}))",
    'Half = type("Half", (), {"apply": lambda self, h: h * 0.5})',
    'Twice = type("Twice", (), {"apply": lambda self, h: h * 2.0})',
    'swapped = {"obj": Half()}',
    "kwhelper = (lambda h, *, kind=np.float32, s=0.5: h * s)",
]
STATE = ["STATS", "HISTORY", "counter", "log", "cache", "weights", "cfg", "settings", "order", "window", "arr",
         "boxed"]  # fmt: skip
# (statement of f, tag): reads of Python state (values the trace must not bake in) ...
READS = [
    ("h = h * cfg.scale", "read attr"),
    ("h = h + settings['shift']", "read dict"),
    ("h = h * 2 if cfg.flag else h - 1", "branch on attr"),
    ("h = h.tanh() if settings['mode'] == 'tanh' else h * 0.5", "branch on dict"),
    ("h = h * sum(weights)", "read list"),
    ("h = h + len(log)", "read len"),
    ("h = h * {arg}['scale']", "read dict argument"),
    ("h = h + counter['calls']", "read counter"),
    ("h = h.sum(0) if cfg.reduce else h", "structure from attr"),
    ("h = h * knob.scale", "read class attr"),
    ("h = knob_scaled(h)", "read bound method's attr"),
    ("h = scaled(h)", "read default argument"),
    ("h = mul(h)", "read partial keyword"),
    ("h = h * float(table[0])", "read numpy value"),
    ("h = h * float(big[0] + big[-1])", "read large numpy value"),
    ("h = h * float(os.environ.get('KILN_FUZZ_SCALE', '1'))", "read environment"),
    ("for v in order.values(): h = h * 0.5 + v", "loop over dict"),
    ("h = h * next(gen)", "resume generator"),
    ("h = h * sum(window)", "read deque"),
    ("h = h * arr[0]", "read array.array"),
    ("h = h + frozen['shift']", "read mapping proxy"),
    ("h = h * ctx_scale.get()", "read context variable"),
    ("h = scaled_by(h)", "read helper's closure"),
    ("h = h * slotted['obj'].scale", "read slots in a dict"),
    ("h = h * boxed['cfg'].scale", "read namespace in a dict"),
    ("h = h * (next(ids['next']) % 3 + 1)", "resume count in a dict"),
    ("h = h * sys.modules[FUZZ_MOD].scale + sys.modules[FUZZ_MOD].calls", "read module by name"),
    ("h = h * importlib.import_module(FUZZ_MOD).scale", "read module by import_module"),
    ("h = h * float(held['parser']['train']['scale'])", "read library config in a dict"),
    ("h = h + float(held['parser']['train']['calls'])", "read library config counter"),
    ("h = h * cached_scale()", "read cached helper"),
    ("h = swapped['obj'].apply(h)", "read method of an object in a dict"),
    ("h = h * getattr(fuzzmod, 'SCALE'.lower())", "read module by computed attribute"),
    ("h = kwhelper(h)", "read helper's keyword default"),
    # a float argument, another value at each call (scalar_args.py: an input once two traces agree)
    ("h = h * {num}", "float argument"),
    ("h = ({num} - h) / {num}", "float argument twice"),
    ("h = h.clamp(max={num})", "float argument bound"),
    ("h = kiln.where(h > 0, h, {num})", "float argument in where"),
    ("h = h * (1 - {num})", "float argument derived"),
    ("h = h * math.exp({num} / 4)", "float argument through math"),
    ("h = h * 2 if {num} > 0.6 else h - {num}", "branch on float argument"),
    ("h = h * min({num}, 1.0)", "float argument in min"),
    ("h = h * abs({num}) + kiln.full_like(h, {num} // 0.5)", "float argument folded"),
    ("h = {num} * h + (1 - {num}) * h.flip(0)", "float argument mixed"),
    ("h = h * (1 - {rare}) + {num}", "two float arguments, one mostly repeated"),
    ("h = h * 2 if str({num}).startswith('0.') else h - {num}", "branch on float argument's text"),
    ("h = h * 2 if {num} not in {{1.5, -1.25}} else h - {num}", "float argument in a set"),
    # floats of Python state, derived and compared (state_floats.py: inputs once two watched traces agree)
    ("h = h * (1 - cfg.scale) + settings['shift'] ** 2", "read attr derived"),
    ("h = h * math.exp(cfg.scale / 4)", "read attr through math"),
    ("h = h.clamp(max=settings['shift'] + 1)", "read dict bound"),
    ("h = h * 2 if cfg.scale > 1.1 else h * cfg.scale", "branch on attr float"),
    ("h = h * 2 if f'{{cfg.scale:.2f}}'.startswith('0.') else h * cfg.scale", "branch on attr float's text"),
]
# ... and mutations of it (each must happen at every call, as eagerly)
MUTATIONS = [
    ("counter['calls'] += 1", "mutate closure dict"),
    ("STATS['calls'] += 1", "mutate global dict"),
    ("log.append(h.sum())", "list.append tensor"),
    ("log.append(cfg.scale)", "list.append value"),
    ("HISTORY.append(len(HISTORY))", "global list.append"),
    ("cache.update(last=h.detach())", "dict.update tensor"),
    ("cache.update(step=counter['calls'])", "dict.update value"),
    ("{arg}['seen'] = {arg}['seen'] + 1", "mutate dict argument"),
    ("{arg}['out'] = h.detach()", "store into dict argument"),
    ("weights.append(0.25)", "list.append read later"),
    ("cfg.calls = cfg.calls + 1", "attribute store"),
    ("settings.setdefault('seen', []).append(1)", "setdefault append"),
    ("log.pop() if log else None", "list.pop"),
    ("window.append(float(len(log)))", "deque.append"),
    ("arr[1] += 1.0", "array.array store"),
    ("ctx_scale.set(ctx_scale.get() + 0.25)", "context variable set"),
    ("boxed['cfg'].calls += 1", "namespace in a dict store"),
    ("sys.modules[FUZZ_MOD].calls += 1", "module by name store"),
    ("held['parser']['train']['calls'] = str(int(held['parser']['train']['calls']) + 1)", "library config store"),
    ("swapped['obj'].__class__ = Twice if type(swapped['obj']) is Half else Half", "class set in the call"),
]
# the tags of reads of dict entries and list contents (attributes are guarded by kiln.compile)
CONTAINER_READS = tuple(tag for _, tag in READS if "attr" not in tag)
# changes the caller makes between calls
CHANGES = [
    ("cfg.scale = 0.25", "attr"),
    ("cfg.flag = not cfg.flag", "attr flag"),
    ("cfg.reduce = not cfg.reduce", "attr structure"),
    ("settings['shift'] = -1.0", "dict entry"),
    ("settings['mode'] = 'tanh'", "dict entry branch"),
    ("settings.update(scale=2.0, shift=1.0)", "dict.update"),
    ("weights[0] = 2.0", "list entry"),
    ("weights.append(1.5)", "list.append"),
    ("log.clear()", "list.clear"),
    ("counter['calls'] = 10", "counter reset"),
    ("Knob.scale = -0.5", "class attr"),
    ("knob.scale = 0.25", "instance attr shadows class attr"),
    ("scaled.__defaults__[0]['s'] = 2.5", "default argument"),
    ("mul.keywords['s'] = -1.0", "partial keyword"),
    ("table[0] = 3.0", "numpy value"),
    ("big[-1] = big[0] + 1.0", "large numpy value"),
    ("np.random.default_rng(3).shuffle(big)", "large numpy array shuffled"),
    ("os.environ['KILN_FUZZ_SCALE'] = '0.5'", "environment"),
    ("order['a'] = order.pop('a')", "dict order"),
    ("window.append(0.25)", "deque.append"),
    ("arr[0] = 2.5", "array.array entry"),
    ("ctx_scale.set(1.5)", "context variable"),
    ("scaled_by.__closure__[0].cell_contents = 2.5", "helper's closure rebound"),
    ("slotted['obj'].scale = -0.5", "slots in a dict"),
    ("boxed['cfg'].scale = 1.5", "namespace in a dict"),
    ("fuzzmod.scale = -0.75", "module found by name"),
    ("held['parser']['train']['scale'] = '1.25'", "library config in a dict"),
    ("cached_scale.__wrapped__.__closure__[0].cell_contents['s'] = 1.5; cached_scale.cache_clear()", "cached helper"),
    ("swapped['obj'].__class__ = Twice", "class set"),
    ("kwhelper.__kwdefaults__['s'] = 1.5", "helper's keyword default"),
]
# changes before every call: a float of Python state annealed, another value each call (state_floats.py)
ANNEALED = [
    ("cfg.scale = 0.5 + 0.125 * call", "anneal attr"),
    ("settings['shift'] = 0.25 - 0.375 * call", "anneal dict entry"),
    ("weights[1] = 0.5 / (call + 1)", "anneal list entry"),
    ("knob.scale = 1.0 + 0.25 * call", "anneal instance attr"),
    ("scaled.__defaults__[0]['s'] = 0.75 + 0.5 * call", "anneal default argument"),
    ("cfg.scale = 1.5 if call % 2 else 0.75", "alternate attr"),
    ("scaled_by.__closure__[0].cell_contents = 0.5 + 0.25 * call", "anneal helper's closure"),
    ("slotted['obj'].scale = 1.0 - 0.125 * call", "anneal slot"),
    ("window.append(0.25 * call)", "anneal deque"),
    ("fuzzmod.scale = 0.5 + 0.125 * call", "anneal module found by name"),
]


def generate(seed: int) -> Scenario:
    """A few tensor ops interleaved with reads and mutations of Python state, changed between calls."""
    r = random.Random(seed)
    b = Builder(seed)
    dtype = r.choice(("float32", "float64"))
    shape = tuple(r.randint(1, 4) for _ in range(r.randint(1, 2)))
    x = b.float_input(shape, dtype)
    arg = b.argument('{"scale": float(rng.choice([0.5, 2.0])), "seen": 0}', prefix="d")
    num = b.argument("float(rng.choice([0.25, 0.5, 0.75, 1.5, -1.25]))", prefix="s")
    # a second float argument that mostly repeats a value: a trace that watches one float but not the other
    rare = b.argument("float(rng.choice([0.5, 0.5, 0.5, 2.0]))", prefix="s")
    b.preamble += PREAMBLE
    b.setup += SETUP
    b.state_names += STATE
    b.stmt(f"h = {x} * 1.0", "start")
    # A program that only reads (a stream of its own): a mutation makes each call run eagerly, so only
    # such programs compile the reads of floats that change at every call
    reads_only = random.Random(seed * 7 + 11).random() < 0.3
    for _ in range(r.randint(2, 7)):
        line, tag = r.choice(READS if r.random() < 0.5 or reads_only else MUTATIONS)
        b.stmt(line.format(arg=arg, num=num, rare=rare), tag)
    for _ in range(r.randint(1, 3)):
        line, tag = r.choice(CHANGES)
        b.action(r.randint(1, 5), line, f"change:{tag}")
    if r.random() < 0.5:
        line, tag = r.choice(ANNEALED)
        b.action_line(line, f"change:{tag}")
    returns = r.choice(("h", "h, counter['calls']", "h, len(log)", "h, dict(cache)", f"h, {num} * 2"))
    return b.scenario("pystate", returns, scale=1.0, rtol=TOLERANCE[dtype])
