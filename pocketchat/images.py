"""Images sent with user messages. An upload is checked (its kind told by its bytes and decoded once, its
size and the images waiting limited) and stored waiting for the conversation's next message; a message
that names images is checked (waiting images of this conversation, few enough) and, for a model that
cannot see images, refused before its turn starts: nothing is sent that the user believes the model saw.
The nodes read the bytes when they build the prompt (nodes.ReadImages); the routes are web/images.py.
"""

import asyncio
from collections.abc import Sequence
from typing import BinaryIO

from pocketchat.documents import UploadRefused, file_name, megabytes, not_read
from pocketchat.errors import BadFrame, ImagesNotSupported, OverQuota
from pocketchat.jobs import JobFailed, Jobs
from pocketchat.providers import sees_images
from pocketchat.records import ImageRecord
from pocketchat.settings import Settings
from pocketchat.store import Store
from utils.llm_stream import ChatProvider
from utils.read_image import UnreadableImage, read_image


class Images:
    """The images of every conversation this process serves."""

    def __init__(self, settings: Settings, store: Store, provider: ChatProvider, jobs: Jobs) -> None:
        self.settings = settings
        self.store = store
        self.provider = provider
        self.jobs = jobs  # an upload is decoded by the job workers: a crafted image can take long
        self._uploads = asyncio.Lock()  # a user's limits are checked and taken one upload at a time

    def sees(self, model: str) -> bool:
        """Whether `model` takes images (--vision-models; never the embedded model)."""
        return sees_images(self.provider, model, self.settings.vision_models)

    async def add(
        self, conversation_id: str, owner: str, raw_name: str | None, file: BinaryIO, size: int
    ) -> ImageRecord:
        """Check an upload and store it waiting for the next message; or raise UploadRefused, having stored
        nothing."""
        name = file_name(raw_name, "image")
        settings = self.settings
        if size > settings.limit_image_bytes:
            raise UploadRefused(413, f"“{name}” is over the limit of {megabytes(settings.limit_image_bytes)} an image.")
        if size == 0:
            raise UploadRefused(422, f"“{name}” is empty.")
        await self.room(conversation_id, owner, size)  # before it is decoded: decoding costs
        data = await asyncio.to_thread(file.read)  # spooled to a temporary file as it came in
        try:
            kind = await self.jobs.run(owner, read_image, data)
        except UnreadableImage as error:
            raise UploadRefused(422 if error.damaged else 415, f"“{name}” {error}") from None
        except JobFailed as error:
            raise not_read(name, error) from None
        async with self._uploads:
            await self.room(conversation_id, owner, len(data))  # again: another may have come meanwhile
            image = ImageRecord(conversation_id, owner, name, kind.type, len(data), kind.width, kind.height)
            await self.store.add_image(image, data)
        return image

    async def room(self, conversation_id: str, owner: str, size: int) -> int | None:
        """The bytes the user's images may still take (None: no limit); UploadRefused if the images waiting are
        the most a message carries, or `size` more would take the user's over their limit."""
        settings = self.settings
        waiting, used = await self.store.image_usage(conversation_id, owner)
        most = settings.limit_images_per_message
        if waiting >= most:
            raise UploadRefused(
                409, f"{waiting} images wait to go with your next message, the most one may carry ({most})."
            )
        if settings.limit_image_bytes_per_user and used + size > settings.limit_image_bytes_per_user:
            limit = megabytes(settings.limit_image_bytes_per_user)
            raise UploadRefused(
                409,
                f"Your images would take more than your {limit}; delete some conversations first "
                f"({megabytes(used)} now).",
            )
        return settings.limit_image_bytes_per_user - used if settings.limit_image_bytes_per_user else None

    async def for_message(self, conversation_id: str, owner: str, ids: Sequence[str], model: str) -> list[ImageRecord]:
        """The images a message names, in its order: each one waiting in this conversation, for a model
        that sees them. Else BadFrame or ImagesNotSupported, and nothing changes."""
        most = self.settings.limit_images_per_message
        if len(ids) > most:
            raise BadFrame(f"A message may carry {most} images at most; this one names {len(ids)}.")
        if len(set(ids)) < len(ids):
            raise BadFrame("A message names the same image twice.")
        waiting = {image.id: image for image in await self.store.waiting_images(conversation_id, owner)}
        if any(image_id not in waiting for image_id in ids):
            raise BadFrame(
                "An image this message names is not waiting in this conversation: it was sent already, removed, "
                "or never attached here. Attach it again."
            )
        images = [waiting[image_id] for image_id in ids]
        self.refuse_unseen(model, images)
        return images

    async def check_copies(self, conversation_id: str, owner: str, images: Sequence[ImageRecord]) -> None:
        """An edit stores a copy of each of its message's images (each version keeps its own): OverQuota
        if the copies would take the user's images over their limit, as an upload would."""
        limit = self.settings.limit_image_bytes_per_user
        if not limit or not images:
            return
        _, used = await self.store.image_usage(conversation_id, owner)
        copies = sum(image.size for image in images)
        if used + copies > limit:
            raise OverQuota(
                f"An edit keeps its own copy of the message's images ({megabytes(copies)}), which would take "
                f"more than your {megabytes(limit)} ({megabytes(used)} now): nothing was sent. Delete some "
                "conversations first, or send a new message."
            )

    def refuse_unseen(self, model: str, images: Sequence[ImageRecord], again: bool = False) -> None:
        """ImagesNotSupported if there are images and `model` cannot see them. `again`: a regenerate or an
        edit, whose message (the last one) has them."""
        if not images or self.sees(model):
            return
        named = f"“{model}”" if model else "This conversation's model"
        if again:
            raise ImagesNotSupported(
                f"{named} cannot see images, and the message to answer has {len(images)}: nothing was sent. "
                "Pick a model that can see images, or send a new message."
            )
        raise ImagesNotSupported(
            f"{named} cannot see images, so this message and its images were not sent. Remove the images to "
            "send the text alone, or pick a model that can see images."
        )

    async def remove(self, conversation_id: str, image_id: str) -> bool:
        """Delete an image still waiting to be sent; whether there was one (a sent one stays with its message)."""
        return await self.store.delete_image(conversation_id, image_id)
