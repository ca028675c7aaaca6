"""The part of Go's text/template that Ollama's prompt templates use, for /api/generate's `template` field.

    render(template, values) -> the prompt text

Supported: text and `{{ pipeline }}` actions with `{{-` / `-}}` trimming; comments `{{/* ... */}}`; fields
(`.Prompt`, `.Function.Name`, `.`), `$` (the root), variables (`$x := ...`, `$x = ...`, `range $i, $m :=
...`); `if` / `else if` / `else` / `end`, `range` (with `else`), `with`; string, number, true/false/nil
literals; parentheses and `|` pipes; the functions eq ne lt le gt ge and or not len index slice print json
and Ollama's currentDate. Anything else (`define`, `template`, `block`, `printf`, method calls) is a
TemplateError naming it, which the route answers as a 400.

Truth is Go's: false, 0, "", nil and empty lists and maps are false. As in Ollama, rendering stops at an
empty `{{ .Response }}`: what came before it is the prompt, and the model writes the response. A request's
template is untrusted: a run may take at most MAX_STEPS nodes (nested ranges grow exponentially) and write
at most MAX_OUTPUT_CHARS, else a TemplateError.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_OUTPUT_CHARS", "MAX_STEPS", "TemplateError", "render", "uses_field"]

MAX_STEPS = 100_000  # nodes one render may visit
MAX_OUTPUT_CHARS = 4 * 2**20  # about the largest prompt a request body can carry


class TemplateError(ValueError):
    """The template cannot be parsed or run; the message says where and why."""


# -- the tree ----------------------------------------------------------------------------------------------
@dataclass
class _Cmd:
    """One command of a pipeline: a function call (`func` set) or a single operand."""

    func: str | None
    args: list[Any]  # operands: ("field", base, names) | ("lit", value) | ("pipe", _Pipe)


@dataclass
class _Pipe:
    cmds: list[_Cmd]
    decl: list[str] = field(default_factory=list)  # variables it declares (`:=`) or assigns (`=`)
    is_assign: bool = False


@dataclass
class _Block:
    """if / range / with: `branches` are (pipeline, body) pairs (else-if chains), then the else body."""

    kind: str
    branches: list[tuple[_Pipe, list[Any]]]
    else_body: list[Any] = field(default_factory=list)


class _StopAtResponse(Exception):
    """Raised at an empty {{ .Response }}: the prompt ends there."""


# -- lexing ------------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<raw>`[^`]*`)|(?P<op>:=|[()|=,])|"""
                    r"""(?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)|(?P<field>(?:\.[A-Za-z0-9_]+)+|\.)|"""
                    r"""(?P<num>-?\d+(?:\.\d+)?)|(?P<word>[A-Za-z_][A-Za-z0-9_]*))""")


def _actions(template: str) -> list[tuple[str, str]]:
    """[("text", s) | ("action", s)], with `{{-` / `-}}` trimming applied and comments dropped."""
    out: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    while True:
        start = template.find("{{", pos)
        text = template[pos:] if start < 0 else template[pos:start]
        if trim_next:
            text = text.lstrip()
        if start < 0:
            out.append(("text", text))
            return out
        body_start = start + 2
        if template.startswith("-", body_start) and template[body_start + 1:body_start + 2].isspace():
            text = text.rstrip()
            body_start += 2
        out.append(("text", text))
        end = _action_end(template, body_start)
        body = template[body_start:end]
        trim_next = body.endswith("-") and body[-2:-1].isspace()
        if trim_next:
            body = body[:-1]
        body = body.strip()
        if not (body.startswith("/*") and body.endswith("*/")):
            out.append(("action", body))
        pos = end + 2


