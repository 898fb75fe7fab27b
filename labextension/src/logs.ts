// A main-area panel that follows a job's per-rank lines, with the notebook log viewer's
// filters: rank, host and text.
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ApiError, IJob, ILine, ILogPage, requestAPI } from './api';
import { Poller, el } from './poll';

/** Lines kept in the page (the job's files keep them all). */
const KEEP = 20000;
/** Lines drawn at once: the newest that pass the filters. */
const DRAWN = 2000;

export class LogPanel extends Widget {
  private readonly poller: Poller;
  private readonly jobSelect: HTMLSelectElement;
  private readonly rankSelect: HTMLSelectElement;
  private readonly hostSelect: HTMLSelectElement;
  private readonly search: HTMLInputElement;
  private readonly follow: HTMLButtonElement;
  private readonly state: HTMLElement;
  private readonly output: HTMLElement;
  private lines: ILine[] = [];
  private next = 0;
  private ended = false;
  private job: string | null;
  private ranks = new Set<number>();
  private hosts = new Set<string>();

  constructor(
    readonly clusterId: string,
    job: string | null
  ) {
    super();
    this.job = job;
    this.addClass('cb-Logs');
    this.id = `clusterbook-logs-${clusterId}`;
    this.title.label = `Logs: ${clusterId}`;
    this.title.closable = true;
    const controls = el('div', { class: 'cb-Logs-controls', role: 'toolbar', 'aria-label': 'Log filters' });
    this.jobSelect = el('select', { class: 'cb-Logs-job', 'aria-label': 'Job' });
    this.jobSelect.addEventListener('change', () => this.choose(this.jobSelect.value));
    this.rankSelect = el('select', { class: 'cb-Logs-rank', 'aria-label': 'Rank' });
    this.hostSelect = el('select', { class: 'cb-Logs-host', 'aria-label': 'Host' });
    this.search = el('input', { class: 'cb-Logs-search', type: 'search', placeholder: 'text in a line', 'aria-label': 'Search' });
    this.follow = el('button', { class: 'jp-Button cb-Button cb-Logs-follow', type: 'button', 'aria-pressed': 'true', 'aria-label': 'Follow new lines' }, 'Follow');
    this.follow.addEventListener('click', () => this.toggleFollow());
    for (const select of [this.rankSelect, this.hostSelect]) {
      select.addEventListener('change', () => this.draw());
    }
    this.search.addEventListener('input', () => this.draw());
    controls.append(label('Job', this.jobSelect), label('Rank', this.rankSelect), label('Host', this.hostSelect), label('Search', this.search), this.follow);
    this.state = el('div', { class: 'cb-Logs-state', role: 'status', 'aria-live': 'polite' });
    this.output = el('div', { class: 'cb-Logs-output', role: 'log', tabindex: '0', 'aria-label': 'Log lines' });
    this.node.append(controls, this.state, this.output);
    this.syncFilters();
    this.poller = new Poller(() => this.read(), 1000);
    void this.loadJobs();
  }

  protected onAfterShow(msg: Message): void {
    this.resume();
  }

  protected onAfterAttach(msg: Message): void {
    this.resume();
  }

  protected onBeforeHide(msg: Message): void {
    this.poller.stop();
  }

  protected onBeforeDetach(msg: Message): void {
    this.poller.stop();
  }

  private resume(): void {
    if (this.isVisible && this.following && !this.ended && this.job) {
      this.poller.start();
    }
  }

  private get following(): boolean {
    return this.follow.getAttribute('aria-pressed') === 'true';
  }

  private toggleFollow(): void {
    const on = !this.following;
    this.follow.setAttribute('aria-pressed', String(on));
    if (on) {
      this.resume();
    } else {
      this.poller.stop();
    }
    this.draw();
  }

  private async loadJobs(): Promise<void> {
    let jobs: IJob[];
    try {
      jobs = await requestAPI<IJob[]>(`clusters/${encodeURIComponent(this.clusterId)}/jobs`);
    } catch (error) {
      this.state.textContent = `Cannot list the jobs: ${(error as Error).message}`;
      return;
    }
    this.jobSelect.replaceChildren(
      ...jobs.map(j => el('option', { value: j.id }, `${j.id} (${j.state}) ${j.label ?? j.argv.join(' ')}`.slice(0, 80)))
    );
    const chosen = this.job && jobs.some(j => j.id === this.job) ? this.job : jobs.length ? jobs[0].id : null;
    if (chosen) {
      this.jobSelect.value = chosen;
      this.choose(chosen);
    } else {
      this.state.textContent = 'This cluster has run no job yet.';
    }
  }

