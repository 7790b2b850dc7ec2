// The conversation on screen. Each message is one element that re-renders only when it changed,
// at most once per animation frame, and a streaming reply redraws only its last Markdown blocks; a long
// history is drawn newest first in small batches so the page never freezes; the view sticks to the
// bottom while a reply streams unless the user scrolled up.
import { element } from "./dom.js";
import { imageUrl, thumbnail } from "./images.js";
import { MarkdownView } from "./markdown.js";
import { drawShaped, isInline, renderSteps } from "./steps.js";
import { renderVersions } from "./versions.js";

const BATCH = 25;
const STICK_PX = 48;

function describeMeta(meta) {
  if (!meta || !meta.model) return "";
  const parts = [meta.model];
  if (meta.ttft_ms != null) parts.push(`${meta.ttft_ms} ms to first token`);
  if (meta.tokens_per_second != null) parts.push(`${meta.tokens_per_second} tokens/s`);
  if (meta.usage) {
    const source = meta.usage.source === "provider" ? "" : ` (${meta.usage.source})`;
    parts.push(`${meta.usage.prompt_tokens} in · ${meta.usage.completion_tokens} out${source}`);
  }
  return parts.join(" · ");
}

const STATUS_TEXT = {
  stopped: "Stopped.",
  interrupted: "Interrupted: the server stopped while this reply was being written.",
  error: "This reply failed.",
};

/** The images a user message carries, each a link to the whole image. */
function messageImages(conversationId, images) {
  const box = element("div", "message-images");
  for (const image of images) {
    const link = element("a", "message-image");
    link.href = imageUrl(conversationId, image.id);
    link.target = "_blank";
    link.rel = "noopener";
    link.append(thumbnail(conversationId, image, "thumbnail"));
    box.append(link);
  }
  return box;
}

class MessageView {
  constructor(message, conversationId) {
    this.message = { reasoning: "", meta: null, error: null, status: "complete", steps: message.meta?.steps ?? [], ...message };
    this.root = element("article", `message ${message.role}`);
    this.root.dataset.role = message.role;
    this.root.setAttribute("aria-label", message.role === "user" ? "You said" : "Assistant replied");
    this.reasoning = element("details", "reasoning");
    this.reasoning.append(element("summary", "", "Reasoning"), element("div", "reasoning-body"));
    this.reasoning.hidden = true;
    this.body = element("div", "body");
    this.steps = element("div", "steps");
    this.steps.hidden = true;
    this.stepsBelow = element("div", "steps below");
    this.stepsBelow.hidden = true;
    this.conversationId = conversationId;
    this.renderedSteps = null;
    this.inlineKey = ""; // where the inline steps split the text, as drawn
    this.notice = element("p", "notice");
    this.notice.hidden = true;
    this.meta = element("p", "meta");
    this.actions = element("div", "actions");
    this.versions = element("div", "versions");
    this.versions.hidden = true;
    const footer = element("div", "message-footer");
    footer.append(this.versions, this.actions);
    this.root.append(this.reasoning, this.steps, this.body, this.stepsBelow, this.notice, this.meta, footer);
    // A message's images never change (an edit is a new message): drawn once.
    if (message.images?.length) this.root.insertBefore(messageImages(conversationId, message.images), this.body);
    this.markdown = message.role === "user" ? null : new MarkdownView(this.body);
    this.segments = null; // with inline steps: [{view, box}] the text is drawn in, a step between each two
    this.renderedText = null;
  }

  get id() {
    return this.message.id;
  }

  set(fields) {
    Object.assign(this.message, fields);
  }

