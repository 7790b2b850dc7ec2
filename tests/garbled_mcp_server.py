"""An MCP server over stdio whose every answer is what a hostile or broken server could write (for
tests/test_model_text.py): a tool whose description is a megabyte with NULs, whose schema is 150 levels
deep with a NUL, a second tool with a megabyte name, and a result of a megabyte with NULs.

Written by hand, line by line of JSON-RPC, not with the SDK: the SDK would check and reshape what it sends.
(A lone surrogate cannot come this way: the app's MCP client refuses such a line as junk.)"""

import json
import sys

DEEP = '{"a":' * 150 + '"\\u0000"' + "}" * 150
TOOLS = (
    '[{"name":"echo","description":"Echo\\u0000' + "d" * 1_000_000 + '",'
    '"inputSchema":{"type":"object","properties":{"x":' + DEEP + "}}},"
    '{"name":"' + "n" * 1_000_000 + '","inputSchema":{"type":"object"}}]'
)
RESULT = '{"content":[{"type":"text","text":"result\\u0000 \\ud83d\\ude00 ' + "r" * 1_000_000 + '"}],"isError":false}'


def answer(message_id: object, result: str) -> None:
    sys.stdout.write('{"jsonrpc":"2.0","id":' + json.dumps(message_id) + ',"result":' + result + "}\n")
    sys.stdout.flush()


for line in sys.stdin:
    message = json.loads(line)
    method, message_id = message.get("method"), message.get("id")
    if message_id is None:
        continue  # a notification: nothing to answer
    if method == "initialize":
        version = json.dumps(message["params"]["protocolVersion"])
        info = '"serverInfo":{"name":"garbled","version":"1"}'
        answer(message_id, '{"protocolVersion":' + version + ',"capabilities":{"tools":{}},' + info + "}")
    elif method == "tools/list":
        answer(message_id, '{"tools":' + TOOLS + "}")
    elif method == "tools/call":
        answer(message_id, RESULT)
    else:
        answer(message_id, "{}")