  private choose(job: string): void {
    this.poller.stop();
    this.job = job;
    this.title.label = `Logs: ${job} of ${this.clusterId}`;
    this.lines = [];
    this.next = 0;
    this.ended = false;
    this.ranks.clear();
    this.hosts.clear();
    this.syncFilters();
    this.draw();
    this.resume();
    if (!this.isVisible) {
      void this.read(); // show what there is once, even before the panel shows
    }
  }

  private async read(): Promise<void> {
    const job = this.job;
    if (!job) {
      return;
    }
    let page: ILogPage;
    try {
      page = await requestAPI<ILogPage>(
        `clusters/${encodeURIComponent(this.clusterId)}/jobs/${encodeURIComponent(job)}/logs?after=${this.next}`
      );
    } catch (error) {
      this.state.textContent = `Cannot read the job's lines: ${(error as Error).message}`;
      if (error instanceof ApiError && error.status === 404) {
        this.poller.stop(); // the cluster or the job is gone
      }
      return;
    }
    if (job !== this.job) {
      return; // another job was chosen meanwhile
    }
    this.next = page.next;
    this.ended = page.ended;
    if (page.lines.length) {
      this.lines.push(...page.lines);
      if (this.lines.length > KEEP) {
        this.lines.splice(0, this.lines.length - KEEP);
      }
      let grown = false;
      for (const line of page.lines) {
        grown = !this.ranks.has(line.rank) || !this.hosts.has(line.host) || grown;
        this.ranks.add(line.rank);
        this.hosts.add(line.host);
      }
      if (grown) {
        this.syncFilters();
      }
    }
    if (this.ended) {
      this.poller.stop();
    }
    this.draw();
  }

  private syncFilters(): void {
    const rank = this.rankSelect.value || 'all';
    const host = this.hostSelect.value || 'all';
    const ranks = [...this.ranks].sort((a, b) => a - b);
    this.rankSelect.replaceChildren(
      el('option', { value: 'all' }, 'all'),
      ...ranks.map(r => el('option', { value: String(r) }, r < 0 ? 'launcher' : String(r)))
    );
    this.hostSelect.replaceChildren(el('option', { value: 'all' }, 'all'), ...[...this.hosts].sort().map(h => el('option', { value: h }, h)));
    this.rankSelect.value = rank === 'all' || this.ranks.has(Number(rank)) ? rank : 'all';
    this.hostSelect.value = host === 'all' || this.hosts.has(host) ? host : 'all';
  }

  private draw(): void {
    const rank = this.rankSelect.value;
    const host = this.hostSelect.value;
    const text = this.search.value;
    const shown = this.lines.filter(
      l => (rank === 'all' || String(l.rank) === rank) && (host === 'all' || l.host === host) && (!text || l.text.includes(text))
    );
    const drawn = shown.slice(-DRAWN);
    this.output.replaceChildren(
      ...drawn.map(l => {
        const row = el('div', { class: `cb-Line cb-Line-${l.stream}`, 'data-rank': String(l.rank) });
        row.append(el('span', { class: 'cb-Line-who' }, `[${l.rank < 0 ? 'launcher' : l.rank} ${l.host}]`), document.createTextNode(' ' + l.text));
        return row;
      })
    );
    if (this.following) {
      this.output.scrollTop = this.output.scrollHeight;
    }
    const how = this.ended ? 'ended' : this.following ? 'live' : 'paused';
    const more = shown.length > drawn.length ? `, the newest ${drawn.length} shown` : '';
    this.state.textContent = `${this.job ?? ''}: ${shown.length} of ${this.lines.length} lines${more} (${how})`;
  }
}

function label(text: string, control: HTMLElement): HTMLElement {
  const node = el('label', { class: 'cb-Label' });
  node.append(el('span', {}, text), control);
  return node;
}
