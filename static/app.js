// The page: one conversation on screen, a sidebar of all of them, one WebSocket to the server.
// docs/protocol.md is the contract for every frame handled here.
import { Composer } from "./composer.js";
import { Connection } from "./connection.js";
import { Documents } from "./documents.js";
import { Drawer } from "./drawer.js";
import { FlowPicker } from "./flows.js";
import { ImageTray, isImage } from "./images.js";
import { Importer } from "./import.js";
import { copyCode } from "./markdown.js";
import { MemoryPanel } from "./memory.js";
import { MenuButton } from "./menu.js";
import { readSampling, samplingSummary, showSampling } from "./sampling.js";
import { initSearch } from "./search.js";
import { SharePanel } from "./share.js";
import { Shortcuts } from "./shortcuts.js";
import { ConversationList } from "./sidebar.js";
import { ToolsPanel } from "./tools.js";
import { withStep } from "./steps.js";
import { Transcript } from "./transcript.js";
import { acceptFiles } from "./uploads.js";
import { lockVersions, makeRoomAfter, showPath, startEdit, switchFrame } from "./versions.js";
import { Welcome } from "./welcome.js";

const CONVERSATION_KEY = "pocketchat.conversation";
const OLD_CONVERSATION_KEY = "pocketchat.session"; // where an earlier page kept it
const $ = (id) => document.getElementById(id);

const ui = {
  input: $("input"), title: $("title"),
  promptSummary: $("system-prompt-summary"),
  modelPicker: $("model-picker"), exportLink: $("export"), exportJson: $("export-json"),
  banner: $("banner"), bannerText: $("banner-text"), announcer: $("announcer"),
  promptDialog: $("system-prompt-dialog"), promptInput: $("system-prompt-input"),
};

const state = {
  conversationId: localStorage.getItem(CONVERSATION_KEY) ?? localStorage.getItem(OLD_CONVERSATION_KEY),
  conversation: null, // {title, model, system_prompt}
  provider: null, // ready.provider: who answers
  running: null, // {turnId, seq, view}
  closeEdit: null, // closes the editor of the edit sent, once its turn starts (a refused one stays open)
  models: [],
  vision: null, // the models that see images (null: not known yet)
  reveal: null, // {conversationId, messageId}: a search hit to show once its conversation is drawn
};

const transcript = new Transcript($("transcript"), $("scroller"), $("jump"));
const documents = new Documents($("documents"), (text) => showNotice(text), signIn);
const images = new ImageTray($("images"), $("images-note"), (text) => showNotice(text), signIn);
const connection = new Connection(onFrame, helloFrame, showConnection, signIn);
const composer = new Composer({
  send: (frame) => connection.send(frame), running: () => state.running, images: () => images.ids(),
});
new Importer($("import"), $("import-picker"), $("import-status"), signIn, () => sidebar.refresh());
const tools = new ToolsPanel($("tools-button"), $("tools-dialog"), (off) => changeConversation({ tools_off: off }));
const welcome = new Welcome($("welcome"), $("transcript"), $("model-notice"), (prompt) => {
  composer.put(prompt);
  composer.submit();
});
const shortcuts = new Shortcuts($("shortcuts-dialog"), {
  newChat,
  stop: () => Boolean(state.running) && connection.send({ type: "stop", turn_id: state.running.turnId }),
  focusInput: () => ui.input.focus(),
});
new MenuButton($("menu-button"), $("page-menu"));
const drawer = new Drawer($("sidebar"), $("toggle-sidebar"), $("sidebar-backdrop"), document.querySelector(".main"));
const sidebar = new ConversationList({
  api, open: openConversation, current: () => state.conversationId, onError: (text) => showNotice(text),
});
new SharePanel($("share-button"), $("share-dialog"), () => state.conversationId, signIn);
new MemoryPanel($("memory-button"), $("memory-dialog"), signIn);

/** Not signed in (no session, or it was revoked): the sign-in page. */
function signIn() {
  location.assign("/login");
}

function helloFrame() {
  return state.conversationId ? { type: "hello", conversation_id: state.conversationId } : { type: "hello" };
}

function announce(text) {
  ui.announcer.textContent = text;
}

