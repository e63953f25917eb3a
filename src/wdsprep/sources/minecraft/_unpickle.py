"""The one unpickler in wdsprep: a frame's pickle, checked before it runs, rebuilt from a whitelist.

A frame is what `np.save(path, dict(action=..., voxel=...))` writes: a 0-d object array holding a
dict of plain arrays. A frame comes from a stranger, so it is read in two passes:

1. `scan_pickle` walks the opcodes without running any (`pickletools.genops`) and simulates the
   unpickler's stack on a graph of placeholders. It admits only the opcodes of protocols 2-5 that
   such a file needs, only the numpy globals below (and only where they belong: `REDUCE` on a
   global, `BUILD` on an array or dtype made by `REDUCE`), memo indices in order (a `LONG_BINPUT`
   of 2**32 would make the C unpickler allocate a 32 GiB memo table), exactly one pickle (any byte
   after its `STOP` is an error), and no structure larger than `PickleLimits` *as if every shared
   reference were a copy* -- counted on the graph before anything is built, so a list nested
   26 deep through memo references (2**26 leaves from 200 bytes) is refused without expanding it.
   A structure that contains itself is refused too.
2. `load_pickle` runs the C unpickler with `find_class` mapped to builders that never hand
   attacker data to numpy's own `__setstate__`: a dtype is rebuilt from a whitelist of plain descr
   strings (bool, integers, floats, complex, `U<n>`, `S<n>`) and its pickled BUILD state must equal
   the plain dtype's own state (a state claiming "no objects" for an object dtype -- raw bytes taken
   as object pointers, a segfault -- is refused); an array is rebuilt with `np.frombuffer` from
   exactly `prod(shape) * itemsize` bytes. Object dtypes exist in one form only: an object array
   whose data is a pickled list of (already built) Python objects, never bytes; an object scalar or
   an object dtype anywhere else is refused.
"""
from __future__ import annotations

import io
import math
import pickle
import pickletools
import re
from dataclasses import dataclass

import numpy as np

from ..base import postorder_shared


@dataclass(frozen=True)
class PickleLimits:
    """What one frame's pickle may hold, counted as if every shared reference were a copy."""

    objects: int  # objects of the expanded structure (a 64**3 object array of names: 262,144)
    payload_bytes: int  # bytes of its strings and byte strings (a frame's arrays' data)
    depth: int  # nesting (a real frame, np.save of the dict of arrays: 9 levels, 84 objects)


# (module, name) -> the builder `_FrameUnpickler` returns for it (numpy 1.x and 2.x spell the modules apart)
_GLOBALS = {
    ("numpy._core.multiarray", "_reconstruct"): "_reconstruct",
    ("numpy.core.multiarray", "_reconstruct"): "_reconstruct",
    ("numpy._core.multiarray", "scalar"): "scalar",
    ("numpy.core.multiarray", "scalar"): "scalar",
    ("numpy._core.numeric", "_frombuffer"): "_frombuffer",
    ("numpy.core.numeric", "_frombuffer"): "_frombuffer",
    ("numpy", "dtype"): "dtype",
    ("numpy", "ndarray"): "ndarray",
}
_CALLABLE = {"_reconstruct", "scalar", "_frombuffer", "dtype"}  # what REDUCE may call ("ndarray" is an argument)
_BUILDABLE = {"_reconstruct", "dtype"}  # what BUILD may give a state to

# Opcodes that push one new value (no children); str/bytes ones carry a payload.
_LEAVES = {"NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "LONG4", "BINFLOAT",
           "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8",
           "BYTEARRAY8", "SHORT_BINSTRING", "BINSTRING", "EMPTY_TUPLE"}
_TUPLE_SIZES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_NO_CHILDREN: list = []  # shared by every leaf (APPEND and SETITEM only ever extend lists and dicts)


class _Node:
    """A placeholder for one object the unpickler would make: its kind and what it refers to."""

    __slots__ = ("kind", "value", "children", "payload", "built")

    def __init__(self, kind: str, value=None, payload: int = 0, children: list | None = None):
        self.kind = kind  # "leaf", "list", "dict", "tuple", "global", "reduce"
        self.value = value  # a str leaf's text (STACK_GLOBAL's operands), a global's or a reduce's builder
        self.children: list[_Node] = [] if children is None else children
        self.payload = payload
        self.built = False


