"""Parse codec chain strings from configuration: ``fp16(svd(0.6))``, ``int8(block=64)``,
``size(4096, small=lz4, large=fp16)``, ``role(activation=fp16(svd(0.6)), gradient=int8, ids=lz4)``.

Grammar::

    expr  := NAME [ "(" [ arg ("," arg)* ] ")" ]
    arg   := NAME "=" value | value
    value := NUMBER | expr

A codec expression as the positional argument of a concrete codec means
composition: ``outer(inner, outer_params...)``.
"""

from __future__ import annotations

import re
from typing import Any

from nebula_mq.codecs.base import Codec, codec_class, registered
from nebula_mq.codecs.compose import ByRole, BySize, Chain
from nebula_mq.codecs.cast import Identity
from nebula_mq.errors import CodecError, UnknownCodec

_TOKEN = re.compile(r"\s*(?:(?P<num>[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[(),=]))")
_MAX_LEN = 512


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None:
                raise CodecError(f"codec spec {text!r}: unexpected character {text[pos:].lstrip()[:1]!r} at {pos}")
            kind = m.lastgroup or "op"
            self.toks.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        self.i = 0

    def _peek(self) -> tuple[str, str, int] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def _fail(self, what: str) -> CodecError:
        tok = self._peek()
        got = f"{tok[1]!r} at {tok[2]}" if tok else "end of string"
        return CodecError(f"codec spec {self.text!r}: expected {what}, got {got}")

    def _take(self, kind: str, value: str | None = None) -> str:
        tok = self._peek()
        if tok is None or tok[0] != kind or (value is not None and tok[1] != value):
            raise self._fail(value or kind)
        self.i += 1
        return tok[1]

    def parse(self) -> Codec:
        codec = self.expr()
        if self._peek() is not None:
            raise self._fail("end of string")
        return codec

    def expr(self) -> Codec:
        tok = self._peek()
        name = self._take("name") if tok and tok[0] == "name" else None
        if name is None or tok is None:
            raise self._fail("a codec name")
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        if (nxt := self._peek()) is not None and nxt[1] == "(":
            self.i += 1
            while (nxt := self._peek()) is not None and nxt[1] != ")":
                if nxt[0] == "name" and self.i + 1 < len(self.toks) and self.toks[self.i + 1][1] == "=":
                    key = self._take("name")
                    self._take("op", "=")
                    if key in kwargs:
                        raise CodecError(f"codec spec {self.text!r}: {key} given twice")
                    kwargs[key] = self.value()
                else:
                    if kwargs:
                        raise self._fail("key=value after a key=value")
                    args.append(self.value())
                if (nxt := self._peek()) is not None and nxt[1] == ",":
                    self.i += 1
                elif nxt is None or nxt[1] != ")":
                    raise self._fail("',' or ')'")
            self._take("op", ")")
        return self.build(name, tok[2], args, kwargs)

    def value(self) -> Any:
        tok = self._peek()
        if tok is not None and tok[0] == "num":
            self.i += 1
            text = tok[1]
            return float(text) if any(c in text for c in ".eE") else int(text)
        return self.expr()

    def build(self, name: str, pos: int, args: list[Any], kwargs: dict[str, Any]) -> Codec:
        where = f"codec spec {self.text!r}: {name}"
        if name == "role":
            codecs = {k: v for k, v in kwargs.items()}
            bad = set(codecs) - {"activation", "gradient", "ids", "default"}
            if args or bad or not all(isinstance(v, Codec) for v in codecs.values()):
                raise CodecError(f"{where}: takes only activation=, gradient=, ids=, default= codecs")
            default = codecs.get("default", Identity())
            return ByRole(**{r: codecs.get(r, default) for r in ("activation", "gradient", "ids")}, default=default)
        if name == "size":
            threshold = args[0] if args else kwargs.pop("threshold", None)
            if type(threshold) is not int or len(args) > 1 or set(kwargs) - {"small", "large"}:
                raise CodecError(f"{where}: expected size(THRESHOLD, small=CODEC, large=CODEC)")
            small, large = kwargs.get("small", Identity()), kwargs.get("large", Identity())
            if not (isinstance(small, Codec) and isinstance(large, Codec)):
                raise CodecError(f"{where}: small= and large= must be codecs")
            return BySize(threshold, small, large)
        try:
            cls = codec_class(name)
        except UnknownCodec:
            known = sorted({c.name for c in registered().values()} | {"role", "size"})
            raise UnknownCodec(f"codec spec {self.text!r}: unknown codec {name!r} at {pos}; known: {known}") from None
        inner = [a for a in args if isinstance(a, Codec)]
        numbers = [a for a in args if not isinstance(a, Codec)]
        if len(inner) > 1 or any(isinstance(v, Codec) for v in kwargs.values()):
            raise CodecError(f"{where}: at most one inner codec, as the first argument")
        fields = [f for f in cls.__dataclass_fields__]  # type: ignore[attr-defined]
        if len(numbers) > len(fields):
            raise CodecError(f"{where}: takes at most {len(fields)} positional parameter(s)")
        params = dict(zip(fields, numbers))
        for key in kwargs:
            if key in params:
                raise CodecError(f"{where}: {key} given twice")
        params.update(kwargs)
        try:
            codec = cls.from_params(params)
        except TypeError:
            raise CodecError(f"{where}: missing parameter(s) {fields}") from None
        return Chain(codec, inner[0]) if inner else codec


def parse_codec(spec: str) -> Codec:
    """Parse a chain string into a codec; errors are UnknownCodec / CodecError naming the token."""
    if not isinstance(spec, str) or not spec.strip():
        raise CodecError(f"codec spec must be a non-empty string, got {spec!r}")
    if len(spec) > _MAX_LEN:
        raise CodecError(f"codec spec longer than {_MAX_LEN} characters")
    return _Parser(spec).parse()
