"""Images: attached over real HTTP (multipart), their kind told by their bytes, sent with a message to a
model that sees them as OpenAI image parts (the fake provider records them), refused before the turn for
one that does not; stored with the message and shown back in the history; every storage rule in one
process on SQLite and in a replica on PostgreSQL and Redis."""

import asyncio
import base64
import io
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from PIL import Image

from pocketchat.providers import WithEmbeddedModel, sees_images
from pocketchat.providers.openai_compatible import OpenAIProvider
from pocketchat.records import ConversationRecord, ImageRecord, Message
from pocketchat.settings import VISION_MODELS
from tests.conftest import MODES, AppProcess, ChatClient
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_documents import call, multipart, new_conversation, post_chunked, rows
from tests.test_store import opened, store  # noqa: F401 (a fixture)
from utils.read_image import UnreadableImage, read_image

both = pytest.mark.parametrize("mode", MODES, indirect=True)
# The fake lists fake-model (its default) and fake-model-large: the first sees images, the second does not.
VISION = ("--vision-models", "fake-model")


def picture(kind: str, size: tuple[int, int] = (48, 32), color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A real image of `kind` (PNG, JPEG, WEBP), made by Pillow."""
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, kind)
    return out.getvalue()


PNG, JPEG, WEBP = picture("PNG"), picture("JPEG", color=(10, 200, 10)), picture("WEBP", color=(10, 10, 200))


def data_url(type: str, data: bytes) -> str:
    return f"data:{type};base64,{base64.b64encode(data).decode()}"


def upload(app: AppProcess, conversation_id: str, name: str, data: bytes, **headers: str) -> tuple[int, Any]:
    body, content_type = multipart(name, data)
    path = f"/api/conversations/{conversation_id}/images"
    return call(app, "POST", path, body, **{"Content-Type": content_type, **headers})


def waiting(app: AppProcess, conversation_id: str, **headers: str) -> list[dict[str, Any]]:
    status, answer = call(app, "GET", f"/api/conversations/{conversation_id}/images", **headers)
    assert status == 200, answer
    return answer["images"]


def fetch(app: AppProcess, conversation_id: str, image_id: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    """GET an image: its status, headers and bytes."""
    path = f"/api/conversations/{conversation_id}/images/{image_id}"
    request = urllib.request.Request(app.url + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def send(client: ChatClient, content: str, images: list[str], type: str = "message") -> list[dict[str, Any]]:
    """A message naming images: the frames up to its turn_end, or up to the error that refused it."""
    client.send(type, content=content, images=images)
    frames = [client.recv()]
    while frames[-1]["type"] not in ("turn_end", "error"):
        frames.append(client.recv())
    return frames


def pick_model(app: AppProcess, client: ChatClient, conversation_id: str, model: str) -> None:
    """Change the conversation's model, as the page's picker does, and wait for the socket to be told."""
    body = json.dumps({"model": model}).encode()
    path = f"/api/conversations/{conversation_id}"
    assert call(app, "PATCH", path, body, **{"Content-Type": "application/json"})[0] == 200
    client.until("conversation")


def last_user_content(fake: FakeOpenAI) -> Any:
    return fake.chat_requests[-1]["json"]["messages"][-1]["content"]


def count(request: pytest.FixtureRequest, mode: str, app: AppProcess, where: str = "") -> int:
    return rows(request, mode, app, f"SELECT count(*) FROM images {where}")[0][0]


@both
def test_png_jpeg_and_webp_reach_a_vision_model_as_image_parts_and_stay_with_the_message(
    request, mode, start_app, fake
):
    app = start_app(*VISION)
    client, conversation_id = new_conversation(app)
    attached = []
    # The kind comes from the bytes: a PNG named .jpg is a PNG.
    for name, data in (("photo.jpg", PNG), ("scan.jpeg", JPEG), ("sticker.webp", WEBP)):
        status, image = upload(app, conversation_id, name, data)
        assert status == 201, image
        attached.append(image)
    assert [(i["name"], i["type"], i["size"], i["width"], i["height"]) for i in attached] == [
        ("photo.jpg", "image/png", len(PNG), 48, 32),
        ("scan.jpeg", "image/jpeg", len(JPEG), 48, 32),
        ("sticker.webp", "image/webp", len(WEBP), 48, 32),
    ]
    assert waiting(app, conversation_id) == attached
    ids = [image["id"] for image in attached]

    fake.queue(Reply(tokens=["Three squares."]))
    frames = send(client, "What is in these?", ids)
    assert frames[0]["type"] == "turn_start" and frames[0]["message"]["images"] == attached
    assert frames[-1]["status"] == "complete"
    # The provider got them as OpenAI image parts, after the text, in the order sent, bytes as uploaded.
    assert last_user_content(fake) == [
        {"type": "text", "text": "What is in these?"},
        {"type": "image_url", "image_url": {"url": data_url("image/png", PNG)}},
        {"type": "image_url", "image_url": {"url": data_url("image/jpeg", JPEG)}},
        {"type": "image_url", "image_url": {"url": data_url("image/webp", WEBP)}},
    ]
    assert waiting(app, conversation_id) == []  # the message's now, not the next one's
    assert app.get(f"/api/conversations/{conversation_id}")["messages"][0]["images"] == attached
    assert app.client().hello(conversation_id)["history"][0]["images"] == attached  # another tab

    # Served back to its owner with the type its bytes have, never sniffed by the browser.
    status, headers, body = fetch(app, conversation_id, ids[2])
    assert (status, headers["content-type"], headers["x-content-type-options"], body) == (
        200,
        "image/webp",
        "nosniff",
        WEBP,
    )
    # Kept across a restart (SQLite), or on another replica (PostgreSQL): in the history and as bytes.
    if mode == "single":
        app.stop()
        app.start()
        reader = app
    else:
        reader = start_app(*VISION)
    assert reader.client().hello(conversation_id)["history"][0]["images"] == attached
    assert fetch(reader, conversation_id, ids[0])[2] == PNG
    # Named in the export.
    with urllib.request.urlopen(f"{reader.url}/api/conversations/{conversation_id}/export.md", timeout=10) as answer:
        markdown = answer.read().decode()
    assert "What is in these?\n\nImages:\n\n- photo.jpg (48×32, image/png)\n- scan.jpeg (48×32, image/jpeg)" in markdown
    # And their bytes reach no log.
    assert base64.b64encode(PNG).decode()[:40] not in app.logs() + reader.logs()
    assert count(request, mode, app, "WHERE message_id IS NOT NULL") == 3


@pytest.mark.parametrize("mode", ["replicas"], indirect=True)
def test_a_replica_that_follows_the_turn_keeps_the_images_with_the_message_and_sends_them_again(start_app, fake):
    """Replica B follows a turn that runs on A: the user message it keeps in memory has the images (a new
    tab on B sees them), and a regenerate sent through B sends them to the model again."""
    a, b = start_app(*VISION), start_app(*VISION)
    sender, conversation_id = new_conversation(a)
    follower = b.client()
    follower.hello(conversation_id)
    _, image = upload(a, conversation_id, "dot.png", PNG)
    assert send(sender, "And this?", [image["id"]])[-1]["status"] == "complete"
    assert follower.until("turn_end")[0]["message"]["images"] == [image]
    assert b.client().hello(conversation_id)["history"][0]["images"] == [image]
    fake.queue(Reply(tokens=["Again."]))
    follower.send("regenerate")
    assert follower.until("turn_end")[-1]["status"] == "complete"
    assert last_user_content(fake)[1] == {"type": "image_url", "image_url": {"url": data_url("image/png", PNG)}}


@both
def test_a_text_only_model_refuses_a_message_with_images_before_its_turn_and_the_text_can_go_alone(
    request, mode, start_app, fake
):
    app = start_app(*VISION)
    client, conversation_id = new_conversation(app)
    _, image = upload(app, conversation_id, "chart.png", PNG)
    pick_model(app, client, conversation_id, "fake-model-large")
    asked = len(fake.chat_requests)
    [refused] = send(client, "Read this chart", [image["id"]])
    assert refused["type"] == "error" and refused["code"] == "images_not_supported"
    assert "“fake-model-large” cannot see images, so this message and its images were not sent" in refused["message"]
    # Nothing started, nothing was asked of the model, and the image still waits for a message.
    assert len(fake.chat_requests) == asked and waiting(app, conversation_id) == [image]
    assert app.get(f"/api/conversations/{conversation_id}")["messages"] == []
    # The text alone goes, if the user chooses: as text, no part.
    frames = send(client, "Read this chart", [])
    assert frames[0]["type"] == "turn_start" and "images" not in frames[0]["message"]
    assert last_user_content(fake) == "Read this chart"
    assert count(request, mode, app, "WHERE message_id IS NULL") == 1


def test_a_message_answered_again_by_a_text_only_model_is_refused_and_its_history_images_are_never_sent(
    start_app, fake
):
    app = start_app(*VISION)
    client, conversation_id = new_conversation(app)
    _, image = upload(app, conversation_id, "map.png", PNG)
    first = send(client, "Where is this?", [image["id"]])
    assert first[-1]["status"] == "complete"
    pick_model(app, client, conversation_id, "fake-model-large")
    asked = len(fake.chat_requests)
    client.send("regenerate")
    assert client.until("error")[-1]["code"] == "images_not_supported"
    client.send("edit", message_id=first[0]["message"]["id"], content="Where is this place?")
    assert client.until("error")[-1]["code"] == "images_not_supported"
    assert len(fake.chat_requests) == asked
    # A new message goes; the earlier image stays out of the prompt of a model that cannot see it.
    send(client, "Tell me more", [])
    assert [m["content"] for m in fake.chat_requests[-1]["json"]["messages"][1:]] == [
        "Where is this?",
        "tok1 tok2 tok3 tok4 tok5 ",
        "Tell me more",
    ]


def test_an_edit_keeps_the_images_and_an_image_alone_is_a_message(start_app, fake):
    app = start_app(*VISION)
    client, conversation_id = new_conversation(app)
    _, image = upload(app, conversation_id, "cat.png", PNG)
    frames = send(client, "", [image["id"]])  # no text: the image is the message
    assert frames[-1]["status"] == "complete"
    assert last_user_content(fake) == [{"type": "image_url", "image_url": {"url": data_url("image/png", PNG)}}]
    assert app.get(f"/api/conversations/{conversation_id}")["title"] is None  # named by the next text
    client.send("edit", message_id=frames[0]["message"]["id"], content="What breed?")
    edited = client.until("turn_end")
    # The edit is a new version of the message, with a copy of its image: each version keeps its own.
    [copy] = edited[0]["message"]["images"]
    assert copy["id"] != image["id"] and {**copy, "id": image["id"]} == image
    assert fetch(app, conversation_id, copy["id"])[2] == fetch(app, conversation_id, image["id"])[2] == PNG
    assert last_user_content(fake)[0] == {"type": "text", "text": "What breed?"}
    assert len(last_user_content(fake)) == 2


def test_older_images_are_dropped_oldest_first_to_fit_the_context_budget(start_app, fake):
    # 4000 tokens: the images may take 2000 of them, at 800 each: the newest message's and one older.
    app = start_app(*VISION, "--context-budget", "4000")
    client, conversation_id = new_conversation(app)
    for number, data in enumerate((PNG, JPEG, WEBP), 1):
        _, image = upload(app, conversation_id, f"{number}.img", data)
        assert send(client, f"picture {number}", [image["id"]])[-1]["status"] == "complete"
    users = [m["content"] for m in fake.chat_requests[-1]["json"]["messages"] if m["role"] == "user"]
    assert users[0] == "picture 1"  # its text only
    assert [part["type"] for part in users[1]] == ["text", "image_url"]
    assert users[2][1]["image_url"]["url"] == data_url("image/webp", WEBP)


BAD_IMAGES = {
    "text named .png": ("cat.png", b"Not an image at all, just words.", 415, "is not a PNG, JPEG or WebP image"),
    "GIF": ("anim.gif", b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", 415, "is not a PNG, JPEG or WebP image"),
    "truncated PNG": ("half.png", picture("PNG", (300, 200))[:120], 422, "is damaged"),
    "empty": ("empty.png", b"", 422, "is empty"),
    "too many pixels": ("wide.png", picture("PNG", (17_000, 2)), 415, "17000×2 pixels: more than PocketChat sends"),
}


@both
@pytest.mark.parametrize("bad", BAD_IMAGES.values(), ids=BAD_IMAGES.keys())
def test_a_bad_image_gets_a_clear_error_stores_nothing_and_leaves_the_rest_working(request, mode, start_app, bad):
    app = start_app(*VISION)
    client, conversation_id = new_conversation(app)
    name, data, status, reason = bad
    answer = upload(app, conversation_id, name, data)
    assert answer[0] == status and f"“{name}” " in answer[1]["detail"] and reason in answer[1]["detail"], answer
    assert waiting(app, conversation_id) == [] and count(request, mode, app) == 0
    _, good = upload(app, conversation_id, "good.png", PNG)
    assert send(client, "And this one?", [good["id"]])[-1]["status"] == "complete"


@both
def test_an_image_over_the_size_limit_gets_413_while_it_comes_in_and_stores_nothing(request, mode, start_app):
    app = start_app("--limit-image-bytes", "2000")
    _, conversation_id = new_conversation(app)
    photo = picture("PNG", (400, 400))
    photo = photo + b"\0" * (3000 - len(photo)) if len(photo) < 3000 else photo
    status, answer = upload(app, conversation_id, "big.png", photo)  # within the body's slack: the route says
    assert status == 413 and answer["detail"] == "“big.png” is over the limit of 0.002 MB an image."
    # Declared too long: refused before a byte of the body is read (not by the route, which never runs).
    status, answer = upload(app, conversation_id, "huge.png", b"\x89PNG\r\n\x1a\n" + b"x" * 200_000)
    assert status == 413 and answer["detail"].startswith("The request body is over this route's limit")
    # Chunked, no length declared: refused as it passes the limit, the rest unread.
    assert post_chunked(app, f"/api/conversations/{conversation_id}/images", "streamed.png", 500_000) == 413
    assert count(request, mode, app) == 0


@both
def test_the_images_of_a_message_and_of_a_user_are_limited_and_bad_names_change_nothing(request, mode, start_app, fake):
    app = start_app(*VISION, "--limit-images-per-message", "2", "--limit-image-bytes-per-user", str(3 * len(PNG)))
    client, conversation_id = new_conversation(app)
    first, second = upload(app, conversation_id, "1.png", PNG)[1], upload(app, conversation_id, "2.png", PNG)[1]
    status, answer = upload(app, conversation_id, "3.png", PNG)
    assert status == 409 and "the most one may carry (2)" in answer["detail"]
    asked = len(fake.chat_requests)
    bad_names = {
        "2 images at most": [first["id"], second["id"], "x" * 22],
        "the same image twice": [first["id"], first["id"]],
        "not waiting in this conversation": [first["id"], "NoSuchImage0123456789a"],
    }
    for reason, ids in bad_names.items():
        [refused] = send(client, "Look", ids)
        assert refused["code"] == "bad_frame" and reason in refused["message"], refused
    assert len(fake.chat_requests) == asked and len(waiting(app, conversation_id)) == 2
    looked = send(client, "Look", [first["id"]])
    assert looked[-1]["status"] == "complete"
    # Sent already: it is the first message's, and cannot go with another.
    [refused] = send(client, "Again", [first["id"]])
    assert refused["code"] == "bad_frame" and "sent already" in refused["message"]
    # The user's bytes: two images stored, a third fits, a fourth does not (in any conversation).
    _, other = new_conversation(app)
    assert upload(app, other, "3.png", PNG)[0] == 201
    status, answer = upload(app, other, "4.png", PNG)
    assert status == 409 and "delete some conversations first" in answer["detail"]
    assert count(request, mode, app) == 3
    # An edit keeps its own copy of its message's images: past the user's bytes, refused, nothing sent.
    asked = len(fake.chat_requests)
    client.send("edit", message_id=looked[0]["message"]["id"], content="Look again")
    refused = client.until("error")[-1]
    assert refused["code"] == "over_quota" and "nothing was sent" in refused["message"], refused
    assert len(fake.chat_requests) == asked and count(request, mode, app) == 3


@both
def test_images_are_their_owners_and_another_users_image_cannot_be_sent_or_seen(request, mode, start_app, fake):
    app = start_app(*VISION, "--auth", "header")
    alice, bob = {"X-Forwarded-User": "alice"}, {"X-Forwarded-User": "bob"}
    alice_client, alices = new_conversation(app, **alice)
    _, kept = upload(app, alices, "secret.png", PNG, **alice)
    _, sent = upload(app, alices, "sent.png", JPEG, **alice)
    assert send(alice_client, "Mine", [sent["id"]])[-1]["status"] == "complete"
    for image in (kept, sent):
        assert fetch(app, alices, image["id"], **bob)[0] == 404
        assert fetch(app, alices, image["id"], **alice)[0] == 200
    assert call(app, "GET", f"/api/conversations/{alices}/images", **bob)[0] == 404
    assert call(app, "DELETE", f"/api/conversations/{alices}/images/{kept['id']}", **bob)[0] == 404
    assert upload(app, alices, "bob.png", PNG, **bob)[0] == 404
    # Bob names Alice's waiting image in his own conversation: refused, nothing sent.
    bob_client, bobs = new_conversation(app, **bob)
    asked = len(fake.chat_requests)
    [refused] = send(bob_client, "What is this?", [kept["id"]])
    assert refused["code"] == "bad_frame" and len(fake.chat_requests) == asked
    assert fetch(app, bobs, kept["id"], **bob)[0] == 404  # nor through a conversation of his
    assert waiting(app, alices, **alice) == [kept]
    assert count(request, mode, app) == 2


@both
def test_a_waiting_image_can_be_removed_a_sent_one_stays_and_deleting_the_conversation_deletes_all(
    request, mode, start_app, fake
):
    app = start_app(*VISION)
    client, doomed = new_conversation(app)
    _, sent = upload(app, doomed, "sent.png", PNG)
    send(client, "Keep it", [sent["id"]])
    _, dropped = upload(app, doomed, "drop.png", PNG)
    _, left = upload(app, doomed, "left.png", PNG)
    assert call(app, "DELETE", f"/api/conversations/{doomed}/images/{dropped['id']}")[0] == 204
    assert call(app, "DELETE", f"/api/conversations/{doomed}/images/{sent['id']}")[0] == 404
    assert waiting(app, doomed) == [left] and fetch(app, doomed, sent["id"])[0] == 200
    _, kept = new_conversation(app)
    upload(app, kept, "other.png", PNG)
    assert call(app, "DELETE", f"/api/conversations/{doomed}")[0] == 204
    assert rows(request, mode, app, "SELECT conversation_id FROM images") == [(kept,)]
    assert fetch(app, doomed, sent["id"])[0] == 404


# ---- without a server ----------------------------------------------------------------------------


def test_read_image_tells_the_kind_by_the_bytes_and_refuses_what_is_not_one():
    for kind, data in (("image/png", PNG), ("image/jpeg", JPEG), ("image/webp", WEBP)):
        found = read_image(data)
        assert (found.type, found.width, found.height) == (kind, 48, 32)
    with pytest.raises(UnreadableImage, match="not a PNG, JPEG or WebP") as refused:
        read_image(b"<svg xmlns='http://www.w3.org/2000/svg'/>")
    assert not refused.value.damaged
    with pytest.raises(UnreadableImage, match="damaged") as refused:
        read_image(JPEG[: len(JPEG) // 2])
    assert refused.value.damaged
    # A tiny file that would decode to 400 million pixels (a "decompression bomb") is never decoded.
    with pytest.raises(UnreadableImage, match="more than PocketChat sends"):
        read_image(picture("PNG", (20_000, 20_000)))


def test_the_default_vision_models_are_the_known_ones_and_the_embedded_model_never_sees():
    remote = OpenAIProvider("http://127.0.0.1:9/v1", "sk-test", None, idle_limit=1)
    patterns = list(VISION_MODELS)
    seeing = ["gpt-4o", "gpt-4o-mini", "openai/gpt-4o", "gpt-4.1-nano", "gpt-5", "claude-3-5-sonnet-latest",
              "anthropic/claude-sonnet-4", "gemini-2.0-flash", "llava:13b", "llama3.2-vision:11b", "qwen2.5vl:7b",
              "Qwen/Qwen2-VL-7B-Instruct", "gemma3:4b", "pixtral-12b"]  # fmt: skip
    blind = ["gpt-3.5-turbo", "llama3.2", "mistral", "qwen2.5:7b", "deepseek-r1", "fake-model", ""]
    assert [m for m in seeing if not sees_images(remote, m, patterns)] == []
    assert [m for m in blind if sees_images(remote, m, patterns)] == []

    class Embedded:  # what WithEmbeddedModel asks of the embedded model
        model_name = "SmolLM2-135M-Instruct"

        async def aclose(self) -> None:
            return None

    both_models = WithEmbeddedModel(remote, Embedded())  # type: ignore[arg-type]
    assert sees_images(both_models, "gpt-4o", ["*"]) and not sees_images(both_models, "SmolLM2-135M-Instruct", ["*"])

    class Local:
        kind = "local"

    assert not sees_images(Local(), "llava", ["*"])  # type: ignore[arg-type]


def test_an_image_is_made_one_messages_and_never_taken_by_another(store):  # noqa: F811 (the fixture)
    """Two messages naming the same waiting image (the second checked before the first's write landed, with
    a stalled database): the first keeps it, whoever names it again."""

    async def run() -> tuple[list[str | None], list[str]]:
        async with opened(store) as db:
            record = ConversationRecord(model="fake-model", system_prompt="")
            await db.create_conversation(record)
            image = ImageRecord(record.id, record.owner, "a.png", "image/png", len(PNG), 48, 32)
            await db.add_image(image, PNG)
            owners = []
            for message_id in ("first", "second", "first"):
                await db.attach_images(record.id, message_id, [image.id])
                found = await db.image(record.id, image.id, record.owner)
                owners.append(found[0].message_id if found else None)
            await db.save_messages(record.id, [Message("user", "one", id="first"), Message("user", "two", id="second")])
            _, messages = await db.load(record.id) or (None, [])
            return owners, [m.id for m in messages if m.images]

    assert asyncio.run(run()) == (["first", "first", "first"], ["first"])
