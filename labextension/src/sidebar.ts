// The Clusters sidebar: every cluster of the user, live while the panel is visible.
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ApiError, ICluster, IProfiles, requestAPI } from './api';
import { Poller, button, el } from './poll';

/** At most one request a second while the panel shows. */
export const SIDEBAR_INTERVAL = 1000;

export interface ISidebarActions {
  attach(cluster: ICluster): void;
  logs(cluster: ICluster): void;
  resources(cluster: ICluster): void;
}

export class ClusterSidebar extends Widget {
  private readonly poller: Poller;
  private readonly list: HTMLElement;
  private readonly status: HTMLElement;
  private readonly newBox: HTMLElement;
  private readonly profileSelect: HTMLSelectElement;
  private shown = '';
  private profilesShown = '';
  private stopping = new Set<string>();

  constructor(private readonly actions: ISidebarActions) {
    super();
    this.addClass('cb-Sidebar');
    this.id = 'clusterbook-sidebar';
    this.title.caption = 'Clusters';
    const header = el('div', { class: 'cb-Sidebar-header' });
    header.appendChild(el('h2', { class: 'cb-Sidebar-title' }, 'Clusters'));
    this.newBox = el('div', { class: 'cb-New', hidden: '' });
    this.profileSelect = el('select', { class: 'cb-New-profile', 'aria-label': 'Profile of the new cluster' });
    this.newBox.appendChild(this.profileSelect);
    this.newBox.appendChild(button('New', 'Start a new detached cluster of the chosen profile', () => void this.startNew()));
    header.appendChild(this.newBox);
    this.node.appendChild(header);
    this.status = el('div', { class: 'cb-Sidebar-status', role: 'status', 'aria-live': 'polite' });
    this.node.appendChild(this.status);
    this.list = el('div', { class: 'cb-Sidebar-list' });
    this.node.appendChild(this.list);
    this.poller = new Poller(() => this.refresh(), SIDEBAR_INTERVAL);
  }

  protected onAfterShow(msg: Message): void {
    this.poller.start();
    void this.loadProfiles();
  }

  protected onAfterAttach(msg: Message): void {
    if (this.isVisible) {
      this.poller.start();
      void this.loadProfiles();
    }
  }

  protected onBeforeHide(msg: Message): void {
    this.poller.stop();
  }

  protected onBeforeDetach(msg: Message): void {
    this.poller.stop();
  }

  /** Whether the sidebar polls now (it does only while visible). */
  get polling(): boolean {
    return this.poller.active;
  }

  private async refresh(): Promise<void> {
    let clusters: ICluster[];
    try {
      clusters = await requestAPI<ICluster[]>('clusters');
    } catch (error) {
      this.status.textContent = `Cannot list the clusters: ${(error as Error).message}`;
      return;
    }
    // Rows are drawn again only when more than the time left changed: an element replaced
    // under a click that is under way would lose the click.
    const text = JSON.stringify(clusters.map(c => ({ ...c, time_left: null, time_left_text: null })));
    if (text === this.shown) {
      for (const cluster of clusters) {
        const left = this.list.querySelector(`[data-cluster-id="${CSS.escape(cluster.id)}"] .cb-Fact-left`);
        if (left) {
          left.textContent = leftText(cluster);
        }
      }
      return;
    }
    this.shown = text;
    this.render(clusters);
  }

  private async loadProfiles(): Promise<void> {
    let found: IProfiles;
    try {
      found = await requestAPI<IProfiles>('profiles');
    } catch {
      return;
    }
    const text = JSON.stringify(found.profiles);
    if (text === this.profilesShown) {
      return;
    }
    this.profilesShown = text;
    this.profileSelect.replaceChildren(
      ...found.profiles.map(p => el('option', { value: p.name }, `${p.name} (${p.kind})`))
    );
    if (found.profiles.length) {
      this.newBox.removeAttribute('hidden');
    } else {
      this.newBox.setAttribute('hidden', '');
    }
  }

  private async startNew(): Promise<void> {
    const profile = this.profileSelect.value;
    this.status.textContent = `Starting a cluster of profile ${profile}…`;
    try {
      const cluster = await requestAPI<ICluster>('clusters', {
        method: 'POST',
        body: JSON.stringify({ profile })
      });
      this.status.textContent = `Started ${cluster.id}.`;
    } catch (error) {
      this.status.textContent = `Could not start profile ${profile}: ${(error as Error).message}`;
    }
    await this.poller.now();
  }

