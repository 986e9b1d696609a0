"""JSON Schema ``pattern`` / ``patternProperties`` regular expressions (ECMA-262 syntax) on RE2 (pure).

JSON Schema patterns are ECMA-262 regular expressions. They run here on RE2, which matches in linear time,
so no pattern can stall the event loop (a backtracking engine takes exponential time on ``^(a+)+$``
against ``"aaaa…!"`` and holds the GIL meanwhile). :func:`ecma_to_re2` rewrites what ECMA-262 spells or
means differently from RE2:

* ``.`` matches any character but the line terminators ``\\n``, ``\\r``, U+2028 and U+2029;
* ``\\s`` / ``\\S`` are ECMA-262's white space (``\\t\\n\\v\\f\\r``, space, U+00A0, U+1680, U+2000 to U+200A,
  U+2028, U+2029, U+202F, U+205F, U+3000, U+FEFF); ``\\d`` and ``\\w`` are ASCII in both;
* escapes ``\\uXXXX`` (a surrogate pair ``\\uD83D\\uDE00`` is one character), ``\\u{X…}``, ``\\xHH``, ``\\cX``,
  ``\\0``, ``\\v``, ``\\b`` inside a class (backspace); ``\\p{Letter}`` / ``\\p{Script=Greek}`` spellings;
* ``[^]`` (any character) and ``[]`` (none); named groups ``(?<name>…)``.

What RE2 cannot run raises :class:`EcmaRegexError` naming the construct: backreferences (``\\1``,
``\\k<name>``), lookahead and lookbehind, and escapes that are not ECMA-262's (``\\a``, ``\\z``, ``\\Q``…).
``^`` and ``$`` anchor at the ends of the text (no multiline flag), as in ECMA-262 and RE2 alike.

Compiled programs are cached (:class:`PatternCache`, one per process: patterns are the same whatever the
registry) by count and by bytes: a program costs :func:`program_cost` (RE2 allows each one up to about 1 MiB,
so 256 of them could hold 256 MiB), the least recently used goes first. A validator does not hold its
programs: one dropped from the cache is compiled again when next needed. Programs are built past google-re2's
own ``re2.compile`` cache (:func:`~service.lib.java_regex.re2_compile`), which would keep 128 more.
"""

from __future__ import annotations

from typing import Any

import re2

from service.lib.java_regex import re2_compile, re2_refusal
from service.schemas.registry import CacheBudget, LRUCache

_WS = r"\t\n\x0B\f\r \x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF}"
_DOT = r"[^\n\r\x{2028}\x{2029}]"
_ANY = r"[\x{0}-\x{10FFFF}]"
_NONE = r"[^\x{0}-\x{10FFFF}]"
# ECMA-262 long General_Category names -> the short ones RE2 knows
_GC_LONG = {"Letter": "L", "Cased_Letter": "L", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll",
            "Titlecase_Letter": "Lt", "Modifier_Letter": "Lm", "Other_Letter": "Lo", "Mark": "M",
            "Combining_Mark": "M", "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc", "Enclosing_Mark": "Me",
            "Number": "N", "Decimal_Number": "Nd", "digit": "Nd", "Letter_Number": "Nl", "Other_Number": "No",
            "Punctuation": "P", "punct": "P", "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd",
            "Open_Punctuation": "Ps", "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi",
            "Final_Punctuation": "Pf", "Other_Punctuation": "Po", "Symbol": "S", "Math_Symbol": "Sm",
            "Currency_Symbol": "Sc", "Modifier_Symbol": "Sk", "Other_Symbol": "So", "Separator": "Z",
            "Space_Separator": "Zs", "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Other": "C",
            "Control": "Cc", "cntrl": "Cc", "Format": "Cf", "Surrogate": "Cs", "Private_Use": "Co",
            "Unassigned": "Cn"}
_GC_SHORT = {"L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No", "P", "Pc", "Pd",
             "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So", "Z", "Zs", "Zl", "Zp", "C", "Cc", "Cf",
             "Cs", "Co", "Cn"}
_NOT_WS_MARK = "\x00\\S\x00"  # \S inside a class, until the class closes (no pattern text holds it)
_HEX = set("0123456789abcdefABCDEF")
_SYNTAX = set("^$\\.*+?()[]{}|/-")
#: longest pattern compiled (RE2 compiles in linear time, but the program's memory grows with it)
MAX_PATTERN_LENGTH = 10_000

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 logs every parse error to stderr otherwise
_OPTIONS.max_mem = 1 << 20  # bounds the compiled program and its DFA cache (a pattern too big fails to compile)
# Markers in RE2's parse errors of constructs RE2 refuses by design.
_UNSUPPORTED = (("(?=", "lookahead"), ("(?!", "negative lookahead"), ("(?<=", "lookbehind"),
                ("(?<!", "negative lookbehind"), ("*+", "a possessive quantifier"),
                ("++", "a possessive quantifier"), ("?+", "a possessive quantifier"),
                ("}+", "a possessive quantifier"))


class EcmaRegexError(ValueError):
    """A pattern that is not ECMA-262, or uses what RE2 cannot run (the message names it)."""