// ---- frames from the server ---------------------------------------------------------------

const handlers = {
  ready(frame) {
    connection.confirmed();
    state.conversationId = frame.conversation_id;
    localStorage.setItem(CONVERSATION_KEY, frame.conversation_id);
    localStorage.removeItem(OLD_CONVERSATION_KEY);
    state.provider = frame.provider;
    showConversation(frame);
    state.running = null;
    const drawn = transcript.reset(frame.conversation_id, frame.history);
    const reveal = state.reveal;
    if (reveal?.conversationId === frame.conversation_id) {
      state.reveal = null;
      drawn.then(() => revealHit(reveal.messageId));
    }
    if (frame.running) {
      const view = transcript.append({
        role: "assistant", content: frame.running.content, reasoning: frame.running.reasoning,
        status: "streaming", id: frame.running.message_id, steps: frame.running.steps ?? [],
        versions: frame.running.versions,
      });
      state.running = { turnId: frame.running.turn_id, seq: frame.running.seq, view };
    }
    setStreaming(Boolean(state.running));
    sidebar.refresh();
    documents.open(frame.conversation_id);
    images.open(frame.conversation_id);
    tools.refresh(); // a server may have failed, or come back, since
  },

  document(frame) {
    documents.update(frame);
  },

  turn_start(frame) {
    composer.lastSent = null; // accepted
    state.closeEdit?.();
    state.closeEdit = null;
    images.sent(frame.message.images ?? []);
    if (!makeRoomAfter(transcript, frame.message.parent_id)) {
      connection.send(helloFrame()); // its parent is not on screen: resync from the server
      return;
    }
    transcript.append(frame.message);
    const view = transcript.append({
      role: "assistant", content: "", status: "streaming", id: frame.reply.id, versions: frame.reply.versions,
    });
    state.running = { turnId: frame.turn_id, seq: 0, view };
    setStreaming(true);
    announce("The assistant is replying.");
  },

  pressed(frame) {
    if (frame.conversation_id !== transcript.conversationId) return;
    const view = transcript.find(frame.message_id);
    if (!view) return;
    const meta = view.message.meta ?? {};
    transcript.update(view, { meta: { ...meta, presses: { ...(meta.presses ?? {}), [frame.step]: frame.button } } });
  },

  path(frame) {
    if (frame.conversation_id !== state.conversationId) return;
    showPath(transcript, frame.history);
    const reveal = state.reveal;
    if (reveal?.conversationId === frame.conversation_id) {
      state.reveal = null;
      transcript.reveal(reveal.messageId);
    }
  },

  queued(frame) {
    if (state.running?.turnId === frame.turn_id) transcript.update(state.running.view, { queued: frame.position });
  },

  chunk(frame) {
    const running = state.running;
    if (!running || running.turnId !== frame.turn_id || frame.seq <= running.seq) return; // already have it
    // A frame may carry several chunks, first_seq to seq, their text joined (a socket that fell behind).
    if ((frame.first_seq ?? frame.seq) !== running.seq + 1) {
      connection.send(helloFrame()); // a gap cannot happen on one socket; resync from the server if it does
      return;
    }
    running.seq = frame.seq;
    const m = running.view.message;
    transcript.update(running.view, {
      content: m.content + frame.content,
      reasoning: m.reasoning + (frame.reasoning || ""),
      queued: null,
    });
  },

  step(frame) {
    const running = state.running;
    if (!running || running.turnId !== frame.turn_id) return;
    transcript.update(running.view, { steps: withStep(running.view.message.steps, frame) });
  },

  turn_end(frame) {
    const running = state.running;
    if (!running || running.turnId !== frame.turn_id) return;
    transcript.update(running.view, {
      id: frame.message_id, status: frame.status, queued: null,
      meta: { model: frame.model, usage: frame.usage, ttft_ms: frame.ttft_ms, tokens_per_second: frame.tokens_per_second },
    });
    state.running = null;
    transcript.flush();
    transcript.refreshActions();
    setStreaming(false);
    announce(frame.status === "complete" ? "The reply is complete." : `The reply ${frame.status === "error" ? "failed" : "was stopped"}.`);
    sidebar.refresh();
  },

  error(frame) {
    if (frame.code === "unknown_conversation") {
      newChat(); // it was deleted, or never got a message before the server restarted
      return;
    }
    if (["rate_limited", "images_not_supported", "importing"].includes(frame.code)) {
      // The message was not sent: it goes back in the box (its images stay above it), an edit stays in
      // its editor, and the notice says why: how long to wait, that the model cannot see images, or
      // that an import still writes this conversation.
      state.closeEdit = null;
      composer.refused();
      showNotice(frame.retry_after ? `${frame.message} Try again in ${frame.retry_after} s.` : frame.message);
      announce(`Not sent: ${frame.message}`);
      return;
    }
    if (frame.turn_id && state.running?.turnId === frame.turn_id) {
      transcript.update(state.running.view, { error: frame.message });
    } else {
      showNotice(frame.message);
    }
    announce(`Error: ${frame.message}`);
  },

  conversation(frame) {
    if (frame.conversation_id === state.conversationId) showConversation(frame);
    sidebar.refresh();
  },

  deleted(frame) {
    if (frame.conversation_id === state.conversationId) newChat();
    sidebar.refresh();
  },
};

