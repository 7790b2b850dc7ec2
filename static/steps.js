// What the nodes of a turn show (`step` frames, docs/protocol.md "How a node shows itself"). A step names a
// shape the page draws (text, markdown, keyvalue, table, links, image, progress) and a place (above the
// reply, below it, inline where it came, or hidden), with buttons under it; the page knows shapes and
// places, never a node's name. A few kinds of the app's own nodes (sources, tool calls, a streaming status)
// are drawn for what they are; a step of no shape the page knows is shown plainly (node, kind, data).
// Everything goes in as text, never as markup, but Markdown, which is sanitized as replies are.
import { element } from "./dom.js";
import { MarkdownView } from "./markdown.js";

const SHAPES = new Set(["text", "markdown", "keyvalue", "table", "links", "image", "progress"]);

function plain(data) {
  return typeof data === "string" ? data : JSON.stringify(data, null, 2);
}

function expandable(className, summary, ...parts) {
  const details = element("details", className);
  details.append(element("summary", "", summary), ...parts);
  return details;
}

function sources(step) {
  const list = element("ol", "sources");
  list.setAttribute("aria-label", "Sources");
  for (const [index, item] of (Array.isArray(step.data) ? step.data : []).entries()) {
    const entry = element("li");
    const label = `[${index + 1}] ${item.source ?? ""}`;
    entry.append(expandable("source", label, element("blockquote", "passage", item.text ?? "")));
    list.append(entry);
  }
  return list;
}

function toolCall(step, results) {
  const call = step.data ?? {};
  const result = results.get(call.id);
  const state = result ? (result.denied ? " · denied" : result.error ? " · failed" : "") : " · running…";
  const parts = [element("pre", "tool-arguments", plain(call.arguments ?? {}))];
  if (result) parts.push(element("pre", `tool-result${result.error ? " error" : ""}`, plain(result.error ?? result.result)));
  return expandable("tool", `Tool ${call.name ?? "?"}${state}`, ...parts);
}

function other(step) {
  return expandable("step other", `${step.node} · ${step.kind}`, element("pre", "", plain(step.data)));
}

/** A link only to this site or the web (http, https): never `javascript:`, nor a `data:` page. */
function safeHref(url) {
  if (typeof url !== "string") return null;
  if (url.startsWith("/") && !url.startsWith("//")) return url;
  try {
    const parsed = new URL(url);
    return parsed.protocol === "https:" || parsed.protocol === "http:" ? parsed.href : null;
  } catch {
    return null;
  }
}

function rows(data) {
  if (Array.isArray(data)) return data.filter(Array.isArray).map(([key, value]) => [key, value]);
  return data && typeof data === "object" ? Object.entries(data) : [];
}

const DRAW = {
  text: (data) => element("p", "step-text", plain(data)),
  markdown: (data) => {
    const box = element("div", "step-markdown");
    new MarkdownView(box).render(plain(data));
    return box;
  },
  keyvalue: (data) => {
    const list = element("dl", "step-keyvalue");
    for (const [key, value] of rows(data)) list.append(element("dt", "", plain(key)), element("dd", "", plain(value)));
    return list;
  },
  table: (data) => {
    const scroller = element("div", "table-scroll");
    scroller.tabIndex = 0; // a wide table scrolls by keyboard too
    const table = element("table", "step-table");
    const head = element("tr");
    for (const column of Array.isArray(data?.columns) ? data.columns : []) head.append(element("th", "", plain(column)));
    table.append(element("thead"), element("tbody"));
    table.tHead.append(head);
    for (const row of Array.isArray(data?.rows) ? data.rows : []) {
      const line = element("tr");
      for (const cell of Array.isArray(row) ? row : [row]) line.append(element("td", "", plain(cell)));
      table.tBodies[0].append(line);
    }
    scroller.append(table);
    return scroller;
  },
  links: (data) => {
    const list = element("ul", "step-links");
    for (const item of Array.isArray(data) ? data : []) {
      const entry = element("li");
      const href = safeHref(item?.url);
      const label = plain(item?.label ?? item?.url ?? "");
      if (href) {
        const link = element("a", "", label);
        link.href = href;
        link.target = "_blank";
        link.rel = "noopener noreferrer";
        entry.append(link);
      } else entry.append(element("span", "", label));
      if (item?.text) entry.append(element("blockquote", "passage", plain(item.text)));
      list.append(entry);
    }
    return list;
  },
  image: (data, context) => {
    const figure = element("figure", "step-image");
    if (typeof data?.image_id === "string" && context.conversationId) {
      const image = element("img");
      image.alt = plain(data.alt ?? "");
      image.loading = "lazy";
      image.src = `/api/conversations/${encodeURIComponent(context.conversationId)}/images/${encodeURIComponent(data.image_id)}`;
      figure.append(image);
    }
    if (data?.caption) figure.append(element("figcaption", "", plain(data.caption)));
    return figure;
  },
  progress: (data) => {
    const box = element("div", "step-progress");
    const value = Math.max(0, Math.min(1, Number(data?.value) || 0));
    const bar = element("progress");
    bar.max = 1;
    bar.value = value;
    bar.setAttribute("aria-label", plain(data?.label ?? "Progress"));
    box.append(bar, element("span", "", `${data?.label ? `${plain(data.label)} · ` : ""}${Math.round(value * 100)}%`));
    return box;
  },
};

