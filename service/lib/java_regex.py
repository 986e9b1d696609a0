"""Java regular-expression syntax → RE2 syntax, for the topic patterns clients send (pure).

Kafka clients subscribe with ``java.util.regex`` patterns (and Kafka moved to RE2/J for KIP-848 regex
subscriptions). Patterns run on RE2 here (linear time: no pattern can stall the event loop), so the
constructs where Java's spelling differs from RE2's are rewritten to RE2's equivalent:

* POSIX classes ``\\p{Lower}`` … ``\\p{XDigit}``, ``\\p{ASCII}`` (ASCII-only, as in Java) and their
  negations ``\\P{…}`` → ``[[:lower:]]`` / ``[^[:lower:]]`` (inside a class: ``[:lower:]`` / ``[:^lower:]``);
* Unicode spellings ``\\p{IsL}``, ``\\p{gc=Lu}``, ``\\p{IsLatin}``, ``\\p{sc=Greek}``, ``\\p{javaLowerCase}``,
  ``\\p{IsLetter}`` … → RE2's ``\\p{L}``, ``\\p{Lu}``, ``\\p{Latin}``, ``\\p{Greek}``, ``\\p{Ll}``, ``\\p{L}``;
* escapes ``\\uXXXX``, ``\\0ooo``, ``\\e``, ``\\cX``, ``\\h``, ``\\v`` (vertical whitespace), ``\\R``, ``\\Z``;
* named groups ``(?<name>…)`` → ``(?P<name>…)``; the flags ``d`` and ``u`` (no effect on topic names)
  are dropped.

What RE2 cannot run, or what would silently change meaning, raises :class:`JavaRegexError` with the
construct named: backreferences (``\\1``, ``\\k<name>``), ``\\G``, ``\\X``, ``\\N{…}``, class intersection
(``&&``) and nested class unions, Unicode blocks (``\\p{InGreek}``), the ``(?U)`` and ``(?x)`` flags, and
Java properties without an exact RE2 equivalent. Lookaround, atomic groups and possessive quantifiers
pass through and are refused by the caller from RE2's own error.
"""

from __future__ import annotations

from typing import Any

_POSIX = {"Lower": "lower", "Upper": "upper", "ASCII": "ascii", "Alpha": "alpha", "Digit": "digit",
          "Alnum": "alnum", "Punct": "punct", "Graph": "graph", "Print": "print", "Blank": "blank",
          "Cntrl": "cntrl", "XDigit": "xdigit", "Space": "space"}
# java.lang.Character methods and Java binary properties with an exact Unicode-category equivalent
_JAVA_PROPS = {"javaLowerCase": "Ll", "javaUpperCase": "Lu", "javaTitleCase": "Lt", "javaDigit": "Nd",
               "javaLetter": "L", "IsLetter": "L", "IsDigit": "Nd", "IsPunctuation": "P", "IsControl": "Cc",
               "IsTitlecase": "Lt"}
# Java binary properties (``\\p{IsAlphabetic}``…) without an exact RE2 equivalent
_JAVA_BINARY = {"Alphabetic", "Ideographic", "Lowercase", "Uppercase", "White_Space", "WhiteSpace",
                "Hex_Digit", "HexDigit", "Join_Control", "JoinControl", "Noncharacter_Code_Point",
                "NoncharacterCodePoint", "Assigned", "Emoji", "Emoji_Presentation", "Emoji_Modifier",
                "Emoji_Modifier_Base", "Emoji_Component", "Extended_Pictographic"}
_CATEGORIES = {"L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No", "P", "Pc",
               "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So", "Z", "Zs", "Zl", "Zp", "C",
               "Cc", "Cf", "Cs", "Co", "Cn"}
_HSPACE = r"\t \x{A0}\x{1680}\x{180E}\x{2000}-\x{200A}\x{202F}\x{205F}\x{3000}"
_VSPACE = r"\n\x0B\f\r\x{85}\x{2028}\x{2029}"


class JavaRegexError(ValueError):
    """A Java pattern construct that RE2 cannot run (the message names it)."""


def _refuse(what: str, verb: str = "is") -> JavaRegexError:
    return JavaRegexError(f"{what} {verb} not supported (patterns run on RE2, which matches in linear time)")


def _property(name: str, negated: bool, in_class: bool) -> str:
    """RE2 spelling of Java's ``\\p{name}`` / ``\\P{name}``."""
    if name in _POSIX:
        posix = _POSIX[name]
        if in_class:
            return f"[:^{posix}:]" if negated else f"[:{posix}:]"
        return f"[^[:{posix}:]]" if negated else f"[[:{posix}:]]"
    target: str | None = None
    if name in _JAVA_PROPS:
        target = _JAVA_PROPS[name]
    elif name.startswith("In") or name.startswith(("blk=", "block=")):
        raise _refuse(f"the Unicode block \\p{{{name}}}")
    else:
        for prefix in ("gc=", "general_category=", "sc=", "script=", "Is"):
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        if name in _JAVA_BINARY:
            raise _refuse(f"the Java property \\p{{Is{name}}}")
        if name in _CATEGORIES or (name[:1].isupper() and name.replace("_", "").isalpha() and len(name) > 2):
            target = name  # a category, or a script name (RE2 refuses names it does not know)
    if target is None:
        raise _refuse(f"the Java property \\p{{{name}}}")
    return ("\\P" if negated else "\\p") + "{" + target + "}"


def _hex(code: int) -> str:
    return f"\\x{{{code:X}}}"