  /** Bring the element up to date with the message; cheap when only the text grew. */
  render() {
    const m = this.message;
    this.root.dataset.id = m.id || "";
    this.root.dataset.status = m.status;
    this.root.setAttribute("aria-busy", m.status === "streaming" ? "true" : "false");
    const inline = this.markdown ? m.steps.filter(isInline).sort((a, b) => a.at - b.at) : [];
    const inlineKey = inline.map((step) => `${step.node}:${step.id ?? ""}:${step.at}`).join(",");
    if (inlineKey !== this.inlineKey) this.splitBody(inline, inlineKey);
    if (m.content !== this.renderedText) {
      if (this.segments) this.renderSegments(inline, m.content);
      else if (this.markdown) this.markdown.render(m.content);
      else this.body.textContent = m.content;
      this.renderedText = m.content;
    }
    if (m.steps !== this.renderedSteps?.steps || m.status !== this.renderedSteps.status || m.meta !== this.renderedSteps.meta) {
      const context = { conversationId: this.conversationId, message: m };
      renderSteps({ above: this.steps, below: this.stepsBelow }, m.steps, m.status === "streaming", context);
      if (this.segments) this.drawInline(inline, context);
      this.renderedSteps = { steps: m.steps, status: m.status, meta: m.meta };
    }
    this.reasoning.hidden = !m.reasoning;
    if (m.reasoning) this.reasoning.lastElementChild.textContent = m.reasoning;
    const notice = m.queued ? `Waiting for the model (${m.queued} ahead)…` : m.error || STATUS_TEXT[m.status];
    this.notice.hidden = !notice;
    this.notice.textContent = notice || "";
    this.notice.classList.toggle("error", Boolean(m.error) || m.status === "error");
    this.meta.textContent = m.status === "streaming" ? "" : describeMeta(m.meta);
    renderVersions(this.versions, m);
  }

  /** Lay the text out again in segments, one more than the inline steps, each step between two. */
  splitBody(inline, key) {
    this.inlineKey = key;
    this.renderedText = null;
    this.renderedSteps = null;
    if (!inline.length) {
      this.segments = null;
      this.body.replaceChildren();
      this.markdown = new MarkdownView(this.body);
      return;
    }
    this.segments = [];
    const parts = [];
    for (let i = 0; i <= inline.length; i++) {
      const box = element("div", "segment");
      this.segments.push({ view: new MarkdownView(box), box });
      parts.push(box);
      if (i < inline.length) parts.push(element("div", "inline-step"));
    }
    this.body.replaceChildren(...parts);
  }

  renderSegments(inline, content) {
    const cuts = [0, ...inline.map((step) => Math.min(step.at, content.length)), content.length];
    this.segments.forEach((segment, i) => segment.view.render(content.slice(cuts[i], cuts[i + 1])));
  }

  drawInline(inline, context) {
    const places = this.body.querySelectorAll(":scope > .inline-step");
    inline.forEach((step, i) => places[i]?.replaceChildren(drawShaped(step, context) ?? ""));
  }
}

export class Transcript {
  constructor(container, scroller, jumpButton) {
    this.container = container;
    this.scroller = scroller;
    this.jumpButton = jumpButton;
    this.views = [];
    this.dirty = new Set();
    this.frame = null;
    this.generation = 0;
    this.conversationId = null; // of the messages on screen: where their images are served
    this.stuck = true;
    this.top = 0; // the scroll position at the last scroll event
    // Only the user scrolling up unsticks the view, never the messages growing under it (the end of a
    // reply, its actions appearing, can come between a scroll and its event); reaching the bottom sticks.
    scroller.addEventListener("scroll", () => {
      const up = scroller.scrollTop < this.top;
      this.top = scroller.scrollTop;
      this.stuck = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < STICK_PX || (this.stuck && !up);
      this.jumpButton.hidden = this.stuck;
    }, { passive: true });
    jumpButton.addEventListener("click", () => this.scrollToEnd());
    // Whatever changes the size of the messages or of the view keeps it at the bottom while it sticks there:
    // a reply growing, its actions appearing once it ends, the message box growing as one types, a tray
    // above the box.
    const follow = new ResizeObserver(() => {
      if (this.stuck) this.scrollToEnd();
    });
    follow.observe(container);
    follow.observe(scroller);
  }