def _opcodes(data: bytes):
    """`pickletools.genops` over `data`, a cut or garbled stream being a ValueError that says so."""
    try:
        yield from pickletools.genops(io.BytesIO(data))
    except (ValueError, EOFError, UnicodeDecodeError) as error:
        raise ValueError(f"not a whole pickle ({error})") from None


def scan_pickle(data: bytes, limits: PickleLimits) -> None:
    """Check the pickle that `data` must be, exactly, without running it (see the module docstring);
    a ValueError says what is wrong."""
    stack: list[_Node] = []
    memo: list[_Node] = []
    marks: list[int] = []  # stack heights at each open MARK
    made = 0

    def new(kind: str, value=None, payload: int = 0, children: list | None = None) -> _Node:
        nonlocal made
        made += 1
        if made > limits.objects:  # bounds the scan's own memory, before the expanded count
            raise ValueError(f"holds more than {limits.objects} objects")
        return _Node(kind, value, payload, children)

    def pop() -> _Node:
        if not stack or (marks and len(stack) == marks[-1]):
            raise ValueError("stack underflow")
        return stack.pop()

    def pop_to_mark() -> list[_Node]:
        if not marks:
            raise ValueError("no MARK before a MARK-ended opcode")
        start = marks.pop()
        items = stack[start:]
        del stack[start:]
        return items

    def top(kind: str) -> _Node:
        if not stack or (marks and len(stack) == marks[-1]) or stack[-1].kind != kind:
            raise ValueError(f"an opcode needs a {kind} on the stack")
        return stack[-1]

    stop = None
    for opcode, arg, position in _opcodes(data):
        name = opcode.name
        if name == "PROTO":
            if position != 0 or not 2 <= arg <= 5:
                raise ValueError(f"protocol {arg} at byte {position} (expected 2..5, first)")
        elif name == "FRAME":
            pass
        elif name == "STOP":
            stop = position
            break
        elif name == "MARK":
            marks.append(len(stack))
        elif name in _LEAVES:
            text = arg if isinstance(arg, str) else None
            payload = len(arg) if isinstance(arg, (str, bytes, bytearray)) else 0
            stack.append(new("leaf", text, payload, _NO_CHILDREN))
        elif name in ("EMPTY_LIST", "EMPTY_DICT"):
            stack.append(new(name[6:].lower()))
        elif name in _TUPLE_SIZES:
            stack.append(new("tuple", children=[pop() for _ in range(_TUPLE_SIZES[name])][::-1]))
        elif name in ("TUPLE", "LIST", "DICT"):
            node = new(name.lower(), children=pop_to_mark())
            if name == "DICT" and len(node.children) % 2:
                raise ValueError("DICT with an odd number of items")
            stack.append(node)
        elif name == "APPEND":
            item = pop()
            top("list").children.append(item)
        elif name == "APPENDS":
            items = pop_to_mark()
            top("list").children.extend(items)
        elif name == "SETITEM":
            value, key = pop(), pop()
            top("dict").children.extend((key, value))
        elif name == "SETITEMS":
            items = pop_to_mark()
            if len(items) % 2:
                raise ValueError("SETITEMS with an odd number of items")
            top("dict").children.extend(items)
        elif name in ("MEMOIZE", "BINPUT", "LONG_BINPUT"):
            index = len(memo) if name == "MEMOIZE" else arg
            if not stack or index > len(memo):
                raise ValueError(f"memo index {index} out of order (the next is {len(memo)})")
            if index == len(memo):
                memo.append(stack[-1])
            else:
                memo[index] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET"):
            if arg >= len(memo):
                raise ValueError(f"memo index {arg} never stored")
            stack.append(memo[arg])
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            if name == "GLOBAL":
                module, _, attribute = arg.partition(" ")
            else:
                attribute_node, module_node = pop(), pop()
                if module_node.kind != "leaf" or attribute_node.kind != "leaf":
                    raise ValueError("STACK_GLOBAL of something other than two strings")
                module, attribute = module_node.value, attribute_node.value
            builder = _GLOBALS.get((module, attribute))
            if builder is None:
                raise ValueError(f"refusing to load {module}.{attribute} (only numpy arrays are allowed)")
            stack.append(new("global", builder, children=_NO_CHILDREN))
        elif name == "REDUCE":
            arguments, function = pop(), pop()
            if function.kind != "global" or function.value not in _CALLABLE or arguments.kind != "tuple":
                raise ValueError("REDUCE of something other than a numpy array, dtype or scalar")
            stack.append(new("reduce", function.value, children=[arguments]))
        elif name == "BUILD":
            state = pop()
            target = top("reduce")
            if target.value not in _BUILDABLE or target.built:
                raise ValueError(f"BUILD of a {target.value} result (only arrays and dtypes, once each)")
            target.built = True
            target.children.append(state)
        else:
            raise ValueError(f"opcode {name} at byte {position} is not part of a numpy frame")
    if stop is None:
        raise ValueError("no STOP opcode: the pickle is cut short")
    if stop + 1 != len(data):
        raise ValueError(f"{len(data) - stop - 1} bytes after the pickle's end (a frame holds one pickle, nothing after it)")
    if len(stack) != 1 or marks:
        raise ValueError("the pickle does not end with exactly one object")
    _check_expanded(stack[0], limits)


