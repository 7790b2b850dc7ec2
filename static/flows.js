// The flow a conversation runs (flow.py's FLOWS, those the deployment offers: GET /api/flows), picked beside
// the model. Shown only when there is a choice; a conversation that picked none runs the default.

export class FlowPicker {
  /** @param {HTMLSelectElement} select @param {(name: string) => void} change: the conversation picks `name` */
  constructor(select, change) {
    this.select = select;
    this.offered = { default: "", flows: [] };
    this.current = "";
    select.addEventListener("change", () => change(select.value));
  }

  async load() {
    try {
      const answer = await fetch("/api/flows", { credentials: "same-origin" });
      if (answer.ok) this.offered = await answer.json();
    } catch {
      // no choice shown: the conversation runs the default
    }
    this.show(this.current);
  }

  /** Show the conversation's flow (`name`; "" for the default). */
  show(name) {
    this.current = name || "";
    const picked = this.current || this.offered.default;
    const options = this.offered.flows.map((flow) => {
      const option = new Option(flow.title, flow.name, false, flow.name === picked);
      option.title = flow.description;
      return option;
    });
    this.select.replaceChildren(...options);
    this.select.title = this.offered.flows.find((flow) => flow.name === picked)?.description ?? "";
    this.select.closest("label").hidden = this.offered.flows.length < 2;
  }
}
