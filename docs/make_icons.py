"""Draw the app's icons (static/icons/): a speech bubble on the page's blue, as SVG and as PNG (192 and
512 pixels, and a maskable 512 whose square background the device crops to its own shape).

.venv/bin/python -m docs.make_icons
"""

from pathlib import Path

from PIL import Image, ImageDraw

OUT = Path(__file__).resolve().parent.parent / "static" / "icons"
SIZE = 512  # the drawing's units
BLUE, WHITE = "#2563eb", "#ffffff"
CORNER = 112  # of the background; a maskable icon's is square
# The bubble lies within 190 units of the centre: inside the maskable safe zone (a circle of 40% of the size).
BUBBLE = (112, 136, 400, 344)
BUBBLE_CORNER = 56
TAIL = [(176, 328), (160, 400), (248, 340)]
DOTS = [(192, 240), (256, 240), (320, 240)]
DOT_RADIUS = 24


def svg() -> str:
    left, top, right, bottom = BUBBLE
    width, height = right - left, bottom - top
    tail = " ".join(f"{x} {y}" for x, y in TAIL)
    dots = "".join(f'<circle cx="{x}" cy="{y}" r="{DOT_RADIUS}" fill="{BLUE}"/>' for x, y in DOTS)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {SIZE} {SIZE}">'
        f'<rect width="{SIZE}" height="{SIZE}" rx="{CORNER}" fill="{BLUE}"/>'
        f'<rect x="{left}" y="{top}" width="{width}" height="{height}" rx="{BUBBLE_CORNER}" fill="{WHITE}"/>'
        f'<polygon points="{tail}" fill="{WHITE}"/>{dots}</svg>\n'
    )


def png(pixels: int, maskable: bool) -> Image.Image:
    scale = 4 * pixels / SIZE  # drawn four times larger, then scaled down: smooth edges

    def at(*values: float) -> list[float]:
        return [value * scale for value in values]

    image = Image.new("RGBA", (4 * pixels, 4 * pixels), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    draw.rounded_rectangle(at(0, 0, SIZE, SIZE), radius=0 if maskable else CORNER * scale, fill=BLUE)
    draw.rounded_rectangle(at(*BUBBLE), radius=BUBBLE_CORNER * scale, fill=WHITE)
    draw.polygon([tuple(at(x, y)) for x, y in TAIL], fill=WHITE)
    for x, y in DOTS:
        draw.ellipse(at(x - DOT_RADIUS, y - DOT_RADIUS, x + DOT_RADIUS, y + DOT_RADIUS), fill=BLUE)
    return image.resize((pixels, pixels), Image.Resampling.LANCZOS)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    (OUT / "icon.svg").write_text(svg())
    png(192, maskable=False).save(OUT / "icon-192.png", optimize=True)
    png(512, maskable=False).save(OUT / "icon-512.png", optimize=True)
    png(512, maskable=True).save(OUT / "icon-maskable-512.png", optimize=True)
    print(f"icons written to {OUT}")


if __name__ == "__main__":
    main()
