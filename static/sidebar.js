// The sidebar's list of conversations, newest first, in groups by when each last changed (Today, Yesterday,
// Last 7 days, Last 30 days, then by month), as ChatGPT groups them. A row is its title, whole, and a ⋯
// button (shown on hover or focus, and always on a touch screen) whose menu renames or deletes it. With no
// conversation yet, a line says where they will be.
import { element } from "./dom.js";
import { MenuButton } from "./menu.js";

const DAY_MS = 86_400_000;

/** The group of a conversation that last changed at `seconds` (since the epoch), seen at `now`. */
export function dateGroup(seconds, now = new Date()) {
  const then = new Date(seconds * 1000);
  const midnight = (date) => new Date(date.getFullYear(), date.getMonth(), date.getDate());
  const days = Math.round((midnight(now) - midnight(then)) / DAY_MS); // rounded: a day of a clock change is 23 or 25 h
  if (days <= 0) return "Today";
  if (days === 1) return "Yesterday";
  if (days < 7) return "Last 7 days";
  if (days < 30) return "Last 30 days";
  return then.toLocaleDateString("en", { month: "long", year: "numeric" });
}

export class ConversationList {
  /**
   * @param {{api: Function, open: (id: string) => void, current: () => string | null,
   *          onError: (text: string) => void}} actions  api(method, path, body) is the page's JSON request
   */
  constructor(actions) {
    this.actions = actions;
    this.list = document.getElementById("conversation-list");
    this.empty = document.getElementById("no-conversations");
    this.menu = new MenuButton(null, document.getElementById("conversation-menu"));
    this.deleteDialog = document.getElementById("delete-dialog");
    this.list.addEventListener("click", (event) => {
      const open = event.target.closest("button.open");
      if (open) actions.open(open.closest("li").dataset.id);
    });
    this.menu.menu.addEventListener("click", (event) => {
      const action = event.target.closest("[data-action]")?.dataset.action;
      const row = this.menu.button?.closest("li");
      if (action === "rename" && row) this.rename(row);
      if (action === "delete" && row) this.confirmDelete(row);
    });
    // The menu floats by its button: it closes when the list moves under it.
    this.list.closest("nav").addEventListener("scroll", () => this.menu.close(false), { passive: true });
  }

  async refresh() {
    let conversations;
    try {
      ({ conversations } = await this.actions.api("GET", "/api/conversations"));
    } catch {
      return; // the banner already says the server is unreachable
    }
    const groups = [];
    const now = new Date();
    for (const conversation of conversations) {
      const name = dateGroup(conversation.updated_at, now);
      if (groups.at(-1)?.name !== name) groups.push({ name, rows: [] });
      groups.at(-1).rows.push(this.row(conversation));
    }
    this.list.replaceChildren(...groups.flatMap(({ name, rows }, index) => {
      const heading = element("h2", "group-heading", name);
      heading.id = `conversation-group-${index}`;
      const list = element("ul");
      list.setAttribute("aria-labelledby", heading.id);
      list.append(...rows);
      return [heading, list];
    }));
    this.empty.hidden = conversations.length > 0;
    // A menu open on a row drawn again stays open, on the row's new ⋯; on a row gone, it closes.
    if (this.menu.isOpen) {
      const id = this.menu.button.closest("li")?.dataset.id;
      const again = this.list.querySelector(`li[data-id="${CSS.escape(id ?? "")}"] .row-menu`);
      if (again) this.menu.follow(again);
      else this.menu.close(false);
    }
  }

  row(conversation) {
    const title = conversation.title || "New chat";
    const item = element("li");
    item.dataset.id = conversation.id;
    const open = element("button", "open", title);
    open.type = "button";
    open.title = title;
    if (conversation.id === this.actions.current()) open.setAttribute("aria-current", "page");
    const more = element("button", "row-menu", "⋯");
    more.type = "button";
    more.setAttribute("aria-label", `Actions for “${title}”`);
    more.setAttribute("aria-haspopup", "menu");
    more.setAttribute("aria-expanded", "false");
    more.setAttribute("aria-controls", "conversation-menu");
    this.menu.wire(more);
    item.append(open, more);
    return item;
  }

  rename(item) {
    const open = item.querySelector(".open");
    const input = element("input", "rename-input");
    input.value = open.textContent;
    input.setAttribute("aria-label", "New title");
    open.replaceWith(input);
    input.select();
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      const title = input.value.trim();
      if (save && title) {
        await this.actions.api("PATCH", `/api/conversations/${item.dataset.id}`, { title })
          .catch((error) => this.actions.onError(error.message));
      }
      this.refresh();
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") finish(true);
      if (event.key === "Escape") finish(false);
    });
    input.addEventListener("blur", () => finish(true));
  }

  confirmDelete(item) {
    const dialog = this.deleteDialog;
    document.getElementById("delete-title").textContent = item.querySelector(".open")?.textContent || "New chat";
    dialog.returnValue = "";
    dialog.showModal();
    dialog.addEventListener("close", async () => {
      if (dialog.returnValue !== "delete") return;
      // The server tells this page with a `deleted` frame if it was showing that conversation.
      await this.actions.api("DELETE", `/api/conversations/${item.dataset.id}`)
        .catch((error) => this.actions.onError(error.message));
      this.refresh();
    }, { once: true });
  }
}