  scrollToEnd() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
    this.stuck = true;
    this.jumpButton.hidden = true;
  }

  /** Replace everything with `history`, drawing it newest first in batches between frames. */
  async reset(conversationId, history) {
    const generation = ++this.generation;
    this.conversationId = conversationId;
    this.container.replaceChildren();
    this.views = history.map((message) => new MessageView(message, conversationId));
    this.dirty.clear();
    this.stuck = true;
    this.jumpButton.hidden = true;
    for (let end = this.views.length; end > 0; end -= BATCH) {
      const batch = this.views.slice(Math.max(end - BATCH, 0), end);
      for (const view of batch) view.render();
      this.container.prepend(...batch.map((view) => view.root));
      await new Promise((resolve) => setTimeout(resolve, 0));
      if (generation !== this.generation) return;
    }
    this.refreshActions();
  }

  find(id) {
    return this.views.find((view) => view.id === id);
  }

  /** Scroll to the message `id` and mark it a moment (a search hit); whether it is on screen. */
  reveal(id) {
    const view = this.find(id);
    if (!view) return false;
    this.stuck = false; // the view stays on the message, not on the latest
    // The messages above it take their real height only once laid out (their blocks are
    // `content-visibility: auto`), which moves it: for a moment, each change of the transcript's height
    // centres it again, until the user scrolls.
    const centre = () => view.root.scrollIntoView({ block: "center" });
    const observer = new ResizeObserver(centre);
    observer.observe(this.container);
    const stop = () => observer.disconnect();
    setTimeout(stop, 1500);
    for (const event of ["wheel", "touchstart", "keydown"]) this.scroller.addEventListener(event, stop, { once: true });
    centre();
    view.root.classList.remove("found");
    void view.root.offsetWidth; // restart the animation when the same message is revealed again
    view.root.classList.add("found");
    setTimeout(() => view.root.classList.remove("found"), 2500);
    return true;
  }

  /** Remove the message at `index` and everything after it (another version replaces them). */
  removeFrom(index) {
    for (const view of this.views.splice(index)) {
      view.root.remove();
      this.dirty.delete(view);
    }
  }

  append(message) {
    const view = new MessageView(message, this.conversationId);
    this.views.push(view);
    this.container.append(view.root);
    view.render();
    this.refreshActions();
    return view;
  }

  /** Change a message; it is drawn at the next animation frame, with any other change. */
  update(view, fields) {
    view.set(fields);
    this.dirty.add(view);
    if (this.frame === null) this.frame = requestAnimationFrame(() => this.flush());
  }

  flush() {
    this.frame = null;
    for (const view of this.dirty) view.render();
    this.dirty.clear();
  }

  /** Any user message can be edited (a new version of it) and the last reply regenerated, once nothing streams. */
  refreshActions() {
    const messages = this.views.filter((view) => !view.message.notice);
    const streaming = messages.some((view) => view.message.status === "streaming");
    const last = streaming ? null : messages.at(-1);
    for (const view of this.views) {
      const actions = [];
      if (!streaming && view.message.role === "user" && !view.message.notice) actions.push(["edit", "Edit"]);
      if (view === last && view.message.role === "assistant") {
        actions.push(["regenerate", view.message.status === "error" ? "Retry" : "Regenerate"]);
      }
      if (view.message.role === "assistant" && view.message.content && view.message.status !== "streaming" &&
          !view.message.notice) {
        actions.push(["copy-reply", "Copy"]);
      }
      const key = actions.map(([name]) => name).join();
      if (view.actions.dataset.key === key) continue;
      view.actions.dataset.key = key;
      view.actions.replaceChildren(...actions.map(([action, label]) => {
        const button = element("button", "action", label);
        button.type = "button";
        button.dataset.action = action;
        return button;
      }));
    }
  }
}
