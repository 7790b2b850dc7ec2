// What the nodes of a turn show (`step` frames, docs/protocol.md): the kinds the page knows are drawn
// for what they are; any other kind is shown plainly, so a new node is seen without a page change.
// Everything goes in as text, never as markup: a step's data may come from a document or a tool.
import { element } from "./dom.js";

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

function suggestions(step) {
  const box = element("div", "suggestions");
  box.setAttribute("aria-label", "Suggested follow-ups");
  for (const text of Array.isArray(step.data) ? step.data : []) {
    const button = element("button", "suggestion", String(text));
    button.type = "button";
    button.dataset.action = "suggestion";
    box.append(button);
  }
  return box;
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

/** Draw `steps` into `container`; `streaming` shows the latest `status` line, which is gone once the reply ends. */
export function renderSteps(container, steps, streaming) {
  const results = new Map(steps.filter((s) => s.kind === "tool_result").map((s) => [s.data?.id, s.data]));
  const drawn = [];
  for (const step of steps) {
    if (step.kind === "status" || step.kind === "tool_result") continue;
    if (step.kind === "sources") drawn.push(sources(step));
    else if (step.kind === "suggestions") { if (!streaming) drawn.push(suggestions(step)); }
    else if (step.kind === "tool_call") drawn.push(toolCall(step, results));
    else drawn.push(other(step));
  }
  const status = streaming ? steps.findLast((s) => s.kind === "status") : null;
  if (status) drawn.push(element("p", "step-status", String(status.data)));
  container.replaceChildren(...drawn);
  container.hidden = drawn.length === 0;
}
