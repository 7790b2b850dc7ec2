// The share dialog: make a read-only link to a snapshot of this conversation as it is now, copy it, see
// the live links with their dates, revoke one (docs/protocol.md: .../shares). A link is shown once, when
// it is made: the server keeps only a hash of its token.
import { element } from "./dom.js";
import { conversationRequest, reason } from "./uploads.js";

export class SharePanel {
  /**
   * @param {HTMLButtonElement} button  opens the dialog
   * @param {HTMLDialogElement} dialog
   * @param {() => string | null} conversationId  the conversation on screen
   * @param {() => void} onSignedOut
   */
  constructor(button, dialog, conversationId, onSignedOut) {
    this.dialog = dialog;
    this.conversationId = conversationId;
    this.onSignedOut = onSignedOut;
    this.made = dialog.querySelector(".share-made");
    this.link = dialog.querySelector(".share-link");
    this.copy = dialog.querySelector(".share-copy");
    this.note = dialog.querySelector(".share-note");
    this.list = dialog.querySelector(".share-list");
    button.addEventListener("click", () => this.open());
    dialog.querySelector(".share-make").addEventListener("click", () => this.make());
    this.copy.addEventListener("click", () => this.copyLink());
    this.list.addEventListener("click", (event) => {
      const revoke = event.target.closest("button[data-id]");
      if (revoke) this.revoke(revoke.dataset.id);
    });
  }

  request(method, path = "") {
    return conversationRequest(this.conversationId(), "shares", this.onSignedOut, method, path)
      .catch((error) => ({ ok: false, error }));
  }

  async open() {
    this.showLink("");
    this.say("");
    this.dialog.showModal();
    await this.refresh();
  }

  /** Draw the live links again, newest last, each with its date and a Revoke button. */
  async refresh() {
    const response = await this.request("GET");
    if (!response.ok) {
      this.say(await reason(response, "The links could not be listed"));
      return;
    }
    const { shares } = await response.json();
    this.list.replaceChildren(...shares.map((share) => {
      const made = new Date(share.created_at * 1000).toLocaleString();
      const item = element("li", "share-item");
      const revoke = element("button", "", "Revoke");
      revoke.type = "button";
      revoke.dataset.id = share.id;
      revoke.setAttribute("aria-label", `Revoke the link made ${made}`);
      item.append(element("span", "", `Made ${made}`), revoke);
      return item;
    }));
    if (!shares.length) this.list.append(element("li", "note", "No links yet."));
  }

  async make() {
    const response = await this.request("POST");
    if (!response.ok) {
      this.say(await reason(response, "No link was made"));
      return;
    }
    const share = await response.json();
    this.say("");
    this.showLink(new URL(share.url, location.origin).href);
    await this.refresh();
  }

  async copyLink() {
    try {
      await navigator.clipboard.writeText(this.link.value);
      this.copy.textContent = "Copied";
    } catch {
      this.link.select(); // the browser refused: selected, for Ctrl+C
      this.copy.textContent = "Copy failed";
    }
    setTimeout(() => { this.copy.textContent = "Copy"; }, 1500);
  }

  async revoke(id) {
    const response = await this.request("DELETE", `/${encodeURIComponent(id)}`);
    if (!response.ok) this.say(await reason(response, "The link was not revoked"));
    await this.refresh();
  }

  showLink(url) {
    this.link.value = url;
    this.made.hidden = !url;
  }

  say(text) {
    this.note.textContent = text;
    this.note.hidden = !text;
  }
}
