// Importing conversations: a file (PocketChat's JSON export, or ChatGPT's conversations.json) is sent
// to the server, which checks it whole (a bad file is refused with why, and nothing is stored), then
// writes its conversations in the background while this shows how far it got (docs/protocol.md,
// `POST /api/imports`).
import { counted } from "./dom.js";
import { reason } from "./uploads.js";

const POLL_MS = 400;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export class Importer {
  /** `onImported()` is called as conversations arrive (the sidebar lists them); `onSignedOut()` on a 401. */
  constructor(button, picker, status, onSignedOut, onImported) {
    this.button = button;
    this.status = status;
    this.text = status.querySelector(".import-text");
    this.bar = status.querySelector("progress");
    this.onSignedOut = onSignedOut;
    this.onImported = onImported;
    button.addEventListener("click", () => picker.click());
    picker.addEventListener("change", () => {
      const file = picker.files[0];
      picker.value = "";
      if (file) this.upload(file);
    });
  }

  async upload(file) {
    this.button.disabled = true;
    this.show(`Reading “${file.name}”…`, null);
    const body = new FormData();
    body.append("file", file, file.name);
    try {
      const response = await fetch("/api/imports", { method: "POST", body }).catch((error) => ({ ok: false, error }));
      if (response.status === 401) return this.onSignedOut();
      if (!response.ok) {
        this.show(await reason(response, `“${file.name}” could not be imported`, file.name), null, true);
        return;
      }
      await this.follow(await response.json());
    } finally {
      this.button.disabled = false;
    }
  }

  /** Show the import's progress until it ends. */
  async follow(job) {
    let shown = 0;
    while (job.status === "importing") {
      this.show(`Importing: ${job.imported.toLocaleString("en")} of ${counted(job.total, "conversation")}`, job);
      if (job.imported > shown) {
        shown = job.imported;
        this.onImported();
      }
      await sleep(POLL_MS);
      const response = await fetch(`/api/imports/${encodeURIComponent(job.id)}`).catch((error) => ({ ok: false, error }));
      if (response.status === 401) return this.onSignedOut();
      if (!response.ok) {
        this.show(await reason(response, "The import's progress cannot be read"), null, true);
        return;
      }
      job = await response.json();
    }
    this.onImported();
    if (job.status === "failed") {
      this.show(job.error, null, true);
      return;
    }
    // The server names each kind in the plural ("tool calls"): its count follows it, right for one too.
    const left = Object.entries(job.dropped).map(([kind, count]) => `${kind} (${count.toLocaleString("en")})`);
    const note = left.length ? ` Left out: ${left.join(", ")}.` : "";
    this.show(`Imported ${counted(job.imported, "conversation")}.${note}`, job);
  }

  show(text, job, failed = false) {
    this.status.hidden = false;
    this.status.classList.toggle("warning", failed);
    this.text.textContent = text;
    this.bar.hidden = !job;
    if (job) {
      this.bar.max = Math.max(job.total, 1);
      this.bar.value = job.imported;
    }
  }
}
