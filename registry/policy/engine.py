"""The rule engine of alias promotion policies: rules written in the Common Expression Language (CEL).

A policy is a list of :class:`Rule` (a name, a CEL expression that must give true or false, and the
message shown when it fails). :func:`compile_policy` checks a whole policy once, when it is saved, and
refuses it with a :class:`PolicyError` that names the rule and, where there is one, the line and column
of the fault. :func:`evaluate_policy` runs the compiled rules against a promotion's evidence (the
documented :data:`VARIABLES`) and says, rule by rule, whether it passed and if not why; it never raises
for a rule's own fault.

The CEL implementation: ``cel-python`` (``celpy``), pure Python, rather than the Rust-backed
``common-expression-language``, because the engine must do three things that only the former allows:

- point at an unknown name: celpy's parse tree (lark) carries the line and column of every identifier,
  so the engine walks it, binds the names that comprehension macros introduce (the ``a`` of
  ``approvals.exists(a, ...)``, in that macro's body only) and refuses any other name that is not a
  documented variable, with its position. The Rust binding only lists the names an expression uses,
  without positions and mixed with macro-bound ones;
- bound a rule's run time for real: celpy evaluates by walking the tree in Python, so the engine's
  evaluator (a subclass of celpy's, used for the macros' bodies too) checks a deadline before every node
  it visits and abandons the rule once it passes, in the calling thread, leaving nothing behind. The
  Rust evaluator holds the GIL until it is done and cannot be interrupted (a rule of 10^6 steps runs to
  the end), so it would need a child process per evaluation;
- the rest both give: syntax errors with line and column.

What bounds a rule's time: the deadline (``settings.POLICY_EVAL_TIMEOUT_MS``, checked between the
interpreter's steps; a rule that finishes past it fails too), and what keeps any single step short:

- the evidence is cut before evaluation: strings to :data:`MAX_EVIDENCE_STRING` characters, lists and maps
  to their first :data:`MAX_EVIDENCE_ITEMS` items, nesting to :data:`MAX_EVIDENCE_DEPTH` levels, and all of
  it to :data:`MAX_EVIDENCE_VALUES` values, read breadth first so that what is left out is the deepest
  (reading it is done once per evaluation, for all rules, and takes a few tens of milliseconds at most);
- ``+`` refuses to build a string, bytes or list longer than :data:`MAX_CONCAT`; ``matches()`` uses RE2
  (linear time); CEL has no loops but its macros, whose every step meets the deadline;
- expressions are at most ``settings.POLICY_MAX_RULE_LENGTH`` characters and :data:`MAX_NESTING` tree
  levels deep (about ten levels of parentheses or nested macros), so evaluation stays within Python's
  default recursion limit;
- celpy's lexer backtracks exponentially on an unterminated string literal full of escapes, so the engine
  refuses unterminated string literals itself before parsing (a raw string ending in a backslash counts
  as unterminated: celpy cannot read it either).

Each rule has its own deadline, so a policy takes at most about ``POLICY_MAX_RULES`` times the timeout.

Where celpy departs from what policy authors expect, the engine adjusts it: an int and a double compare
and do arithmetic as doubles (``benchmark.slowdown_percent <= 10`` and ``candidate.size_bytes < 1.5e3``
both work; celpy alone refuses mixed operands), ``x == null`` is false rather than an error for a
non-null ``x``, a bool never equals a number, and an evidence integer beyond 64 bits becomes a double.
Only standard CEL macros (``has``, ``all``, ``exists``, ``exists_one``, ``map``, ``filter``) and celpy's
standard functions are accepted; celpy's extensions (``reduce``, ``min``) are refused as unknown.

Missing evidence: the other side passes ``None`` for evidence that does not exist yet (no benchmark, a
first promotion has no current version). A rule is still evaluated, so it can say what it wants then
(``current == null || candidate.size_bytes <= current.size_bytes * 2`` passes a first promotion); one
that does not pass while a variable it refers to is null fails with that variable's :data:`MISSING`
reason (all of them, joined), since that is what would change its outcome.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import Activation, CELEvalError, Evaluator, Result, base_functions
from django.conf import settings
from lark.exceptions import UnexpectedCharacters, UnexpectedToken

logger = logging.getLogger(__name__)

# The documented variables a rule may use (docs/registry-api/policy.md says the same).
VARIABLES: dict[str, str] = {
    "candidate": "the version to promote: number, status, size_bytes, metadata, tags, uploaded_by",
    "current": "the version the alias serves now, with the same fields; null for a first promotion",
    "signature": "the signature change from current to candidate: breaking (list of strings), changes",
    "provenance": "the candidate's signed provenance: signed (bool), signers (list of strings)",
    "benchmark": "candidate against current on one provider: provider, batch, candidate, current, slowdown_percent",
    "accuracy": "the candidate's outputs against current's: cosine, max_abs_diff, top1_agreement",
    "shadow": "the alias's shadow traffic report: requests, compared, outputs, candidate",
    "approvals": "the promotion request's approvals: a list of {user, roles}",
    "requester": "who asks for the promotion: {user, roles}",
}

# Why a rule that needs a variable fails while its evidence is null.
MISSING: dict[str, str] = {
    "candidate": "no candidate version",
    "current": "no current version (a first promotion)",
    "signature": "no signature comparison",
    "provenance": "no provenance",
    "benchmark": "no benchmark yet",
    "accuracy": "no accuracy delta measured",
    "shadow": "no shadow report yet",
    "approvals": "no approvals",
    "requester": "no requester",
}

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]*")
MAX_NAME_LENGTH = 100
MAX_MESSAGE_LENGTH = 500
# Evidence is cut to these before evaluation, so that a large metadata dict cannot make a rule slow.
MAX_EVIDENCE_STRING = 10_000
MAX_EVIDENCE_ITEMS = 1_000
MAX_EVIDENCE_DEPTH = 64
# Values read from the evidence in all (breadth first: see _context); the rest is left out.
MAX_EVIDENCE_VALUES = 20_000
# The longest string, bytes or list that ``+`` may build.
MAX_CONCAT = 100_000
# Parse tree levels; a plain comparison is about 15, each parenthesis or macro adds about 10.
MAX_NESTING = 120

# The comprehension macros: ``target.macro(name, body)``, ``name`` bound in ``body`` only.
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
# celpy's standard functions and methods (operators aside), and the two macros written as calls.
_FUNCTIONS = frozenset(name for name in base_functions if name.isidentifier()) | {"has", "dyn"}
# Type names a rule may write as values (``type(x) == int``).
_TYPE_NAMES = frozenset(
    {"bool", "bytes", "double", "duration", "int", "list", "map", "null_type", "string", "timestamp", "type", "uint"}
)
# Parse tree nodes that only pass one child through: what a macro's variable may be wrapped in.
_PASS_THROUGH = frozenset(
    {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary", "member", "primary"}
)
_INT64 = (-(2**63), 2**63 - 1)


class PolicyError(ValueError):
    """A policy that cannot be saved: which rule (or None for the policy as a whole), where, and what.

    ``str()`` of it names the rule and the position; :attr:`detail` is the body of an API error.
    """

    def __init__(
        self, error: str, *, rule: str | None = None, line: int | None = None, column: int | None = None
    ) -> None:
        where = []
        if rule is not None:
            where.append(f"rule {rule!r}")
        if line is not None:
            where.append(f"line {line}, column {column}")
        message = f"{', '.join(where)}: {error}" if where else error
        super().__init__(message)
        self.rule = rule
        self.line = line
        self.column = column
        self.error = error

    @property
    def detail(self) -> dict[str, Any]:
        return {"rule": self.rule, "line": self.line, "column": self.column, "error": str(self)}


@dataclass(frozen=True)
class Rule:
    name: str
    expr: str
    message: str = ""


@dataclass(frozen=True)
class CompiledRule:
    rule: Rule
    # The documented variables the rule refers to (a macro's own names are not among them).
    variables: frozenset[str]
    program: _Program = field(repr=False, compare=False)


@dataclass(frozen=True)
class RuleResult:
    name: str
    passed: bool
    why: str

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "why": self.why}


class _OutOfTime(BaseException):
    """Raised inside the interpreter at the deadline. A BaseException, so that no handler of celpy's
    (they catch ``Exception`` subclasses to turn them into CEL errors) can swallow it."""


class _BoundedEvaluator(Evaluator):
    """celpy's tree-walking evaluator, checking a deadline at every node, in macro bodies too."""

    def __init__(self, ast: lark.Tree, activation: Activation, deadline: float) -> None:
        super().__init__(ast=ast, activation=activation)
        self.deadline = deadline

    def sub_evaluator(self, ast: lark.Tree) -> Evaluator:
        return _BoundedEvaluator(ast, self.activation, self.deadline)

    def visit(self, tree: lark.Tree) -> Result:
        if time.monotonic() > self.deadline:
            raise _OutOfTime
        return super().visit(tree)

    def visit_children(self, tree: lark.Tree) -> list[Result]:
        if time.monotonic() > self.deadline:
            raise _OutOfTime
        return super().visit_children(tree)