def java_to_re2(pattern: str) -> str:
    """The RE2 pattern that matches what the Java ``pattern`` matches (see the module docstring)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    depth = 0  # inside a character class (Java nests them; RE2 does not)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                raise JavaRegexError("the pattern ends with a lone backslash")
            e = pattern[i + 1]
            if e == "Q":  # quoted literal up to \E (RE2 has \Q…\E too; copy verbatim)
                end = pattern.find("\\E", i + 2)
                stop = n if end < 0 else end + 2
                out.append(pattern[i:stop])
                i = stop
                continue
            if e in "pP":
                if i + 2 < n and pattern[i + 2] == "{":
                    close = pattern.find("}", i + 3)
                    if close < 0:
                        raise JavaRegexError("unterminated \\p{...}")
                    out.append(_property(pattern[i + 3:close], e == "P", depth > 0))
                    i = close + 1
                else:  # \pL: one-letter category
                    if i + 2 >= n:
                        raise JavaRegexError("\\p needs a property name")
                    out.append(_property(pattern[i + 2], e == "P", depth > 0))
                    i += 3
                continue
            if e == "u":
                digits = pattern[i + 2:i + 6]
                if len(digits) != 4 or any(ch not in "0123456789abcdefABCDEF" for ch in digits):
                    raise JavaRegexError("\\u needs four hexadecimal digits")
                out.append(_hex(int(digits, 16)))
                i += 6
                continue
            if e == "0":
                j = i + 2
                while j < n and j < i + 5 and pattern[j] in "01234567":
                    j += 1
                if j == i + 5 and pattern[i + 2] > "3":  # \0mnn only for m <= 3 (as Java)
                    j -= 1
                if j == i + 2:
                    raise JavaRegexError("\\0 needs octal digits")
                out.append(_hex(int(pattern[i + 2:j], 8)))
                i = j
                continue
            if e == "c":
                if i + 2 >= n:
                    raise JavaRegexError("\\c needs a control letter")
                out.append(_hex(ord(pattern[i + 2]) ^ 64))
                i += 3
                continue
            simple = {"e": _hex(0x1B), "h": f"[{_HSPACE}]", "H": f"[^{_HSPACE}]", "v": f"[{_VSPACE}]",
                      "V": f"[^{_VSPACE}]"}
            if e in simple:
                rep = simple[e]
                if depth > 0 and rep.startswith("[^"):
                    raise _refuse(f"\\{e} inside a character class")
                out.append(rep[1:-1] if depth > 0 and rep.startswith("[") else rep)
                i += 2
                continue
            if e == "R":
                if depth > 0:
                    raise JavaRegexError("\\R is not allowed inside a character class")
                out.append(f"(?:\\r\\n|[{_VSPACE}])")
                i += 2
                continue
            if e == "Z":
                out.append("(?:\\n?\\z)")  # before an optional final line terminator
                i += 2
                continue
            if e.isdigit() or e == "k":
                raise _refuse("backreferences", "are")
            if e in "GXN":
                raise _refuse({"G": "\\G (end of the previous match)", "X": "\\X (grapheme cluster)",
                               "N": "\\N{name}"}[e])
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if depth > 0:
            if c == "[":
                if pattern.startswith("[:", i):  # a POSIX bracket: RE2's own syntax, copy it
                    close = pattern.find(":]", i + 2)
                    if close >= 0:
                        out.append(pattern[i:close + 2])
                        i = close + 2
                        continue
                raise _refuse("a nested character class (union)")
            if c == "&" and pattern.startswith("&&", i):
                raise _refuse("character class intersection (&&)")
            if c == "]":
                depth -= 1
            out.append(c)
            i += 1
            continue
        if c == "[":
            depth = 1
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":  # a leading ']' is a literal in Java
                out.append("\\]")
                i += 1
            continue
        if c == "(" and pattern.startswith("(?", i):
            if pattern.startswith("(?<", i) and i + 3 < n and pattern[i + 3] not in "=!":
                out.append("(?P<")
                i += 3
                continue
            j = i + 2
            while j < n and (pattern[j].isalpha() or pattern[j] == "-"):
                j += 1
            if j < n and pattern[j] in ":)" and j > i + 2:
                flags = pattern[i + 2:j]
                if "U" in flags:
                    raise _refuse("the (?U) flag (Unicode character classes)")
                if "x" in flags:
                    raise _refuse("the (?x) flag (comments mode)")
                flags = flags.replace("d", "").replace("u", "")
                if flags.strip("-") == "":
                    out.append("(?:" if pattern[j] == ":" else "")
                else:
                    out.append(f"(?{flags.rstrip('-')}{pattern[j]}")
                i = j + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


def re2_compile(pattern: str, options: Any) -> Any:
    """``pattern`` compiled with RE2, past google-re2's module cache: ``re2.compile`` keeps the last 128
    programs it built (an ``lru_cache`` of the binding, whatever their size: up to ``max_mem`` each), out of
    reach of any bound of ours. A program built here lives as long as whoever holds it. Raises ``re2.error``."""
    import re2  # here: the rest of this module is pure

    make = getattr(re2, "_Regexp", None)  # the class re2.compile instantiates through its cache
    return make(pattern, options) if make is not None else re2.compile(pattern, options)


def re2_refusal(exc: Exception, markers: tuple[tuple[str, str], ...]) -> tuple[str | None, str]:
    """What RE2's compile error ``exc`` refuses: ``(construct, detail)`` where ``construct`` names the
    construct RE2 does not run by design (from ``markers``, ``(text in RE2's message, name)`` pairs, or
    ``"backreferences"``), or None for any other error; ``detail`` is RE2's message as text."""
    detail = exc.args[0] if exc.args else str(exc)
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", "replace")
    detail = str(detail)
    for marker, what in markers:
        if detail.endswith(marker) or f": {marker}" in detail:
            return what, detail
    if "invalid escape sequence: \\" in detail and detail[-1:].isdigit():
        return "backreferences", detail
    return None, detail

