from tests.conftest import reply_text


def test_smoke(app, fake):
    c = app.client()
    ready = c.hello()
    print(ready)
    frames = c.turn("hi there")
    print(frames)
    assert reply_text(frames) == "tok1 tok2 tok3 tok4 tok5 "
