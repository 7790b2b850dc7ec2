"""The docs describe what the code does: every frame, error code and setting is documented."""

from pathlib import Path

import pytest

from utils import protocol
from utils.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL_DOC = (ROOT / "docs" / "protocol.md").read_text()
README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("frame_type", protocol.CLIENT_FRAME_TYPES + protocol.SERVER_FRAME_TYPES)
def test_every_frame_type_is_in_the_protocol_doc(frame_type):
    assert f"| `{frame_type}` |" in PROTOCOL_DOC


@pytest.mark.parametrize("code", [*protocol.ERROR_CODES, protocol.ProtocolError.code])
def test_every_error_code_is_in_the_protocol_doc(code):
    assert f"| `{code}` |" in PROTOCOL_DOC


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_every_setting_is_in_the_readme_as_variable_and_flag(name):
    assert f"`POCKETCHAT_{name.upper()}`" in README
    assert f"`--{name.replace('_', '-')}`" in README
