"""The built-in tools, which need no setup: each one a function of `utils/`, declared for the model here.
The two that read the user's data (their conversations, the conversation's documents) read only what
the turn's owner owns."""

import json
from typing import Any

from pocketchat.jobs import JobFailed, Jobs
from pocketchat.store import Store
from pocketchat.tools import BUILTIN, CallContext, Tool, ToolFailed
from utils.calculator import CalculationError, calculate, format_number
from utils.clock import UnknownTimeZone, current_time
from utils.document_text import NoSuchDocument, read_conversation_document
from utils.search_conversations import search_conversations

# The calculator bounds every operation, so an answer takes milliseconds; past this, something it did not
# foresee is at work, and its worker is stopped.
CALCULATION_SECONDS = 2.0


def _text(arguments: dict[str, Any], name: str, required: bool = True) -> str:
    value = arguments.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise ToolFailed(f"'{name}' must be a string.")
    return value


def _schema(properties: dict[str, dict[str, str]], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def builtin_tools(store: Store, jobs: Jobs) -> list[Tool]:
    """The four built-in tools, reading `store` for the user's conversations and documents; the calculator
    runs in the job workers (`jobs`)."""

    async def calculator(arguments: dict[str, Any], context: CallContext) -> str:
        expression = _text(arguments, "expression")
        try:
            return format_number(await jobs.run(context.owner, calculate, expression, seconds=CALCULATION_SECONDS))
        except CalculationError as error:
            raise ToolFailed(str(error)) from None
        except JobFailed as error:
            raise ToolFailed(f"No value: {error.message}") from None

    async def clock(arguments: dict[str, Any], context: CallContext) -> str:
        try:
            return current_time(_text(arguments, "timezone", required=False) or None)
        except UnknownTimeZone as error:
            raise ToolFailed(str(error)) from None

    async def search(arguments: dict[str, Any], context: CallContext) -> str:
        found = await search_conversations(store, context.owner, _text(arguments, "query"), context.turn_id)
        return json.dumps(found, ensure_ascii=False, indent=1) if found else "Nothing found."

    async def read(arguments: dict[str, Any], context: CallContext) -> str:
        name = _text(arguments, "name")
        try:
            return await read_conversation_document(store, context.conversation_id, context.owner, name)
        except NoSuchDocument as missing:
            raise ToolFailed(str(missing)) from None

    return [
        Tool(
            BUILTIN,
            "calculator",
            "Evaluate an arithmetic expression exactly: numbers, + - * / // % ** (or ^), parentheses, "
            "sqrt, sin, cos, tan, asin, acos, atan, log, log10, log2, exp, abs, round, floor, ceil, min, max, "
            "pi, e, tau.",
            _schema({"expression": {"type": "string", "description": "e.g. (3.5 + 2) * sqrt(16)"}}, ["expression"]),
            calculator,
        ),
        Tool(
            BUILTIN,
            "current_time",
            "The current date, time and weekday.",
            _schema(
                {
                    "timezone": {
                        "type": "string",
                        "description": "An IANA time zone, e.g. Europe/Paris; UTC if left out",
                    }
                },
                [],
            ),
            clock,
        ),
        Tool(
            BUILTIN,
            "search_conversations",
            "Search the user's earlier conversations for messages holding every word of a query; gives each "
            "message's conversation title, date and an excerpt.",
            _schema({"query": {"type": "string", "description": "Words the messages must hold"}}, ["query"]),
            search,
        ),
        Tool(
            BUILTIN,
            "read_document",
            "Read one of the documents attached to this conversation, whole, by its file name.",
            _schema({"name": {"type": "string", "description": "The document's file name"}}, ["name"]),
            read,
        ),
    ]
