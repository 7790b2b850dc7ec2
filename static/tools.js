// The tools a conversation lets the model call: the built-in ones and each of the operator's MCP servers,
// turned on or off for this conversation (PATCH tools_off, kept with it), with the servers that fail and
// why. The list is GET /api/tools (docs/protocol.md); the server names nothing secret in it.
import { element } from "./dom.js";

const LABELS = { builtin: "Built-in tools" };
const NEEDS_PROVIDER = "Tools need a provider that supports them (OpenAI tool calls): the embedded model " +
  "answers without tools. Pick another model, or set POCKETCHAT_BASE_URL.";

export class ToolsPanel {
  /**
   * @param {HTMLButtonElement} button  opens the dialog; marked when a server fails
   * @param {HTMLDialogElement} dialog
   * @param {(tools_off: string[]) => void} onChange  a source was turned on or off
   */
  constructor(button, dialog, onChange) {
    this.button = button;
    this.dialog = dialog;
    this.list = dialog.querySelector(".tool-sources");
    this.note = dialog.querySelector(".tools-note");
    this.onChange = onChange;
    this.sources = [];
    this.enabled = true;
    this.maxTools = Infinity; // offered to the model in one turn, at most (--max-tools)
    this.off = [];
    this.embedded = false; // the conversation's model is the embedded one: no tools are offered to it
    button.addEventListener("click", () => this.open());
    this.list.addEventListener("change", () => {
      const boxes = [...this.list.querySelectorAll("input[type=checkbox]")];
      this.onChange(boxes.filter((box) => !box.checked).map((box) => box.value));
    });
  }

  /** Read the list of sources again (their state changes: a server fails, or comes back). */
  async refresh() {
    try {
      const response = await fetch("/api/tools");
      if (!response.ok) return;
      ({ sources: this.sources, enabled: this.enabled, max_tools: this.maxTools } = await response.json());
    } catch {
      return; // offline: the banner says so
    }
    this.mark();
    if (this.dialog.open) this.draw();
  }

  /** The button says what is wrong, if anything, before it is opened. */
  mark() {
    const failed = this.sources.filter((s) => s.status === "failed").map((s) => s.name);
    this.button.classList.toggle("warning", failed.length > 0);
    this.button.title = failed.length ? `Tool servers failing: ${failed.join(", ")}`
      : this.embedded ? NEEDS_PROVIDER : "The tools the model may call";
  }

  /** The conversation shown changed (`ready`, `conversation`): its sources turned off, whether its model takes tools. */
  show(toolsOff, embedded) {
    this.off = toolsOff ?? [];
    this.embedded = embedded;
    this.mark();
    if (this.dialog.open) this.draw();
  }

  async open() {
    this.draw();
    this.dialog.showModal();
    await this.refresh();
  }

  draw() {
    this.note.textContent = !this.enabled ? "Tools are turned off on this server (--max-tool-steps 0)."
      : this.embedded ? NEEDS_PROVIDER : this.leftOut();
    this.note.hidden = !this.note.textContent;
    this.list.replaceChildren(...this.sources.map((source) => {
      const item = element("li", `tool-source ${source.status}`);
      item.dataset.source = source.name;
      const label = element("label");
      const box = element("input");
      box.type = "checkbox";
      box.value = source.name;
      box.checked = !this.off.includes(source.name);
      label.append(box, ` ${LABELS[source.name] ?? source.name}`);
      const state = source.status === "failed" ? `failed: ${source.error ?? "unknown error"}`
        : source.status === "starting" ? "starting…"
        : source.listed ? `offers ${count(source.listed)} tools; the first ${count(source.tools.length)} are used`
        : `${source.tools.length} tools`;
      item.append(label, element("span", `note${source.status === "failed" ? " warning" : ""}`, ` · ${state}`));
      if (source.tools.length) {
        item.append(element("p", "note tool-names", source.tools.map((tool) => tool.name).join(", ")));
      }
      return item;
    }));
  }

  /** What the model is not offered of the sources on, past --max-tools (the server's order: the last ones). */
  leftOut() {
    const on = this.sources.filter((s) => s.status === "ok" && !this.off.includes(s.name));
    const total = on.reduce((sum, s) => sum + s.tools.length, 0);
    return total > this.maxTools ? `The model is offered ${count(this.maxTools)} tools at most (--max-tools): ` +
      `of the ${count(total)} of the sources on, the last ${count(total - this.maxTools)} are left out.` : "";
  }
}

function count(number) {
  return number.toLocaleString("en");
}
