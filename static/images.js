// Images for the next message: attached like documents (the button, a drop, a paste), shown as thumbnails
// above the message box, each with ✕, and sent with the message (`message.images`, docs/protocol.md). The
// server keeps the ones waiting (a reload shows them again), and refuses them for a model that cannot see
// images; the tray says so as soon as it knows the model is one.
import { element } from "./dom.js";
import { conversationRequest, reason, uploadEach } from "./uploads.js";

/** Whether a file goes to the images (any image: the server says which kinds it takes) or the documents. */
export function isImage(file) {
  return file.type.startsWith("image/");
}

/** Where an image of a conversation is served (to its owner only). */
export function imageUrl(conversationId, id) {
  return `/api/conversations/${encodeURIComponent(conversationId)}/images/${encodeURIComponent(id)}`;
}

/** A thumbnail of an image, as text-safe as the rest of the page: its name only ever as an attribute. */
export function thumbnail(conversationId, image, className) {
  const img = element("img", className);
  img.src = imageUrl(conversationId, image.id);
  img.alt = image.name ?? "image";
  img.title = `${image.name} · ${image.width}×${image.height} · ${(image.size / 1000).toFixed(1)} kB`;
  img.width = image.width;
  img.height = image.height;
  img.loading = "lazy";
  return img;
}

export class ImageTray {
  /**
   * @param {HTMLElement} list   where the waiting images are shown
   * @param {HTMLElement} note   where the tray says the model cannot see them
   * @param {(text: string) => void} onError  a refused upload or removal, said as a message
   * @param {() => void} onSignedOut  the server answered 401
   */
  constructor(list, note, onError, onSignedOut) {
    this.list = list;
    this.note = note;
    this.onError = onError;
    this.onSignedOut = onSignedOut;
    this.conversationId = null;
    this.items = []; // the images waiting, oldest first
    this.blindModel = null; // the conversation's model, when it is known not to see images
    list.addEventListener("click", (event) => {
      const button = event.target.closest("button.remove-image");
      if (button) this.remove(button.closest("li").dataset.id);
    });
  }

  /** Show the images waiting in the conversation a `ready` opened. */
  async open(conversationId) {
    this.conversationId = conversationId;
    this.items = [];
    this.draw();
    const response = await this.request("GET", "").catch(() => null);
    if (!response?.ok || this.conversationId !== conversationId) return;
    this.items = (await response.json()).images;
    this.draw();
  }

  /** The ids the next message names. */
  ids() {
    return this.items.map((image) => image.id);
  }

  /** A `turn_start` carried these images: they are its message's now, not the next one's. */
  sent(images) {
    const gone = new Set(images.map((image) => image.id));
    if (!this.items.some((image) => gone.has(image.id))) return;
    this.items = this.items.filter((image) => !gone.has(image.id));
    this.draw();
  }

  /** Say on the tray that `model` cannot see images (null: it can, or it is not known). */
  setBlindModel(model) {
    this.blindModel = model;
    this.draw();
  }

  /** Upload images one after the other; each refusal is said as a message, the others go on. */
  async attach(files) {
    if (!this.conversationId || files.length === 0) return;
    await uploadEach(files, (body) => this.request("POST", "", body), (image) => {
      this.items.push(image);
      this.draw();
    }, this.onError);
  }

  async remove(id) {
    const response = await this.request("DELETE", `/${encodeURIComponent(id)}`).catch((error) => ({ ok: false, error }));
    if (response.ok || response.status === 404) { // 404: sent or removed meanwhile (another tab)
      this.items = this.items.filter((image) => image.id !== id);
      this.draw();
    } else {
      this.onError(await reason(response, "The image could not be removed"));
    }
  }

  request(method, path, body) {
    return conversationRequest(this.conversationId, "images", this.onSignedOut, method, path, body);
  }

  draw() {
    this.list.replaceChildren(...this.items.map((image) => {
      const item = element("li", "tray-image");
      item.dataset.id = image.id;
      const remove = element("button", "remove-image icon", "✕");
      remove.type = "button";
      remove.setAttribute("aria-label", `Remove “${image.name}”`);
      item.append(thumbnail(this.conversationId, image, "tray-thumbnail"), remove);
      return item;
    }));
    this.list.hidden = this.items.length === 0;
    const blind = this.items.length > 0 && this.blindModel;
    this.note.hidden = !blind;
    this.note.textContent = blind
      ? `“${this.blindModel}” cannot see images: a message with them will not be sent. Pick a model that can ` +
        "see images, or remove them (✕) to send the text alone."
      : "";
  }
}
