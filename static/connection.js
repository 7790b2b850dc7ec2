// The page's one WebSocket: reconnects by itself with growing delays (1 s doubling to 30 s) and
// says `hello` again on every open, so the server resumes the conversation where it was.
// At most one socket is ever open or connecting: each new one closes the one before, and the events
// of a socket that was replaced are ignored (the server would otherwise keep feeding a second copy).

const FIRST_DELAY_MS = 1000;
const LONGEST_DELAY_MS = 30000;
const SIGNED_OUT = 4401; // no session (or it was revoked): reconnecting would only be refused again

export class Connection {
  /**
   * @param {(frame: object) => void} onFrame  every frame from the server
   * @param {() => object} helloFrame          the `hello` to send on each open
   * @param {(state: object) => void} onState  {connected, attempt, retryInMs}
   * @param {() => void} onSignedOut            the server closed with 4401: sign in first
   */
  constructor(onFrame, helloFrame, onState, onSignedOut) {
    this.onFrame = onFrame;
    this.helloFrame = helloFrame;
    this.onState = onState;
    this.onSignedOut = onSignedOut;
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

  /** Open a new socket in place of any other, open or still connecting. */
  open() {
    this.stopWaiting();
    this.socket?.close();
    const socket = new WebSocket(this.url);
    this.socket = socket;
    const current = () => socket === this.socket;
    socket.addEventListener("open", () => {
      if (current()) this.send(this.helloFrame());
    });
    socket.addEventListener("message", (event) => {
      if (current() && event.data) this.onFrame(JSON.parse(event.data));
    });
    socket.addEventListener("close", (event) => {
      if (current()) this.closed(event.code);
    });
    if (this.attempt > 0) this.tell(0); // the banner says a try is under way, not a stale countdown
  }

  /**
   * The current socket closed: the server closed it, with a code that says why, or the network or the
   * server went away. Every code the server sends (docs/protocol.md) means "come back": 1009 (a frame
   * far too large), 1011 (a failure outside a turn), 1012 (a restart) and 1013 (this page fell too far
   * behind a stream; the `hello` on the next socket resumes the reply, as after any drop). A code
   * that calls for something else gets its own line here, before the reconnect: 4401, not signed in.
   */
  closed(code) {
    this.socket = null;
    if (code === SIGNED_OUT) {
      this.onSignedOut();
      return;
    }
    this.scheduleReconnect();
  }

  /** Called once the server answered `ready`: the connection is fully back. */
  confirmed() {
    this.attempt = 0;
    this.onState({ connected: true });
  }

  scheduleReconnect() {
    const delay = Math.min(FIRST_DELAY_MS * 2 ** this.attempt, LONGEST_DELAY_MS);
    this.attempt += 1;
    const due = Date.now() + delay;
    const tell = () => this.tell(Math.max(due - Date.now(), 0));
    tell();
    this.countdown = setInterval(tell, 1000);
    this.timer = setTimeout(() => this.open(), delay);
  }

  tell(retryInMs) {
    this.onState({ connected: false, attempt: this.attempt, retryInMs });
  }

  stopWaiting() {
    clearTimeout(this.timer);
    clearInterval(this.countdown);
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