  private async stop(cluster: ICluster): Promise<void> {
    const answer = await showDialog({
      title: `Stop cluster ${cluster.name ?? cluster.id}?`,
      body: `Its head stops its jobs and its nodes (${cluster.running_jobs ?? 0} job(s) running).`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop' })]
    });
    if (!answer.button.accept) {
      return;
    }
    this.stopping.add(cluster.id);
    this.shown = '';
    this.status.textContent = `Stopping ${cluster.id}…`;
    try {
      await requestAPI<ICluster>(`clusters/${encodeURIComponent(cluster.id)}/stop`, { method: 'POST' });
      this.status.textContent = `Stopped ${cluster.id}.`;
    } catch (error) {
      const why = error instanceof ApiError ? error.message : String(error);
      this.status.textContent = `Could not stop ${cluster.id}: ${why}`;
    } finally {
      this.stopping.delete(cluster.id);
    }
    this.shown = '';
    await this.poller.now();
  }

  private render(clusters: ICluster[]): void {
    const focused = document.activeElement?.getAttribute('data-action-key') ?? null;
    const running = clusters.filter(c => c.running);
    const others = clusters.filter(c => !c.running);
    const groups: [string, ICluster[]][] = [
      ['Running', running],
      ['Stopped', others]
    ];
    const parts: HTMLElement[] = [];
    for (const [title, members] of groups) {
      const section = el('section', { class: 'cb-Group', 'aria-label': `${title} clusters` });
      section.appendChild(el('h3', { class: 'cb-Group-title' }, `${title} (${members.length})`));
      const list = el('ul', { class: 'cb-Group-list' });
      for (const cluster of members) {
        list.appendChild(this.row(cluster));
      }
      if (!members.length) {
        list.appendChild(el('li', { class: 'cb-Empty' }, title === 'Running' ? 'No cluster runs.' : 'None.'));
      }
      section.appendChild(list);
      parts.push(section);
    }
    this.list.replaceChildren(...parts);
    if (focused) {
      const again = this.list.querySelector(`[data-action-key="${CSS.escape(focused)}"]`);
      (again as HTMLElement | null)?.focus();
    }
  }

  private row(cluster: ICluster): HTMLElement {
    const stopping = this.stopping.has(cluster.id);
    const state = stopping ? 'stopping' : cluster.state;
    const item = el('li', { class: 'cb-Cluster', 'data-cluster-id': cluster.id, 'data-state': state });
    const top = el('div', { class: 'cb-Cluster-top' });
    top.appendChild(el('span', { class: 'cb-Cluster-name', title: cluster.directory }, cluster.name ?? cluster.id));
    top.appendChild(el('span', { class: 'cb-Cluster-kind' }, cluster.kind ?? '?'));
    top.appendChild(el('span', { class: `cb-Badge cb-Badge-${state}`, 'aria-label': `state ${state}` }, state));
    item.appendChild(top);
    const facts = el('div', { class: 'cb-Cluster-facts' });
    facts.appendChild(el('span', { class: 'cb-Fact cb-Fact-nodes' }, `${cluster.nodes_ready}/${cluster.nodes ?? 0} nodes ready`));
    facts.appendChild(el('span', { class: 'cb-Fact cb-Fact-jobs' }, `${cluster.running_jobs ?? 0} job(s) running`));
    if (cluster.running) {
      facts.appendChild(el('span', { class: 'cb-Fact cb-Fact-left' }, leftText(cluster)));
    }
    item.appendChild(facts);
    item.appendChild(el('div', { class: 'cb-Cluster-id' }, cluster.id));
    if (cluster.problem) {
      item.appendChild(el('div', { class: 'cb-Cluster-problem' }, cluster.problem));
    }
    const actions = el('div', { class: 'cb-Cluster-actions' });
    const add = (label: string, aria: string, run: () => void): void => {
      const b = button(label, `${aria} ${cluster.id}`, run);
      b.setAttribute('data-action-key', `${label}:${cluster.id}`);
      b.classList.add(`cb-Action-${label.toLowerCase()}`);
      actions.appendChild(b);
    };
    if (cluster.running) {
      add('Attach', 'Insert code that attaches to cluster', () => this.actions.attach(cluster));
    }
    if ((cluster.jobs ?? 0) > 0) {
      add('Logs', 'Follow the log lines of a job of cluster', () => this.actions.logs(cluster));
    }
    if (cluster.running) {
      add('Resources', 'Show the CPU, memory and GPU plots of cluster', () => this.actions.resources(cluster));
      if (!stopping) {
        add('Stop', 'Stop cluster', () => void this.stop(cluster));
      }
    }
    item.appendChild(actions);
    return item;
  }
}

function leftText(cluster: ICluster): string {
  return cluster.time_left_text ? `${cluster.time_left_text} left` : 'no time limit';
}