def _check_expanded(root: _Node, limits: PickleLimits) -> None:
    """Count the structure under `root` as if every shared reference were a copy (memoized, so the
    counting itself is linear in the pickle), refusing cycles and anything above `limits`."""
    objects: dict[int, int] = {}
    payload: dict[int, int] = {}
    depth: dict[int, int] = {}
    for node, kids in postorder_shared(root, lambda node: node.children):
        key = id(node)
        objects[key] = min(1 + sum(objects[id(c)] for c in kids), limits.objects + 1)
        payload[key] = min(node.payload + sum(payload[id(c)] for c in kids), limits.payload_bytes + 1)
        depth[key] = 1 + max((depth[id(c)] for c in kids), default=0)
        if objects[key] > limits.objects:
            raise ValueError(f"holds more than {limits.objects} objects once its shared references are expanded")
        if payload[key] > limits.payload_bytes:
            raise ValueError(f"holds more than {limits.payload_bytes} bytes of data once its shared references are expanded")
        if depth[key] > limits.depth:
            raise ValueError(f"nested deeper than {limits.depth} levels")


# ------------------------------------------------------------------------------- building
# plain descr strings only: bool, integers, floats, complex, unicode and byte strings of n >= 1 chars
_PLAIN_DESCR = re.compile(r"^(b1|[iu][1248]|f[248]|c(8|16)|[US][1-9][0-9]{0,8})$")
_OBJECT_DESCR = ("O", "O8")
_BYTE_ORDERS = ("<", ">", "|", "=")


class _DtypeSpec:
    """`numpy.dtype(descr, align, copy)` as pickled: checked, and its state checked against the plain one."""

    __slots__ = ("descr", "dtype", "is_object", "state_seen")

    def __init__(self, descr, align=False, copy=True):
        if not isinstance(descr, str) or not (_PLAIN_DESCR.match(descr) or descr in _OBJECT_DESCR):
            raise ValueError(f"dtype {descr!r} is not a plain numeric, bool or string dtype")
        self.descr = descr
        self.is_object = descr in _OBJECT_DESCR
        self.dtype = np.dtype(object) if self.is_object else np.dtype(descr)
        self.state_seen = False

    def __setstate__(self, state) -> None:
        order = state[1] if isinstance(state, tuple) and len(state) > 1 else None
        if self.state_seen or order not in _BYTE_ORDERS:
            raise ValueError(f"dtype {self.descr!r} with a state that is not a plain dtype's: {state!r}"[:200])
        plain = self.dtype.newbyteorder(order) if order in "<>" and self.dtype.byteorder != "|" else self.dtype
        if state != plain.__reduce__()[2]:
            raise ValueError(f"dtype {self.descr!r} with a state that is not a plain dtype's: {state!r}"[:200])
        self.dtype = plain
        self.state_seen = True


class _NdarrayClass:
    """What the global `numpy.ndarray` stands for: only an argument of `_reconstruct`."""

    __slots__ = ()


_NDARRAY = _NdarrayClass()


def _plain_array(data, spec: _DtypeSpec, shape, fortran: bool) -> np.ndarray:
    """An array of `shape` and the plain dtype of `spec`, a copy of exactly the bytes its shape needs."""
    if not isinstance(spec, _DtypeSpec) or spec.is_object:
        raise ValueError("an array of an object dtype from raw bytes")
    count = _element_count(shape)
    if not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"array data of type {type(data).__name__}, expected bytes")
    if len(data) != count * spec.dtype.itemsize:
        raise ValueError(f"an array of shape {shape} and dtype {spec.dtype} from {len(data)} bytes "
                            f"(it needs {count * spec.dtype.itemsize})")
    flat = np.frombuffer(data, dtype=spec.dtype, count=count)
    return flat.reshape(shape, order="F" if fortran else "C").copy(order="K")


