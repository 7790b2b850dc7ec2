"""The tools the model may call in a turn, from three sources: built in (`builtin.py`), the operator's MCP
servers (`mcp.py`), and the client that started the turn (`client.py`). `Tools` is the process-wide
set, made in the lifespan; `ToolBox` is one turn's view of it (the tools its conversation has on), which
the flow's nodes use: StreamChat offers `ToolBox.offer()` to the model, RunTools calls `ToolBox.run`.

A tool's result is untrusted text: it goes to the model as a tool message, cut to --tool-result-chars,
and to the page as text. A call that fails, times out, is refused or stopped gives the model an error
result; the turn goes on.
"""

import asyncio
import functools
import itertools
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pocketchat.errors import RateLimited
from pocketchat.limits import Limits
from pocketchat.settings import Settings
from utils.clean import ID_CHARACTERS, NAME_CHARACTERS, clean_arguments, clean_text
from utils.llm_stream import ToolCall, ToolCallParts, ToolOffer

logger = logging.getLogger("pocketchat")

BUILTIN, CLIENT = "builtin", "client"  # sources that are not MCP servers
WIRE_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # what OpenAI accepts as a function name
STEP_RESULT_CHARACTERS = 2000  # of a result (and of arguments, an error), kept in its step for the page
# Of a call's arguments as the model wrote them: they go to the tool, and back to the model in each later
# request of the turn. Longer ones are cut (StreamChat), and the call is not run.
ARGUMENT_CHARACTERS = 100_000
CANCEL_WAIT_SECONDS = 1.0  # a cancelled call may take this long to say goodbye (MCP's cancellation)
# A model may ask for thousands of calls at once: each would run (or be refused by the rate limit), show
# two steps kept with the reply, and go back to the provider in every later request.
MAX_CALLS_PER_STEP = 32  # the rest of a step's calls get one error result, which speaks for them all
MAX_CALLS_PER_REPLY = 128  # then the model answers without tools


def wire_name(name: str) -> str:
    """The name the model sees for a tool shown as `name`: OpenAI's function names have no dots, so
    `server.tool` becomes `server__tool`."""
    return name.replace(".", "__")


@dataclass
class CallContext:
    """Who calls, for the tools that read the user's data, and how the call ended if it was cut short."""

    owner: str
    conversation_id: str
    turn_id: str
    call_id: str
    cancelled: str | None = None  # why it was cancelled: "stopped", or its time ran out


class ToolFailed(Exception):
    """A tool's own failure: its message is the error result the model reads."""


class Denied(ToolFailed):
    """The client refused the call (or never answered it)."""


