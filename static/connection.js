// The page's one WebSocket: reconnects by itself with growing delays (1 s doubling to 30 s) and
// says `hello` again on every open, so the server resumes the conversation where it was.

const FIRST_DELAY_MS = 1000;
const LONGEST_DELAY_MS = 30000;

export class Connection {
  /**
   * @param {(frame: object) => void} onFrame  every frame from the server
   * @param {() => object} helloFrame          the `hello` to send on each open
   * @param {(state: object) => void} onState  {connected, attempt, retryInMs}
   */
  constructor(onFrame, helloFrame, onState) {
    this.onFrame = onFrame;
    this.helloFrame = helloFrame;
    this.onState = onState;
    this.attempt = 0;
    this.socket = null;
    this.timer = null;
    this.countdown = null;
  }

  get url() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}/ws`;
  }

  get connected() {
    return this.socket !== null && this.socket.readyState === WebSocket.OPEN;
  }

  open() {
    clearTimeout(this.timer);
    clearInterval(this.countdown);
    const socket = new WebSocket(this.url);
    this.socket = socket;
    socket.addEventListener("open", () => {
      this.send(this.helloFrame());
    });
    socket.addEventListener("message", (event) => {
      if (event.data && socket === this.socket) this.onFrame(JSON.parse(event.data));
    });
    socket.addEventListener("close", () => {
      if (socket === this.socket) this.scheduleReconnect();
    });
  }

  /** Called once the server answered `ready`: the connection is fully back. */
  confirmed() {
    this.attempt = 0;
    this.onState({ connected: true });
  }

  scheduleReconnect() {
    this.socket = null;
    const delay = Math.min(FIRST_DELAY_MS * 2 ** this.attempt, LONGEST_DELAY_MS);
    this.attempt += 1;
    const due = Date.now() + delay;
    const tell = () => this.onState({ connected: false, attempt: this.attempt, retryInMs: Math.max(due - Date.now(), 0) });
    tell();
    this.countdown = setInterval(tell, 1000);
    this.timer = setTimeout(() => this.open(), delay);
  }

  reconnectNow() {
    if (!this.connected) this.open();
  }

  /** Send a frame; false if the socket is down (the caller keeps what the user wrote). */
  send(frame) {
    if (!this.connected) return false;
    this.socket.send(JSON.stringify(frame));
    return true;
  }
}