class _Program(celpy.InterpretedRunner):
    """A compiled rule: its parse tree and the engine's operators."""

    def run(self, context: dict[str, Any], deadline: float) -> Any:
        return _BoundedEvaluator(self.ast, self.new_activation(), deadline).evaluate(context)


_environment_lock = threading.Lock()


@cache
def _environment() -> celpy.Environment:
    # celpy raises the process's recursion limit when an Environment is made; the engine keeps to the
    # default one (MAX_NESTING) and leaves the process as it found it.
    with _environment_lock:
        limit = sys.getrecursionlimit()
        try:
            return celpy.Environment()
        finally:
            sys.setrecursionlimit(limit)


# Operators: an int and a double meet as doubles; ``+`` is bounded.


def _is_integer(value: Any) -> bool:
    return isinstance(value, celtypes.IntType | celtypes.UintType)


def _numbers(a: Any, b: Any) -> tuple[Any, Any]:
    # celpy's double arithmetic gives plain floats: they are doubles too.
    if isinstance(a, float) and not isinstance(a, celtypes.DoubleType):
        a = celtypes.DoubleType(a)
    if isinstance(b, float) and not isinstance(b, celtypes.DoubleType):
        b = celtypes.DoubleType(b)
    if _is_integer(a) and isinstance(b, celtypes.DoubleType):
        return celtypes.DoubleType(a), b
    if isinstance(a, celtypes.DoubleType) and _is_integer(b):
        return a, celtypes.DoubleType(b)
    return a, b


