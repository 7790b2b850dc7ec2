"""What an uploaded image is: PNG, JPEG or WebP, told by its bytes (never by its name), decoded whole
once so that a damaged file is refused at upload rather than by the model later. Runs off the event
loop: decoding a large photo takes a tenth of a second or more."""

import io
import warnings
from dataclasses import dataclass

from PIL import Image

# The kinds a vision model takes as an image part (OpenAI's list; GIF is left out: animated, rarely
# meant), by the bytes each begins with. WebP is a RIFF container whose form type is WEBP.
TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
# Each side and the whole: a small file can hold an image that would take gigabytes decoded (a
# "decompression bomb"), which neither this server nor a browser showing it should unpack.
MAX_SIDE = 16_384
MAX_PIXELS = 40_000_000


@dataclass(frozen=True)
class ImageKind:
    type: str  # image/png, image/jpeg or image/webp
    width: int
    height: int


class UnreadableImage(ValueError):
    """Bytes that are no image PocketChat sends; the message says why, for the user. `damaged`: they
    begin as an image does, but do not decode (the HTTP answer is 422 then; 415 for any other kind)."""

    def __init__(self, message: str, damaged: bool = False) -> None:
        super().__init__(message)
        self.damaged = damaged


def sniff(data: bytes) -> str | None:
    """The Pillow format name the bytes begin with (PNG, JPEG, WEBP), or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def read_image(data: bytes) -> ImageKind:
    """The kind and size of the image in `data`; UnreadableImage says why it is not one."""
    found = sniff(data)
    if found is None:
        raise UnreadableImage("is not a PNG, JPEG or WebP image (its bytes say so, whatever its name).")
    try:
        with warnings.catch_warnings():
            # Pillow warns of large images; the sides are checked here, before anything is decoded.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            # Only the format the bytes announced: no other decoder of Pillow ever reads an upload.
            with Image.open(io.BytesIO(data), formats=[found]) as image:
                width, height = image.size
                if width > MAX_SIDE or height > MAX_SIDE or width * height > MAX_PIXELS:
                    raise _too_large(f"{width}×{height} pixels")
                image.load()  # the whole image: a truncated or corrupt one fails here
    except UnreadableImage:
        raise
    except Image.DecompressionBombError:  # Pillow's own bound, far above ours, checked as it opens
        raise _too_large("hundreds of millions of pixels") from None
    except (OSError, ValueError, SyntaxError) as error:
        # Pillow's messages name the problem ("image file is truncated"), never the bytes.
        raise UnreadableImage(f"is damaged: it cannot be read as a {found} image ({error}).", damaged=True) from None
    return ImageKind(TYPES[found], width, height)


def _too_large(size: str) -> UnreadableImage:
    return UnreadableImage(
        f"is {size}: more than PocketChat sends ({MAX_SIDE} a side, {MAX_PIXELS // 1_000_000} million in all)."
    )