function buttons(step, message) {
  const box = element("div", "step-buttons");
  for (const button of step.buttons ?? []) {
    const drawn = element("button", "step-button", String(button.label ?? button.id));
    drawn.type = "button";
    if (button.send !== undefined) {
      drawn.dataset.action = "step-send";
      drawn.dataset.send = String(button.send);
    } else {
      drawn.dataset.action = "step-press";
      Object.assign(drawn.dataset, { messageId: message.id ?? "", step: step.id, button: button.id });
      const pressed = message.meta?.presses?.[step.id];
      if (pressed !== undefined) {
        drawn.disabled = true;
        if (pressed === button.id) drawn.classList.add("pressed");
      }
    }
    box.append(drawn);
  }
  return box;
}

/** A step of a shape the page knows, with its buttons; null if it has none it knows. */
export function drawShaped(step, context) {
  if (!SHAPES.has(step.shape)) return null;
  const box = element("div", `step shaped ${step.shape}`);
  box.dataset.node = step.node;
  box.append(DRAW[step.shape](step.data, context));
  if (step.buttons?.length) box.append(buttons(step, context.message));
  return box;
}

/** Whether a step goes inline, where it came in the reply: one of a shape the page draws, with its place. */
export function isInline(step) {
  return step.display === "inline" && SHAPES.has(step.shape) && Number.isInteger(step.at);
}

/**
 * Draw a message's steps above and below its text (`places.above`, `places.below`; the inline ones are
 * the text's own, see transcript.js); `streaming` shows the latest `status` line, gone once the reply ends.
 */
export function renderSteps(places, steps, streaming, context) {
  const results = new Map(steps.filter((s) => s.kind === "tool_result").map((s) => [s.data?.id, s.data]));
  const above = [];
  const below = [];
  for (const step of steps) {
    if (step.display === "hidden" || isInline(step)) continue;
    const shaped = drawShaped(step, context);
    if (shaped) (step.display === "below" ? below : above).push(shaped);
    else if (step.kind === "status" || step.kind === "tool_result") continue;
    else if (step.kind === "sources") above.push(sources(step));
    else if (step.kind === "tool_call") above.push(toolCall(step, results));
    else above.push(other(step));
  }
  const status = streaming ? steps.findLast((s) => s.kind === "status" && !s.shape) : null;
  if (status) above.push(element("p", "step-status", String(status.data)));
  places.above.replaceChildren(...above);
  places.above.hidden = above.length === 0;
  places.below.replaceChildren(...below);
  places.below.hidden = below.length === 0;
}

/** The steps of a frame, as the page keeps them: a step of the same node and id replaces the earlier one. */
export function withStep(steps, frame) {
  const step = { node: frame.node, kind: frame.kind, data: frame.data };
  for (const name of ["id", "shape", "display", "buttons", "at"]) if (frame[name] !== undefined) step[name] = frame[name];
  if (step.id === undefined) return [...steps, step];
  const index = steps.findIndex((kept) => kept.id === step.id && kept.node === step.node);
  return index < 0 ? [...steps, step] : steps.map((kept, i) => (i === index ? step : kept));
}