def _double(value: Any) -> Any:
    return (
        celtypes.DoubleType(value) if isinstance(value, float) and not isinstance(value, celtypes.DoubleType) else value
    )


def _mixed(operator: str) -> Callable[[Any, Any], Any]:
    base = base_functions[operator]

    def apply(a: Any, b: Any) -> Any:
        return _double(base(*_numbers(a, b)))

    apply.__name__ = f"policy{operator}"
    return apply


def _equal(a: Any, b: Any) -> Any:
    # CEL's equality across kinds: only null equals null (celpy refuses ``x == null`` for a non-null x), and
    # a bool is never equal to a number (Python's True == 1 is not CEL's).
    for operand in (a, b):
        if isinstance(operand, CELEvalError):
            return operand
    if a is None or b is None:
        return celtypes.BoolType(a is None and b is None)
    if isinstance(a, celtypes.BoolType) != isinstance(b, celtypes.BoolType):
        return celtypes.BoolType(False)
    return base_functions["_==_"](*_numbers(a, b))


def _not_equal(a: Any, b: Any) -> Any:
    same = _equal(a, b)
    return same if isinstance(same, CELEvalError) else celtypes.BoolType(not same)


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, str | bytes | list) and isinstance(b, str | bytes | list) and len(a) + len(b) > MAX_CONCAT:
        return CELEvalError(f"the result would be longer than {MAX_CONCAT}", ValueError, None)
    return _double(base_functions["_+_"](*_numbers(a, b)))


