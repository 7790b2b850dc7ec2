"""The docs describe what the code does: every frame, error code and setting is documented."""

import re
import subprocess
from pathlib import Path

import pytest

from pocketchat import errors, protocol
from pocketchat.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL_DOC = (ROOT / "docs" / "protocol.md").read_text()
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()


@pytest.mark.parametrize("frame_type", protocol.CLIENT_FRAME_TYPES + protocol.SERVER_FRAME_TYPES)
def test_every_frame_type_is_in_the_protocol_doc(frame_type):
    assert f"| `{frame_type}` |" in PROTOCOL_DOC


@pytest.mark.parametrize("code", [*errors.ERROR_CODES, errors.ProtocolError.code])
def test_every_error_code_is_in_the_protocol_doc(code):
    assert f"| `{code}` |" in PROTOCOL_DOC


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_every_setting_is_in_the_configuration_doc_as_variable_and_flag(name):
    assert f"`POCKETCHAT_{name.upper()}`" in CONFIGURATION
    assert f"`--{name.replace('_', '-')}`" in CONFIGURATION


NGINX_BLOCKS = re.findall(r"```nginx\n(.*?)```", README, re.S)
UPGRADE_MAP = 'map $http_upgrade $connection_upgrade { default upgrade; "" close; }'


@pytest.mark.parametrize("block", NGINX_BLOCKS, ids=[f"nginx-{i}" for i in range(len(NGINX_BLOCKS))])
def test_the_readmes_nginx_configs_are_valid(block, tmp_path):
    """Each nginx snippet of the README, as a server block in an http block, passes `nginx -t` (with
    a throwaway certificate in place of Let's Encrypt's)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
         "-subj", "/CN=chat.example.org"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = block.replace("/etc/letsencrypt/live/chat.example.org/fullchain.pem", str(cert))
    server = server.replace("/etc/letsencrypt/live/chat.example.org/privkey.pem", str(key))
    server = server.replace("# ssl_certificate lines as above", f"ssl_certificate {cert}; ssl_certificate_key {key};")
    server = server.replace(f"# in the http block:\n{UPGRADE_MAP}\n", "")
    config = tmp_path / "nginx.conf"
    config.write_text(
        f"pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log; events {{}}\n"
        f"http {{ access_log off; {UPGRADE_MAP}\n"
        f"client_body_temp_path {tmp_path}/body; proxy_temp_path {tmp_path}/proxy;\n{server}}}\n"
    )
    checked = subprocess.run(["nginx", "-t", "-c", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
