// A menu button, as the WAI-ARIA Authoring Practices describe it: the button says whether its menu is open
// (aria-expanded); opening moves focus to an item, the arrow keys, Home, End and a first letter move
// between items, Escape closes and gives focus back to the button, Tab or a click elsewhere closes.
// Its items are whatever `[role=menuitem]` the menu holds when it opens: a feature adds one in the markup.
// One menu may serve many buttons (each row of the sidebar has a ⋯): it then floats by the one that opened it.

export class MenuButton {
  /**
   * @param {HTMLButtonElement|null} button  aria-haspopup="menu", aria-controls the menu; null for a menu that
   *   several buttons share, each given with `wire(button)`
   * @param {HTMLElement} menu  role="menu", hidden while closed
   */
  constructor(button, menu) {
    this.button = button;
    this.menu = menu;
    this.floating = button === null;
    if (button) this.wire(button);
    menu.addEventListener("keydown", (event) => this.onKey(event));
    // Before the item's own handler runs: focus is back on the button when a dialog it opens takes it,
    // so that closing that dialog gives focus back to the button, not to a hidden item.
    menu.addEventListener("click", (event) => {
      if (event.target.closest("[role=menuitem]")) this.close(true);
    }, { capture: true });
    menu.addEventListener("focusout", (event) => {
      if (this.isOpen && !menu.contains(event.relatedTarget) && event.relatedTarget !== this.button) this.close(false);
    });
    document.addEventListener("pointerdown", (event) => {
      if (this.isOpen && !menu.contains(event.target) && !this.button.contains(event.target)) this.close(false);
    });
    if (this.floating) return;
    // An item that needs attention (the Tools item while a server fails) marks the button too.
    new MutationObserver(() => this.mark()).observe(menu, { attributes: true, attributeFilter: ["class", "title"], subtree: true });
    this.mark();
  }

  /** Let `button` open the menu: a click, or an arrow key. */
  wire(button) {
    button.addEventListener("click", () => (this.isOpen && this.button === button ? this.close(true) : this.open(0, button)));
    button.addEventListener("keydown", (event) => {
      if (event.key === "ArrowDown" || event.key === "ArrowUp") {
        event.preventDefault();
        this.open(event.key === "ArrowDown" ? 0 : -1, button);
      }
    });
  }

  get isOpen() {
    return !this.menu.hidden;
  }

  get items() {
    return [...this.menu.querySelectorAll("[role=menuitem]")].filter((item) => !item.closest("li[hidden]"));
  }

  /** Open the menu from `button` with focus on the item at `index` (-1: the last). */
  open(index, button = this.button) {
    if (this.isOpen && button !== this.button) this.close(false);
    this.menu.hidden = false;
    this.follow(button);
    this.items.at(index)?.focus();
  }

  /** The menu now belongs to `button`: the one that opened it, or the same row's drawn again meanwhile. */
  follow(button) {
    this.button = button;
    button.setAttribute("aria-expanded", "true");
    if (!this.floating) return;
    this.menu.setAttribute("aria-label", button.getAttribute("aria-label"));
    // Below the button, or above it when there is no room below; always on screen.
    const anchor = button.getBoundingClientRect();
    const { offsetWidth: width, offsetHeight: height } = this.menu;
    const top = anchor.bottom + 4 + height <= innerHeight ? anchor.bottom + 4 : anchor.top - 4 - height;
    this.menu.style.top = `${Math.max(4, top)}px`;
    this.menu.style.left = `${Math.max(4, Math.min(anchor.right - width, innerWidth - width - 4))}px`;
  }

  close(focusButton) {
    if (!this.isOpen) return;
    this.menu.hidden = true;
    this.button.setAttribute("aria-expanded", "false");
    if (focusButton) this.button.focus();
  }

  onKey(event) {
    const items = this.items;
    const current = items.indexOf(document.activeElement);
    const move = { ArrowDown: current + 1, ArrowUp: current - 1, Home: 0, End: items.length - 1 }[event.key];
    if (move !== undefined) {
      items.at(move % items.length)?.focus();
    } else if (event.key === "Escape") {
      this.close(true);
    } else if (event.key === "Tab") {
      this.close(true); // and Tab goes on from the button, to the next control or the one before
      return;
    } else if (event.key === " " && document.activeElement.tagName === "A") {
      document.activeElement.click(); // Space activates every item, the links too
    } else if (event.key.length === 1 && !event.ctrlKey && !event.metaKey && !event.altKey) {
      const letter = event.key.toLowerCase();
      const after = [...items.slice(current + 1), ...items.slice(0, current + 1)];
      after.find((item) => item.textContent.trim().toLowerCase().startsWith(letter))?.focus();
    } else {
      return;
    }
    event.preventDefault();
    event.stopPropagation(); // Escape here closes the menu, and stops no reply
  }

  mark() {
    const warning = this.menu.querySelector("[role=menuitem].warning");
    this.button.classList.toggle("warning", Boolean(warning));
    this.button.title = warning ? warning.title : "More actions";
  }
}