def _action_end(template: str, pos: int) -> int:
    """Index of the `}}` closing the action from `pos`, skipping over quoted strings."""
    quote = None
    i = pos
    while i < len(template):
        ch = template[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"`":
            quote = ch
        elif template.startswith("}}", i):
            return i
        i += 1
    raise TemplateError(f"unclosed action at offset {pos - 2}")


def _tokens(action: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(action.rstrip()):
        m = _TOKEN.match(action, pos)
        if m is None or m.end() == pos:
            raise TemplateError(f"cannot parse {action[pos:].strip()!r} in {{{{ {action} }}}}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


# -- parsing -----------------------------------------------------------------------------------------------
class _Parser:
    def __init__(self, template: str) -> None:
        self.items = _actions(template)
        self.pos = 0

    def parse(self) -> list[Any]:
        body, end = self.body()
        if end is not None:
            raise TemplateError(f"unexpected {{{{ {end} }}}}")
        return body

    def body(self) -> tuple[list[Any], str | None]:
        """Nodes up to an `else...` or `end` action (returned as the second element) or the end of the text."""
        nodes: list[Any] = []
        while self.pos < len(self.items):
            kind, value = self.items[self.pos]
            self.pos += 1
            if kind == "text":
                if value:
                    nodes.append(value)
                continue
            word = value.split(None, 1)[0] if value else ""
            if word in ("end", "else"):
                return nodes, value
            if word in ("if", "range", "with"):
                nodes.append(self.block(word, value[len(word):]))
            elif word in ("define", "template", "block", "break", "continue"):
                raise TemplateError(f"{{{{ {word} }}}} is not supported in templates here")
            else:
                nodes.append(self.pipeline(_tokens(value), value))
        return nodes, None

    def block(self, kind: str, rest: str) -> _Block:
        pipe = self.pipeline(_tokens(rest), rest, allow_two=kind == "range")
        body, end = self.body()
        node = _Block(kind, [(pipe, body)])
        while end is not None and end.startswith("else"):
            tail = end[4:].strip()
            if tail.startswith(("if ", "with ")) and kind != "range":
                word = tail.split(None, 1)[0]
                if word != kind:
                    raise TemplateError(f"{{{{ else {word} }}}} inside {{{{ {kind} }}}}")
                cond = self.pipeline(_tokens(tail[len(word):]), tail)
                body, end = self.body()
                node.branches.append((cond, body))
            elif not tail:
                node.else_body, end = self.body()
                if end != "end":
                    raise TemplateError(f"{{{{ {kind} }}}}: expected {{{{ end }}}} after {{{{ else }}}}")
            else:
                raise TemplateError(f"cannot parse {{{{ {end} }}}}")
        if end != "end":
            raise TemplateError(f"{{{{ {kind} }}}} has no {{{{ end }}}}")
        return node

    def pipeline(self, toks: list[tuple[str, str]], source: str, allow_two: bool = False) -> _Pipe:
        pipe = _Pipe([])
        if len(toks) >= 2 and toks[0][0] == "var" and toks[1] in (("op", ":="), ("op", "="), ("op", ",")):
            names = [toks[0][1]]
            i = 1
            if toks[1] == ("op", ","):
                if not allow_two or len(toks) < 4 or toks[2][0] != "var":
                    raise TemplateError(f"cannot parse {{{{ {source} }}}}")
                names.append(toks[2][1])
                i = 3
            if toks[i] not in (("op", ":="), ("op", "=")):
                raise TemplateError(f"cannot parse {{{{ {source} }}}}")
            pipe.decl, pipe.is_assign = names, toks[i] == ("op", "=")
            toks = toks[i + 1:]
        cmd_toks: list[tuple[str, str]] = []
        depth = 0
        for tok in [*toks, ("op", "|")]:
            if tok == ("op", "|") and depth == 0:
                pipe.cmds.append(self.command(cmd_toks, source))
                cmd_toks = []
                continue
            depth += {"(": 1, ")": -1}.get(tok[1], 0) if tok[0] == "op" else 0
            cmd_toks.append(tok)
        return pipe

    def command(self, toks: list[tuple[str, str]], source: str) -> _Cmd:
        if not toks:
            raise TemplateError(f"empty command in {{{{ {source} }}}}")
        operands: list[Any] = []
        i = 0
        while i < len(toks):
            kind, value = toks[i]
            if kind == "op" and value == "(":
                depth, j = 1, i + 1
                while j < len(toks) and depth:
                    depth += {"(": 1, ")": -1}.get(toks[j][1], 0) if toks[j][0] == "op" else 0
                    j += 1
                if depth:
                    raise TemplateError(f"unclosed parenthesis in {{{{ {source} }}}}")
                inner: Any = ("pipe", self.pipeline(toks[i + 1:j - 1], source))
                if j < len(toks) and toks[j][0] == "field" and toks[j][1] != ".":  # (index .Messages 0).Role
                    inner = ("field", inner, toks[j][1][1:].split("."))
                    j += 1
                operands.append(inner)
                i = j
                continue
            operands.append(self.operand(kind, value, source))
            i += 1
        first = toks[0]
        if first[0] == "word" and first[1] not in ("true", "false", "nil"):
            if first[1] not in _FUNCS:
                raise TemplateError(f"function {first[1]!r} is not supported in templates here")
            return _Cmd(first[1], operands[1:])
        if len(operands) > 1:
            raise TemplateError(f"{{{{ {source} }}}}: only a function takes arguments")
        return _Cmd(None, operands)

    @staticmethod
    def operand(kind: str, value: str, source: str) -> Any:
        if kind == "field":
            return ("field", ".", [] if value == "." else value[1:].split("."))
        if kind == "var":
            base, *names = value.split(".")
            return ("field", base, names)
        if kind == "str":
            return ("lit", json.loads(value))
        if kind == "raw":
            return ("lit", value[1:-1])
        if kind == "num":
            return ("lit", float(value) if "." in value else int(value))
        if kind == "word":
            return ("lit", {"true": True, "false": False, "nil": None}.get(value, value))
        raise TemplateError(f"unexpected {value!r} in {{{{ {source} }}}}")


# -- running -----------------------------------------------------------------------------------------------
def _truth(v: Any) -> bool:
    return bool(v) if isinstance(v, (bool, int, float, str, list, tuple, dict)) else v is not None


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return ""
    if isinstance(v, (list, dict)):
        return json.dumps(v, ensure_ascii=False)
    return str(v)


def _and(*a: Any) -> Any:
    return next((x for x in a if not _truth(x)), a[-1])


def _or(*a: Any) -> Any:
    return next((x for x in a if _truth(x)), a[-1])


def _print(*a: Any) -> str:
    """Go's fmt.Sprint: a space between two operands when neither is a string."""
    out = ""
    for i, x in enumerate(a):
        if i and not isinstance(x, str) and not isinstance(a[i - 1], str):
            out += " "
        out += _text(x)
    return out


_FUNCS: dict[str, Callable[..., Any]] = {
    "eq": lambda a, *b: any(a == x for x in b), "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "and": _and, "or": _or, "not": lambda a: not _truth(a), "len": len,
    "index": lambda x, *keys: _index(x, keys), "slice": lambda x, *ij: x[slice(*ij)], "print": _print,
    "json": lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")),
    "currentDate": lambda: datetime.date.today().isoformat(),
}


def _index(x: Any, keys: tuple[Any, ...]) -> Any:
    for k in keys:
        x = x[k]
    return x


class _Run:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.scopes: list[dict[str, Any]] = [{"$": root}]
        self.out: list[str] = []
        self.num_steps = 0
        self.num_chars = 0

    def write(self, text: str) -> None:
        self.num_chars += len(text)
        if self.num_chars > MAX_OUTPUT_CHARS:
            raise TemplateError(f"the template writes more than {MAX_OUTPUT_CHARS} characters")
        self.out.append(text)

    def nodes(self, nodes: list[Any], dot: Any) -> None:
        for node in nodes:
            self.num_steps += 1
            if self.num_steps > MAX_STEPS:
                raise TemplateError(f"the template takes more than {MAX_STEPS} steps")
            if isinstance(node, str):
                self.write(node)
            elif isinstance(node, _Pipe):
                value = self.pipe(node, dot)
                if not node.decl:
                    if value == "" and self._is_response(node):
                        raise _StopAtResponse
                    self.write(_text(value))
            else:
                self.block(node, dot)

    @staticmethod
    def _is_response(pipe: _Pipe) -> bool:
        args = pipe.cmds[0].args if len(pipe.cmds) == 1 and pipe.cmds[0].func is None else []
        return len(args) == 1 and args[0][0] == "field" and args[0][1] in (".", "$") and args[0][2] == ["Response"]

    def block(self, node: _Block, dot: Any) -> None:
        for pipe, body in node.branches:
            self.scopes.append({})
            try:
                value = self.pipe(pipe, dot, declare=node.kind != "range")
                if node.kind == "range":
                    if _truth(value):
                        self.loop(pipe, value, body)
                        return
                elif _truth(value):
                    self.nodes(body, value if node.kind == "with" else dot)
                    return
            finally:
                self.scopes.pop()
        self.scopes.append({})
        try:
            self.nodes(node.else_body, dot)
        finally:
            self.scopes.pop()

    def loop(self, pipe: _Pipe, value: Any, body: list[Any]) -> None:
        if not isinstance(value, (list, dict)):
            raise TemplateError(f"range can't iterate over {_kind(value)}")
        items = sorted(value.items()) if isinstance(value, dict) else list(enumerate(value))
        for key, item in items:
            if len(pipe.decl) == 2:
                self.scopes[-1][pipe.decl[0]], self.scopes[-1][pipe.decl[1]] = key, item
            elif pipe.decl:
                self.scopes[-1][pipe.decl[0]] = item
            self.nodes(body, item)

    def pipe(self, pipe: _Pipe, dot: Any, declare: bool = True) -> Any:
        value: Any = None
        for i, cmd in enumerate(pipe.cmds):
            args = [self.operand(a, dot) for a in cmd.args] + ([value] if i else [])
            if cmd.func is None:
                value = args[0] if len(args) == 1 else _fail(f"a pipe into {cmd.args[0]!r}, which is not a function")
            else:
                try:
                    value = _FUNCS[cmd.func](*args)
                except (TypeError, KeyError, IndexError, ValueError) as e:
                    raise TemplateError(f"{cmd.func}: {e}") from None
        if pipe.decl and declare:
            self.bind(pipe, value)
        return value

    def bind(self, pipe: _Pipe, value: Any) -> None:
        name = pipe.decl[0]
        if pipe.is_assign:
            scope = next((s for s in reversed(self.scopes) if name in s), None)
            if scope is None:
                raise TemplateError(f"undefined variable {name}")
            scope[name] = value
        else:
            self.scopes[-1][name] = value

    def operand(self, op: Any, dot: Any) -> Any:
        kind = op[0]
        if kind == "lit":
            return op[1]
        if kind == "pipe":
            return self.pipe(op[1], dot)
        base, names = op[1], op[2]
        if isinstance(base, tuple):
            value = self.operand(base, dot)
        elif base == ".":
            value = dot
        else:
            scope = next((s for s in reversed(self.scopes) if base in s), None)
            if scope is None:
                raise TemplateError(f"undefined variable {base}")
            value = scope[base]
        for name in names:
            if not isinstance(value, dict) or name not in value:
                raise TemplateError(f"can't evaluate field {name} in {_kind(value)}")
            value = value[name]
        return value


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "nil"}.get(type(v), type(v).__name__)


def _fail(message: str) -> Any:
    raise TemplateError(message)


def render(template: str, values: dict[str, Any]) -> str:
    """Run `template` over `values` (Ollama's names: System, Prompt, Suffix, Response, Messages, ...).
    Raises TemplateError."""
    run = _Run(values)
    try:
        run.nodes(_Parser(template).parse(), values)
    except _StopAtResponse:
        pass
    except RecursionError:
        raise TemplateError("the template nests too deeply") from None
    return "".join(run.out)


def uses_field(template: str, name: str) -> bool:
    """Does the template mention `.Name` (e.g. .Suffix: a fill-in-middle template)?"""
    return re.search(rf"\.{name}\b", template) is not None
