// The message box and its button. Enter sends, Shift+Enter starts a new line. While a reply streams the
// button is Stop, and Enter neither sends nor stops (as in ChatGPT): the message waits in the box, and a
// line under it says so. What is typed leaves the box only once it is on its way (nothing is lost offline).

const WAITING = "Still replying: your message waits here until the reply ends (Esc stops it).";

export class Composer {
  /**
   * @param {{send: (frame: object) => boolean, running: () => {turnId: string} | null,
   *          images: () => string[]}} actions  send: false when the socket is not open; images: those
   *   waiting above the box, to go with the message
   */
  constructor(actions) {
    this.actions = actions;
    this.input = document.getElementById("input");
    this.button = document.getElementById("send");
    this.label = this.button.querySelector(".label");
    this.hint = document.getElementById("composer-hint");
    this.lastSent = null; // the last message sent, put back in the box if the server refuses it
    document.getElementById("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      this.submit();
    });
    this.input.addEventListener("keydown", (event) => {
      if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
      event.preventDefault();
      if (actions.running()) this.hint.textContent = WAITING;
      else this.submit();
    });
    this.input.addEventListener("input", () => this.autosize());
  }

  /** The button: Send, or Stop while a reply streams. */
  submit() {
    const running = this.actions.running();
    if (running) {
      this.actions.send({ type: "stop", turn_id: running.turnId });
      return;
    }
    const content = this.input.value;
    const attached = this.actions.images(); // they stay above the box until the turn starts with them
    if (!content.trim() && attached.length === 0) return;
    if (this.actions.send({ type: "message", content, ...(attached.length ? { images: attached } : {}) })) {
      this.lastSent = content;
      this.put("");
    }
  }

  /** Put `text` in the box (an example prompt, a step's button, a refused message back). */
  put(text) {
    this.input.value = text;
    this.autosize();
  }

  /** The server refused the last message: it goes back in the box, unless something else was typed since. */
  refused() {
    if (this.lastSent && !this.input.value) this.put(this.lastSent);
  }

  setStreaming(streaming) {
    this.label.textContent = streaming ? "Stop" : "Send";
    this.button.classList.toggle("stop", streaming);
    this.button.setAttribute("aria-label", streaming ? "Stop the reply" : "Send message");
    if (!streaming) this.hint.textContent = "";
  }

  setConnected(connected) {
    this.button.disabled = !connected; // what is typed stays in the box until the server is back
  }

  autosize() {
    this.input.style.height = "auto";
    this.input.style.height = `${Math.min(this.input.scrollHeight, window.innerHeight * 0.4)}px`;
  }
}
