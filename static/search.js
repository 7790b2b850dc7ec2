// Search: a box in the sidebar (its results take the conversation list's place while a query is typed)
// and a palette (Ctrl+K or Cmd+K, or the `pocketchat:search` event), both over GET /api/search. A hit's
// title and snippet are plain text with the ranges of the matching words: drawn as text nodes and
// <mark> elements, never as markup.
import { counted, element } from "./dom.js";
import { reason } from "./uploads.js";

const DEBOUNCE_MS = 150;
const LIMIT = 20;

/** `text` with the [start, end) code-point ranges wrapped in <mark>, as DOM nodes. */
export function highlight(text, ranges) {
  const characters = Array.from(text ?? "");
  const nodes = [];
  let at = 0;
  for (const [start, end] of ranges ?? []) {
    if (start < at || end <= start || end > characters.length) continue; // not a range of this text
    if (start > at) nodes.push(document.createTextNode(characters.slice(at, start).join("")));
    nodes.push(element("mark", "", characters.slice(start, end).join("")));
    at = end;
  }
  if (at < characters.length) nodes.push(document.createTextNode(characters.slice(at).join("")));
  return nodes;
}

/** A hit's title and snippet, for a result row. */
function hitContent(hit) {
  const title = element("span", "hit-title");
  title.append(...(hit.title ? highlight(hit.title, hit.title_highlights) : [document.createTextNode("New chat")]));
  const parts = [title];
  if (hit.snippet) {
    const snippet = element("span", "hit-snippet");
    if (hit.role === "user") snippet.append(element("span", "hit-role", "You: "));
    snippet.append(...highlight(hit.snippet, hit.highlights));
    parts.push(snippet);
  }
  return parts;
}

/** Queries typed into `input`, answered after a pause, a newer one winning over an older one still out. */
class Searcher {
  constructor(input, show, signIn) {
    this.input = input;
    this.show = show; // given the results: null for an empty query, a string for an error
    this.signIn = signIn;
    this.timer = null;
    this.pending = null;
    input.addEventListener("input", () => this.schedule());
  }

  schedule() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.run(), DEBOUNCE_MS);
  }

  clear() {
    clearTimeout(this.timer);
    this.pending?.abort();
    this.input.value = "";
    this.show(null);
  }

  async run() {
    const query = this.input.value;
    this.pending?.abort();
    if (!query.trim()) {
      this.show(null);
      return;
    }
    const pending = this.pending = new AbortController();
    try {
      const params = new URLSearchParams({ q: query.slice(0, 500), limit: String(LIMIT) });
      const response = await fetch(`/api/search?${params}`, { signal: pending.signal });
      if (response.status === 401) this.signIn();
      if (!response.ok) throw new Error(await reason(response, "Search failed")); // 429: the limit, said
      const { results } = await response.json();
      if (pending === this.pending) this.show(results);
    } catch (error) {
      if (error.name !== "AbortError" && pending === this.pending) this.show(error.message);
    }
  }
}

function statusText(results, query) {
  if (typeof results === "string") return results;
  if (results.length === 0) return `No conversations match “${query.trim()}”.`;
  return `${counted(results.length, "conversation")} found.`;
}

/** The sidebar's box: while it holds a query, its results replace the conversation list. */
class SidebarSearch {
  constructor(open, signIn) {
    this.input = document.getElementById("search-box");
    this.list = document.getElementById("search-results");
    this.status = document.getElementById("search-status");
    this.conversations = document.getElementById("conversation-list").closest("nav");
    this.searcher = new Searcher(this.input, (results) => this.show(results), signIn);
    this.input.addEventListener("keydown", (event) => {
      if (event.key !== "Escape") return;
      event.preventDefault();
      event.stopPropagation(); // Escape here clears the box; it does not stop a streaming reply
      this.searcher.clear();
    });
    this.list.addEventListener("click", (event) => {
      const button = event.target.closest("button.hit");
      if (button) open(button.dataset.conversation, button.dataset.message || null);
    });
  }