def _member(item: Any, container: Any) -> Any:
    if isinstance(container, celtypes.ListType) and (_is_integer(item) or isinstance(item, celtypes.DoubleType)):
        for element in container:
            try:
                same = _equal(item, element)
            except TypeError:
                continue
            if not isinstance(same, CELEvalError) and bool(same):
                return celtypes.BoolType(True)
        return celtypes.BoolType(False)
    return base_functions["_in_"](item, container)


_OPERATORS: dict[str, Any] = {
    **{name: _mixed(name) for name in ("_<_", "_<=_", "_>_", "_>=_", "_-_", "_*_", "_/_")},
    "_==_": _equal,
    "_!=_": _not_equal,
    "_+_": _add,
    "_in_": _member,
}


# Compiling


def compile_policy(rules: list[Rule]) -> list[CompiledRule]:
    """Check and compile a whole policy; raise :class:`PolicyError` at its first fault."""
    max_rules = settings.POLICY_MAX_RULES
    if len(rules) > max_rules:
        raise PolicyError(
            f"a policy has at most {max_rules} rules (MODELYARD_POLICY_MAX_RULES), this one has {len(rules)}"
        )
    seen: set[str] = set()
    compiled = []
    for index, rule in enumerate(rules, start=1):
        name = _check_name(rule.name, index)
        if name in seen:
            raise PolicyError("two rules have this name", rule=name)
        seen.add(name)
        compiled.append(_compile_rule(rule, name))
    return compiled


def _check_name(name: Any, index: int) -> str:
    if not isinstance(name, str) or not name:
        raise PolicyError(f"rule {index} has no name")
    if len(name) > MAX_NAME_LENGTH:
        raise PolicyError(f"the name of rule {index} is longer than {MAX_NAME_LENGTH} characters")
    if not NAME_PATTERN.fullmatch(name):
        raise PolicyError(
            "a rule's name is lowercase letters, digits, '-' and '_', starting with a letter or digit", rule=name
        )
    return name


def _compile_rule(rule: Rule, name: str) -> CompiledRule:
    expr, message = rule.expr, rule.message
    if not isinstance(expr, str) or not expr.strip():
        raise PolicyError("the expression is empty", rule=name)
    max_length = settings.POLICY_MAX_RULE_LENGTH
    if len(expr) > max_length:
        raise PolicyError(
            f"the expression is {len(expr)} characters long, at most {max_length} (MODELYARD_POLICY_MAX_RULE_LENGTH)",
            rule=name,
        )
    if not isinstance(message, str):
        raise PolicyError("the message must be a string", rule=name)
    if len(message) > MAX_MESSAGE_LENGTH:
        raise PolicyError(f"the message is longer than {MAX_MESSAGE_LENGTH} characters", rule=name)
    unterminated = _unterminated_string(expr)
    if unterminated is not None:
        raise PolicyError(
            "syntax error: a string that does not end", rule=name, line=unterminated[0], column=unterminated[1]
        )
    environment = _environment()
    try:
        ast = environment.compile(expr)
    except CELParseError as error:
        raise _syntax_error(error, expr, name) from None
    variables = _names(ast, name)
    return CompiledRule(rule=rule, variables=variables, program=_Program(environment, ast, _OPERATORS))


def _position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _unterminated_string(expr: str) -> tuple[int, int] | None:
    """Where a string literal starts that does not end (before celpy's lexer backtracks on it), or None.

    Reads as the lexer does: ``//`` comments to the end of the line, ``'``/``"`` strings on one line,
    ``'''``/``\"\"\"`` ones over several, a backslash taking the next character with it.
    """
    i, n = 0, len(expr)
    while i < n:
        char = expr[i]
        if char == "/" and expr.startswith("//", i):
            end = expr.find("\n", i)
            i = n if end < 0 else end
            continue
        if char not in "'\"":
            i += 1
            continue
        start = i
        close = char * 3 if expr.startswith(char * 3, i) else char
        multiline = len(close) == 3
        i += len(close)
        while True:
            if i >= n:
                return _position(expr, start)
            if expr[i] == "\\":
                if not multiline and expr.startswith("\\\n", i):
                    return _position(expr, start)
                i += 2
            elif expr[i] == "\n" and not multiline:
                return _position(expr, start)
            elif expr.startswith(close, i):
                i += len(close)
                break
            else:
                i += 1
    return None