def _element_count(shape) -> int:
    if not isinstance(shape, tuple) or len(shape) > 32 or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"array shape {shape!r}"[:120])
    return math.prod(shape)


class _ArraySpec:
    """`_reconstruct(ndarray, (0,), b'b')` as pickled; its BUILD state makes the array."""

    __slots__ = ("array", "objects", "shape", "fortran")

    def __init__(self):
        self.array = None  # a plain array, once built
        self.objects = None  # an object array's items (a list), built in `resolve`

    def __setstate__(self, state) -> None:
        if self.array is not None or self.objects is not None:
            raise ValueError("an array given a state twice")
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise ValueError("an array state that is not numpy's")
        shape, spec, fortran, data = state[-4:]
        if len(state) == 5 and state[0] != 1 or type(fortran) is not bool or not isinstance(spec, _DtypeSpec):
            raise ValueError("an array state that is not numpy's")
        if spec.is_object:
            if not isinstance(data, list) or len(data) != _element_count(shape):
                raise ValueError("an object array whose items are not a list of its size")
            self.objects, self.shape, self.fortran = data, shape, fortran
        else:
            self.array = _plain_array(data, spec, shape, fortran)


class _FrameUnpickler(pickle.Unpickler):
    """The C unpickler with every global mapped to this module's builders (after `scan_pickle`)."""

    def find_class(self, module: str, name: str):
        builder = _GLOBALS.get((module, name))
        if builder is None:
            raise ValueError(f"refusing to load {module}.{name} (only numpy arrays are allowed)")
        return {"_reconstruct": _reconstruct, "scalar": _scalar, "_frombuffer": _frombuffer,
                "dtype": _DtypeSpec, "ndarray": _NDARRAY}[builder]


def _reconstruct(cls, shape, typecode) -> _ArraySpec:
    if cls is not _NDARRAY or shape != (0,) or typecode not in (b"b", "b"):
        raise ValueError("_reconstruct of something other than an ndarray")
    return _ArraySpec()


def _scalar(spec, data=None):
    if not isinstance(spec, _DtypeSpec) or spec.is_object:
        raise ValueError("a scalar of an object dtype")
    return _plain_array(data, spec, (), False)[()]


def _frombuffer(data, spec, shape, order) -> _ArraySpec:
    built = _ArraySpec()
    if order not in ("C", "F"):
        raise ValueError(f"array order {order!r}"[:60])
    built.array = _plain_array(bytes(data) if isinstance(data, bytearray) else data, spec, shape, order == "F")
    return built


def _resolve(value, depth: int = 0):
    """`value` with every placeholder replaced by what it stands for (array, dtype)."""
    if depth > 64:  # scan_pickle bounds the depth far below this; a guard against a missed path
        raise ValueError("nested too deep")
    if isinstance(value, _ArraySpec):
        if value.array is not None:
            return value.array
        if value.objects is None:
            raise ValueError("an array without its state")
        array = np.empty(len(value.objects), dtype=object)
        for position, item in enumerate(value.objects):
            array[position] = _resolve(item, depth + 1)
        return array.reshape(value.shape, order="F" if value.fortran else "C")
    if isinstance(value, _DtypeSpec):
        return value.dtype
    if isinstance(value, dict):
        return {_resolve(k, depth + 1): _resolve(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(item, depth + 1) for item in value]
    if isinstance(value, tuple):
        return tuple(_resolve(item, depth + 1) for item in value)
    if value is _NDARRAY:
        raise ValueError("numpy.ndarray outside an array's reconstruction")
    return value


def load_pickle(data: bytes, limits: PickleLimits):
    """The object the pickle `data` holds, after `scan_pickle`; anything else is a ValueError
    "cannot unpickle: <why>" (the caller names the file)."""
    try:
        scan_pickle(data, limits)
        return _resolve(_FrameUnpickler(io.BytesIO(data)).load())
    except Exception as error:  # whatever the scan, the C unpickler or a builder meets: a bad file, never a crash
        raise ValueError(f"cannot unpickle: {error}") from None