  show(results) {
    const searching = results !== null;
    this.conversations.hidden = searching;
    this.list.hidden = !searching;
    this.status.textContent = searching ? statusText(results, this.input.value) : "";
    // The count is for screen readers; that nothing matched, or the search failed, is for everyone to see.
    this.status.classList.toggle("visually-hidden", !searching || (Array.isArray(results) && results.length > 0));
    this.list.replaceChildren(...(Array.isArray(results) ? results : []).map((hit) => {
      const button = element("button", "hit");
      button.type = "button";
      button.dataset.conversation = hit.conversation_id;
      if (hit.message_id) button.dataset.message = hit.message_id;
      button.append(...hitContent(hit));
      const item = element("li");
      item.append(button);
      return item;
    }));
  }
}

/** The palette: a dialog with a combobox and a listbox of hits; arrows move, Enter opens, Escape closes,
 *  and focus goes back where it was. */
class Palette {
  constructor(open, signIn) {
    this.open = open;
    this.dialog = document.getElementById("search-dialog");
    this.input = document.getElementById("palette-input");
    this.list = document.getElementById("palette-results");
    this.status = document.getElementById("palette-status");
    this.results = [];
    this.active = -1;
    this.returnTo = null;
    this.searcher = new Searcher(this.input, (results) => this.draw(results), signIn);
    this.input.addEventListener("keydown", (event) => this.key(event));
    this.list.addEventListener("click", (event) => {
      const option = event.target.closest("[role=option]");
      if (option) this.choose(Number(option.dataset.index));
    });
    this.dialog.addEventListener("close", () => {
      if (this.returnTo?.isConnected) this.returnTo.focus();
      this.returnTo = null;
    });
  }

  present() {
    if (this.dialog.open) {
      this.input.focus();
      return;
    }
    this.returnTo = document.activeElement;
    this.searcher.clear();
    this.dialog.showModal();
    this.input.focus();
  }

  key(event) {
    if (event.key === "Escape") {
      event.preventDefault();
      event.stopPropagation(); // closes the palette only: it does not stop a streaming reply
      this.dialog.close();
    } else if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      if (this.results.length) this.select((this.active + (event.key === "ArrowDown" ? 1 : -1) + this.results.length) % this.results.length);
    } else if (event.key === "Enter") {
      event.preventDefault();
      if (this.results.length) this.choose(Math.max(this.active, 0));
    }
  }

  select(index) {
    this.active = index;
    for (const option of this.list.children) {
      const selected = Number(option.dataset.index) === index;
      option.setAttribute("aria-selected", String(selected));
      if (selected) {
        this.input.setAttribute("aria-activedescendant", option.id);
        option.scrollIntoView({ block: "nearest" });
      }
    }
  }

  choose(index) {
    const hit = this.results[index];
    if (!hit) return;
    this.dialog.close();
    this.open(hit.conversation_id, hit.message_id);
  }

  /** Draw the results: null for an empty query, a string for an error. */
  draw(results) {
    this.results = Array.isArray(results) ? results : [];
    this.active = -1;
    this.input.removeAttribute("aria-activedescendant");
    this.status.textContent = results === null ? "Type words to find in your conversations." : statusText(results, this.input.value);
    this.list.replaceChildren(...this.results.map((hit, index) => {
      const option = element("li", "hit");
      option.id = `palette-option-${index}`;
      option.dataset.index = String(index);
      option.setAttribute("role", "option");
      option.setAttribute("aria-selected", "false");
      option.append(...hitContent(hit));
      return option;
    }));
    if (this.results.length) this.select(0);
  }
}

/** Wire the sidebar's box and the palette; `open(conversationId, messageId)` shows a hit. */
export function initSearch(open, signIn) {
  new SidebarSearch(open, signIn);
  const palette = new Palette(open, signIn);
  document.addEventListener("keydown", (event) => {
    if ((event.ctrlKey || event.metaKey) && !event.altKey && event.key.toLowerCase() === "k") {
      event.preventDefault();
      palette.present();
    }
  });
  document.addEventListener("pocketchat:search", () => palette.present());
}
