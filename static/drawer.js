// On a phone-sized screen the sidebar is a drawer over the chat, as in the apps people know: ☰ opens it, and
// a tap on the dimmed chat beside it, a swipe to the left, Escape, or opening a conversation closes it.
// While it is open the chat is inert: neither a finger nor the keyboard reaches it.

const PHONE = matchMedia("(max-width: 720px)");
const SWIPE_PX = 60; // how far left a finger must move to close it

export class Drawer {
  constructor(sidebar, toggle, backdrop, main) {
    Object.assign(this, { sidebar, toggle, backdrop, main });
    toggle.addEventListener("click", () => (this.isOpen ? this.close() : this.open()));
    backdrop.addEventListener("click", () => this.close(true));
    sidebar.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && this.isOpen && !event.defaultPrevented) {
        event.preventDefault();
        this.close(true);
      }
    });
    let start = null;
    sidebar.addEventListener("touchstart", (event) => {
      start = event.touches.length === 1 ? { x: event.touches[0].clientX, y: event.touches[0].clientY } : null;
    }, { passive: true });
    sidebar.addEventListener("touchend", (event) => {
      const end = event.changedTouches[0];
      if (start && start.x - end.clientX > SWIPE_PX && start.x - end.clientX > Math.abs(end.clientY - start.y)) {
        this.close(true);
      }
      start = null;
    }, { passive: true });
    PHONE.addEventListener("change", () => this.close()); // a wider window shows the sidebar beside the chat
  }

  get isOpen() {
    return this.sidebar.classList.contains("open");
  }

  open() {
    this.sidebar.classList.add("open");
    this.toggle.setAttribute("aria-expanded", "true");
    this.backdrop.hidden = false;
    this.main.inert = PHONE.matches;
    // Focus goes into the drawer (the chat behind it is inert): to the conversation shown, or New chat.
    (this.sidebar.querySelector(".open[aria-current]") ?? this.sidebar.querySelector("#new-chat")).focus();
  }

  /** Close it; `focusToggle` when the person closed it (focus then goes back to ☰). */
  close(focusToggle = false) {
    if (!this.isOpen) return;
    this.sidebar.classList.remove("open");
    this.toggle.setAttribute("aria-expanded", "false");
    this.backdrop.hidden = true;
    this.main.inert = false;
    if (focusToggle) this.toggle.focus();
  }
}
