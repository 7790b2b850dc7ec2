// The page's keyboard shortcuts, and the dialog that lists them (`?`). None takes a key the browser
// needs: new chat is Ctrl+Shift+O (Cmd on a Mac) as in ChatGPT, Escape stops a reply only while one
// streams, `?` opens the list only outside a text field. Ctrl+K (search) belongs to search.js: listed
// here, bound there.
import { element } from "./dom.js";

const MAC = /Mac|iPhone|iPad/.test(navigator.platform);
const MOD = MAC ? "⌘" : "Ctrl";

/** What the dialog lists, in its order: [keys, what they do]. */
const LIST = [
  [[MOD, "Shift", "O"], "New chat"],
  [[MOD, "K"], "Search conversations"],
  [["Esc"], "Stop the reply"],
  [["Shift", "Esc"], "Focus the message box"],
  [["Enter"], "Send the message"],
  [["Shift", "Enter"], "New line in the message"],
  [["?"], "Show these shortcuts"],
];

function typing(target) {
  return target instanceof Element && target.closest("input, textarea, select, [contenteditable]:not([contenteditable=false])");
}

export class Shortcuts {
  /**
   * @param {HTMLDialogElement} dialog  lists the shortcuts
   * @param {{newChat: () => void, stop: () => boolean, focusInput: () => void}} actions  stop: false when
   *   nothing streams (then Escape does nothing)
   */
  constructor(dialog, actions) {
    this.dialog = dialog;
    dialog.querySelector(".shortcuts").replaceChildren(...LIST.flatMap(([keys, does]) => {
      const term = element("dt");
      keys.forEach((key, index) => term.append(...(index ? [" + "] : []), element("kbd", "", key)));
      return [term, element("dd", "", does)];
    }));
    document.addEventListener("keydown", (event) => {
      if (event.defaultPrevented || document.querySelector("dialog[open]")) return; // a dialog has its own keys
      if (this.handle(event, actions)) event.preventDefault();
    });
  }

  open() {
    this.dialog.showModal();
  }

  handle(event, actions) {
    const mod = event.ctrlKey || event.metaKey;
    if (mod && event.shiftKey && !event.altKey && event.key.toLowerCase() === "o") {
      actions.newChat();
    } else if (event.key === "Escape" && event.shiftKey) {
      actions.focusInput();
    } else if (event.key === "Escape" && !event.target.closest?.(".editor, .rename-input")) {
      return actions.stop(); // an editor's Escape cancels the edit instead
    } else if (event.key === "?" && !mod && !event.altKey && !typing(event.target)) {
      this.open();
    } else {
      return false;
    }
    return true;
  }
}
