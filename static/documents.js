// The conversation's documents: attach (button, drag-and-drop, paste), see each one's state (a progress
// bar while it is indexed, ready, failed with why), remove. The server tells every tab of a change with
// a `document` frame (docs/protocol.md); the list is read again on each `ready`.
import { counted, element } from "./dom.js";
import { conversationRequest, reason, uploadEach } from "./uploads.js";

export class Documents {
  /**
   * @param {HTMLElement} list       where the documents are shown
   * @param {(text: string) => void} onError  a refused upload or removal, said as a message
   * @param {() => void} onSignedOut  the server answered 401
   */
  constructor(list, onError, onSignedOut) {
    this.list = list;
    this.onError = onError;
    this.onSignedOut = onSignedOut;
    this.conversationId = null;
    this.items = new Map(); // document id -> its state, as the server last said it
    list.addEventListener("click", (event) => {
      const button = event.target.closest("button.remove-document");
      if (button) this.remove(button.closest("li").dataset.id);
    });
  }

  /** Show the documents of the conversation a `ready` opened. */
  async open(conversationId) {
    this.conversationId = conversationId;
    this.items.clear();
    this.draw();
    const response = await this.request("GET", "").catch(() => null);
    if (!response?.ok || this.conversationId !== conversationId) return;
    const { documents } = await response.json();
    for (const document of documents) this.items.set(document.id, document);
    this.draw();
  }

  /** A `document` frame: one document's new state, or its removal. */
  update(frame) {
    if (frame.conversation_id !== this.conversationId) return;
    const state = frame.document;
    if (state.status === "removed") this.items.delete(state.id);
    else this.items.set(state.id, { ...this.items.get(state.id), ...state });
    this.draw();
  }

  /** Upload files one after the other; each refusal is said as a message, the others go on. */
  async attach(files) {
    if (!this.conversationId || files.length === 0) return;
    await uploadEach(files, (body) => this.request("POST", "", body), (document) => {
      this.items.set(document.id, { ...document, ...this.items.get(document.id) });
      this.draw();
    }, this.onError);
  }

  async remove(id) {
    const response = await this.request("DELETE", `/${encodeURIComponent(id)}`).catch((error) => ({ ok: false, error }));
    if (!response.ok && response.status !== 404) this.onError(await reason(response, "The document could not be removed"));
  }

  request(method, path, body) {
    return conversationRequest(this.conversationId, "documents", this.onSignedOut, method, path, body);
  }

  draw() {
    const items = [...this.items.values()]; // oldest first, as the server lists them
    this.list.replaceChildren(...items.map(drawn));
    this.list.hidden = items.length === 0;
  }
}

function drawn(document) {
  const item = element("li", `document ${document.status}`);
  item.dataset.id = document.id;
  item.dataset.status = document.status;
  const name = element("span", "document-name", document.name ?? "");
  name.title = `${document.name} · ${(document.size / 1000).toFixed(1)} kB`;
  const state = element("span", "document-state");
  if (document.status === "indexing") {
    const bar = element("progress");
    bar.max = 1;
    bar.value = document.progress ?? 0;
    bar.setAttribute("aria-label", `Indexing ${document.name}`);
    state.append(bar);
  } else if (document.status === "failed") {
    state.textContent = `failed: ${document.error ?? "unknown reason"}`;
  } else {
    state.textContent = `ready · ${counted(document.chunks, "passage")}`;
  }
  const remove = element("button", "remove-document icon", "✕");
  remove.type = "button";
  remove.setAttribute("aria-label", `Remove “${document.name}”`);
  item.append(name, state, remove);
  return item;
}
