"""Arithmetic for the model's calculator tool, parsed safely: Python's own parser reads the expression,
and a small walker evaluates the few kinds of node arithmetic needs. Nothing is ever `eval`ed, no name
but a handful of functions and constants is known, and every operation is bounded, so no expression can run
code or take the CPU for long: the text is short (so are its chains of operations and its nesting), no
integer the walker makes grows past MAX_BITS (powers and products are refused before they are computed,
any other result once made), and round() takes at most MAX_DIGITS digits. Floats bound themselves: one
that grows too big overflows, which says so."""

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

MAX_CHARACTERS = 500
MAX_EXPONENT = 1000  # of a power
MAX_BITS = 8000  # of any integer: about 2,400 digits, which even // divides in microseconds
MAX_DIGITS = 2500  # of round(): past it, rounding any value the calculator holds changes nothing or gives 0

Number = int | float

BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "log": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "exp": math.exp,
    "abs": abs,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
    "min": min,
    "max": max,
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}


class CalculationError(ValueError):
    """The expression is not arithmetic this calculator does, or has no finite real value; says why."""


def calculate(expression: str) -> Number:
    """The value of an arithmetic expression: numbers, + - * / // % ** (or ^), parentheses, the
    functions of FUNCTIONS and the constants pi, e and tau."""
    if len(expression) > MAX_CHARACTERS:
        raise CalculationError(f"The expression is longer than {MAX_CHARACTERS} characters.")
    try:
        tree = ast.parse(expression.replace("^", "**").strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculationError("The expression does not parse as arithmetic.") from None
    try:
        value = _evaluate(tree.body)
    except CalculationError:
        raise
    except ZeroDivisionError:
        raise CalculationError("Division by zero.") from None
    except (OverflowError, ValueError, TypeError, RecursionError) as error:
        raise CalculationError(f"No value: {error}.") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculationError("The result is not a finite number.")
    return value


def _evaluate(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # not bool, str or complex
        return node.value
    if isinstance(node, ast.Name) and node.id in CONSTANTS:
        return CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return _checked(UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        _check_size(node.op, left, right)
        return _checked(BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS:
        if node.keywords:
            raise CalculationError(f"{node.func.id}() takes no named arguments.")
        arguments = [_evaluate(argument) for argument in node.args]
        _check_arguments(node.func.id, arguments)
        return _checked(FUNCTIONS[node.func.id](*arguments))
    if isinstance(node, ast.Name):
        raise CalculationError(f"Unknown name {node.id[:40]!r}: only {', '.join(CONSTANTS)} are known.")
    what = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else type(node).__name__
    raise CalculationError(f"Not arithmetic this calculator does: {what[:40]}.")


def _check_size(op: ast.operator, left: Number, right: Number) -> None:
    """Refuse what would take long or a lot of memory: big powers and products of big integers (a float
    that grows too big overflows, which says so itself)."""
    integers = isinstance(left, int) and isinstance(right, int)
    if isinstance(op, ast.Pow) and (
        abs(right) > MAX_EXPONENT or (integers and right > 0 and left.bit_length() * right > MAX_BITS)
    ):
        raise CalculationError("The power is too large to compute.")
    if isinstance(op, ast.Mult) and integers and left.bit_length() + right.bit_length() > MAX_BITS:
        raise CalculationError("The product is too large to compute.")


def _check_arguments(function: str, arguments: list[Number]) -> None:
    # round(x, -n) computes 10**n before it rounds: round(1, -10**9) took minutes.
    if function == "round" and len(arguments) == 2 and isinstance(arguments[1], int) and abs(arguments[1]) > MAX_DIGITS:
        raise CalculationError(f"round() rounds to at most {MAX_DIGITS} digits either side of the point.")


def _checked(value: Any) -> Number:
    # (-8) ** 0.5 is complex in Python: a calculator of real numbers has no value for it.
    if isinstance(value, complex):
        raise CalculationError("The result is not a real number.")
    # A sum grows by a bit at most, but every result is held to the bound, so no chain creeps past it.
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise CalculationError("The result is too large to compute.")
    return value


def format_number(value: Number) -> str:
    """The value as the tool answers it: integers whole, floats to 12 significant digits."""
    return str(value) if isinstance(value, int) else format(value, ".12g")