def _refuse(what: str) -> EcmaRegexError:
    return EcmaRegexError(f"{what} is not supported (patterns run on RE2, which matches in linear time: no "
                          f"backreferences, lookahead or lookbehind)")


def _cp(code: int) -> str:
    return f"\\x{{{code:X}}}"


def _hex_at(p: str, i: int, n: int) -> int | None:
    digits = p[i:i + n]
    if len(digits) == n and all(c in _HEX for c in digits):
        return int(digits, 16)
    return None


def _property(body: str, negated: bool) -> str:
    name, _, value = body.partition("=")
    if value:
        if name in ("General_Category", "gc"):
            target = _GC_LONG.get(value, value)
            if target not in _GC_SHORT:
                raise EcmaRegexError(f"unknown General_Category \\p{{{body}}}")
        elif name in ("Script", "sc"):
            target = value  # RE2 knows the script names (and refuses unknown ones)
        else:
            raise _refuse(f"the property \\p{{{body}}}")
    else:
        target = _GC_LONG.get(name, name)
        if target not in _GC_SHORT:
            if name == "Any":
                return _NONE if negated else _ANY
            raise _refuse(f"the binary property \\p{{{body}}}")
    return ("\\P" if negated else "\\p") + "{" + target + "}"


def _escape(p: str, i: int, in_class: bool) -> tuple[str, int]:
    """The RE2 spelling of the escape at ``p[i]`` (just after the backslash) and the index after it."""
    if i >= len(p):
        raise EcmaRegexError("a pattern may not end with a backslash")
    c = p[i]
    if c in "dDwW":
        return "\\" + c, i + 1
    if c == "s":
        return (_WS if in_class else f"[{_WS}]"), i + 1
    if c == "S":  # inside a class: a marker the class rewrites (RE2 classes cannot hold a negated set)
        return (_NOT_WS_MARK if in_class else f"[^{_WS}]"), i + 1
    if c == "b":
        return ("\\x08" if in_class else "\\b"), i + 1
    if c == "B":
        if in_class:
            raise EcmaRegexError("\\B inside a character class is not an ECMA-262 escape")
        return "\\B", i + 1
    if c in "fnrt":
        return "\\" + c, i + 1
    if c == "v":
        return "\\x0B", i + 1
    if c == "0" and not p[i + 1:i + 2].isdigit():
        return "\\x00", i + 1
    if c.isdigit():
        raise _refuse(f"the backreference \\{c}")
    if c == "k" and p[i + 1:i + 2] == "<":
        raise _refuse("the named backreference \\k<…>")
    if c == "c":
        letter = p[i + 1:i + 2]
        if letter.isascii() and letter.isalpha():
            return _cp(ord(letter) % 32), i + 2
        raise EcmaRegexError("\\c must be followed by a letter")
    if c == "x":
        code = _hex_at(p, i + 1, 2)
        if code is None:
            raise EcmaRegexError("\\x must be followed by two hex digits")
        return _cp(code), i + 3
    if c == "u":
        if p[i + 1:i + 2] == "{":
            end = p.find("}", i + 2)
            digits = p[i + 2:end] if end > 0 else ""
            if not digits or not all(ch in _HEX for ch in digits) or int(digits, 16) > 0x10FFFF:
                raise EcmaRegexError("\\u{…} must hold a code point in hex (at most 10FFFF)")
            return _cp(int(digits, 16)), end + 1
        code = _hex_at(p, i + 1, 4)
        if code is None:
            raise EcmaRegexError("\\u must be followed by four hex digits")
        if 0xD800 <= code <= 0xDBFF and p[i + 5:i + 7] == "\\u":
            low = _hex_at(p, i + 7, 4)
            if low is not None and 0xDC00 <= low <= 0xDFFF:
                return _cp(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), i + 11
        if 0xD800 <= code <= 0xDFFF:
            raise _refuse(f"the lone surrogate \\u{code:04X}")
        return _cp(code), i + 5
    if c in "pP":
        if p[i + 1:i + 2] != "{" or p.find("}", i + 2) < 0:
            raise EcmaRegexError(f"\\{c} must be followed by {{property}}")
        end = p.find("}", i + 2)
        return _property(p[i + 2:end], c == "P"), end + 1
    if c in _SYNTAX:
        return "\\" + c, i + 1
    if c.isascii() and c.isalnum():
        raise EcmaRegexError(f"\\{c} is not an ECMA-262 escape")
    return _cp(ord(c)), i + 1  # an identity escape of any other character: that character


