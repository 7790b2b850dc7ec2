"""What the settings' areas share: a list given as comma-separated text."""

from typing import Annotated

from pydantic import BeforeValidator
from pydantic_settings import NoDecode


def split_commas(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


# NoDecode: a variable's text is split at its commas, not read as JSON.
CommaList = Annotated[list[str], NoDecode, BeforeValidator(split_commas)]
