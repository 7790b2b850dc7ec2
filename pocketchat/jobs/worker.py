"""A job worker: `python -m pocketchat.jobs.worker`, started by the app's `Jobs`. It runs one job at a time,
read from stdin, and writes its answer to stdout (pocketchat/jobs/wire.py), each job under a memory budget
(RLIMIT_AS above what the worker itself takes). It runs only the functions the app names on its command
line (pocketchat/jobs/wire.py's JOB_FUNCTIONS). Its time budget is the app's to enforce: it kills the worker.
"""

import contextlib
import ctypes
import importlib
import os
import pickle
import resource
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO

from pocketchat.jobs.wire import ANSWER_CLASSES, HEADER, READY, frame, length_of

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
PR_SET_PDEATHSIG = 1


def die_with_the_app(app: int) -> None:
    """Be killed when the app dies (Linux), even in the middle of a job it would have stopped."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != app:  # it died before that was set
        sys.exit(0)


def virtual_bytes() -> int:
    """The address space this process holds now (what RLIMIT_AS counts)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * PAGE_BYTES


def function_of(reference: str, functions: frozenset[str]) -> Callable[..., Any]:
    if reference not in functions:
        raise ValueError(f"{reference} is not a job")
    module, name = reference.split(":")
    return getattr(importlib.import_module(module), name)


def answer(function: Callable[..., Any], args: tuple[Any, ...], memory: int) -> tuple[bytes, bytes] | None:
    """The framed answer to one job: ("ok", value), ("raised", the job's own error), ("failed", a bug's
    traceback, for the app's log); None if it went over its memory budget."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (virtual_bytes() + memory, hard))
    try:
        try:
            return frame(("ok", function(*args)))
        except MemoryError:
            raise
        except ValueError as error:  # the jobs' own errors (unreadable, not arithmetic) are ValueErrors
            if (type(error).__module__, type(error).__name__) in ANSWER_CLASSES:
                return frame(("raised", error))
            return frame(("failed", traceback.format_exc()[-4000:]))
        except Exception:
            return frame(("failed", traceback.format_exc()[-4000:]))
    except MemoryError:
        return None  # said below, once the budget is lifted and the job's memory freed
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def serve(requests: BinaryIO, answers: BinaryIO, functions: frozenset[str]) -> None:
    """Say it started, then answer jobs until the app closes the pipe; only `functions` ("module:function")
    are run."""
    answers.write(READY)
    answers.flush()
    while header := requests.read(HEADER.size):
        reference, args, memory = pickle.loads(requests.read(length_of(header)))  # the app's: trusted
        framed = answer(function_of(reference, functions), args, memory)
        answers.writelines(framed or frame(("memory", None)))
        answers.flush()
        if framed is None:
            return  # a job over its memory budget may leave the heap in pieces: a fresh worker takes over


if __name__ == "__main__":
    die_with_the_app(os.getppid())
    os.nice(10)  # never urgent: the app's chats get the CPU first
    serve(sys.stdin.buffer, sys.stdout.buffer, frozenset(sys.argv[1:]))