def _syntax_error(error: CELParseError, expr: str, name: str) -> PolicyError:
    cause = error.__context__
    line, column = error.line, error.column
    if isinstance(cause, UnexpectedToken):
        token = cause.token
        if token.type == "$END":
            # The end of the expression: just after its last token.
            end_line, end_column = getattr(token, "end_line", None), getattr(token, "end_column", None)
            if end_line is not None and end_column is not None:
                line, column = end_line, end_column
            else:  # pragma: no cover - lark gives the end of the last token
                line, column = _position(expr, len(expr))
            what = "the expression ends too early"
        else:
            what = f"unexpected {str(token.value)!r}"
    elif isinstance(cause, UnexpectedCharacters):
        what = f"unexpected character {cause.char!r}"
    else:  # pragma: no cover - celpy turns only lark's errors into CELParseError
        what = str(error).splitlines()[0] if str(error) else "cannot be parsed"
    return PolicyError(f"syntax error: {what}", rule=name, line=line, column=column)


def _names(ast: lark.Tree, name: str) -> frozenset[str]:
    """The documented variables the tree refers to; refuse unknown names and functions, and deep trees."""
    found: set[str] = set()
    stack: list[tuple[Any, frozenset[str], int]] = [(ast, frozenset(), 1)]
    while stack:
        node, bound, depth = stack.pop()
        if not isinstance(node, lark.Tree):
            continue
        if depth > MAX_NESTING:
            line, column = _tree_position(node)
            raise PolicyError("the expression is nested too deeply", rule=name, line=line, column=column)
        kind = node.data
        children: list[Any] = node.children
        if kind in ("ident", "dot_ident"):
            token = children[0]
            if kind == "ident" and token.value in bound:
                continue
            if token.value in VARIABLES:
                found.add(token.value)
            elif token.value not in _TYPE_NAMES:
                raise PolicyError(
                    f"unknown variable {token.value!r} (known: {', '.join(VARIABLES)})",
                    rule=name,
                    line=token.line,
                    column=token.column,
                )
            continue
        if kind in ("ident_arg", "dot_ident_arg"):
            _check_function(children[0], name)
            stack.extend((child, bound, depth + 1) for child in children[1:])
            continue
        if kind == "member_dot":
            stack.append((children[0], bound, depth + 1))
            continue
        if kind == "member_dot_arg":
            target, method = children[0], children[1]
            arguments = children[2].children if len(children) > 2 else []
            stack.append((target, bound, depth + 1))
            if method.value in _MACROS:
                if len(arguments) != 2:
                    raise PolicyError(
                        f"{method.value}() takes a name and an expression",
                        rule=name,
                        line=method.line,
                        column=method.column,
                    )
                variable = _macro_variable(arguments[0])
                if variable is None:
                    line, column = _tree_position(arguments[0])
                    raise PolicyError(
                        f"the first argument of {method.value}() must be a name", rule=name, line=line, column=column
                    )
                # The macro's tree is deeper than the source reads: count it from the arguments.
                stack.append((arguments[1], bound | {variable}, depth + 2))
            else:
                _check_function(method, name)
                stack.extend((argument, bound, depth + 2) for argument in arguments)
            continue
        stack.extend((child, bound, depth + 1) for child in children)
    return frozenset(found)


def _check_function(token: lark.Token, name: str) -> None:
    if token.value not in _FUNCTIONS:
        raise PolicyError(f"unknown function {token.value!r}", rule=name, line=token.line, column=token.column)


