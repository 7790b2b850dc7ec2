"""The hostile inputs of issue 30 (tests/hostile_files.py) are what they claim to be: valid files of their
kind, shaped as the finding says, at a small size (their cost at full size is bench/hostile.py's)."""

import io
import json
import subprocess
import sys

from PIL import Image
from pypdf import PdfReader

from pocketchat.transfer.read import read_trees
from tests import hostile_files as files


def test_the_pdf_is_well_formed_and_every_page_shares_one_content_stream():
    data = files.shared_stream_pdf(pages=3, stream_megabytes=0.01)
    xref = int(data.rsplit(b"startxref\n", 1)[1].split()[0])
    entries = data[xref:].split(b"\n")[3 : 3 + 4 + 3]  # after "xref", "0 N" and the free entry 0
    assert all(data[int(entry[:10]) :].startswith(b"%d 0 obj" % n) for n, entry in enumerate(entries, start=1))
    reader = PdfReader(io.BytesIO(data), strict=True)
    contents = [page.raw_get("/Contents").idnum for page in reader.pages]
    assert len(contents) == 3 and len(set(contents)) == 1
    assert "Hello" in reader.pages[2].extract_text()
    assert 5_000 < len(files.shared_stream_pdf()) < 8_000  # the finding's ~6.5 KB


def test_the_jpeg_is_progressive_with_a_scan_per_coefficient_and_bit():
    data = files.many_scans_jpeg(side=64, refinements=2)
    assert data.count(b"\xff\xda") == 1 + 3 * 63 * 3
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        assert image.size == (64, 64) and image.info.get("progressive")
        assert image.getpixel((10, 10)) == (128, 128, 128)


def test_the_chatgpt_export_keeps_every_message_under_the_chain():
    trees = list(read_trees(io.BytesIO(files.chatgpt_chain_export(empty=50, kept=20))))
    assert len(trees[0].messages) == 20 and all(m.parent_id is None for m in trees[0].messages)


def test_the_import_files_parse():
    assert json.loads(files.empty_lists_import(0.001)) == [[]] * 333
    (tree,) = read_trees(io.BytesIO(files.big_message_import(0.01)))
    assert len(tree.messages) == 1 and files.BIG_MESSAGE_QUERY in tree.messages[0].content.replace("é", "e")


def test_the_text_files_are_one_line_and_one_run_of_spaces():
    line, spaces = files.one_line_text(0.01), files.spaces_text(1)
    assert len(line) == 10_000 and b"\n" not in line and b"." not in line  # no sentence end to cut at
    assert spaces == b" " * 1000
    assert files.close_tags_html(3) == b"</</</"
    assert len(files.UploadBurst(size=1000).document()) == 1000


def test_the_scripts_call_the_tools():
    calls = files.calculator_replies(7)[0].calls
    assert [(c.name, c.arguments) for c in calls] == [("calculator", {"expression": "round(1,-10**7)"})]
    asked = files.many_calls_replies(5)[0].calls
    assert len(asked) == 5 and {c.name for c in asked} == {"current_time"}


def test_the_flooding_mcp_server_writes_no_newline():
    entry = files.flooding_mcp_server(0.01)
    out = subprocess.run([entry["command"], *entry["args"]], capture_output=True, timeout=30).stdout
    assert out == b"x" * 10_000
    assert json.loads(files.mcp_config(hostile=entry))["mcpServers"]["hostile"]["command"] == sys.executable
