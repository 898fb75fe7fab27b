// The Resources dashboard pane: each node's CPU, memory and GPU history, and the cluster's,
// as small SVG plots from the head's resource history.
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ApiError, IHistory, requestAPI } from './api';
import { ISeries, combine, sparkline } from './plot';
import { Poller, el } from './poll';

/** A redraw a second at most: the head's history moves no faster than its nodes report. */
export const RESOURCES_INTERVAL = 1000;
/** The window drawn, in seconds. */
const WINDOW = 600;

export class ResourcePanel extends Widget {
  private readonly poller: Poller;
  private readonly state: HTMLElement;
  private readonly grid: HTMLElement;

  constructor(readonly clusterId: string) {
    super();
    this.addClass('cb-Resources');
    this.id = `clusterbook-resources-${clusterId}`;
    this.title.label = `Resources: ${clusterId}`;
    this.title.closable = true;
    this.state = el('div', { class: 'cb-Resources-state', role: 'status', 'aria-live': 'polite' });
    this.grid = el('div', { class: 'cb-Resources-grid', role: 'table', 'aria-label': `Resources of ${clusterId}` });
    this.node.append(this.state, this.grid);
    this.poller = new Poller(() => this.read(), RESOURCES_INTERVAL);
  }

  protected onAfterShow(msg: Message): void {
    this.poller.start();
  }

  protected onAfterAttach(msg: Message): void {
    if (this.isVisible) {
      this.poller.start();
    }
  }

  protected onBeforeHide(msg: Message): void {
    this.poller.stop();
  }

  protected onBeforeDetach(msg: Message): void {
    this.poller.stop();
  }

  private async read(): Promise<void> {
    let history: IHistory;
    try {
      history = await requestAPI<IHistory>(`clusters/${encodeURIComponent(this.clusterId)}/resources?window=${WINDOW}`);
    } catch (error) {
      this.state.textContent = `No resource history: ${(error as Error).message}`;
      if (error instanceof ApiError && (error.status === 404 || error.status === 409)) {
        this.poller.stop(); // the cluster is gone or stopped: its history went with its head
      }
      return;
    }
    this.draw(history);
  }

  draw(history: IHistory): void {
    const names = Object.keys(history.nodes).sort();
    // The time axis spans what the history holds, up to the window: a young cluster's few
    // points fill the plot rather than its last pixels.
    let end = -Infinity;
    let first = Infinity;
    for (const name of names) {
      const t = history.nodes[name].t;
      if (t.length) {
        end = Math.max(end, t[t.length - 1]);
        first = Math.min(first, t[0]);
      }
    }
    if (!isFinite(end)) {
      end = first = 0;
    }
    const start = Math.max(first, end - WINDOW);
    const header = el('div', { class: 'cb-Resources-row cb-Resources-head', role: 'row' });
    for (const text of ['node', 'CPU %', 'memory GiB', 'GPU %']) {
      header.appendChild(el('span', { class: 'cb-Resources-cell', role: 'columnheader' }, text));
    }
    const rows: HTMLElement[] = [header];
    const cpu: ISeries[] = [];
    const memory: ISeries[] = [];
    const gpu: ISeries[] = [];
    let total = 0;
    for (const name of names) {
      const node = history.nodes[name];
      cpu.push({ t: node.t, v: node.cpu });
      memory.push({ t: node.t, v: node.memory_used_gib });
      gpu.push({ t: node.t, v: node.gpu });
      total += node.memory_gib ?? 0;
    }
    const sumCpu = combine(cpu, history.interval, true);
    const sumMemory = combine(memory, history.interval, false);
    const sumGpu = combine(gpu, history.interval, true);
    rows.push(this.row('cluster', 'cb-Resources-sum', sumCpu, sumMemory, total, sumGpu, start, end));
    for (let i = 0; i < names.length; i++) {
      rows.push(this.row(names[i], 'cb-Resources-node', cpu[i], memory[i], history.nodes[names[i]].memory_gib ?? 0, gpu[i], start, end));
    }
    this.grid.replaceChildren(...rows);
    this.state.textContent = `${names.length} node(s); the last ${Math.round(WINDOW / 60)} minutes, a point every ${history.interval} s`;
  }

  private row(name: string, kind: string, cpu: ISeries, memory: ISeries, memoryMax: number, gpu: ISeries, start: number, end: number): HTMLElement {
    const row = el('div', { class: `cb-Resources-row ${kind}`, role: 'row', 'data-node': name });
    const label = name === 'cluster' ? 'cluster (CPU and GPU: mean; memory: sum)' : name;
    row.appendChild(el('span', { class: 'cb-Resources-cell cb-Resources-name', role: 'rowheader' }, label));
    const cells: [ISeries, number, string, string][] = [
      [cpu, 100, `${name} CPU`, '%'],
      [memory, memoryMax, `${name} memory`, 'GiB'],
      [gpu, 100, `${name} GPU`, '%']
    ];
    for (const [series, max, what, unit] of cells) {
      const cell = el('span', { class: 'cb-Resources-cell', role: 'cell' });
      cell.appendChild(sparkline(series, max, start, end, what, unit));
      row.appendChild(cell);
    }
    return row;
  }
}