def ecma_to_re2(pattern: str) -> str:
    """The RE2 pattern of an ECMA-262 pattern; raises :class:`EcmaRegexError` naming what RE2 cannot run."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    class_at = 0  # where the open class starts in out
    while i < n:
        c = pattern[i]
        if c == "\\":
            spelled, i = _escape(pattern, i + 1, in_class)
            out.append(spelled)
            continue
        if in_class:
            if c == "]":
                in_class = False
                if _NOT_WS_MARK in out[class_at + 1:]:  # [x\S] = x or not ECMA white space
                    if out[class_at] == "[^":
                        raise _refuse("\\S inside a negated character class")
                    rest = [part for part in out[class_at + 1:] if part != _NOT_WS_MARK]
                    del out[class_at:]
                    out.append(f"(?:[{''.join(rest)}]|[^{_WS}])" if rest else f"[^{_WS}]")
                    i += 1
                    continue
            elif c == "[":
                c = "\\["
            out.append(c)
            i += 1
            continue
        if c == "[":
            if pattern.startswith("[^]", i):
                out.append(_ANY)
                i += 3
                continue
            if pattern.startswith("[]", i):
                out.append(_NONE)
                i += 2
                continue
            in_class = True
            class_at = len(out)
            if pattern.startswith("[^", i):
                out.append("[^")
                i += 2
            else:
                out.append("[")
                i += 1
            if pattern.startswith("]", i):  # RE2 would read a leading "]" as a literal: not ECMA-262's meaning
                raise EcmaRegexError("a character class cannot start with ']'")
            continue
        if c == ".":
            out.append(_DOT)
            i += 1
            continue
        if c == "(" and pattern.startswith("(?", i):
            head = pattern[i + 2:i + 4]
            if head.startswith("="):
                raise _refuse("lookahead (?=…)")
            if head.startswith("!"):
                raise _refuse("negative lookahead (?!…)")
            if head == "<=":
                raise _refuse("lookbehind (?<=…)")
            if head == "<!":
                raise _refuse("negative lookbehind (?<!…)")
            if head.startswith("<"):
                out.append("(?P<")
                i += 3
                continue
            if head.startswith(":"):
                out.append("(?:")
                i += 3
                continue
            raise EcmaRegexError("'(?' must start a group (?:…), (?<name>…) or a lookaround")
        out.append(c)
        i += 1
    if in_class:
        raise EcmaRegexError("a character class is not closed with ']'")
    return "".join(out)


#: compiled programs kept at most (per process)
PATTERN_CACHE_SIZE = 256
#: bytes of compiled programs kept at most (per process), as :func:`program_cost` counts them
PATTERN_CACHE_MAX_BYTES = 32 * 1024 * 1024
#: bytes an RE2 instruction is charged (measured: ~10 of RSS; ``\p{L}{55}x``, 65,786 instructions, 0.63 MiB)
INSTRUCTION_BYTES = 16
#: what a program's DFA caches are charged: they grow while it matches, up to its share of ``max_mem``
#: (measured: ~0.2 MiB for a pattern whose DFA explodes, against 200 KB of random text)
DFA_ALLOWANCE = 128 * 1024


def program_cost(pattern: str, program: Any) -> int:
    """The bytes charged for a compiled program: its instructions both ways (the reverse program, built when a
    match needs it, is about the forward one's size), its DFA allowance and its text."""
    return 2 * INSTRUCTION_BYTES * max(0, program.programsize) + DFA_ALLOWANCE + 4 * len(pattern)


class PatternCache:
    """Compiled patterns, the least recently used dropped first past ``size`` programs or ``max_bytes``
    (:func:`program_cost` each; a program costing more than ``max_bytes`` is compiled, used, never kept).
    Only what compiled is kept: a refusal raises every time. Thread-safe (schemas compile on a worker thread)."""

    def __init__(self, size: int = PATTERN_CACHE_SIZE, max_bytes: int = PATTERN_CACHE_MAX_BYTES) -> None:
        self.budget = CacheBudget(max_bytes)
        self._lru: LRUCache[str, Any] = LRUCache(size, self.budget)
        self.compiles = 0  # programs compiled (tests)

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def used(self) -> int:
        """Bytes charged for the programs kept now."""
        return self.budget.used

    def compile(self, pattern: str) -> Any:
        """An ECMA-262 pattern compiled with RE2 (cached); raises :class:`EcmaRegexError` naming what it
        refuses. Match with ``.search(text)`` (JSON Schema patterns are not anchored)."""
        found = self._lru.get(pattern)
        if found is not None:
            return found
        program = _compile(pattern)
        self.compiles += 1
        self._lru.put(pattern, program, program_cost(pattern, program))
        return program


def _compile(pattern: str) -> Any:
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise EcmaRegexError(f"the pattern is longer than {MAX_PATTERN_LENGTH} characters")
    translated = ecma_to_re2(pattern)
    try:
        return re2_compile(translated, _OPTIONS)
    except re2.error as exc:
        what, detail = re2_refusal(exc, _UNSUPPORTED)
        if what == "backreferences":
            raise _refuse("a backreference") from None
        if what is not None:
            raise _refuse(what) from None
        raise EcmaRegexError(detail) from None


#: the process's cache of compiled patterns
PATTERNS = PatternCache()


def compile_pattern(pattern: str) -> Any:
    """An ECMA-262 pattern compiled with RE2, from :data:`PATTERNS`; raises :class:`EcmaRegexError` naming what
    it refuses. Match with ``.search(text)`` (JSON Schema patterns are not anchored)."""
    return PATTERNS.compile(pattern)
