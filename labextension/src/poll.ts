// Polling that runs while its widget is visible, one request at a time.

/** Calls `tick` every `interval` ms while started; the next call is planned once the
 * previous one has settled, so requests never pile up behind a slow server. */
export class Poller {
  private timer: number | null = null;
  private running = false;
  private busy = false;

  constructor(
    private readonly tick: () => Promise<void>,
    private readonly interval: number
  ) {}

  get active(): boolean {
    return this.running;
  }

  start(): void {
    if (this.running) {
      return;
    }
    this.running = true;
    void this.run();
  }

  stop(): void {
    this.running = false;
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
      this.timer = null;
    }
  }

  /** Poll now (after an action), unless a poll is under way. */
  async now(): Promise<void> {
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
      this.timer = null;
    }
    await this.run();
  }

  private async run(): Promise<void> {
    if (this.busy) {
      return;
    }
    this.busy = true;
    try {
      await this.tick();
    } catch (error) {
      console.warn('clusterbook: polling failed', error);
    } finally {
      this.busy = false;
    }
    if (this.running && this.timer === null) {
      this.timer = window.setTimeout(() => {
        this.timer = null;
        void this.run();
      }, this.interval);
    }
  }
}

/** An element with its class, attributes and text. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: { [name: string]: string } = {},
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    node.setAttribute(name, value);
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** A button with a label and what it says to screen readers. */
export function button(label: string, aria: string, onClick: () => void): HTMLButtonElement {
  const node = el('button', { class: 'jp-Button cb-Button', type: 'button', 'aria-label': aria, title: aria }, label);
  node.addEventListener('click', onClick);
  return node;
}