function onFrame(frame) {
  handlers[frame.type]?.(frame);
}

// ---- what the page shows ------------------------------------------------------------------

function showConversation(frame) {
  state.conversation = {
    title: frame.title, model: frame.model, system_prompt: frame.system_prompt, sampling: frame.sampling,
    flow: frame.flow,
  };
  ui.title.textContent = frame.title || "New chat";
  const sampling = samplingSummary(frame.sampling);
  ui.promptSummary.textContent = (frame.system_prompt ? `System prompt: ${frame.system_prompt}` : "No system prompt") +
    (sampling ? ` · ${sampling}` : "");
  document.title = frame.title ? `${frame.title} · PocketChat` : "PocketChat";
  ui.exportLink.href = `/api/conversations/${encodeURIComponent(frame.conversation_id)}/export.md`;
  ui.exportJson.href = `/api/conversations/${encodeURIComponent(frame.conversation_id)}/export.json`;
  fillModelPicker();
  flowPicker.show(frame.flow);
  welcome.show(state.provider, frame.model);
  showImageSight();
  const provider = state.provider;
  tools.show(frame.tools_off, provider?.kind === "local" || frame.model === provider?.embedded_model);
}

/** Tell the image tray whether the conversation's model is one known not to see images. */
function showImageSight() {
  const model = state.conversation?.model;
  const known = state.vision !== null && state.models.includes(model);
  images.setBlindModel(known && !state.vision.includes(model) ? model : null);
}

/** An error that belongs to no reply (a refused frame, a failed request): shown in place, no actions. */
function showNotice(text) {
  const view = transcript.append({ role: "assistant", content: "", status: "error", error: text, notice: true });
  view.root.classList.add("notice-only");
}

function setStreaming(streaming) {
  composer.setStreaming(streaming);
  lockVersions($("transcript"), streaming);
}

function showConnection({ connected, attempt, retryInMs }) {
  ui.banner.hidden = connected;
  composer.setConnected(connected);
  if (!connected) {
    const seconds = Math.ceil(retryInMs / 1000);
    ui.bannerText.textContent = seconds > 0
      ? `Connection lost. Reconnecting in ${seconds} s (attempt ${attempt})…`
      : `Connection lost. Reconnecting (attempt ${attempt})…`;
  }
}

// ---- opening conversations ------------------------------------------------------------------

async function api(method, path, body) {
  const response = await fetch(path, {
    method, headers: body ? { "Content-Type": "application/json" } : {}, body: body ? JSON.stringify(body) : undefined,
  });
  if (response.status === 401) signIn();
  if (!response.ok) throw new Error(`${method} ${path}: HTTP ${response.status}`);
  return response.status === 204 ? null : response.json();
}

function openConversation(id) {
  drawer.close();
  if (id === state.conversationId) return;
  state.conversationId = id;
  connection.send({ type: "hello", conversation_id: id });
}

/** Open a search hit: its conversation, scrolled to its message. */
function openHit(conversationId, messageId) {
  drawer.close();
  if (conversationId === state.conversationId) {
    if (messageId) revealHit(messageId);
    return;
  }
  state.reveal = messageId ? { conversationId, messageId } : null;
  openConversation(conversationId);
}