@dataclass(frozen=True)
class Tool:
    source: str  # BUILTIN, CLIENT, or an MCP server's name
    name: str  # as people see it: "calculator", "files.read_file", "client.lookup"
    description: str
    parameters: dict[str, Any]  # the JSON schema of its arguments
    run: Callable[[dict[str, Any], CallContext], Awaitable[str]]

    @property
    def wire_name(self) -> str:
        return wire_name(self.name)

    def summary(self) -> dict[str, str]:
        """As the page's tool list shows it."""
        return {"name": self.name, "description": self.description}

    @functools.cached_property
    def declaration(self) -> dict[str, Any]:
        """As an OpenAI request declares it (made once: every turn offers it)."""
        function = {"name": self.wire_name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class CallOutcome:
    """How one call ended: `result` is what the model reads (cut to the budget); `error` says why it failed."""

    call: ToolCall
    name: str  # the tool as people see it (the model's name, if no tool has it)
    result: str = ""
    error: str | None = None
    denied: bool = False  # the client refused it, or never answered
    stopped: bool = False  # the turn was stopped while it ran

    def message(self) -> dict[str, Any]:
        """The tool message the model reads next."""
        return {"role": "tool", "tool_call_id": self.call.id, "content": self.result or f"Error: {self.error}"}

    def step(self) -> dict[str, Any]:
        """The `tool_result` step's data: the page shows the start of a long result."""
        data: dict[str, Any] = {
            "id": self.call.id,
            "name": self.name,
            "result": cut(self.result, STEP_RESULT_CHARACTERS),
        }
        if self.error is not None:
            data["error"] = cut(self.error, STEP_RESULT_CHARACTERS)
        if self.denied:
            data["denied"] = True
        return data


def cut(text: str, budget: int) -> str:
    """`text`, or its first `budget` characters and a line saying how much was cut."""
    if len(text) <= budget:
        return text
    return text[:budget] + f"\n[… cut: the result has {len(text):,} characters; these are the first {budget:,}.]"


def safe_call(call: ToolCall) -> ToolCall:
    """A tool call as the model wrote it, made safe before it is run, shown or kept (StreamChat calls this
    on each): its id and name bounded, its arguments JSON without a lone surrogate nor deep nesting. The
    escape of a lone surrogate in its arguments (`{"expression":"\\ud800"}`, which a prompt injection can
    ask for) once made its conversation unreadable, across restarts (issue 31)."""
    return ToolCall(
        clean_text(call.id, ID_CHARACTERS),
        clean_text(call.name, NAME_CHARACTERS),
        clean_arguments(call.arguments, ARGUMENT_CHARACTERS),
    )


def arguments_of(call: ToolCall) -> dict[str, Any] | str:
    """The call's arguments as a JSON object, or its text as the model wrote it if it is not one."""
    try:
        arguments = json.loads(call.arguments or "{}")
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser's stack
        return call.arguments
    return arguments if isinstance(arguments, dict) else call.arguments


def shown_arguments(call: ToolCall) -> dict[str, Any] | str:
    """The arguments as the `tool_call` step shows them: long ones as the start of their text."""
    if len(call.arguments) > STEP_RESULT_CHARACTERS:
        return cut(call.arguments, STEP_RESULT_CHARACTERS)
    return arguments_of(call)


@dataclass(frozen=True)
class Admitted:
    """What runs of the calls a model step asked for (`ToolBox.admit`)."""

    calls: list[ToolCall]  # those that run, in the order asked, with ids unique in the turn
    asked: int  # how many the step asked for
    left_out: ToolCall | None = None  # the first call over the caps: its error result speaks for them all
    error: str = ""  # that result

    def step(self) -> dict[str, Any]:
        """The `tool_calls_left_out` step's data."""
        return {"asked": self.asked, "ran": len(self.calls), "error": self.error}


@dataclass
class ToolBox:
    """One turn's tools: those of the sources its conversation has on, and its client's."""

    available: Callable[[], list[Tool]]  # every tool on for this turn now (MCP servers come and go)
    context: Callable[[str], CallContext]  # for a call id
    limits: Limits
    settings: Settings
    _offered: dict[str, Tool] = field(default_factory=dict)  # by wire name: what the model was offered
    _ids: set[str] = field(default_factory=set)  # of this turn's calls (each answered under its own)
    _made: int = 0  # calls this turn ran

    def offer(self, final: bool = False) -> ToolOffer | None:
        """What StreamChat offers the model: the tools on now; `final`, the step cap is reached and the
        model must answer without them (they stay declared: the prompt holds calls to them)."""
        if not self.settings.max_tool_steps:
            return None
        tools = self.available()
        self._offered = {tool.wire_name: tool for tool in tools}
        if not tools:
            return None
        return ToolOffer([tool.declaration for tool in tools], "none" if final else "auto")

    def admit(self, calls: list[ToolCall]) -> Admitted:
        """The calls of a step that run: the first MAX_CALLS_PER_STEP, while the reply has made fewer
        than MAX_CALLS_PER_REPLY. A call whose id an earlier one of the turn took (a provider that
        repeats ids, or numbers each step's from 1) is renamed `<id>_2`, `<id>_3`...: its result goes
        back to the model, the page and a client by its id."""
        room = min(MAX_CALLS_PER_STEP, MAX_CALLS_PER_REPLY - self._made)
        admitted: list[ToolCall] = []
        for call in calls[: room + 1]:  # and the first left out, which is answered
            if call.id in self._ids:
                call = replace(
                    call, id=next(f"{call.id}_{n}" for n in itertools.count(2) if f"{call.id}_{n}" not in self._ids)
                )
            self._ids.add(call.id)
            admitted.append(call)
        if len(calls) <= room:
            self._made += len(admitted)
            return Admitted(admitted, len(calls))
        left_out = admitted.pop()
        # A stream of more calls than ToolCallParts.MOST is read no further: how many more, nobody knows.
        many = len(calls) >= ToolCallParts.MOST
        if room == MAX_CALLS_PER_STEP:
            asked = f"over {ToolCallParts.MOST - 1}" if many else f"{len(calls):,}"
            limit = f"one step runs {MAX_CALLS_PER_STEP} tool calls at most, and this one asked for {asked}"
        else:
            limit = f"one reply makes {MAX_CALLS_PER_REPLY} tool calls at most, and this one has made them"
        after = "all those after it" if many else f"the {len(calls) - room - 1:,} after it"
        error = f"Not run: {limit}. This call and {after} were left out."
        self._made += len(admitted)
        return Admitted(admitted, len(calls), left_out, error)

    @property
    def spent(self) -> bool:
        """The turn made all the calls a reply may: the model answers next without tools."""
        return self._made >= MAX_CALLS_PER_REPLY

    def name_of(self, call: ToolCall) -> str:
        tool = self._offered.get(call.name)
        return tool.name if tool else call.name

    async def run(self, call: ToolCall, stop: asyncio.Event) -> CallOutcome:
        """Run one call, within --tool-timeout and until `stop`; never raises for the tool's sake."""
        tool = self._offered.get(call.name)
        if tool is None:
            return CallOutcome(call, call.name, error=f"No tool called {call.name!r:.80} is available.")
        if len(call.arguments) > ARGUMENT_CHARACTERS:
            return CallOutcome(call, tool.name, error=f"The arguments are over {ARGUMENT_CHARACTERS:,} characters.")
        arguments = arguments_of(call)
        if isinstance(arguments, str):
            return CallOutcome(call, tool.name, error="The arguments are not a JSON object.")
        context = self.context(call.id)
        try:
            await self.limits.take_tool_call(context.owner)
        except RateLimited as limited:
            return CallOutcome(call, tool.name, error=limited.message)
        started = time.monotonic()
        outcome = await self._run(tool, call, arguments, context, stop)
        # Untrusted text, made valid Unicode without NULs: the socket and PostgreSQL refuse the others. An
        # error may be as long as a result (a server's error result, a client's `error`): cut the same.
        budget = self.settings.tool_result_chars
        error = outcome.error and clean_text(cut(outcome.error, budget))
        outcome = replace(outcome, result=clean_text(outcome.result), error=error)
        logger.debug(
            "tool %s in turn %s: %s in %d ms",
            tool.name,
            context.turn_id,
            outcome.error or "ok",
            (time.monotonic() - started) * 1000,
        )
        return outcome

    async def _run(
        self, tool: Tool, call: ToolCall, arguments: dict[str, Any], context: CallContext, stop: asyncio.Event
    ) -> CallOutcome:
        timeout = self.settings.tool_timeout
        running = asyncio.ensure_future(tool.run(arguments, context))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({running, stopping}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            running.cancel()  # the turn itself was cancelled: the call does not outlive it
            raise
        finally:
            stopping.cancel()
        if not running.done():
            context.cancelled = "stopped" if stop.is_set() else f"no answer within {timeout:g} s"
            running.cancel()  # an MCP call is cancelled on the server too; a client is told
            await asyncio.wait({running}, timeout=CANCEL_WAIT_SECONDS)
            if stop.is_set():
                return CallOutcome(call, tool.name, error="Stopped.", stopped=True)
            if tool.source == CLIENT:
                return CallOutcome(call, tool.name, error=f"Denied: {context.cancelled}.", denied=True)
            return CallOutcome(call, tool.name, error=f"The tool did not answer within {timeout:g} s.")
        try:
            result = running.result()
        except Denied as denied:
            return CallOutcome(call, tool.name, error=f"Denied: {denied}", denied=True)
        except ToolFailed as failed:
            return CallOutcome(call, tool.name, error=str(failed))
        except Exception:
            # A bug of PocketChat's: the model is told, the turn goes on, the log has the traceback.
            logger.exception("tool %s failed", tool.name)
            return CallOutcome(call, tool.name, error="The tool failed inside PocketChat; see its log.")
        return CallOutcome(call, tool.name, result=cut(result, self.settings.tool_result_chars) or "(empty)")