def _macro_variable(tree: Any) -> str | None:
    """The name a macro binds, if its first argument is a plain name."""
    node = tree
    while isinstance(node, lark.Tree) and node.data in _PASS_THROUGH and len(node.children) == 1:
        node = node.children[0]
    if isinstance(node, lark.Tree) and node.data == "ident":
        token: Any = node.children[0]
        return str(token.value)
    return None


def _tree_position(tree: lark.Tree) -> tuple[int | None, int | None]:
    meta = tree.meta
    return getattr(meta, "line", None), getattr(meta, "column", None)


# Evaluating


def evaluate_policy(compiled: list[CompiledRule], evidence: dict[str, Any]) -> list[RuleResult]:
    """Every rule against the evidence (all :data:`VARIABLES` as keys; None where there is no such evidence)."""
    timeout_ms = settings.POLICY_EVAL_TIMEOUT_MS
    context = _context(evidence)
    missing = {name for name in VARIABLES if evidence.get(name) is None}
    return [_evaluate(rule, context, missing, timeout_ms) for rule in compiled]


def _evaluate(compiled: CompiledRule, context: dict[str, Any], missing: set[str], timeout_ms: int) -> RuleResult:
    rule = compiled.rule
    started = time.monotonic()
    deadline = started + timeout_ms / 1000
    value: Any = None
    failure = ""
    try:
        value = compiled.program.run(context, deadline)
    except _OutOfTime:
        return RuleResult(rule.name, False, f"took longer than {timeout_ms} ms")
    except CELEvalError as error:
        failure = f"error: {_describe_error(error)}"
    except RecursionError:
        failure = "error: the rule is nested too deeply to evaluate"
    except Exception as error:
        # A fault of celpy's on some input: this rule fails, the others are still evaluated.
        logger.warning("policy rule %r raised", rule.name, exc_info=True)
        failure = f"error: {type(error).__name__}"
    if time.monotonic() > deadline:
        return RuleResult(rule.name, False, f"took longer than {timeout_ms} ms")
    if not failure and isinstance(value, celtypes.BoolType | bool) and bool(value):
        return RuleResult(rule.name, True, "")
    absent = [name for name in VARIABLES if name in compiled.variables and name in missing]
    if absent:
        return RuleResult(rule.name, False, "; ".join(MISSING[name] for name in absent))
    if failure:
        return RuleResult(rule.name, False, failure)
    if not isinstance(value, celtypes.BoolType | bool):
        return RuleResult(rule.name, False, f"the rule gave {_describe(value)}, not true or false")
    return RuleResult(rule.name, False, rule.message or f"rule {rule.name} failed")


def _context(evidence: Mapping[str, Any]) -> dict[str, Any]:
    """The evidence as CEL values, cut to the engine's bounds.

    Read breadth first over all variables, so that when :data:`MAX_EVIDENCE_VALUES` runs out it is the
    deepest and latest values that are left out (a huge ``candidate.metadata`` leaves ``candidate.tags``
    and the other variables whole). A list or map keeps its first :data:`MAX_EVIDENCE_ITEMS` items, one
    at :data:`MAX_EVIDENCE_DEPTH` levels is empty, a string keeps its first :data:`MAX_EVIDENCE_STRING`
    characters.
    """
    context: dict[str, Any] = {}
    queue: deque[tuple[Any, Any, Any, int]] = deque((evidence.get(name), context, name, 1) for name in VARIABLES)
    budget = MAX_EVIDENCE_VALUES
    while queue and budget > 0:
        value, parent, key, depth = queue.popleft()
        budget -= 1
        converted = _cel_value(value)
        if isinstance(parent, list):
            parent.append(converted)
        else:
            parent[key] = converted
        if depth >= MAX_EVIDENCE_DEPTH:
            continue
        if isinstance(value, Mapping):
            children: Iterable[tuple[Any, Any]] = ((_cel_key(name), item) for name, item in value.items())
        elif isinstance(value, list | tuple):
            children = ((None, item) for item in value)
        else:
            continue
        for count, (name, item) in enumerate(children):
            # Past the budget nothing more is read: stop queueing there (a list that holds itself ends too).
            if count >= MAX_EVIDENCE_ITEMS or len(queue) >= budget:
                break
            queue.append((item, converted, name, depth + 1))
    return {name: context.get(name) for name in VARIABLES}


