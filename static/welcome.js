// Who answers, said where it helps: on the first screen of a conversation (with example prompts: a click
// sends one, as in ChatGPT), and, when the small embedded demo model answers, in a banner above the chat
// that can be dismissed for good (this browser remembers it).
import { element } from "./dom.js";

const DISMISSED_KEY = "pocketchat.demoNoticeDismissed";
const DEMO_NOTE = ": a small offline demo model. For real answers, point PocketChat at a bigger model: " +
  "set POCKETCHAT_BASE_URL (OpenAI, OpenRouter, Ollama, vLLM…) or --model-path (see the README).";

export class Welcome {
  /**
   * @param {HTMLElement} section  the first screen: #welcome-model and the example prompts' buttons
   * @param {HTMLElement} transcript  the first screen shows while it has no message
   * @param {HTMLElement} notice  the banner: a text and a dismiss button
   * @param {(prompt: string) => void} send
   */
  constructor(section, transcript, notice, send) {
    this.model = section.querySelector("#welcome-model");
    this.notice = notice;
    this.noticeText = notice.querySelector("p");
    this.dismiss = notice.querySelector("button");
    section.querySelector(".examples").addEventListener("click", (event) => {
      const example = event.target.closest("button");
      if (example) send(example.textContent);
    });
    // Shown from the first `ready` on (it names the model), while no message is on screen.
    this.toggle = () => { section.hidden = transcript.querySelector(".message:not(.notice-only)") !== null; };
    new MutationObserver(this.toggle).observe(transcript, { childList: true });
    this.dismiss.addEventListener("click", () => {
      localStorage.setItem(DISMISSED_KEY, "1");
      notice.hidden = true;
      document.getElementById("input").focus(); // the banner's button is gone: focus goes where one types
    });
  }

  /** The conversation's model, or the provider, changed. */
  show(provider, model) {
    if (!provider) return;
    this.toggle();
    const local = provider.kind === "local";
    const demo = local ? provider.demo : model === provider.embedded_model;
    const unavailable = !demo && provider.kind === "unavailable";
    const how = demo ? "a small demo model on this machine" : local ? "running on this machine" : `via ${provider.base_url}`;
    this.model.replaceChildren(...(unavailable ? ["No model can answer yet: see the notice above."]
      : ["Answered by ", element("strong", "", model), `, ${how}`]));
    this.model.classList.toggle("warning", unavailable);
    // The demo notice can be dismissed; "no model can answer" stays until one can.
    this.noticeText.textContent = unavailable ? `No model can answer: ${provider.message} ` +
      "Or set POCKETCHAT_BASE_URL and POCKETCHAT_API_KEY to use an OpenAI-compatible provider."
      : demo ? model + DEMO_NOTE : "";
    this.notice.hidden = !this.noticeText.textContent || (demo && localStorage.getItem(DISMISSED_KEY) === "1");
    this.notice.classList.toggle("warning", unavailable);
    this.dismiss.hidden = unavailable;
  }
}
