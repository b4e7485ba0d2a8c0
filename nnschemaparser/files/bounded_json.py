"""Strict JSON decoding whose memory is counted as it is built, refused the moment it passes a budget.

`decode_bounded(text, budget, source, ...)` reads one JSON text (bytes or str) with the rules of
file_format (no duplicate keys, no NaN/Infinity, no overflowing number, bounded nesting and string
length) and builds a compact document while it counts what it allocates:

* an object becomes a `JSONObject`, a read-only mapping of two slots (its values as a tuple and a
  shape shared by every object with the same keys, in order): 88 + 8n bytes where a dict takes
  184-640;
* every string, key or value, is interned: a schema file repeats a few hundred distinct strings
  tens of thousands of times, and each repeat then costs a pointer;
* arrays are lists, numbers and literals what `json` gives.

Each allocation is priced (CPython, 64-bit: the sizes `sys.getsizeof` reports, with list growth and
the intern table's slots) and charged to a `DecodeBudget` *before* it is made; when the charge would
pass the budget, `FileLimitError` is raised naming the limit and the fix, so a file never costs more
than its budget whatever it holds (dense numbers, unique keys, empty containers). Several texts of
one file (a trace's header and the trace document in its metadata) and the objects built from them
share one budget. The decoder is iterative (no recursion), so nesting is bounded by `max_depth`
exactly and never by the interpreter's stack.

Depends on the standard library only; the errors are file_format's, passed in by it.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import KeysView, Mapping
from itertools import islice
from json.decoder import JSONDecodeError, scanstring
from typing import Any, Iterator, Optional, Union

__all__ = ["JSONObject", "DecodeBudget", "decode_bounded", "is_object", "is_array", "plain"]

# what one object costs, in bytes (CPython 3.11+, 64-bit; checked by tests/files/test_hostile_files.py)
OBJECT_BYTES = 56           # a JSONObject (a tuple subclass: its keys, its values and a spare slot); + 8 per value
TUPLE_BYTES = 40            # an array, once closed (a tuple); + 8 per item
LIST_BYTES = 56 + 48        # a list and the spare slots of its first growth; + 9 per item (1/8 spare)
SLOT_BYTES = 10  # a pointer and its share of the list's spare room and growth
FLOAT_BYTES = 24
FRAME_BYTES = 2 * LIST_BYTES + 120  # an open object's keys and values lists and the frame itself
DECODER_BYTES = 8 * 1024    # the decoder's own objects while it runs: closures, match objects, errors
TABLE_HEADROOM = 2          # a resize of the string table: the new table, about twice the old one


class DecodeBudget:
    """Bytes a load may still allocate; shared by every text of one file and what is built from it.

    `charge(n, what)` records `n` more bytes or raises the error `refuse(used, what)` builds;
    `release(n)` gives back bytes known to be freed. `used` and `peak` are what was counted.
    """

    __slots__ = ("limit", "used", "peak", "refuse")

    def __init__(self, limit: int, refuse):
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.refuse = refuse

    def charge(self, amount: int, what: str = "") -> None:
        used = self.used + amount
        if used > self.limit:
            raise self.refuse(used, what)
        self.used = used
        if used > self.peak:
            self.peak = used

    def release(self, amount: int) -> None:
        self.used -= amount


_item = tuple.__getitem__
_size = tuple.__len__


class JSONObject(tuple):
    """A decoded JSON object: a read-only, hashable mapping (registered as a Mapping).

    One tuple holds the keys (a tuple shared by every object with the same keys in the same order)
    and then the values: 48 + 8n bytes, where a dict takes 184-640. It is a tuple only to be that
    small, and never reads as a sequence. Two JSONObjects are equal when their keys, in order, and
    their values are; a JSONObject and a dict compare as mappings do.
    """

    __slots__ = ()

    def __new__(cls, keys: tuple, values: list) -> "JSONObject":
        values.insert(0, keys)
        return tuple.__new__(cls, values)

    def __getitem__(self, key: str) -> Any:
        keys = _item(self, 0)
        if key in keys:
            return _item(self, keys.index(key) + 1)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        keys = _item(self, 0)
        return _item(self, keys.index(key) + 1) if key in keys else default

    def __contains__(self, key: object) -> bool:
        return key in _item(self, 0)

    def __iter__(self) -> Iterator[str]:
        return iter(_item(self, 0))

    def __len__(self) -> int:
        return _size(self) - 1

    def keys(self) -> KeysView:
        return KeysView(self)

    def items(self) -> Iterator[tuple[str, Any]]:
        return zip(_item(self, 0), islice(tuple.__iter__(self), 1, None))

    def values(self) -> Iterator[Any]:
        return islice(tuple.__iter__(self), 1, None)

    def __eq__(self, other: object) -> bool:
        if type(other) is JSONObject:
            return tuple.__eq__(self, other)
        if isinstance(other, Mapping):
            return len(self) == len(other) and dict(self.items()) == dict(other.items())
        return False  # never equal to an array, even one holding the same items

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return repr(dict(self.items()))

    def __reduce__(self):
        return _rebuild, (list(self.items()),)


def _rebuild(pairs: list) -> JSONObject:
    return JSONObject(tuple(key for key, _ in pairs), [value for _, value in pairs])


Mapping.register(JSONObject)


def is_object(value: Any) -> bool:
    """A JSON object as a reader sees it: a plain dict or a decoded JSONObject."""
    kind = type(value)
    return kind is dict or kind is JSONObject


def is_array(value: Any) -> bool:
    """A JSON array as a reader sees it: a list (json.loads) or a tuple (decoded here)."""
    kind = type(value)
    return kind is list or kind is tuple


_PATTERN = (r'[ \t\n\r]*(?:'
            r'"([^"\\\x00-\x1f]*)"'                                       # 1 a string without escapes
            r'|([{\[])'                                                   # 2 an opening bracket
            r'|([\]}])'                                                   # 3 a closing bracket
            r'|(,)'                                                       # 4
            r'|(:)'                                                       # 5
            r'|(-?(?:0|[1-9][0-9]*))((?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)'  # 6 integer part, 7 fraction/exponent
            r'|(true|false|null)'                                         # 8
            r'|(")'                                                       # 9 a string with escapes (slow path)
            r'|(NaN|-?Infinity)'                                          # 10
            r')')
_TOKEN_STR = re.compile(_PATTERN)
_KEY = r'[ \t\n\r]*"([^"\\\x00-\x1f]*)"[ \t\n\r]*:'
_KEY_STR = re.compile(_KEY)
_KEY_BYTES = re.compile(_KEY.encode("ascii"))
_TOKEN_BYTES = re.compile(_PATTERN.encode("ascii"))
# possessive repeats: the regex engine keeps no backtracking state per escape (1 MiB for 70 KiB otherwise)
_ESCAPED = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_ESCAPED_STR = re.compile(_ESCAPED, re.S)
_ESCAPED_BYTES = re.compile(_ESCAPED.encode("ascii"), re.S)
_WS_STR = re.compile(r"[ \t\n\r]*")
_WS_BYTES = re.compile(rb"[ \t\n\r]*")
_LITERALS = {"true": True, "false": False, "null": None, b"true": True, b"false": False, b"null": None}
_MAX_INT_DIGITS = 400
_OPEN = (b"{", "{")
_EMPTY_OBJECT = JSONObject((), [])


class _Errors:
    """The typed errors of the caller (file_format's), so this module imports nothing of the package."""

    def __init__(self, malformed, limit, source: str, text: Union[bytes, str], start: int, end: int):
        self.malformed, self.limit, self.source, self.text = malformed, limit, source, text
        self.start, self.end = start, end

    def at(self, pos: int, what: str) -> Exception:
        text, start = self.text, self.start
        newline_char = b"\n" if isinstance(text, (bytes, bytearray)) else "\n"
        line = text.count(newline_char, start, pos) + 1
        column = pos - max(text.rfind(newline_char, start, pos), start - 1)
        rest = _skip(text, pos, isinstance(text, (bytes, bytearray)), self.end)
        hint = " (the file ends early: truncated?)" if rest >= self.end else ""
        return self.malformed(f"{self.source}: not valid JSON at line {line} column {column}: {what}{hint}")

    def rest(self, pos: int) -> int:
        return _skip(self.text, pos, isinstance(self.text, (bytes, bytearray)), self.end)


def decode_bounded(text: Union[bytes, str], budget: DecodeBudget, source: str, *, malformed, limit_error,
                   max_depth: int, max_string_chars: int, start: int = 0, end: Optional[int] = None) -> Any:
    """The JSON value of `text[start:end]` (read in place), every allocation charged to `budget` first."""
    end = len(text) if end is None else end
    errors = _Errors(malformed, limit_error, source, text, start, end)
    is_bytes = isinstance(text, (bytes, bytearray))
    token = (_TOKEN_BYTES if is_bytes else _TOKEN_STR).match
    plain_key = (_KEY_BYTES if is_bytes else _KEY_STR).match
    escaped_token = (_ESCAPED_BYTES if is_bytes else _ESCAPED_STR).match

    def escaped(text, pos):
        return escaped_token(text, pos, end)
    charge = budget.charge
    release = budget.release
    interned: dict = {}  # every distinct string, and integer past the small ones, once
    shapes: dict = {}    # every distinct key tuple, once
    # Every distinct container holding only strings, null, integers and such containers, once: a
    # schema file repeats its shapes, operands and call targets hundreds of times. Booleans and
    # floats keep a container out (True == 1 == 1.0 would merge containers that differ).
    consed: dict = {}
    # A new string is interned only when there is room for the string table's next resize
    # (`room_to_intern`): a file of unique keys, one new string per key, took 4.07x its size without.
    table_bytes = [sys.getsizeof(interned), sys.getsizeof(shapes), sys.getsizeof(consed), DECODER_BYTES]
    charge(sum(table_bytes), "the decoder's tables")

    def grown(table: dict, slot: int) -> None:
        """Charge a table's growth, its size read back (a resize briefly holds the old table too)."""
        size = sys.getsizeof(table)
        if size != table_bytes[slot]:
            charge(size, "the decoder's tables")  # the new table beside the old one, as while resizing
            release(table_bytes[slot])
            table_bytes[slot] = size

    # When the string table resizes next: CPython's dicts hold (2 * slots) // 3 entries and, when
    # full, move to the smallest power of two of slots >= 3 * entries (an empty dict: 8 slots).
    resize_at = [(2 * 8) // 3]

    def room_to_intern(value: Any) -> None:
        """Before a new string fills the string table: room for its resize, which happens inside the
        insertion (the old table and one about twice as large held at once)."""
        if len(interned) >= resize_at[0] and value not in interned:
            probe = TABLE_HEADROOM * table_bytes[0]
            charge(probe, "the decoder's tables")
            release(probe)
            slots = 8
            while slots < 3 * (len(interned) + 1):
                slots *= 2
            resize_at[0] = (2 * slots) // 3

    def intern(value: Any, what: str) -> Any:
        """The one copy of `value` (a string or a large int): the first one seen, charged once."""
        room_to_intern(value)
        first = interned.setdefault(value, value)
        if first is value:
            charge(sys.getsizeof(value), what)
            grown(interned, 0)
        return first
    max_raw = 6 * max_string_chars  # a character takes at most 6 bytes of JSON (\uXXXX)

    def string(raw: Union[bytes, str], pos: int) -> str:
        size = len(raw)  # the raw token exists already (the match made it); charged below with its decoded copy
        if size > max_raw:
            raise limit_error(f"{source}: a string of {size} bytes is over the limit of {max_string_chars} "
                              "characters")
        if is_bytes:
            # The raw token (a bytes copy the match made) is held until it is decoded: charged for
            # that time (a trace's document is one string about the size of the file).
            token_bytes = size + 33
            charge(token_bytes, "a string")
            try:
                if budget.used + size + 64 > budget.limit:
                    charge(size + 64, "a string")  # refused before its decoded copy is made
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise malformed(f"{source}: a string is not UTF-8 text (near byte {pos}); is this a file written "
                                "by save_schema / save_trace?") from None
            finally:
                release(token_bytes)
        if len(raw) > max_string_chars:
            raise limit_error(f"{source}: a string of {len(raw)} characters is over the limit of {max_string_chars}")
        return intern(raw, "a string")

    def slow_string(pos: int) -> tuple[str, int]:
        found = escaped(text, pos)
        if found is None:
            raise errors.at(pos, "Unterminated string starting at")
        raw = found.group()
        if len(raw) > max_raw:
            raise limit_error(f"{source}: a string of {len(raw)} bytes is over the limit of {max_string_chars} "
                              "characters")
        transient = 2 * len(raw) + 256  # two of: the raw token, its decoded text, the string it holds
        charge(transient, "a string")
        try:
            if is_bytes:
                raw = raw.decode("utf-8")
            value, _ = scanstring(raw, 1, True)
        except UnicodeDecodeError:
            raise malformed(f"{source}: a string is not UTF-8 text (near byte {pos}); is this a file written by "
                            "save_schema / save_trace?") from None
        except JSONDecodeError as exc:
            raise errors.at(pos + exc.pos, exc.msg) from None
        finally:
            release(transient)
        if len(value) > max_string_chars:
            raise limit_error(f"{source}: a string of {len(value)} characters is over the limit of {max_string_chars}")
        return intern(value, "a string"), found.end()

    def shared(container: Any, size: int) -> Any:
        """The first container equal to `container` (hash-consing); charges or releases its `size`."""
        first = consed.setdefault(container, container)
        if first is container:
            grown(consed, 2)
        else:
            release(size)
        return first

    def finish_object(keys: list, values: list, plain_values: bool) -> tuple[JSONObject, bool]:
        n = len(keys)
        size = OBJECT_BYTES + 8 * n
        charge(size + TUPLE_BYTES + 8 * n, "an object")
        key_tuple = tuple(keys)
        known = shapes.get(key_tuple)
        if known is None:
            check = 128 * n + 1024  # the set that looks for a duplicate key, its growth included
            charge(check, "an object's keys")
            distinct = len(set(key_tuple))
            release(check)
            if distinct != n:
                seen: set = set()
                duplicate = next(key for key in key_tuple if key in seen or seen.add(key))
                raise malformed(f"{source}: duplicate key {duplicate!r} in one JSON object; a file with duplicate "
                                "keys is ambiguous and refused")
            known = shapes[key_tuple] = key_tuple
            grown(shapes, 1)
        else:
            release(TUPLE_BYTES + 8 * n)  # the key tuple just built is dropped: the shape has its own
        record = JSONObject(known, values)
        release(FRAME_BYTES + 2 * SLOT_BYTES * n)
        if plain_values:
            return shared(record, size), True
        return record, False

    def finish_array(values: list, plain_values: bool) -> tuple[tuple, bool]:
        n = len(values)
        size = TUPLE_BYTES + 8 * n
        charge(size, "an array")
        array = tuple(values)
        release(LIST_BYTES + SLOT_BYTES * n)
        if plain_values:
            return shared(array, size), True
        return array, False

    def key_at(pos: int) -> tuple[str, int]:
        """A key and its colon, from `pos`; returns the key and the position after the colon."""
        found = plain_key(text, pos, end)
        if found is not None:  # the usual key: no escapes, and its colon
            return string(found.group(1), pos), found.end()
        found = token(text, pos, end)
        if found is None or found.lastindex != 9:
            raise errors.at(errors.rest(pos), "Expecting property name enclosed in double quotes")
        key, pos = slow_string(found.start(9))
        colon = token(text, pos, end)
        if colon is None or colon.lastindex != 5:
            raise errors.at(errors.rest(pos), "Expecting ':' delimiter")
        return key, colon.end()

    # the iterative decoder: `stack` holds open containers as [keys or None, values, all values plain]
    stack: list = []
    pos = start
    value: Any = None
    plain_value = True  # `value` is a string, null, an integer or a shared container
    expect_value = True
    while True:
        if expect_value:
            found = token(text, pos, end)
            if found is None:
                raise errors.at(_skip(text, pos, is_bytes, end), "Expecting value")
            kind = found.lastindex
            pos = found.end()
            plain_value = True
            if kind == 1:
                value = string(found.group(1), pos)
            elif kind == 2:
                if len(stack) >= max_depth:
                    raise limit_error(f"{source}: JSON nesting deeper than {max_depth} levels; a real file is far "
                                      "shallower, so it is refused")
                is_dict = found.group(2) in _OPEN
                if is_dict:
                    charge(FRAME_BYTES, "an object")
                    after = token(text, pos, end)
                    if after is not None and after.lastindex == 3 and after.group(3) in (b"}", "}"):
                        pos = after.end()
                        release(FRAME_BYTES)
                        value = _EMPTY_OBJECT  # one object for every empty object
                    else:
                        key, pos = key_at(pos)
                        stack.append([[key], [], True])
                        continue
                else:
                    after = token(text, pos, end)
                    if after is not None and after.lastindex == 3 and after.group(3) in (b"]", "]"):
                        pos = after.end()
                        value = ()  # the empty tuple: one object for every empty array
                    else:
                        charge(LIST_BYTES, "an array")
                        stack.append([None, [], True])
                        continue
            elif kind == 7:  # a number: group 7 (fraction and exponent, maybe empty) always takes part
                digits, tail = found.group(6), found.group(7)
                if tail:
                    plain_value = False
                    charge(FLOAT_BYTES, "a number")
                    value = float(digits + tail)
                    if not math.isfinite(value):
                        token = digits + tail
                        token = token.decode("ascii") if is_bytes else token
                        raise malformed(f"{source}: the number {token[:40]} overflows a float")
                else:
                    if len(digits) - (digits[:1] in (b"-", "-")) > _MAX_INT_DIGITS:
                        raise limit_error(f"{source}: an integer of {len(digits)} digits is over the limit of "
                                          f"{_MAX_INT_DIGITS}")
                    value = int(digits)
                    if not -5 <= value <= 256:  # CPython's own small ints are shared already
                        value = intern(value, "a number")  # line numbers repeat: intern them too
            elif kind == 8:
                value = _LITERALS[found.group(8)]
                plain_value = value is None
            elif kind == 9:
                value, pos = slow_string(found.start(9))
            elif kind == 10:
                token = found.group(10)
                token = token.decode("ascii") if is_bytes else token
                raise malformed(f"{source}: the JSON token {token} is not allowed; non-finite numbers are written "
                                "as tagged values ({\"kind\": \"float\", \"value\": \"nan\"}) where allowed")
            else:
                raise errors.at(found.start(kind), "Expecting value")
        # a value is complete: give it to the innermost open container
        while True:
            if not stack:
                rest = _skip(text, pos, is_bytes, end)
                if rest != end:
                    raise errors.at(rest, "Extra data")
                release(sum(table_bytes))  # the tables go when the decoder returns
                return value
            frame = stack[-1]
            keys, values, plain_values = frame
            values.append(value)
            if not plain_value and plain_values:
                frame[2] = plain_values = False
            charge(SLOT_BYTES if keys is None else 2 * SLOT_BYTES, "a container")
            found = token(text, pos, end)
            kind = found.lastindex if found is not None else None
            if kind == 4:
                pos = found.end()
                if keys is not None:
                    key, pos = key_at(pos)
                    keys.append(key)
                expect_value = True
                break
            if kind == 3:
                close = found.group(3)
                pos = found.end()
                if (keys is None) != (close in (b"]", "]")):
                    raise errors.at(found.start(3), "Expecting ',' delimiter")
                stack.pop()
                value, plain_value = (finish_array(values, plain_values) if keys is None else
                                      finish_object(keys, values, plain_values))
                continue
            raise errors.at(_skip(text, pos, is_bytes, end), "Expecting ',' delimiter")


def _skip(text, pos: int, is_bytes: bool, end: Optional[int] = None) -> int:
    return (_WS_BYTES if is_bytes else _WS_STR).match(text, pos, len(text) if end is None else end).end()


def plain(value: Any) -> Any:
    """`value` with every JSONObject turned into a dict (for printing or json.dumps)."""
    if type(value) is JSONObject:
        return {key: plain(item) for key, item in value.items()}
    if type(value) is list or type(value) is tuple:
        return [plain(item) for item in value]
    return value