def _cel_key(key: Any) -> Any:
    return _cel_value(key) if isinstance(key, str | int) else celtypes.StringType(str(key)[:MAX_EVIDENCE_STRING])


def _cel_value(value: Any) -> Any:
    """One evidence value as CEL's, a list or map empty (:func:`_context` fills it)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        if _INT64[0] <= value <= _INT64[1]:
            # IntType's own constructor checks what was just checked, at fifty times the cost.
            return int.__new__(celtypes.IntType, value)
        try:
            return celtypes.DoubleType(float(value))
        except OverflowError:
            return celtypes.DoubleType(math.inf if value > 0 else -math.inf)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value[:MAX_EVIDENCE_STRING])
    if isinstance(value, bytes):
        return celtypes.BytesType(value[:MAX_EVIDENCE_STRING])
    if isinstance(value, Mapping):
        return celtypes.MapType()
    if isinstance(value, list | tuple):
        return celtypes.ListType()
    # Anything else (a Decimal, a datetime) as its text.
    return celtypes.StringType(str(value)[:MAX_EVIDENCE_STRING])


_CEL_TYPES = {
    "IntType": "int",
    "UintType": "uint",
    "DoubleType": "double",
    "StringType": "string",
    "BoolType": "bool",
    "BytesType": "bytes",
    "ListType": "list",
    "MapType": "map",
    "NoneType": "null",
    "TimestampType": "timestamp",
    "DurationType": "duration",
    "TypeType": "type",
}
_RULE_OPERATORS = {
    "relation_lt": "<",
    "relation_le": "<=",
    "relation_gt": ">",
    "relation_ge": ">=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "relation_in": "in",
    "addition_add": "+",
    "addition_sub": "-",
    "multiplication_mul": "*",
    "multiplication_div": "/",
    "multiplication_mod": "%",
}
_CLASS = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>")
_OVERLOAD = re.compile(r"found no matching overload for Token\('RULE', '(\w+)'\) applied to '\((.*)\)'")
_NO_KEY = re.compile(r"no such member in mapping: (.*)")


def _describe_error(error: CELEvalError) -> str:
    """celpy's error, short: "no such key: 'foo'", "no such overload: string < int"."""
    message = str(error.args[0]) if error.args else "failed"
    kind = error.args[1] if len(error.args) > 1 else None
    if kind is IndexError:
        return "index out of range"
    if kind is ZeroDivisionError:
        return "division by zero"
    if message == "return error for overflow":
        return "overflow"
    found = _NO_KEY.fullmatch(message)
    if found:
        return f"no such key: {found.group(1)}"
    found = _OVERLOAD.fullmatch(message)
    if found:
        left, _, right = found.group(2).partition(", ")
        operator = _RULE_OPERATORS.get(found.group(1), found.group(1))
        return f"no such overload: {_cel_type(left)} {operator} {_cel_type(right)}"
    if "does not support field selection" in message:
        return "null has no fields" if "NoneType" in message else "this value has no fields"
    message = message.split(" (in activation", 1)[0]
    message = _CLASS.sub(lambda match: _CEL_TYPES.get(match.group(1), match.group(1)), message)
    return message if len(message) <= 200 else message[:199] + "…"


def _cel_type(text: str) -> str:
    found = _CLASS.fullmatch(text.strip())
    return _CEL_TYPES.get(found.group(1), found.group(1)) if found else text


def _describe(value: Any) -> str:
    """A rule's non-bool result, as JSON, short."""
    try:
        text = json.dumps(_plain(value), default=str, allow_nan=True)
    except (TypeError, ValueError):
        text = str(value)
    return text if len(text) <= 100 else text[:99] + "…"


def _plain(value: Any) -> Any:
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value) if math.isfinite(value) else str(float(value))
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, Mapping):
        return {str(_plain(key)): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value if value is None else str(value)
