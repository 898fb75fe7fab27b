// The Resources dashboard pane: each node's CPU, memory and GPU history, and the cluster's,
// as small SVG plots from the head's resource history.
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ApiError, IHistory, requestAPI } from './api';
import { ISeries, combine, sparkline } from './plot';
import { Poller, button, el } from './poll';

/** A redraw a second at most: the head's history moves no faster than its nodes report. */
export const RESOURCES_INTERVAL = 1000;
/** The window drawn, in seconds. */
const WINDOW = 600;
/** Nodes drawn at once (the cluster's row besides). */
const PAGE = 32;

/** `known` with the points of `got` after its own, each node's, the last `window` s kept. */
export function merge(known: IHistory, got: IHistory, window: number): IHistory {
  const nodes: IHistory['nodes'] = {};
  for (const [name, fresh] of Object.entries(got.nodes)) {
    const old = known.nodes[name];
    if (!old || !old.t.length) {
      nodes[name] = fresh;
      continue;
    }
    const last = old.t[old.t.length - 1];
    const from = fresh.t.findIndex(t => t > last);
    const take = from < 0 ? fresh.t.length : from;
    const t = old.t.concat(fresh.t.slice(take));
    const keep = t.findIndex(x => x >= t[t.length - 1] - window);
    const cut = <T,>(a: T[], b: T[]): T[] => a.concat(b.slice(take)).slice(Math.max(keep, 0));
    nodes[name] = {
      t: t.slice(Math.max(keep, 0)),
      cpu: cut(old.cpu, fresh.cpu),
      memory_used_gib: cut(old.memory_used_gib, fresh.memory_used_gib),
      memory_gib: fresh.memory_gib,
      gpu: cut(old.gpu, fresh.gpu)
    };
  }
  return { interval: got.interval, nodes };
}

export class ResourcePanel extends Widget {
  private readonly poller: Poller;
  private readonly state: HTMLElement;
  private readonly grid: HTMLElement;
  private readonly pager: HTMLElement;
  private history: IHistory | null = null;
  private page = 0;

  constructor(readonly clusterId: string) {
    super();
    this.addClass('cb-Resources');
    this.id = `clusterbook-resources-${clusterId}`;
    this.title.label = `Resources: ${clusterId}`;
    this.title.closable = true;
    this.state = el('div', { class: 'cb-Resources-state', role: 'status', 'aria-live': 'polite' });
    this.grid = el('div', { class: 'cb-Resources-grid', role: 'table', 'aria-label': `Resources of ${clusterId}` });
    this.pager = el('div', { class: 'cb-Resources-pager', role: 'navigation', 'aria-label': 'Pages of nodes' });
    this.node.append(this.state, this.pager, this.grid);
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
    // The whole window once, then only what is new (a few seconds' worth, merged here): a
    // thousand nodes' ten minutes are megabytes, their last seconds are not.
    const known = this.history;
    const window = known ? Math.min(WINDOW, Math.max(5, 3 * known.interval)) : WINDOW;
    let got: IHistory;
    try {
      got = await requestAPI<IHistory>(`clusters/${encodeURIComponent(this.clusterId)}/resources?window=${window}`);
    } catch (error) {
      this.state.textContent = `No resource history: ${(error as Error).message}`;
      if (error instanceof ApiError && (error.status === 404 || error.status === 409)) {
        this.poller.stop(); // the cluster is gone or stopped: its history went with its head
      }
      return;
    }
    this.history = known ? merge(known, got, WINDOW) : got;
    this.draw(this.history);
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
    // A page of nodes at a time: a thousand rows of plots would hold the browser up.
    const pages = Math.max(1, Math.ceil(names.length / PAGE));
    this.page = Math.min(this.page, pages - 1);
    const offset = this.page * PAGE;
    for (let i = offset; i < Math.min(names.length, offset + PAGE); i++) {
      rows.push(this.row(names[i], 'cb-Resources-node', cpu[i], memory[i], history.nodes[names[i]].memory_gib ?? 0, gpu[i], start, end));
    }
    this.grid.replaceChildren(...rows);
    this.drawPager(pages, names.length);
    this.state.textContent = `${names.length} node(s); the last ${Math.round(WINDOW / 60)} minutes, a point every ${history.interval} s`;
  }

  private drawPager(pages: number, nodes: number): void {
    if (pages <= 1) {
      this.pager.replaceChildren();
      return;
    }
    const focused = document.activeElement?.getAttribute('data-page-action') ?? null;
    const go = (to: number): void => {
      this.page = Math.max(0, Math.min(pages - 1, to));
      if (this.history) {
        this.draw(this.history);
      }
    };
    const previous = button('Previous', 'Previous page of nodes', () => go(this.page - 1));
    previous.setAttribute('data-page-action', 'previous');
    previous.disabled = this.page === 0;
    const next = button('Next', 'Next page of nodes', () => go(this.page + 1));
    next.setAttribute('data-page-action', 'next');
    next.disabled = this.page === pages - 1;
    const first = this.page * PAGE + 1;
    const said = el('span', { class: 'cb-Resources-page' }, `nodes ${first}-${Math.min(nodes, first + PAGE - 1)} of ${nodes}`);
    this.pager.replaceChildren(previous, said, next);
    if (focused) {
      (this.pager.querySelector(`[data-page-action="${focused}"]`) as HTMLElement | null)?.focus();
    }
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
