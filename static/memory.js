// The Memory dialog: the facts the Memory flow remembers about you (docs/memory.md), each edited in place
// (saved when the field is left, or on Enter) or forgotten; memory turned on or off; Export as JSON; Forget
// all. The facts are the signed-in user's, from /api/memory (docs/protocol.md); every text goes in as text.
import { counted, element } from "./dom.js";
import { reason } from "./uploads.js";

export class MemoryPanel {
  /**
   * @param {HTMLButtonElement} button  opens the dialog
   * @param {HTMLDialogElement} dialog
   * @param {() => void} onSignedOut
   */
  constructor(button, dialog, onSignedOut) {
    this.dialog = dialog;
    this.onSignedOut = onSignedOut;
    this.list = dialog.querySelector(".memory-facts");
    this.on = dialog.querySelector(".memory-on");
    this.note = dialog.querySelector(".memory-note");
    this.forgetAll = dialog.querySelector(".memory-forget-all");
    button.addEventListener("click", () => this.open());
    this.on.addEventListener("change", () => this.switch(this.on.checked));
    this.forgetAll.addEventListener("click", () => this.forgetEverything());
    this.list.addEventListener("click", (event) => {
      const forget = event.target.closest("button[data-id]");
      if (forget) this.forget(forget.dataset.id);
    });
    this.list.addEventListener("change", (event) => {
      if (event.target.matches("input[data-id]")) this.edit(event.target);
    });
    this.list.addEventListener("keydown", (event) => {
      if (event.key !== "Enter" || !event.target.matches("input[data-id]")) return;
      event.preventDefault(); // Enter saves the fact; it does not close the dialog
      this.edit(event.target);
    });
  }

  request(method, path = "", body) {
    const init = body === undefined ? { method }
      : { method, body: JSON.stringify(body), headers: { "Content-Type": "application/json" } };
    return fetch(`/api/memory${path}`, init).then((response) => {
      if (response.status === 401) this.onSignedOut();
      return response;
    }).catch((error) => ({ ok: false, error }));
  }

  async open() {
    this.say("");
    this.dialog.showModal();
    await this.refresh();
  }

  /** Draw the facts again, oldest first, each an editable field with a Forget button. */
  async refresh() {
    const response = await this.request("GET");
    if (!response.ok) {
      this.say(await reason(response, "Your memory could not be read"));
      return;
    }
    const { on, facts, most } = await response.json();
    this.on.checked = on;
    this.forgetAll.disabled = facts.length === 0;
    this.list.replaceChildren(...facts.map((fact) => {
      const item = element("li", "memory-fact");
      const text = element("input", "memory-text");
      Object.assign(text, { value: fact.text, maxLength: 300, required: true });
      text.dataset.id = fact.id;
      text.dataset.saved = fact.text;
      text.setAttribute("aria-label", "Fact");
      const forget = element("button", "", "Forget");
      forget.type = "button";
      forget.dataset.id = fact.id;
      forget.setAttribute("aria-label", `Forget “${fact.text}”`);
      item.append(text, forget);
      return item;
    }));
    if (!facts.length) this.list.append(element("li", "note", "Nothing remembered yet."));
    else if (facts.length >= most) this.say(`Memory is full (${counted(most, "fact")}): forget some to keep new ones.`);
  }

  async edit(input) {
    const text = input.value.trim();
    if (text === input.dataset.saved) return;
    if (!text) {
      input.value = input.dataset.saved;
      this.say("A fact cannot be empty: Forget removes it.");
      return;
    }
    const before = input.dataset.saved;
    input.dataset.saved = text; // Enter, then leaving the field, saves it once
    const response = await this.request("PATCH", `/${encodeURIComponent(input.dataset.id)}`, { text });
    if (!response.ok) {
      input.dataset.saved = before;
      this.say(await reason(response, "The fact was not changed"));
      return;
    }
    const saved = await response.json();
    input.value = input.dataset.saved = saved.text;
    this.say("Saved.");
  }

  async forget(id) {
    const response = await this.request("DELETE", `/${encodeURIComponent(id)}`);
    if (!response.ok && response.status !== 404) this.say(await reason(response, "The fact was not forgotten"));
    await this.refresh();
  }

  async forgetEverything() {
    if (!confirm("Forget every fact remembered about you? This cannot be undone.")) return;
    const response = await this.request("DELETE");
    if (!response.ok) this.say(await reason(response, "Nothing was forgotten"));
    await this.refresh();
  }

  async switch(on) {
    const response = await this.request("PATCH", "", { on });
    if (!response.ok) {
      this.on.checked = !on;
      this.say(await reason(response, `Memory was not turned ${on ? "on" : "off"}`));
      return;
    }
    this.say(on ? "Memory is on." : "Memory is off: nothing is used or remembered until it is on again.");
  }

  say(text) {
    this.note.textContent = text;
    this.note.hidden = !text;
  }
}