/** Show a hit's message: it is on screen, or on a branch not shown (an earlier version), asked for first. */
function revealHit(messageId) {
  if (transcript.reveal(messageId)) return;
  state.reveal = { conversationId: state.conversationId, messageId };
  connection.send({ type: "switch", message_id: messageId });
}

function newChat() {
  state.conversationId = null;
  localStorage.removeItem(CONVERSATION_KEY);
  connection.send({ type: "hello" });
  drawer.close();
  ui.input.focus();
}

// ---- the header: model and system prompt --------------------------------------------------

async function loadModels() {
  try {
    ({ models: state.models, vision: state.vision } = await api("GET", "/api/models"));
  } catch {
    state.models = [];
  }
  fillModelPicker();
  showImageSight();
}

function fillModelPicker() {
  const current = state.conversation?.model;
  const models = [...new Set([...(current ? [current] : []), ...state.models])];
  ui.modelPicker.replaceChildren(...models.map((model) => new Option(model, model, false, model === current)));
  ui.modelPicker.disabled = models.length < 2;
}

function changeConversation(changes) {
  if (!state.conversationId) return;
  api("PATCH", `/api/conversations/${state.conversationId}`, changes).catch((e) => showNotice(e.message));
}

// ---- wiring -------------------------------------------------------------------------------

$("attach").addEventListener("click", () => $("file-picker").click());
acceptFiles($("file-picker"), document.querySelector(".main"), ui.input, (files) => {
  // Images go with the next message; any other file is a document of the conversation.
  images.attach(files.filter(isImage));
  documents.attach(files.filter((file) => !isImage(file)));
});
$("new-chat").addEventListener("click", newChat);
$("reconnect-now").addEventListener("click", () => connection.reconnectNow());
$("transcript").addEventListener("click", (event) => {
  const button = event.target.closest("button");
  if (!button) return;
  if (button.classList.contains("copy")) { copyCode(button); return; }
  const view = transcript.find(button.closest(".message")?.dataset.id);
  if (button.dataset.action === "regenerate" && connection.send({ type: "regenerate" })) composer.lastSent = null;
  if (button.dataset.action === "switch") connection.send(switchFrame(button));
  if (button.dataset.action === "edit" && view) {
    startEdit(view, (content, close) => {
      if (!connection.send({ type: "edit", message_id: view.id, content })) return;
      composer.lastSent = null; // an edit is not put back in the message box
      state.closeEdit = close;
    });
  }
  if (button.dataset.action === "copy-reply" && view) navigator.clipboard.writeText(view.message.content).catch(() => {});
  if (button.dataset.action === "step-send") {
    composer.put(button.dataset.send);
    composer.submit(); // as if typed and sent (while a reply streams, Enter's rule: it waits in the box)
  }
  if (button.dataset.action === "step-press") {
    const { messageId, step, button: pressed } = button.dataset;
    if (connection.send({ type: "press", message_id: messageId, step, button: pressed })) button.disabled = true;
  }
});
ui.modelPicker.addEventListener("change", () => changeConversation({ model: ui.modelPicker.value }));
const flowPicker = new FlowPicker($("flow-picker"), (name) => changeConversation({ flow: name }));
$("system-prompt-button").addEventListener("click", () => {
  ui.promptInput.value = state.conversation?.system_prompt ?? "";
  showSampling(ui.promptInput.form, state.conversation?.sampling);
  ui.promptDialog.returnValue = ""; // Escape closes it without one: not the last Save's again
  ui.promptDialog.showModal();
});
ui.promptDialog.addEventListener("close", () => {
  if (ui.promptDialog.returnValue !== "save") return;
  changeConversation({ system_prompt: ui.promptInput.value, sampling: readSampling(ui.promptInput.form) });
});
$("search-button").addEventListener("click", () => document.dispatchEvent(new CustomEvent("pocketchat:search")));
$("shortcuts-button").addEventListener("click", () => shortcuts.open());

initSearch(openHit, signIn);
connection.open();
loadModels();
flowPicker.load();
